"""Failover proven with real processes (issue 16): coordinators on one PostgreSQL, the leader hit.

Each test runs ``tests/crash/failover.py``'s scenario: real coordinator processes on one
PostgreSQL database, light bank pipelines and a snapshot reader given every address, faults on
the leader (or the store) at random moments, each takeover timed, then the crash checker: every
batch exactly once (I2), every snapshot read consistent (I1), acknowledged commits durable (I4),
the oracle strictly monotonic across takeovers (I6). The long mode is
``scripts/failover_soak.py``.
"""

from __future__ import annotations

import random

import pytest

from tests.crash.failover import failover_under_load
from tests.crash.scenarios import Outcome

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _clean(outcome: Outcome) -> dict:
    assert not outcome.violations, outcome.summary()
    return outcome.notes


def test_takeover_under_bank_workload_after_sigkill_and_sigstop(tmp_path, pg_dsn):
    """Default lease: the leader SIGKILLed (restarted as a standby), then the new leader frozen
    past its lease and resumed; it must answer NOT_SERVING and write nothing."""
    outcome = failover_under_load(tmp_path, pg_dsn, ["sigkill", "sigstop"], random.Random(16),
                                  pipelines=2, batches=3)
    notes = _clean(outcome)
    kill, stop = notes["takeovers"]
    assert (kill["kind"], stop["kind"]) == ("sigkill", "sigstop")
    for takeover in (kill, stop):
        assert takeover["old"] != takeover["new"]
        assert 0 < takeover["seconds"] < 10, takeover
    assert stop["old"] == kill["new"]  # the second fault hit the leader the first one made
    assert stop["details"]["frozen_s"] > notes["lease_s"]
    assert stop["details"]["health_after_resume"][-1] == "NOT_SERVING"
    assert outcome.report.batches_verified >= 6
    assert outcome.report.snapshot_reads_checked > 0


def test_oracle_strictly_monotonic_across_three_takeovers(tmp_path, pg_dsn):
    """Commits between takeovers; the first snapshot_ts after each takeover is above every
    commit_ts and snapshot_ts handed out before it, and a sequential probe's timestamps rise
    strictly through all three leader changes."""
    outcome = failover_under_load(tmp_path, pg_dsn, ["sigkill", "sigstop", "sigkill"],
                                  random.Random(3), pipelines=1, batches=3, lease_s=1.0)
    notes = _clean(outcome)
    takeovers = notes["takeovers"]
    assert len(takeovers) == 3
    assert all(t["details"]["snapshot_ts_above_before"] > 0 for t in takeovers), takeovers
    acks_before = [t["details"]["acks_before"] for t in takeovers]
    assert acks_before == sorted(set(acks_before)) and notes["acks"] > acks_before[-1], \
        f"no commit between some takeovers: {acks_before}, {notes['acks']} in all"
    assert notes["probe"]["switches"] >= 3, notes["probe"]


def test_clients_with_two_addresses_follow_the_leader(tmp_path, pg_dsn):
    """Pipelines and the reader are given "a,b"; the leader is SIGTERMed mid-run (it releases
    its lease) and restarted as a standby: every batch lands exactly once."""
    outcome = failover_under_load(tmp_path, pg_dsn, ["sigterm"], random.Random(2),
                                  pipelines=2, batches=4, lease_s=1.0)
    notes = _clean(outcome)
    (term,) = notes["takeovers"]
    assert term["old"] != term["new"] and term["seconds"] < 10, term
    assert term["details"]["exit"] == 0, "the SIGTERMed leader did not shut down cleanly"
    assert all(done >= 4 for done in notes["batches"].values()), notes["batches"]
    assert len(notes["probe"]["by_address"]) == 2, notes["probe"]


def test_postgres_restart_and_connection_cut_mid_write(tmp_path):
    """PostgreSQL (a server of this test's own) stopped for longer than the lease while
    pipelines commit, then every session cut: the coordinator answers NOT_SERVING while the
    store is down, reconnects and serves again; every batch exactly once, every acknowledged
    commit durable with its commit_ts."""
    from tests.pg_support import PostgresServer

    postgres = PostgresServer(tmp_path / "postgres").start()
    try:
        outcome = failover_under_load(tmp_path / "run", postgres.create_database(),
                                      ["pg-restart", "pg-cut"], random.Random(6),
                                      pipelines=2, batches=3, lease_s=1.0, coordinators=1,
                                      postgres=postgres)
    finally:
        postgres.stop()
    notes = _clean(outcome)
    restart, cut = notes["takeovers"]
    assert restart["details"]["not_serving_after_s"] is not None, restart
    assert restart["new"] == "a" and restart["seconds"] < 10, restart
    assert cut["seconds"] < 10, cut
    assert outcome.report.batches_verified >= 6
