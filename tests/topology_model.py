"""A stateful model of the ETL topology (docs/topology.md) for hypothesis: random sequences of
root and downstream batches, PlanBarrier rounds, RegisterReads, new tables, resets, revisions
(some with the lineage changing while they wait for their holds), coordinator restarts from
the store and retention pruning, driven against an in-process core (memory store, an oracle
on a test clock, a stand-in for Delta) and checked against a small reference model after
every step:

- T1: a downstream batch ends on a global barrier above where its input stands, its Open
  carries that barrier, and it reads each source's changes exactly once (no change is read
  twice, none is passed over, in particular none that lands below a range already read).
- I13 / visibility: every accepted commit of a table is one of its changes at its barrier
  (input barrier, or commit_ts for a root table and a table's root era), and nothing else is.
- T2: a table's completed barrier and a topology snapshot's barrier never go back, and the
  changes up to a completed barrier never change afterwards (but through a revision).
- T4 / revisions: a revision restores exactly the tables the lineage says at its commit
  point, every affected table to its version at the barrier, and starts every affected
  pipeline anew.
- Lineage refusals: a second writer, a cycle, an unplanned downstream commit, a reset moving
  a downstream pipeline's input back: refused exactly when the model says so.

``tests/test_topology_model.py`` runs it with a bounded number of examples in CI;
``scripts/topology_model_soak.py`` runs it as long as asked.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.core.revision import REVISE_PIPELINE
from coordinator.core.snapshots import Consistency
from coordinator.oracle import TimestampOracle
from coordinator.store.memory import MemoryStore
from percolake.barriers import LOGICAL_BITS, first_barrier_at_or_above, is_global_barrier
from percolake.errors import FailedPrecondition
from percolake.lake import delta_commit
from percolake.lake.delta_commit import TableLayout, VersionFiles
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from tests.test_topology_barriers import Clock  # the oracle's wall clock, moved by the model

INTERVAL_MS = 1000
PIPELINES = ("p0", "p1", "p2", "p3")
TABLE_NAMES = ("t0", "t1", "t2", "t3", "t4")
SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


def barrier(seconds: int) -> int:
    return (seconds * INTERVAL_MS) << LOGICAL_BITS


class FakeDelta:
    """What the core needs of Delta: each table's versions as sets of data files. An apply
    of the same transaction twice answers the same version (a roll-forward retried)."""

    def __init__(self) -> None:
        self.versions: dict[str, list[dict[str, AddFileRecord]]] = {}
        self.applied: dict[tuple[str, str], int] = {}

    def __call__(self, write: TableWriteRecord, *, app_id: str, app_version: int,
                 txn_id: str, commit_ts: int) -> int:
        key = (write.table, txn_id)
        if key in self.applied:
            return self.applied[key]
        versions = self.versions.setdefault(write.table, [])
        files = dict(versions[-1]) if versions and write.mode == WriteMode.APPEND else {}
        files.update({f.path: f for f in write.add_files})
        versions.append(files)
        self.applied[key] = len(versions) - 1
        return len(versions) - 1

    def files(self, table: str, version: int | None = None) -> frozenset[str]:
        versions = self.versions.get(table, [])
        if not versions:
            return frozenset()
        return frozenset(versions[-1 if version is None else version])

    def files_of_version(self, table: str, version: int, *, restore: bool = False) -> VersionFiles:
        return VersionFiles(SCHEMA, (), tuple(self.versions[table][version].values()))

    def table_layout(self, table: str) -> TableLayout | None:
        versions = self.versions.get(table)
        return TableLayout(len(versions) - 1, SCHEMA, []) if versions else None


@contextlib.contextmanager
def fake_delta_for_revisions(delta: FakeDelta) -> Iterator[None]:
    """The revision module reads versions' files and layouts from ``delta`` (it takes them from
    the lake's module when it runs)."""
    saved = delta_commit.files_of_version, delta_commit.table_layout
    delta_commit.files_of_version, delta_commit.table_layout = (
        delta.files_of_version, delta.table_layout)
    try:
        yield
    finally:
        delta_commit.files_of_version, delta_commit.table_layout = saved


def model_settings(examples: int, steps: int, derandomize: bool) -> settings:
    """Hypothesis settings of a run of the model: no deadline (the core's waits vary), no
    example database (nothing left behind in the work tree)."""
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    derandomize=derandomize, database=None, report_multiple_bugs=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@contextlib.contextmanager
def quiet_coordinator_log() -> Iterator[None]:
    """The core logs every reset and revision; thousands of steps need only its errors."""
    logger = logging.getLogger("percolake.coordinator")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass
