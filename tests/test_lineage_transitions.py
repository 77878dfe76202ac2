"""Lineage transitions (docs/topology.md, "Lineage transitions"): a pipeline gaining a read,
a table gaining a writer, a reset, each with a defined effect on the commits made before it,
so no commit becomes invisible and no barrier a table completed is rewritten; and the refusal
of a downstream commit its sources did not plan. In-process core on a test clock."""

from __future__ import annotations

import pytest

from coordinator.core.snapshots import Consistency
from percolake.errors import FailedPrecondition
from tests.test_topology_barriers import Lake, _append, g, ts


@pytest.fixture
def lake(tmp_path):
    lake = Lake(tmp_path)
    yield lake
    lake.core.close()


def _changes(lake: Lake, table: str, after: int, upto: int) -> list[str]:
    return [c.txn_id for c in lake.core.get_table_changes(table, after, upto).changes]


def test_a_root_pipeline_gaining_its_first_read_keeps_its_earlier_commits(lake):
    """enrich (root) writes events; audit streams events. enrich registers its first read
    (rates): its batches committed before keep their place, by commit_ts: audit streams the
    one it has not read yet and a topology read still shows them (issue 28, defect 1)."""
    events, rates, trail = lake.table("events"), lake.table("rates"), lake.table("trail")
    lake.at(10_200)
    first = lake.commit("enrich", [events])
    lake.at(10_300)
    lake.commit("fx", [rates])
    lake.core.register_reads("audit", [events], None)
    lake.at(12_300)
    plan = lake.downstream_batch(None, pipeline="audit", table=trail)
    assert (plan.barrier, plan.has_changes) == (g(11), True)
    lake.at(12_500)
    second = lake.commit("enrich", [events])  # not read by audit yet
    lake.at(12_700)
    before = lake.completed(events)
    lake.core.register_reads("enrich", [rates], None)  # the transition, at 12.7
    lake.at(14_100)
    # events stays complete where it was: up to the transition, until enrich's first batch
    assert lake.completed(events) == before == g(12)
    snapshot = lake.core.get_snapshot([events], consistency=Consistency.TOPOLOGY,
                                      as_of_barrier=g(12))
    assert snapshot.versions == {events: 0}  # its root-era commit, not "never written"
    assert _changes(lake, events, 0, g(12)) == [first.txn_id]
    audit = lake.downstream_batch(g(11), pipeline="audit", table=trail)
    assert (audit.barrier, audit.has_changes) == (g(12), False)  # 12.5 is in (12, 13]
    # enrich's first downstream batch reads rates' change at 10.3 (from before the
    # transition) and ends on the first barrier after the transition, above every barrier
    # events completed and above every root-era commit
    lake.at(14_200)
    lake.commit("fx", [rates])
    lake.at(15_500)
    own = lake.downstream_batch(None, pipeline="enrich", table=events)
    assert (own.after_barrier, own.barrier, own.has_changes) == (0, g(13), True)
    enriched = lake.last_txn.txn_id
    assert lake.completed(events) == g(14)  # rates' change at 14.2 is not read yet
    audit = lake.downstream_batch(g(12), pipeline="audit", table=trail)
    assert (audit.barrier, audit.has_changes) == (g(13), True)
    assert _changes(lake, events, g(12), g(13)) == [second.txn_id, enriched]


