"""Revision (docs/topology.md): a table, with every table downstream of it, back to its
versions at a global barrier B, all-or-nothing for readers (T4).

The restore is one coordinator transaction of the reserved pipeline ``percolake.revise``: an
OVERWRITE of each affected table with the files of its version at B, committed at one
commit_ts R. Snapshot readers see every affected table restored from R on.

Affected tables: every table of the revised table's writing pipeline W (W restarted at B
writes them all again, so they all go back to B), and every table downstream of them. Affected
pipelines, each started in a new generation (its drivers fenced, its query id unbound: each
restarts on a new checkpoint): W and every pipeline reading an affected table.

A root table (W reads no percolake table): W restarts from its source offsets at B (printed);
the downstream pipelines' input starts at R and the downstream tables' index rows carry input
barrier R, so topology readers see them restored from the first barrier >= R on, together with
the root tables (whose changes are keyed by commit_ts).

A derived table (W reads percolake tables, none of which is restored): W and the downstream
pipelines re-read their inputs from B, so every affected table's index row carries input
barrier B, and the rows it rolled back (input barriers above B, committed before R) are marked
superseded by R in the same durable write: they are no change and no version at any barrier,
so a re-reading pipeline never streams them and a topology read at G > B shows the restored
state until the re-processing passes G. The affected tables' completed barriers go back to B;
topology answers carry the restore's commit_ts (``revised_ts``), by which a reader that saw a
later barrier follows them back once.

Durable steps and crashes. The transaction records what it is (table, barrier, reason,
pipelines) as JSON in its ``source_offsets``. (1) Commit: durable, nothing applied; the
transaction holds every affected table until applied, so no other write can land on one.
(2) Resets: each affected pipeline's new generation, start barrier R or B (reset reason names
the transaction: a reset already made is recognised and not repeated). (3) Roll-forward. Whoever
applies a revision's table first (this call, a rerun, a waiting writer, the resolver after a
restart) makes the resets first, so an old generation can never commit on a restored table.
A rerun of the same command finds the newest revision; if it is of the same table and
barrier and no affected table changed since, it finishes that one instead of writing again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator import validation
from coordinator.core.state import CoreState, wall_ms
from coordinator.core.vacuum import VACUUM_OR_REVISION
from coordinator.store.base import TableCommit
from percolake.barriers import is_global_barrier
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound, TransactionAborted
from percolake.failpoints import fail_point
from percolake.lineage import Lineage
from percolake.records import TableWriteRecord, TxnRecord, WriteMode
from percolake.states import COMMITTED_STATES, LIVE_STATES, TxnState, check_transition

if TYPE_CHECKING:  # topology imports this module
    from coordinator.core.topology import Completion

log = logging.getLogger("percolake.coordinator")

REVISE_PIPELINE = "percolake.revise"  # reserved: only the coordinator's revisions use it
_REVISION_KEY = "percolake.revision"
_NEWEST = (1 << 63) - 1
# One revision at a time (a retried request waits, then resumes), never during a vacuum: the
# files of the versions it restores are read before its write intent protects them.
_REVISIONS = VACUUM_OR_REVISION


@dataclass(frozen=True)
class RevisedTable:
    table: str
    restored_version: int | None  # None: no version at the barrier (the table was emptied)
    delta_version: int | None  # the restore commit's Delta version


@dataclass(frozen=True)
class RevisedPipeline:
    pipeline_id: str
    generation: int
    start_barrier: int


@dataclass(frozen=True)
class Revision:
    txn_id: str
    revision_ts: int
    tables: tuple[RevisedTable, ...]
    pipelines: tuple[RevisedPipeline, ...]
    root_pipeline_id: str  # "" for a derived table: no root restarts
    root_batch_id: int | None  # the root's batch of its version at the barrier (None: none)
    root_source_offsets: str
    derived: bool  # the table is derived: its writer re-reads its inputs from the barrier
    writing_pipeline_id: str  # the revised table's writer (the root pipeline of a root table)


@dataclass(frozen=True)
class _Plan:
    """What a revision is, recorded in its transaction."""

    table: str
    to_barrier: int
    reason: str
    root_pipeline: str  # the writing pipeline W of the revised table (a root one or not)
    tables: tuple[str, ...]  # W's tables first
    root_tables: tuple[str, ...]  # W's tables
    pipelines: tuple[str, ...]  # W first, then the downstream ones
    restored: dict[str, int | None]  # table -> its version at the barrier
    derived: bool = False  # W reads percolake tables (module doc)
    # The lineage facts the plan rests on (``_Affected.facts``), re-checked at the commit
    # point; not recorded (a resumed revision is committed already).
    facts: tuple = field(default=(), compare=False)

    def to_json(self) -> str:
        return json.dumps({_REVISION_KEY: {
            "table": self.table, "to_barrier": self.to_barrier, "reason": self.reason,
            "root_pipeline": self.root_pipeline, "tables": list(self.tables),
            "root_tables": list(self.root_tables), "pipelines": list(self.pipelines),
            "restored": self.restored, "derived": self.derived}}, separators=(",", ":"))

    def start_barrier(self, revision_ts: int) -> int:
        """Where the new generations' percolake input starts (module doc)."""
        return self.to_barrier if self.derived else revision_ts

    def input_barrier(self, table: str, revision_ts: int) -> int:
        """The input barrier of the revision's index row of ``table`` (0: keyed by commit_ts,
        W's tables of a root revision)."""
        if self.derived:
            return self.to_barrier
        return 0 if table in self.root_tables else revision_ts

    @classmethod
    def of(cls, txn: TxnRecord) -> _Plan | None:
        try:
            data = json.loads(txn.source_offsets or "{}").get(_REVISION_KEY)
        except (ValueError, AttributeError):
            return None
        if not isinstance(data, dict):
            return None
        return cls(data["table"], data["to_barrier"], data["reason"], data["root_pipeline"],
                   tuple(data["tables"]), tuple(data["root_tables"]), tuple(data["pipelines"]),
                   dict(data["restored"]), bool(data.get("derived", False)))

    def reset_reason(self, txn_id: str) -> str:
        why = f": {self.reason}" if self.reason else ""
        return (f"revision {txn_id} restored {self.table} to barrier {self.to_barrier}{why}")[:1000]