class Accepted:
    """A commit the core accepted to a table, as the model keys it (docs/topology.md)."""

    txn_id: str
    key: int  # its barrier: input barrier, or commit_ts without one
    live: bool = True  # False once a derived revision superseded it


@dataclass
class Reader:
    """A downstream pipeline's reading, in the model: per source, from which barrier it reads
    and the changes it read (txn id -> key)."""

    start: dict[str, int] = field(default_factory=dict)
    read: dict[str, dict[str, int]] = field(default_factory=dict)


class TopologyModel(RuleBasedStateMachine):
    """The reference model and the rules (module doc). ``stats`` counts what the runs so far
    exercised (the soak prints it)."""

    stats: Counter[str] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="percolake-model-")
        self.store = MemoryStore()
        self.clock = Clock(10_000)
        self.delta = FakeDelta()
        self._patch = contextlib.ExitStack()
        self._patch.enter_context(fake_delta_for_revisions(self.delta))
        self._patch.enter_context(quiet_coordinator_log())
        self.core = self._core()
        # lineage and pipelines, as the model expects them
        self.owner: dict[str, str] = {}
        self.reads: dict[str, set[str]] = {p: set() for p in PIPELINES}
        self.last_input: dict[str, int | None] = {p: None for p in PIPELINES}  # any generation
        self.start: dict[str, int] = {p: 0 for p in PIPELINES}  # where its input starts
        self.batches: dict[str, int] = {p: 0 for p in PIPELINES}
        self.readers: dict[str, Reader] = {p: Reader() for p in PIPELINES}
        # per table: accepted commits, the base below which history was pruned, the newest
        # completed barrier and changes seen, the newest root revision
        self.accepted: dict[str, list[Accepted]] = {}
        self.base: dict[str, int] = {}
        self.completed: dict[str, int] = {}
        self.seen: dict[str, tuple[int, list[tuple[int, str]]]] = {}
        self.root_restore: dict[str, int] = {}
        self.topology_reads: dict[frozenset[str], int] = {}
        self.revisions: dict[str, tuple[str, int]] = {}  # txn id -> (table, barrier)
        self.files = 0
        for pipeline in PIPELINES:
            self.core.register_pipeline(pipeline, None)

    def teardown(self) -> None:
        self.core.close()
        self._patch.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # ---------------------------------------------------------------- helpers

    def _core(self) -> TransactionCoordinator:
        core = TransactionCoordinator(self.store, CoordinatorConfig(
            [self.root], conflict_wait_s=0.05, snapshot_wait_s=2.0,
            barrier_interval_s=INTERVAL_MS / 1000,
            retention_hours=2 / 3600), applier=self.delta)
        core.oracle = TimestampOracle(self.store, wall_ms=self.clock)
        return core

    def table(self, name: str) -> str:
        return f"file://{self.root}/{name}"

    def epoch(self, pipeline: str) -> int:
        return self.core.get_pipeline(pipeline).epoch

    def reaches(self, start: str, start_is_pipeline: bool, goal: str, goal_is_pipeline: bool
                ) -> bool:
        """Whether the lineage has a path from ``start`` to ``goal`` (pipeline -> table it
        writes, table -> pipeline reading it)."""
        pending, seen = [(start, start_is_pipeline)], set()
        while pending:
            node = pending.pop()
            if node == (goal, goal_is_pipeline):
                return True
            if node in seen:
                continue
            seen.add(node)
            name, is_pipeline = node
            if is_pipeline:
                pending += [(t, False) for t, o in self.owner.items() if o == name]
            else:
                pending += [(p, True) for p, tables in self.reads.items() if name in tables]
        return False

    def may_write(self, pipeline: str, table: str) -> bool:
        """The model's verdict on ``pipeline`` declaring ``table``."""
        owner = self.owner.get(table)
        if owner is not None:
            return owner == pipeline
        return not self.reaches(table, False, pipeline, True)

    def input_start(self, pipeline: str) -> int:
        last = self.last_input[pipeline]
        return self.start[pipeline] if last is None else max(last, self.start[pipeline])

    def write(self, txn_id: str, table: str) -> TableWriteRecord:
        self.files += 1
        path = f"_percolake/{txn_id}/part-{self.files}.parquet"
        return TableWriteRecord(table, WriteMode.APPEND, (AddFileRecord(
            path, 100, {}, 0, '{"numRecords":1}'),), SCHEMA)

    def accept(self, table: str, txn_id: str, key: int) -> None:
        self.accepted.setdefault(table, []).append(Accepted(txn_id, key))

    def rebase(self, pipeline: str, start: int) -> None:
        """The pipeline's input starts at ``start`` now (a reset or a revision)."""
        self.start[pipeline] = start
        self.last_input[pipeline] = None
        reader = self.readers[pipeline]
        for source in reader.start:
            reader.start[source] = start
            reader.read[source] = {t: k for t, k in reader.read[source].items() if k <= start}

    # ---------------------------------------------------------------- rules

    @rule(ms=st.integers(50, 2500))
    def tick(self, ms: int) -> None:
        self.clock.ms += ms

    @rule(pipeline=st.sampled_from(PIPELINES), name=st.sampled_from(TABLE_NAMES))
    def unplanned_batch(self, pipeline: str, name: str) -> None:
        """A batch no percolake source planned: a root pipeline's, or refused."""
        table = self.table(name)
        epoch = self.epoch(pipeline)
        number = self.batches[pipeline]
        try:
            txn, _ = self.core.open_transaction(pipeline, number, epoch, tables=[table])
        except FailedPrecondition:
            assert not self.may_write(pipeline, table), f"{pipeline} may write {name}"
            return
        assert self.may_write(pipeline, table), f"{pipeline} declared {name}"
        self.owner.setdefault(table, pipeline)
        self.batches[pipeline] += 1
        if txn.input_barrier:  # a remembered plan's batch: downstream_batch's business
            self.core.abort(txn.txn_id, epoch)
            return
        try:
            done = self.core.commit(txn.txn_id, epoch, [table], [self.write(txn.txn_id, table)])
        except FailedPrecondition as refused:
            assert self.reads[pipeline] or self.reads.get(self.owner[table]), refused
            assert "carries no input barrier" in str(refused)
            self.stats["unplanned downstream commits refused"] += 1
            self.core.abort(txn.txn_id, epoch)
            return
        assert not self.reads[pipeline], f"{pipeline} reads {self.reads[pipeline]}: accepted"
        assert done.input_barrier == 0
        self.stats["root batches"] += 1
        self.accept(table, done.txn_id, done.commit_ts)
        self.core.get_snapshot([table])  # applied

    @precondition(lambda self: self.owner)
    @rule(data=st.data())
    def register_a_read(self, data: st.DataObject) -> None:
        """A pipeline starts reading a table somebody writes (a percolake source, or its
        first txn.read)."""
        pipeline = data.draw(st.sampled_from(PIPELINES))
        table = data.draw(st.sampled_from(sorted(self.owner)))
        self.register_read(pipeline, table.rsplit("/", 1)[1])

    def register_read(self, pipeline: str, name: str) -> None:
        table = self.table(name)
        cycle = self.reaches(pipeline, True, table, False)
        try:
            self.core.register_reads(pipeline, [table], self.epoch(pipeline))
        except FailedPrecondition as refused:
            assert cycle and "cycle" in str(refused), refused
            return
        assert not cycle, f"{pipeline} reading {name} closes a cycle: accepted"
        if table not in self.reads[pipeline]:
            self.stats["reads gained" if not any(o == pipeline for o in self.owner.values())
                       else "reads gained by a writing pipeline"] += 1
            self.reads[pipeline].add(table)
            reader = self.readers[pipeline]
            reader.start[table] = self.input_start(pipeline)
            reader.read[table] = {}

    @precondition(lambda self: any(self.reads.values()))
    @rule(data=st.data(), ms=st.integers(0, 3000))
    def time_passes_and_downstream_pipelines_run(self, data: st.DataObject, ms: int) -> None:
        """Time passes, then every downstream pipeline runs a batch or two."""
        self.clock.ms += ms
        for pipeline in sorted(p for p in PIPELINES if self.reads[p]):
            for _ in range(data.draw(st.integers(1, 2))):
                self.downstream_batch(data, pipeline, data.draw(st.integers(0, 2)))

    @precondition(lambda self: any(self.reads.values()))
    @rule(data=st.data())
    def roots_write_then_downstream_pipelines_run(self, data: st.DataObject) -> None:
        """Every root pipeline appends to one of its tables, then time passes and the
        downstream pipelines run: the path that gives them rows to read."""
        for pipeline in PIPELINES:
            mine = sorted(t for t, o in self.owner.items() if o == pipeline)
            if mine and not self.reads[pipeline]:
                self.unplanned_batch(pipeline, data.draw(st.sampled_from(mine)).rsplit("/")[-1])
        self.time_passes_and_downstream_pipelines_run(data, data.draw(st.integers(1000, 2500)))

    @precondition(lambda self: any(self.reads.values()))
    @rule(data=st.data(), round_=st.integers(0, 2))
    def one_downstream_batch(self, data: st.DataObject, round_: int) -> None:
        pipeline = data.draw(st.sampled_from(sorted(p for p in PIPELINES if self.reads[p])))
        self.downstream_batch(data, pipeline, round_)

    def downstream_batch(self, data: st.DataObject, pipeline: str, round_: int) -> None:
        """A downstream pipeline's next batch: PlanBarrier (as its sources would), the
        changes of each source in the range, Open carrying the barrier, Commit, apply."""
        generation = self.core.get_pipeline(pipeline).generation
        expected_after = self.input_start(pipeline)
        plan = self.core.plan_barrier(pipeline, generation, self.last_input[pipeline],
                                      round_)
        assert plan.after_barrier == expected_after, (plan, expected_after)
        if plan.barrier == plan.after_barrier:
            return
        assert plan.barrier > plan.after_barrier and is_global_barrier(plan.barrier,
                                                                       INTERVAL_MS), plan
        read: dict[str, dict[str, int]] = {}
        for source in sorted(self.reads[pipeline]):
            try:
                changes = self.core.get_table_changes(source, plan.after_barrier, plan.barrier)
            except FailedPrecondition as refused:
                self._restart_after(pipeline, source, str(refused))
                return
            read[source] = {c.txn_id: c.barrier for c in changes.changes}
        assert plan.has_changes == any(read.values()), (plan, read)
        # mostly a table it may write (its own, or a new one), now and then any
        mine = sorted(n for n in TABLE_NAMES if self.owner.get(self.table(n)) in (None,
                                                                                  pipeline))
        name = data.draw(st.sampled_from(["", *mine]) if mine and data.draw(st.integers(0, 4))
                         else st.sampled_from(("", *TABLE_NAMES)))
        tables = [self.table(name)] if name and plan.has_changes else []
        epoch = self.epoch(pipeline)
        number = self.batches[pipeline]
        try:
            txn, _ = self.core.open_transaction(pipeline, number, epoch, tables=tables)
        except FailedPrecondition:
            assert tables and not self.may_write(pipeline, tables[0])
            return
        assert not tables or self.may_write(pipeline, tables[0])
        for table in tables:
            self.owner.setdefault(table, pipeline)
        self.batches[pipeline] += 1
        assert txn.input_barrier == plan.barrier, (txn, plan)
        done = self.core.commit(txn.txn_id, epoch, tables,
                                [self.write(txn.txn_id, t) for t in tables])
        for table in tables:
            self.accept(table, done.txn_id, plan.barrier)
        if tables:
            self.core.get_snapshot(tables)
        self.last_input[pipeline] = plan.barrier
        self.stats["downstream batches writing a table" if tables else
                   "downstream batches reading changes, writing nothing" if plan.has_changes
                   else "downstream empty steps"] += 1
        reader = self.readers[pipeline]
        for source, changes in read.items():
            twice = set(changes) & set(reader.read[source])
            assert not twice, f"{pipeline} read {twice} of {source} twice (T1)"
            reader.read[source].update(changes)

    def _restart_after(self, pipeline: str, source: str, refusal: str) -> None:
        """A range the coordinator refuses (pruned history, a root table's restore inside):
        the pipeline starts anew after it, as the refusal says."""
        assert "retention floor" in refusal or "restored by revision" in refusal, refusal
        floor = self.store.retention_floor_ts()
        start = max(first_barrier_at_or_above(floor, INTERVAL_MS),
                    self.root_restore.get(source, 0))
        self.core.reset_pipeline(pipeline, "model: range refused", None, start_barrier=start)
        self.stats["ranges refused, restarted after"] += 1
        self.rebase(pipeline, start)

    @rule(pipeline=st.sampled_from(PIPELINES))
    def reset(self, pipeline: str) -> None:
        """A new checkpoint: a new generation where the input stands."""
        before = self.core.get_pipeline(pipeline)
        after, changed, _ = self.core.reset_pipeline(pipeline, "model: new checkpoint", None)
        assert changed and after.generation == before.generation + 1
        assert after.start_barrier == self.input_start(pipeline), (after, self.input_start(
            pipeline))

    @precondition(lambda self: any(self.last_input[p] for p in PIPELINES))
    @rule(data=st.data())
    def reset_back(self, data: st.DataObject) -> None:
        """A reset to a start below where a downstream pipeline's input stands."""
        pipeline = data.draw(st.sampled_from(sorted(p for p in PIPELINES
                                                    if self.last_input[p])))
        start = self.input_start(pipeline) - (INTERVAL_MS << LOGICAL_BITS)
        writes = any(o == pipeline for o in self.owner.values())
        try:
            self.core.reset_pipeline(pipeline, "model: back", None, start_barrier=max(0, start))
        except FailedPrecondition as refused:
            assert writes and "revise --table" in str(refused), refused
            return
        assert not writes, f"{pipeline} writes tables: its input moved back"
        self.rebase(pipeline, max(0, start))

    @rule()
    def restart(self) -> None:
        """The coordinator restarts from its store."""
        self.core.close()
        self.core = self._core()
        lineage = self.core.completion().lineage
        assert lineage.writers == self.owner
        assert {p: t for p, t in lineage.reads.items() if t} == {
            p: t for p, t in self.reads.items() if t}

    @rule()
    def retention(self) -> None:
        """Retention pruning, its floor two seconds of oracle time back (never past a
        downstream pipeline's input)."""
        self.core.prune_history(now_ms=self.clock.ms)
        floor = self.store.retention_floor_ts()
        if floor:
            for table in self.accepted:
                self.base[table] = max(self.base.get(table, 0),
                                       first_barrier_at_or_above(floor, INTERVAL_MS))

    @precondition(lambda self: self.completed)
    @rule(data=st.data(), meanwhile=st.sampled_from(("", "new table", "new reader")))
    def revise(self, data: st.DataObject, meanwhile: str) -> None:
        """A revision of a table to a barrier it completed, maybe with the lineage changing
        while it waits for its holds (issue 28)."""
        table = data.draw(st.sampled_from(sorted(self.completed)))
        to = data.draw(st.sampled_from(sorted({self.completed[table],
                                               self.seen.get(table, (0, []))[0]})))
        changed = self._meanwhile(meanwhile, table, data)
        revised_before = self.store.newest_committed_batch(REVISE_PIPELINE, 0)
        try:
            done = self.core.revise(table, to, "model")
        except FailedPrecondition:
            assert self.store.newest_committed_batch(REVISE_PIPELINE, 0) == revised_before
            self.stats["revisions refused"] += 1
            return
        finally:
            self.core.__dict__.pop("open_transaction", None)
        if done.txn_id in self.revisions:  # the same command again: it finishes that one
            assert self.revisions[done.txn_id] == (table, to), (done, self.revisions)
            return
        self.revisions[done.txn_id] = (table, to)
        assert changed is None or changed[0], "the lineage change did not run"
        self.stats[f"revisions{' (lineage changed meanwhile)' if changed else ''}"] += 1
        tables, pipelines = self._affected(table)
        assert {t.table for t in done.tables} == set(tables), (done.tables, tables)
        assert {p.pipeline_id for p in done.pipelines} == set(pipelines), (done, pipelines)
        for revised in done.tables:
            if revised.table in self.delta.versions:
                restored = (frozenset() if revised.restored_version is None else
                            self.delta.files(revised.table, revised.restored_version))
                assert self.delta.files(revised.table) == restored, revised  # T4
        for name in tables:
            self.completed.pop(name, None)
            self.seen.pop(name, None)
            for old in self.accepted.get(name, []):
                if done.derived and old.key > to:
                    old.live = False
            if not done.derived:  # read from after the restore on
                self.accept(name, done.txn_id, done.revision_ts)
                self.root_restore[name] = self.base[name] = done.revision_ts
        self.topology_reads.clear()
        for revised in done.pipelines:
            self.rebase(revised.pipeline_id, revised.start_barrier)

    def _meanwhile(self, what: str, table: str, data: st.DataObject) -> list[bool] | None:
        """Makes the lineage change while the revision waits (its Open), as ``what`` says."""
        writer = self.owner.get(table)
        if not what or writer is None:
            return None
        if what == "new table":
            new = [self.table(n) for n in TABLE_NAMES if self.table(n) not in self.owner
                   and self.may_write(writer, self.table(n))]
            if not new:
                return None

            def change() -> None:
                self.unplanned_batch(writer, new[0].rsplit("/", 1)[1])
        else:
            candidates = [p for p in PIPELINES if table not in self.reads[p]
                          and not self.reaches(p, True, table, False)]
            if not candidates:
                return None
            reader = data.draw(st.sampled_from(candidates))

            def change() -> None:
                self.register_read(reader, table.rsplit("/", 1)[1])

        real, ran = self.core.open_transaction, []

        def open_transaction(pipeline_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            if pipeline_id == REVISE_PIPELINE and not ran:
                ran.append(True)
                change()
            return real(pipeline_id, *args, **kwargs)

        self.core.open_transaction = open_transaction
        return ran

    def _affected(self, table: str) -> tuple[list[str], list[str]]:
        """The tables and pipelines a revision of ``table`` affects, by the model's lineage."""
        writer = self.owner[table]
        tables = [t for t, o in self.owner.items() if o == writer]
        pipelines = [writer]
        pending = list(tables)
        while pending:
            source = pending.pop()
            for reader in PIPELINES:
                if source in self.reads[reader] and reader not in pipelines:
                    pipelines.append(reader)
                    for written in (t for t, o in self.owner.items() if o == reader):
                        if written not in tables:
                            tables.append(written)
                            pending.append(written)
        return tables, pipelines

    # ---------------------------------------------------------------- checks

    @invariant()
    def tables_keep_their_history(self) -> None:
        """Completed barriers never go back; every accepted commit is a change at its barrier
        and nothing else is; the changes up to a completed barrier never change (T2, I13)."""
        view = {t.table: t.completed_barrier for t in self.core.get_topology().tables}
        for table in (t for t in self.owner if t not in self.accepted):  # no commit yet
            completed = view.get(table)
            if completed is not None:
                assert completed >= self.completed.get(table, 0), (
                    f"{table}: completed barrier {completed} after {self.completed[table]}")
                self.completed[table] = completed
        for table, commits in self.accepted.items():
            completed = view.get(table)
            if completed is None:
                assert table not in self.completed, f"{table} lost its completed barrier"
                continue
            assert completed >= self.completed.get(table, 0), (
                f"{table}: completed barrier {completed} after {self.completed[table]}")
            self.completed[table] = completed
            base = self.base.get(table, 0)
            listed = [(c.barrier, c.txn_id) for c in self.core.get_table_changes(
                table, base, completed).changes] if completed >= base else []
            expected = [c.txn_id for c in commits if c.live and base < c.key <= completed]
            assert sorted(t for _, t in listed) == sorted(expected), (
                f"{table}: changes {listed}, accepted {expected} (up to {completed})")
            upto, before = self.seen.get(table, (0, []))
            now_below = sorted(c for c in listed if c[0] <= upto)
            assert now_below == sorted(c for c in before if c[0] > base), (
                f"{table}: its changes up to {upto} were {before}, now {now_below}")
            self.seen[table] = (completed, listed)

    @invariant()
    def downstream_pipelines_read_every_change_once(self) -> None:
        for pipeline in PIPELINES:
            last = self.last_input[pipeline]
            if last is None:
                continue
            reader = self.readers[pipeline]
            for source in sorted(self.reads[pipeline]):
                start = max(reader.start[source], self.base.get(source, 0))
                if start >= last:
                    continue
                try:
                    changes = self.core.get_table_changes(source, start, last).changes
                except FailedPrecondition:
                    continue  # a revision took the source's completion back
                listed = {c.txn_id for c in changes}
                read = {t for t, k in reader.read[source].items() if start < k <= last}
                assert listed == read, (
                    f"{pipeline} read {sorted(read)} of {source} in ({start}, {last}], "
                    f"its changes are {sorted(listed)}")

    @invariant()
    def topology_reads_never_go_back(self) -> None:
        view = {t.table: t.completed_barrier for t in self.core.get_topology().tables}
        tables = frozenset(t for t, c in view.items() if c is not None)
        if not tables:
            return
        try:
            snapshot = self.core.get_snapshot(sorted(tables), consistency=Consistency.TOPOLOGY)
        except FailedPrecondition as refused:  # a table below the floor (a reader refused)
            assert "retention floor" in str(refused), refused
            return
        previous = self.topology_reads.get(tables, 0)
        assert snapshot.snapshot_ts >= previous, (snapshot, previous)
        self.topology_reads[tables] = snapshot.snapshot_ts