def test_a_downstream_pipeline_gaining_a_read_never_rewrites_a_completed_barrier(lake):
    """ledger reads debits and has completed 20; audit streamed ledger up to 20. ledger
    gains a read of rates, whose change at 12.3 lies below 20: ledger's next batch must not
    end there (audit would never see it); it ends after the transition."""
    debits, rates, ledger = lake.debits, lake.table("rates"), lake.ledger
    trail = lake.table("trail")
    lake.root_commit(10_200)
    lake.core.register_reads("ledger", [debits], None)
    lake.core.register_reads("audit", [ledger], None)
    lake.at(12_300)
    lake.commit("fx", [rates])  # at 12.3, before the transition
    lake.downstream_batch(None)  # ledger: (0, 11]
    lake.at(20_500)
    assert lake.completed(ledger) == g(20)
    lake.downstream_batch(None, pipeline="audit", table=trail)  # (0, 11]: ledger's batch
    audit = lake.downstream_batch(g(11), pipeline="audit", table=trail)
    assert (audit.barrier, audit.has_changes) == (g(20), False)
    lake.core.register_reads("ledger", [rates], None)  # at 20.5
    lake.at(21_000)
    assert lake.completed(ledger) == g(20)  # not back to rates' 12.3
    lake.at(22_400)
    lake.commit("fx", [rates])
    lake.at(24_100)
    # rates' change at 12.3 (before the transition) is read by the batch ending on the first
    # barrier after the transition, not at 13; the change at 22.4 by the next one
    plan = lake.downstream_batch(g(11))
    assert (plan.barrier, plan.has_changes) == (g(21), True)
    lumped = lake.last_txn.txn_id
    assert lake.downstream_batch(g(21)).barrier == g(23)
    following = lake.core.plan_barrier("audit", 0, g(20))
    assert (following.barrier, following.has_changes) == (g(21), True)
    assert _changes(lake, ledger, g(20), g(23)) == [lumped, lake.last_txn.txn_id]


def test_a_new_pipeline_registering_reads_reads_each_interval_as_its_own_batch(lake):
    """A pipeline that writes no table yet gains its reads from the start (no transition)."""
    lake.root_commit(10_200)
    lake.root_commit(12_200)
    lake.core.register_reads("ledger", [lake.debits], None)
    lake.at(15_000)
    assert lake.core.completion().lineage.read_since("ledger", lake.debits) == 0
    assert lake.downstream_batch(None).barrier == g(11)


def test_the_transition_survives_a_restart(tmp_path):
    from coordinator.store.sqlite import SqliteStore

    lake = Lake(tmp_path, SqliteStore(tmp_path / "data"))
    try:
        events, rates = lake.table("events"), lake.table("rates")
        lake.at(10_200)
        lake.commit("enrich", [events])
        lake.commit("fx", [rates])
        lake.at(11_500)
        lake.core.register_reads("enrich", [rates], None)
        since = lake.core.completion().lineage.read_since("enrich", rates)
        assert since > ts(11_500) - 1
        lake.restart()
        assert lake.core.completion().lineage.read_since("enrich", rates) == since
        lake.at(13_000)
        assert lake.completed(events) >= g(11)
    finally:
        lake.core.close()
        lake.store.close()


def test_a_downstream_commit_its_sources_did_not_plan_is_refused(lake):
    """ledger reads debits: a batch opened without a plan (a rate source beside the
    percolake one) carries no input barrier and is refused before the commit point, naming
    the pipeline, the table and what to do (issue 28, defect 3)."""
    lake.root_commit(10_200)
    lake.core.register_reads("ledger", [lake.debits], None)
    lake.at(12_300)
    txn, _ = lake.core.open_transaction("ledger", 0, tables=[lake.ledger])
    assert txn.input_barrier == 0
    with pytest.raises(FailedPrecondition) as refused:
        lake.core.commit(txn.txn_id, None, [lake.ledger], [_append(txn.txn_id, lake.ledger)])
    message = str(refused.value)
    assert "pipeline 'ledger'" in message and lake.ledger in message, message
    assert lake.debits in message and "no input barrier" in message, message
    assert "percolake source" in message and "Abort it" in message, message
    assert lake.core.get_transaction(txn.txn_id).state.value == "OPEN"  # nothing recorded
    assert lake.store.table_commit_at(lake.ledger, 1 << 62) is None  # nothing committed
    lake.core.abort(txn.txn_id, None)
    assert lake.downstream_batch(None).has_changes  # a planned batch commits as ever