class Revising(CoreState):
    """Revise."""

    def revise(self, table: str, to_barrier: int, reason: str = "") -> Revision:
        """Restores ``table`` and every table downstream of it to their versions at global
        barrier ``to_barrier``; see the module doc.

        Raises:
            FailedPrecondition: a table no pipeline writes, a barrier not global, not
                completed, below the retention floor; a file of the version at the barrier is
                gone; a root revision restarting a pipeline that also reads an unaffected
                table.
            Conflict: a table stayed held by a live transaction for --conflict-wait.
        """
        validation.check_non_negative("to_barrier", to_barrier)
        validation.check_text("reason", reason, 500)
        canonical = self._canonical(table)
        with _REVISIONS:
            txn = self._resumable_revision(canonical, to_barrier)
            for attempt in range(1, REPLANS + 1) if txn is None else ():
                plan = self._plan_revision(canonical, to_barrier, reason.strip())
                try:
                    txn = self._commit_revision(plan)
                    break
                except LineageChanged as changed:
                    log.warning("revision planned again", extra={"table": canonical,
                                                                 "reason": str(changed)})
                    if attempt == REPLANS:
                        raise FailedPrecondition(
                            f"{changed}; it changed {REPLANS} times while the revision waited "
                            "for its tables' holds: nothing was revised, run it again") from None
            assert txn is not None
            return self._finish_revision(txn)

    # ---------------------------------------------------------------- the plan

    def _plan_revision(self, table: str, barrier: int, reason: str) -> _Plan:
        from percolake.lake.delta_commit import table_layout

        interval_ms = max(1, round(self.config.barrier_interval_s * 1000))
        if not is_global_barrier(barrier, interval_ms):
            raise FailedPrecondition(
                f"barrier {barrier} is not a global barrier (every {interval_ms} ms of oracle "
                "time; GetTopology shows each table's completed barrier)")
        view = self.completion()
        lineage = view.lineage
        affected = _Affected.of(lineage, table)
        root, derived, tables, pipelines = (affected.root, affected.derived,
                                            list(affected.tables), list(affected.pipelines))
        if derived and barrier <= 0:
            raise FailedPrecondition("a derived table is revised to a global barrier above 0")
        floor = self.store.retention_floor_ts()
        if barrier < floor:
            raise FailedPrecondition(
                f"barrier {barrier} is older than the retention floor (timestamp {floor}): "
                "that history was pruned (serve --retention-hours)")
        if derived:  # its pipelines re-read every input they keep from B
            self._check_kept_inputs_not_revised(lineage, [root, *pipelines], tables, barrier)
            self._check_no_root_era_after(view, tables, barrier)
        else:
            _check_inputs_all_restored(lineage, pipelines, tables)
        restored: dict[str, int | None] = {}
        for name in tables:
            completed = view.completed(name)
            if completed is None or completed < barrier:
                shown = "no completed barrier yet" if completed is None else (
                    f"completed barrier {completed}")
                raise FailedPrecondition(
                    f"table {name} has {shown}, not barrier {barrier}: a revision restores "
                    "barriers every affected table completed (not completed yet)")
            commit = view.version_at(name, barrier)
            if commit is not None and commit.delta_version is None:
                raise FailedPrecondition(f"table {name}: its commit at barrier {barrier} is "
                                         "not applied yet; retry")
            if table_layout(name) is None and self.store.table_commit_at(name, _NEWEST):
                raise FailedPrecondition(f"table {name} has a commit not applied yet (no Delta "
                                         "log so far); retry once it is applied")
            restored[name] = None if commit is None else commit.delta_version
        return _Plan(table, barrier, reason, root, tuple(tables), affected.root_tables,
                     (root, *sorted(pipelines)), restored, derived, affected.facts)

    def _check_no_root_era_after(self, view: Completion, tables: list[str],
                                 barrier: int) -> None:
        """Refuses a derived revision below a commit its table got before its writer read
        percolake tables (no input barrier): re-reading the inputs cannot make it again."""
        for name in tables:
            first = self.store.first_table_commit_after(name, barrier, True, view.now_ts)
            if first is not None and not first.input_barrier:
                raise FailedPrecondition(
                    f"table {name} holds a commit (transaction {first.txn_id}, timestamp "
                    f"{first.commit_ts}) its pipeline made before it read percolake tables, "
                    f"after barrier {barrier}: a derived revision makes a table again from its "
                    "inputs, which cannot make that commit again; revise to a barrier at or "
                    "after its pipeline started reading (docs/topology.md, lineage transitions)")

    def _check_kept_inputs_not_revised(self, lineage: Lineage, pipelines: list[str],
                                       tables: list[str], barrier: int) -> None:
        """Refuses a derived revision whose pipelines would re-read, from the barrier, an
        input another revision restored since: its restore commit is no stream of appends."""
        kept = {t for p in pipelines for t in lineage.reads_of(p)} - set(tables)
        for later in self._revisions_between(barrier) if kept else ():
            plan = _Plan.of(later)
            # a derived revision's restores are no change and what it rolled back is gone
            revised = [] if plan is not None and plan.derived else sorted(
                kept.intersection(later.tables))
            if revised:
                raise FailedPrecondition(
                    f"revision {later.txn_id} restored {revised[0]} after barrier {barrier}; "
                    "the pipelines this revision restarts would re-read it from the barrier "
                    "through that restore: revise to a barrier at or after it (not supported "
                    "yet across a revision of an input)")

    def _writes(self, plan: _Plan) -> list[TableWriteRecord]:
        """The OVERWRITE of each affected table with its files at the barrier (Delta reads,
        outside the lock). A table with no Delta log yet has nothing to restore."""
        from percolake.lake.delta_commit import files_of_version, table_layout

        writes = []
        for table in plan.tables:
            version = plan.restored[table]
            if version is None:
                layout = table_layout(table)
                if layout is None:
                    continue
                writes.append(TableWriteRecord(table, WriteMode.OVERWRITE, (),
                                               layout.schema_json,
                                               tuple(layout.partition_columns)))
                continue
            files = files_of_version(table, version, restore=True)
            writes.append(TableWriteRecord(table, WriteMode.OVERWRITE, files.files,
                                           files.schema_json, files.partition_columns))
        return writes

    # ---------------------------------------------------------------- open, prewrite, commit

    def _commit_revision(self, plan: _Plan) -> TxnRecord:
        writes = self._writes(plan)
        if not writes:
            raise FailedPrecondition(f"no affected table of {plan.table} has a Delta table "
                                     "yet: nothing to revise")
        with self._lock:
            newest = self.store.newest_committed_batch(REVISE_PIPELINE, 0)
        batch_id = 0 if newest is None else newest + 1
        try:
            txn, committed = self.open_transaction(
                REVISE_PIPELINE, batch_id, tables=[w.table for w in writes])
            if committed:  # another revision took the batch id meanwhile: nothing of ours open
                raise FailedPrecondition("another revision committed meanwhile; run it again")
            self._check_applicable(writes)
            with self._lock:
                committed_txn = self._commit_revision_locked(
                    self._prewrite_revision(txn.txn_id, writes, plan), plan)
        except Exception:  # nothing committed: free the tables at once, not at expiry
            self._abort_revision_attempts(batch_id)
            raise
        self.wait_durable()
        fail_point("after-revise-commit")
        log.warning("revision committed", extra={"txn_id": committed_txn.txn_id,
                                                 "commit_ts": committed_txn.commit_ts,
                                                 "table": plan.table,
                                                 "to_barrier": plan.to_barrier})
        return committed_txn

    def _prewrite_revision(self, txn_id: str, writes: list[TableWriteRecord],
                           plan: _Plan) -> TxnRecord:
        """The write intents and the plan, under the lock, recorded in one durable write."""
        txn = self._get(txn_id)
        if txn.state not in LIVE_STATES:
            raise TransactionAborted(f"revision {txn_id} was aborted ({txn.abort_reason}); "
                                     "run it again")
        updated = txn.copy()
        for write in writes:
            updated.tables[write.table].write = write
        updated.source_offsets = plan.to_json()
        check_transition(txn.state, TxnState.PREWRITTEN)
        updated.state = TxnState.PREWRITTEN
        updated.updated_ms = wall_ms()
        self.store.update_txn(updated)
        self._track(updated)
        return updated

    def _abort_revision_attempts(self, batch_id: int) -> None:
        for attempt in self.store.attempts_of(REVISE_PIPELINE, 0, batch_id):
            if attempt.state in LIVE_STATES:
                try:
                    self.abort(attempt.txn_id, None, "the revision failed before its commit")
                except Exception:  # it expires instead; the original error is what matters
                    log.exception("could not abort a failed revision attempt",
                                  extra={"txn_id": attempt.txn_id})

    def _commit_revision_locked(self, txn: TxnRecord, plan: _Plan) -> TxnRecord:
        """The commit point, under the lock: commit_ts R, the transaction's input barrier R,
        each written table's restore row at its input barrier (module doc) and, for a
        derived revision, the rows it rolls back superseded, all in one durable write."""
        floor = self.store.retention_floor_ts()
        if plan.to_barrier < floor:
            raise FailedPrecondition(f"barrier {plan.to_barrier} fell below the retention "
                                     f"floor (timestamp {floor}) while the revision prepared")
        now = _Affected.of(self._lineage, plan.table)
        if now.facts != plan.facts:  # decided at the commit point, under the holds
            raise LineageChanged(now.describe_change(plan.facts))
        for table in plan.tables:
            if table not in txn.tables and self.store.table_commit_at(table, _NEWEST):
                # no Delta log when planned, a commit since: it is not held, so retry
                raise FailedPrecondition(f"table {table} got its first commit while the "
                                         "revision prepared; run it again once it is applied")
        commit_ts = self.oracle.next()
        updated = txn.copy()
        check_transition(txn.state, TxnState.COMMITTED)
        updated.state = TxnState.COMMITTED
        updated.commit_ts = commit_ts
        updated.input_barrier = commit_ts
        updated.updated_ms = wall_ms()
        pipeline = self._pipelines[REVISE_PIPELINE].copy()
        pipeline.last_commit_ms = updated.updated_ms
        with self.store.batch():
            self.store.update_txn(updated)
            for table in updated.tables:
                self.store.add_table_commit(TableCommit(
                    table, commit_ts, txn.txn_id, None,
                    input_barrier=plan.input_barrier(table, commit_ts), restore=plan.derived))
            for table in plan.tables if plan.derived else ():
                self.store.supersede_table_commits(table, commit_ts, plan.to_barrier)
            self.store.update_pipeline(pipeline)
        self._pipelines[REVISE_PIPELINE] = pipeline
        self._revisions_resetting.add(txn.txn_id)  # until _finish_revision made the resets
        key = (REVISE_PIPELINE, txn.generation)
        self._newest_batch[key] = max(self._newest_batch.get(key, -1), txn.batch_id)
        self._track(updated)
        self._changed.notify_all()
        return updated

    # ---------------------------------------------------------------- resume, resets, apply

    def _resumable_revision(self, table: str, barrier: int) -> TxnRecord | None:
        """The newest committed revision if it is of ``table`` to ``barrier`` and no table it
        restored changed since (a rerun finishes it); else None (a new revision)."""
        newest = self.store.newest_committed_batch(REVISE_PIPELINE, 0)
        if newest is None:
            return None
        txn = next((a for a in self.store.attempts_of(REVISE_PIPELINE, 0, newest)
                    if a.state in COMMITTED_STATES), None)
        plan = _Plan.of(txn) if txn is not None else None
        if txn is None or plan is None or (plan.table, plan.to_barrier) != (table, barrier):
            return None
        for name in txn.tables:
            latest = self.store.table_commit_at(name, _NEWEST)
            if latest is None or latest.txn_id != txn.txn_id:
                return None
        return self._get(txn.txn_id)

    def _before_roll_forward(self, txn: TxnRecord) -> None:
        """A revision's resets are made before any of its tables is applied (module doc)."""
        if txn.pipeline_id == REVISE_PIPELINE:
            self._resets_of(txn)

    def _reset_revised_pipelines(self, txn: TxnRecord) -> list[RevisedPipeline]:
        plan = _Plan.of(txn)
        assert plan is not None, f"revision {txn.txn_id} records no plan"
        reason = plan.reset_reason(txn.txn_id)
        reset: list[RevisedPipeline] = []
        for pipeline_id in plan.pipelines:
            record = self._revision_reset_of(pipeline_id, reason,
                                             plan.start_barrier(txn.commit_ts))
            if record is not None:
                reset.append(record)
        return reset

    def _revision_reset_of(self, pipeline_id: str, reason: str,
                           start_barrier: int) -> RevisedPipeline | None:
        """The pipeline's generation the revision started, made now if it was not yet."""
        for _ in range(3):
            try:
                current = self.get_pipeline(pipeline_id)
            except NotFound:
                return None
            done = next((r for r in current.resets if r.reason == reason), None)
            if done is not None:
                return RevisedPipeline(pipeline_id, done.to_generation, start_barrier)
            try:
                pipeline, _, _ = self.reset_pipeline(
                    pipeline_id, reason, current.generation, start_barrier=start_barrier,
                    keep_plan=False, revision=True)
            except FailedPrecondition:  # reset meanwhile (by a concurrent finisher): re-read
                continue
            return RevisedPipeline(pipeline_id, pipeline.generation, start_barrier)
        raise FailedPrecondition(f"pipeline {pipeline_id!r} kept being reset while the "
                                 "revision reset it; run the revision again")

    def _after_load(self) -> None:
        """A revision committed before a crash makes its resets before any request."""
        with self._lock:
            committed = [t for t in self._unfinished.values()
                         if t.pipeline_id == REVISE_PIPELINE and t.state == TxnState.COMMITTED]
        for txn in committed:
            self._resets_of(txn)

    def _finish_pending_resets(self) -> None:
        """The resets of every revision committed but not reset yet, made now."""
        with self._lock:
            pending = [(t, self._unfinished.get(t)) for t in self._revisions_resetting]
        for txn_id, txn in pending:
            txn = txn or self.store.get_txn(txn_id)
            if txn is not None:
                self._resets_of(txn)
            else:  # cannot happen: a committed revision is kept; never wait on it
                with self._lock:
                    self._revisions_resetting.discard(txn_id)

    def _resets_of(self, txn: TxnRecord) -> list[RevisedPipeline]:
        """The revision's resets, made if not made yet; the revision is no longer pending."""
        reset = self._reset_revised_pipelines(txn)
        with self._lock:
            self._revisions_resetting.discard(txn.txn_id)
        return reset

    def _finish_revision(self, txn: TxnRecord) -> Revision:
        pipelines = self._resets_of(txn)
        self.wait_durable()
        fail_point("after-revise-reset")
        deadline = time.monotonic() + self.config.snapshot_wait_s
        pending = [t for t, e in self._get(txn.txn_id).tables.items() if not e.applied]
        failures = self._roll_forward_tables(
            txn.txn_id, pending, deadline)
        for table, exc in failures.items():
            log.warning("revision roll-forward failed", extra={"txn_id": txn.txn_id,
                                                               "table": table})
            raise exc
        done = self.get_transaction(txn.txn_id)
        plan = _Plan.of(done)
        assert plan is not None
        tables = tuple(RevisedTable(t, plan.restored.get(t),
                                    e.delta_version if (e := done.tables.get(t)) else None)
                       for t in plan.tables)
        root_batch, offsets = (None, "") if plan.derived else self._root_offsets(plan)
        log.warning("revision applied", extra={"txn_id": done.txn_id, "table": plan.table,
                                               "to_barrier": plan.to_barrier})
        return Revision(done.txn_id, done.commit_ts, tables, tuple(pipelines),
                        "" if plan.derived else plan.root_pipeline, root_batch, offsets,
                        plan.derived, plan.root_pipeline)

    def _root_offsets(self, plan: _Plan) -> tuple[int | None, str]:
        """The root pipeline's newest batch committed at or before the barrier (whatever
        tables it wrote, if any) and its source offsets: the source restarts right after it
        ("" if it recorded none; (None, "") if there is none, or its record was pruned). A
        revision of the root's tables committed after that batch and before the barrier put
        them back to its own barrier: that barrier's batch counts instead."""
        barrier = plan.to_barrier
        while True:
            origin = self.store.newest_commit_at_or_before(plan.root_pipeline, barrier)
            above = 0 if origin is None else origin.commit_ts
            undone = self._newest_revision_of(plan.root_pipeline, barrier, above)
            if undone is None or undone.to_barrier >= barrier:
                break
            barrier = undone.to_barrier
        if origin is None:
            return None, ""
        return origin.batch_id, origin.source_offsets

    def _newest_revision_of(self, root_pipeline: str, upto_ts: int,
                            above_ts: int) -> _Plan | None:
        """The plan of the newest root revision of ``root_pipeline`` committed in (above_ts,
        upto_ts]; revisions of other tables in between are passed over."""
        for earlier in self._revisions_between(above_ts, upto_ts):
            plan = _Plan.of(earlier)
            if plan is not None and not plan.derived and plan.root_pipeline == root_pipeline:
                return plan
        return None

    def _revisions_between(self, above_ts: int, upto_ts: int = _NEWEST) -> Iterator[TxnRecord]:
        """The committed revisions with a commit_ts in (above_ts, upto_ts], newest first (one
        indexed read each)."""
        while upto_ts > above_ts:
            revision = self.store.newest_commit_at_or_before(REVISE_PIPELINE, upto_ts)
            if revision is None or revision.commit_ts <= above_ts:
                return
            yield revision
            upto_ts = revision.commit_ts - 1


REPLANS = 3  # a lineage changing while a revision waits for holds: plan again, this often


class LineageChanged(FailedPrecondition):
    """The lineage a revision planned with changed before its commit point (nothing of it
    was committed): ``revise`` plans it again."""


@dataclass(frozen=True)
class _Affected:
    """What a revision of ``table`` affects in a lineage (module doc), with every lineage
    fact it rests on: the writer of each affected table and what each affected pipeline
    reads (and since when)."""

    root: str
    derived: bool
    root_tables: tuple[str, ...]
    tables: tuple[str, ...]
    pipelines: tuple[str, ...]  # the downstream ones, in discovery order
    facts: tuple

    @classmethod
    def of(cls, lineage: Lineage, table: str) -> _Affected:
        root = lineage.writers.get(table)
        if root is None or root == REVISE_PIPELINE:
            raise FailedPrecondition(f"table {table} has no writing pipeline: nothing to revise")
        root_tables = (table, *(t for t in lineage.writes_of(root) if t != table))
        tables, pipelines = list(root_tables), []
        frontier = list(root_tables)
        while frontier:
            source = frontier.pop(0)
            for reader in lineage.readers_of(source):
                if reader in pipelines or reader == root:
                    continue
                pipelines.append(reader)
                for written in lineage.writes_of(reader):
                    if written not in tables:
                        tables.append(written)
                        frontier.append(written)
        facts = (
            tuple(sorted((t, lineage.writers.get(t, "")) for t in tables)),
            tuple(sorted((p, t, lineage.read_since(p, t))
                         for p in (root, *pipelines) for t in lineage.reads_of(p))),
            tuple(sorted(pipelines)))
        return cls(root, not lineage.is_root(root), root_tables, tuple(tables),
                   tuple(pipelines), facts)

    def describe_change(self, planned: tuple) -> str:
        """What differs from the ``planned`` facts, for the refusal."""
        writers, reads, pipelines = (set(f) for f in planned)
        new_tables = sorted(t for t, _ in set(self.facts[0]) - writers)
        new_reads = sorted(f"{p} reads {t}" for p, t, _ in set(self.facts[1]) - reads)
        new_pipelines = sorted(set(self.facts[2]) - pipelines)
        parts = ([f"affected tables now include {', '.join(new_tables)}"] if new_tables else [])
        parts += [f"{', '.join(new_reads)}"] if new_reads else []
        parts += ([f"pipelines now affected: {', '.join(new_pipelines)}"] if new_pipelines
                  else [])
        return "the lineage of the revised tables changed (" + (
            "; ".join(parts) or "an edge went away") + ")"


def _check_inputs_all_restored(lineage: Lineage, pipelines: list[str],
                               tables: list[str]) -> None:
    """Refuses a revision that would restart a downstream pipeline reading a table it does not
    restore: the new generation's input starts after the restore in every source, so that
    source's changes between the barrier and the restore would never be read again."""
    affected = set(tables)
    for pipeline in sorted(pipelines):
        kept = [t for t in lineage.reads_of(pipeline) if t not in affected]
        if kept:
            restored = next(t for t in lineage.reads_of(pipeline) if t in affected)
            raise FailedPrecondition(
                f"pipeline {pipeline!r} reads {restored}, which the revision restores, and "
                f"{kept[0]}, which it does not: its new generation would start every source "
                f"after the restore and never read the changes of {kept[0]} since the barrier "
                "again; revising the input of a pipeline that also reads unaffected tables is "
                "not supported yet")


def check_not_reserved(pipeline_id: str) -> None:
    """Refuses a client's request driving the reserved revision pipeline."""
    if pipeline_id == REVISE_PIPELINE:
        raise InvalidArgument(f"pipeline id {REVISE_PIPELINE!r} is reserved for the "
                              "coordinator's revisions (percolake-coordinator revise)")