def test_a_root_batch_open_when_its_pipeline_gains_a_read_is_refused(lake):
    """A root batch opened before its pipeline's first read (no input barrier) would land
    after the transition at no barrier: refused like any unplanned downstream commit."""
    events, rates = lake.table("events"), lake.table("rates")
    lake.at(10_200)
    lake.commit("fx", [rates])
    txn, _ = lake.core.open_transaction("enrich", 0, tables=[events])
    lake.core.register_reads("enrich", [rates], None)
    with pytest.raises(FailedPrecondition, match="carries no input barrier"):
        lake.core.commit(txn.txn_id, None, [events], [_append(txn.txn_id, events)])


def test_a_reset_moving_a_downstream_pipelines_input_back_is_refused(lake):
    lake.root_commit(10_200)
    lake.core.register_reads("ledger", [lake.debits], None)
    lake.at(12_300)
    lake.downstream_batch(None)  # up to 11
    with pytest.raises(FailedPrecondition) as refused:
        lake.core.reset_pipeline("ledger", "again", None, start_barrier=g(10))
    assert "revise --table" in str(refused.value) and lake.ledger in str(refused.value)
    assert lake.core.get_pipeline("ledger").generation == 0
    reset, _, _ = lake.core.reset_pipeline("ledger", "skip ahead", None, start_barrier=g(12))
    assert (reset.generation, reset.start_barrier) == (1, g(12))


def test_a_reads_changes_from_before_its_transition_are_never_read_below_it(lake):
    """Found by the model (tests/topology_model.py): rates changed at 10.3, before enrich
    (writing events) gained the read at 12.7. An empty step of enrich up to 12 would read
    that change at a barrier events had completed, rewriting it for events' readers. The
    change counts at the transition: no batch runs until the sources complete the barrier
    after it, and that batch reads it."""
    events, rates = lake.table("events"), lake.table("rates")
    lake.at(10_200)
    lake.commit("enrich", [events])
    lake.at(10_300)
    lake.commit("fx", [rates])
    lake.at(12_700)
    lake.core.register_reads("enrich", [rates], None)
    lake.at(12_900)
    assert lake.completed(events) == g(12)
    waiting = lake.core.plan_barrier("enrich", 0, None)
    assert waiting.barrier == waiting.after_barrier == 0  # no step over 10.3 up to 12
    lake.at(13_500)
    plan = lake.downstream_batch(None, pipeline="enrich", table=events)
    assert (plan.after_barrier, plan.barrier, plan.has_changes) == (0, g(13), True)
    assert ts(10_300) <= lake.core.get_table_changes(rates, 0, g(13)).changes[0].barrier < g(11)
    assert _changes(lake, events, g(12), g(13)) == [lake.last_txn.txn_id]


def test_a_plan_remembered_before_a_read_was_gained_never_outruns_the_new_source(lake):
    """audit's plan (events up to G11) is remembered, its batch not committed; then audit gains
    a read of labels, whose writer became downstream and has not caught up (labels completed
    below G11). audit's next plan ends no higher than what labels completed, so every source's
    range of it is readable (found by the topology model's soak: GetTableChanges refused)."""
    events, rates, labels = lake.table("events"), lake.table("rates"), lake.table("labels")
    lake.at(10_100)
    lake.commit("fx", [rates])
    lake.at(10_150)
    lake.commit("enrich", [labels])
    lake.at(10_200)
    lake.commit("bank", [events])
    lake.core.register_reads("enrich", [rates], None)  # labels now waits for enrich's batch
    lake.at(13_300)
    lake.core.register_reads("audit", [events], None)
    first = lake.core.plan_barrier("audit", 0, None)
    assert (first.barrier, first.has_changes) == (g(11), True)  # remembered, not committed
    lake.core.register_reads("audit", [labels], None)
    assert lake.completed(labels) < g(11)
    plan = lake.core.plan_barrier("audit", 0, None)
    assert plan.barrier <= lake.completed(labels), plan
    for source in (events, labels):
        lake.core.get_table_changes(source, plan.after_barrier, plan.barrier)
