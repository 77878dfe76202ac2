"""The ETL topology (docs/topology.md): lineage registration (each table's one writing
pipeline, the tables each pipeline reads), its refusals, ``GetTopology``'s view with each
table's last completed global barrier and the delays, the barrier plan of downstream
pipelines (``PlanBarrier``) and the changes of a table in a barrier range.

The graph itself is pure code (``percolake.lineage``), so is the barrier arithmetic and its
rules (``percolake.barriers``); this module keeps the in-memory lineage equal to the durable one
(every change is written to the store first, then applied in memory, under the core's lock) and
reads what the rules need from the store, outside the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator import validation
from coordinator.core.optimizing import is_optimize_pipeline
from coordinator.core.revision import REVISE_PIPELINE
from coordinator.core.state import CoreState, wall_ms
from coordinator.store.base import ReadEdge, Store, TableCommit, TableWriter
from percolake.barriers import (
    barrier_at_or_below,
    downstream_completed_barrier,
    first_barrier_at_or_above,
    next_barrier,
    root_completed_barrier,
    wall_ms_of_barrier,
)
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.failpoints import fail_point
from percolake.lineage import Lineage, describe_cycle
from percolake.records import PipelineRecord

log = logging.getLogger("percolake.coordinator")
PLAN_ATTEMPTS = 3  # a pipeline reset while its plan is computed: compute again, this often


@dataclass(frozen=True)
class PipelineNode:
    pipeline_id: str
    generation: int
    root: bool
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    own_delay_ms: int | None = None  # its own share of its tables' delay; None: not known
    end_to_end_delay_ms: int | None = None  # its tables' delay (from the roots)
    last_input_barrier: int | None = None  # a downstream one's newest committed input barrier


@dataclass(frozen=True)
class TableNode:
    table: str
    writer: str  # "" if no pipeline declared it yet
    readers: tuple[str, ...]
    completed_barrier: int | None  # an oracle timestamp; None while not known
    delay_ms: int | None = None  # now minus the completed barrier's wall time
    bottleneck_pipeline: str = ""  # the largest own delay from the roots to here ("": none)
    bottleneck_delay_ms: int | None = None


@dataclass(frozen=True)
class TopologyView:
    pipelines: tuple[PipelineNode, ...]
    tables: tuple[TableNode, ...]
    barrier_interval_ms: int
    now_ts: int  # the oracle timestamp the view was taken at

    def delay_ms(self, table: TableNode) -> int | None:
        """Now minus the wall time of the table's last completed barrier."""
        return table.delay_ms


@dataclass(frozen=True)
class BarrierPlan:
    """PlanBarrier's answer: the next batch of the pipeline covers (after_barrier, barrier]."""

    generation: int
    start_barrier: int  # where the generation's percolake input starts
    after_barrier: int
    barrier: int  # == after_barrier: nothing to read yet
    has_changes: bool  # False: an empty step that only records progress


@dataclass(frozen=True)
class TableChange:
    delta_version: int
    commit_ts: int
    barrier: int  # commit_ts (root table) or the commit's input barrier
    txn_id: str


@dataclass(frozen=True)
class TableChanges:
    canonical_table: str
    changes: tuple[TableChange, ...]  # in Delta version order
    version_at_after: int | None  # the table's version at the range's start, if any


class Completion:
    """The barrier rules of docs/topology.md evaluated for one answer at one oracle
    timestamp: each table's completed barrier, each pipeline's last input barrier and the
    delays, every store read made at most once (memoised over the graph).

    Reads run outside the core's lock, of the snapshot index as it stood at ``now_ts``: commits
    at or below it are fixed (a commit_ts is taken under the lock with its durable write), and
    a revision committed meanwhile, which supersedes rows below it, is not seen yet; an apply
    meanwhile only moves an answer forward or leaves it conservative.
    """

    def __init__(self, store: Store, lineage: Lineage,
                 pipelines: dict[str, tuple[int, int]], now_ts: int, interval_ms: int,
                 committed_inputs: dict[str, int] | None = None) -> None:
        """``pipelines``: pipeline id -> (generation, start_barrier); others are new.
        ``committed_inputs``: pipeline id -> its current generation's newest committed input
        barrier, as the core keeps it (others are read from the store)."""
        self.store = store
        self.lineage = lineage
        self.pipelines = pipelines
        self.now_ts = now_ts
        self.interval_ms = interval_ms
        self._completed: dict[str, int | None] = {}
        self._committed_input: dict[str, int] = dict(committed_inputs or {})
        self._own: dict[str, int | None] = {}

    # ---------------------------------------------------------------- tables

    def is_downstream(self, table: str) -> bool:
        """Its writer reads percolake tables: its changes are at their input barriers."""
        writer = self.lineage.writers.get(table)
        return writer is not None and not self.lineage.is_root(writer)

    def completed(self, table: str) -> int | None:
        """The last global barrier ``table`` completed; None while it cannot be known."""
        if table in self._completed:
            return self._completed[table]
        self._completed[table] = None  # the graph has no cycles; this only guards recursion
        writer = self.lineage.writers.get(table)
        if writer is None:
            result = None
        elif self.lineage.is_root(writer):
            pending = self.store.unapplied_table_commits(table, self.now_ts)
            result = root_completed_barrier(self.now_ts, pending[0].commit_ts if pending else None,
                                            self.interval_ms)
        else:
            last = self.last_input(writer)
            result = downstream_completed_barrier(
                last, [self.source_completed(writer, s) for s in self.lineage.reads_of(writer)],
                self.first_change_for(writer, last)[0],
                self.store.first_unapplied_input_barrier(table, self.now_ts), self.interval_ms)
        self._completed[table] = result
        return result

    def source_completed(self, pipeline_id: str, source: str) -> int | None:
        """What the source's completion settles for the pipeline's tables: its completed
        barrier, and every barrier below the read's transition (``first_change_for`` counts
        the source's changes before it at it), so a read gained later never takes back a
        barrier the pipeline's tables completed (docs/topology.md, lineage transitions)."""
        completed = self.completed(source)
        since = self.lineage.read_since(pipeline_id, source)
        if not since:
            return completed
        settled = barrier_at_or_below(since - 1, self.interval_ms)
        return settled if completed is None else max(completed, settled)

    def first_change_for(self, pipeline_id: str, after: int) -> tuple[int | None, bool]:
        """The oldest change barrier above ``after`` in any table the pipeline reads, and
        whether one of them has a change above ``after`` from before the pipeline gained
        the read (``Lineage.read_since``): such changes count at the transition's
        timestamp, so the batch reading them ends above every barrier its tables completed
        before it."""
        barriers, before_transition = [], False
        for table in self.lineage.reads_of(pipeline_id):
            found = self.store.first_table_commit_after(table, after, self.is_downstream(table),
                                                        self.now_ts)
            if found is None:
                continue
            change = found.barrier(self.is_downstream(table))
            since = self.lineage.read_since(pipeline_id, table)
            if change <= since:
                change, before_transition = since, True
            barriers.append(change)
        return min(barriers, default=None), before_transition

    def version_at(self, table: str, barrier: int) -> TableCommit | None:
        """The table's newest commit at global barrier ``barrier``: by commit_ts for a root
        table, by input barrier for a downstream one."""
        return self.store.table_commit_at_barrier(table, barrier, self.is_downstream(table),
                                                  self.now_ts)

    def delay_ms(self, table: str) -> int | None:
        completed = self.completed(table)
        if completed is None:
            return None
        return max(0, wall_ms_of_barrier(self.now_ts) - wall_ms_of_barrier(completed))

    # ---------------------------------------------------------------- pipelines

    def generation(self, pipeline_id: str) -> int:
        return self.pipelines.get(pipeline_id, (0, 0))[0]

    def committed_input(self, pipeline_id: str) -> int:
        """The newest input barrier the pipeline's current generation committed (0: none)."""
        if pipeline_id not in self._committed_input:
            self._committed_input[pipeline_id] = self.store.last_input_barrier(
                pipeline_id, self.generation(pipeline_id))
        return self._committed_input[pipeline_id]

    def start_barrier(self, pipeline_id: str) -> int:
        """Where the current generation's percolake input starts: set by a reset or revision;
        for generation 0 (never reset), after what it committed (0 for a new pipeline)."""
        generation, start = self.pipelines.get(pipeline_id, (0, 0))
        return start if generation > 0 else max(start, self.committed_input(pipeline_id))

    def last_input(self, pipeline_id: str) -> int:
        """The end of the range the pipeline has consumed: its newest committed input barrier,
        or its generation's start."""
        return self.committed_input(pipeline_id) or self.pipelines.get(pipeline_id, (0, 0))[1]

    def end_to_end_delay_ms(self, pipeline_id: str) -> int | None:
        """The largest delay of the pipeline's tables (None: none known)."""
        delays = [d for t in self.lineage.writes_of(pipeline_id)
                  if (d := self.delay_ms(t)) is not None]
        return max(delays, default=None)

    def own_delay_ms(self, pipeline_id: str) -> int | None:
        """A root's: its end-to-end delay; a downstream one's: that minus its sources' largest
        delay (what it adds itself). None while a delay it rests on is not known."""
        if pipeline_id in self._own:
            return self._own[pipeline_id]
        own = self.end_to_end_delay_ms(pipeline_id)
        sources = self.lineage.reads_of(pipeline_id)
        if own is not None and sources:
            inputs = [self.delay_ms(t) for t in sources]
            own = None if any(d is None for d in inputs) else max(
                0, own - max(d for d in inputs if d is not None))
        self._own[pipeline_id] = own
        return own

    def bottleneck(self, table: str) -> tuple[str, int | None]:
        """The pipeline with the largest own delay among the table's writer and every pipeline
        upstream of it, with that delay; ("", None) if none is known."""
        seen: set[str] = set()
        pending = [w for w in (self.lineage.writers.get(table),) if w is not None]
        best: tuple[str, int | None] = ("", None)
        while pending:
            pipeline = pending.pop()
            if pipeline in seen:
                continue
            seen.add(pipeline)
            own = self.own_delay_ms(pipeline)
            if own is not None and (best[1] is None or (own, best[0]) > (best[1], pipeline)):
                best = (pipeline, own)
            pending.extend(w for t in self.lineage.reads_of(pipeline)
                           if (w := self.lineage.writers.get(t)) is not None)
        return best


class Topology(CoreState):
    """RegisterReads, GetTopology, PlanBarrier, GetTableChanges, and the writer registration
    of declared tables."""

    def register_reads(self, pipeline_id: str, tables: Iterable[str],
                       epoch: int | None) -> tuple[list[str], int]:
        """Durably records that the pipeline reads these tables (idempotent).

        Returns:
            The canonical table names, in request order, and how many edges were new.

        Raises:
            FailedPrecondition: an edge would close a cycle (named), or fencing refused.
        """
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_epoch(epoch)
        names = list(tables)
        if not names:
            raise InvalidArgument("name at least one table the pipeline reads")
        canonical = self._resolve_tables(names)
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id) or self._new_pipeline(pipeline_id)
            self._check_epoch(pipeline, epoch)
            known = self._lineage.reads.get(pipeline_id, set())
            new = [t for t in canonical if t not in known]
            if not new:
                return canonical, 0
            cycle = self._lineage.cycle_if_reads(pipeline_id, new)
            if cycle is not None:
                raise FailedPrecondition(
                    f"pipeline {pipeline_id!r} reading {cycle[-2]} would close the cycle "
                    f"{describe_cycle(cycle)}; the topology has no cycles (docs/topology.md)")
            now = wall_ms()
            # A lineage transition (docs/topology.md): a pipeline that already writes tables
            # counts a new read from now on, so no barrier its tables completed is rewritten.
            since = self.oracle.next() if self._lineage.writes_of(pipeline_id) else 0
            with self.store.batch():
                added = sum(self.store.insert_read_edge(ReadEdge(pipeline_id, t, now, since))
                            for t in new)
            for table in new:
                self._lineage.add_read(pipeline_id, table, since)
        self.wait_durable()
        fail_point("after-read-edges-durable")
        log.info("reads registered", extra={"pipeline_id": pipeline_id, "tables": len(new)})
        return canonical, added

    def completion(self) -> Completion:
        """The barrier rules at a fresh oracle timestamp, taken under the lock with the
        lineage and the pipelines' generations: after it no commit can be at or below it."""
        while True:
            with self._lock:
                # a revision between its commit and its resets would show its index with the
                # old generations: its resets are made first (Revising's)
                resetting = bool(self._revisions_resetting)
                if not resetting:
                    now_ts = self.oracle.next()
                    lineage = self._lineage.copy()
                    pipelines = {p: (r.generation, r.start_barrier)
                                 for p, r in self._pipelines.items()}
                    # the core's cache (one store read per generation, then kept by the
                    # commits), not a store query per pipeline and answer
                    inputs = {p: self._last_input_barrier(p, pipelines.get(p, (0, 0))[0])
                              for p in lineage.pipelines() if not lineage.is_root(p)}
            if not resetting:
                break
            self._finish_pending_resets()
        return Completion(self.store, lineage, pipelines, now_ts, self._barrier_interval_ms(),
                          inputs)

    def _barrier_interval_ms(self) -> int:
        return max(1, round(self.config.barrier_interval_s * 1000))

    def get_topology(self, tables: Iterable[str] = ()) -> TopologyView:
        """Pipelines, tables, each table's last completed barrier and the delays, read at one
        moment (``completion``). With ``tables``, only those (known to the lineage or not) and
        the pipelines writing or reading them."""
        wanted = self._resolve_tables(tables)
        view = self.completion()
        lineage = view.lineage
        shown = wanted or lineage.tables()
        names = set(view.pipelines) | set(lineage.pipelines()) if not wanted else {
            p for t in wanted for p in (lineage.writers.get(t), *lineage.readers_of(t)) if p}
        pipelines = tuple(
            PipelineNode(p, view.generation(p), lineage.is_root(p),
                         tuple(lineage.reads_of(p)), tuple(lineage.writes_of(p)),
                         view.own_delay_ms(p), view.end_to_end_delay_ms(p),
                         None if lineage.is_root(p) else view.committed_input(p) or None)
            for p in sorted(names))
        nodes = tuple(
            TableNode(t, lineage.writers.get(t, ""), tuple(lineage.readers_of(t)),
                      view.completed(t), view.delay_ms(t), *view.bottleneck(t))
            for t in sorted(shown))
        return TopologyView(pipelines, nodes, view.interval_ms, view.now_ts)

    # ---------------------------------------------------------------- barrier plans

    def plan_barrier(self, pipeline_id: str, generation: int | None,
                     after: int | None, planning_round: int = 0) -> BarrierPlan:
        """The end of the pipeline's next micro-batch after its source's offset
        (``generation``, ``after``), by the rule of docs/topology.md.

        Every source of one query gets the same answer: an answer that moves forward is
        recorded in the pipeline's record (durable before the reply) and repeated for the same
        offset; within one planning round (``planning_round`` > 0: the source's count of its
        planning calls) a "nothing to read yet" answer is repeated too, so no source of the
        round sees a barrier its round-mates did not.

        Without an offset, with one of another generation, or with one below where the
        current generation's input stands (its last committed input barrier, else its start
        barrier), the range starts where that input stands.
        """
        validation.check_id("pipeline_id", pipeline_id)
        for name, value in (("generation", generation), ("after_barrier", after),
                            ("round", planning_round)):
            if value is not None:
                validation.check_non_negative(name, value)
        for _ in range(PLAN_ATTEMPTS):
            plan = self._try_plan(pipeline_id, generation, after, planning_round)
            if plan is not None:
                self.wait_durable()  # a repeated answer too: it may rest on a write in flight
                return plan
        raise FailedPrecondition(
            f"pipeline {pipeline_id!r} was reset or committed a batch {PLAN_ATTEMPTS} times "
            "while its next barrier was planned; ask again")

    def _try_plan(self, pipeline_id: str, generation: int | None, after: int | None,
                  planning_round: int) -> BarrierPlan | None:
        """The plan, or None if the pipeline's generation or input start changed while it was
        computed."""
        view = self.completion()
        current = view.generation(pipeline_id)
        start = view.start_barrier(pipeline_id)
        sources = view.lineage.reads_of(pipeline_id)
        with self._lock:
            record = self._pipelines.get(pipeline_id)
            if (record.generation if record else 0) != current:
                return None
            input_start = self._current_input_start(pipeline_id, record)
            after_barrier = (after if after is not None and generation == current
                             and after >= input_start else input_start)
            known = self._known_plan(pipeline_id, record, current, after_barrier,
                                     planning_round)
        if known is not None and self._sources_completed(view, sources, known[0]):
            return self._repeated(view, pipeline_id, current, start, after_barrier, known)
        change, before_transition = view.first_change_for(pipeline_id, after_barrier)
        barrier, has_changes = next_barrier(
            after_barrier, [view.completed(s) for s in sources], change, view.interval_ms)
        if before_transition and not has_changes:
            # no empty step over a read's changes from before its transition: it would read
            # them at a barrier its tables may have completed already
            barrier = after_barrier
        with self._lock:
            record = self._pipelines.get(pipeline_id)
            if ((record.generation if record else 0) != current
                    or self._current_input_start(pipeline_id, record) != input_start):
                return None  # reset, or a batch committed meanwhile: plan afresh
            known = self._known_plan(pipeline_id, record, current, after_barrier,
                                     planning_round)
            persisted = known is None and self._keep_plan(
                pipeline_id, record, current, after_barrier, input_start, planning_round,
                barrier, has_changes)
        if known is not None and self._sources_completed(view, sources, known[0]):
            # another source of the round (or a retry) was first
            return self._repeated(view, pipeline_id, current, start, after_barrier, known)
        if persisted and barrier > after_barrier:
            self.wait_durable()
            fail_point("after-plan-barrier-durable")
            log.info("barrier planned", extra={"pipeline_id": pipeline_id, "generation": current,
                                               "after": after_barrier, "barrier": barrier})
        return BarrierPlan(current, start, after_barrier, barrier, has_changes)

    @staticmethod
    def _sources_completed(view: Completion, sources: Iterable[str], barrier: int) -> bool:
        """Whether every table the pipeline reads now completed ``barrier``: a remembered
        plan is repeated only then. A read gained after it was planned (its source lagging)
        makes it stale: its range of that source is not final, so it is planned afresh."""
        return all((c := view.completed(s)) is not None and c >= barrier for s in sources)

    @staticmethod
    def _repeated(view: Completion, pipeline_id: str, generation: int, start: int,
                  after: int, known: tuple[int, bool | None]) -> BarrierPlan:
        """An answer given before, with whether its range holds a change (read if not kept)."""
        barrier, has_changes = known
        if has_changes is None:
            change = view.first_change_for(pipeline_id, after)[0]
            has_changes = change is not None and change <= barrier
        return BarrierPlan(generation, start, after, barrier, has_changes)

    def _current_input_start(self, pipeline_id: str, record: PipelineRecord | None) -> int:
        """Where the current generation's next batch reads from (under the lock)."""
        if record is None:  # it only registered its reads: generation 0 from barrier 0
            return self._last_input_barrier(pipeline_id, 0)
        return self._input_start(record)

    def _known_plan(self, pipeline_id: str, record: PipelineRecord | None, generation: int,
                    after: int, planning_round: int) -> tuple[int, bool | None] | None:
        """Under the lock: the answer already given for this offset, as (barrier, has_changes;
        None: to be read), or None if it must be computed.

        The remembered plan when it moves forward (every source and retry); else, in a
        planning round, the round's answer; a fresh coordinator process (no round answer for
        the pipeline) asked in a round repeats a remembered "nothing to read yet", which a
        source of the same round may have been given before the restart.
        """
        plan = self._remembered(record, generation, after)
        if plan is not None and plan > after:
            return plan, None
        if planning_round <= 0:
            return None
        kept = self._plan_rounds.get(pipeline_id)
        if kept is not None and kept[:3] == (generation, after, planning_round):
            return kept[3], kept[4]
        if kept is None and plan == after:
            self._plan_rounds[pipeline_id] = (generation, after, planning_round, after, False)
            return after, False
        return None

    def _keep_plan(self, pipeline_id: str, record: PipelineRecord | None, generation: int,
                   after: int, input_start: int, planning_round: int, barrier: int,
                   has_changes: bool) -> bool:
        """Under the lock: records a freshly computed answer; returns whether it wrote the
        store. A forward answer for the generation's next batch becomes the remembered plan
        (Open records its input barrier); in a planning round the answer is the round's, and
        a "nothing" answer is remembered too (once per offset: a restarted coordinator repeats
        it to the rest of the round). An offset above the input start (not where the next
        batch starts) never replaces the remembered plan (T1)."""
        if planning_round > 0:
            self._plan_rounds[pipeline_id] = (generation, after, planning_round, barrier,
                                              has_changes)
        if after != input_start:
            return False
        if barrier == after and (planning_round <= 0 or (
                record is not None and (record.plan_generation, record.plan_after)
                == (generation, after))):
            return False
        updated = record.copy() if record else self._new_pipeline(pipeline_id)
        updated.plan_generation = generation
        updated.plan_after = after
        updated.plan_barrier = barrier
        with self.store.batch():
            self._persist_pipeline(updated, record)
        self._pipelines[pipeline_id] = updated
        return True

    @staticmethod
    def _remembered(record: PipelineRecord | None, generation: int, after: int) -> int | None:
        if record is None or (record.plan_generation, record.plan_after) != (generation, after):
            return None
        return record.plan_barrier

    # ---------------------------------------------------------------- table changes

    def get_table_changes(self, table: str, after: int, upto: int) -> TableChanges:
        """The table's commits with a barrier in (after, upto], all applied, and its version
        at ``after``. ``upto`` must be a barrier the table completed: the range is final.

        Raises:
            FailedPrecondition: ``upto`` is above the table's completed barrier, or ``after``
                below the retention floor (those index rows may be pruned).
        """
        validation.check_non_negative("after_barrier", after)
        validation.check_non_negative("upto_barrier", upto)
        if after > upto:
            raise InvalidArgument(f"after_barrier {after} is above upto_barrier {upto}")
        canonical = self._resolve_tables([table])[0]
        view = self.completion()
        completed = view.completed(canonical)
        if completed is None or upto > completed:
            known = ("has no completed barrier yet" if completed is None
                     else f"has completed barrier {completed}")
            raise FailedPrecondition(
                f"table {canonical} {known}: changes up to barrier {upto} are not final yet "
                "(not completed yet); ask for a barrier it completed (GetTopology)")
        floor = self.store.retention_floor_ts()
        # Pruning keeps each table's newest row below the floor: a table with no row below it
        # never had one, so nothing of the range was pruned (a new downstream pipeline starts
        # at barrier 0, long below a floor of now - retention).
        if after < floor and self.store.table_commit_at(canonical, floor - 1) is not None:
            start = first_barrier_at_or_above(floor, view.interval_ms)
            raise FailedPrecondition(
                f"after_barrier {after} of table {canonical} is below the retention floor "
                f"(timestamp {floor}): the table's history before the floor was pruned from "
                "the snapshot index (serve --retention-hours), so its changes since "
                f"{after} cannot be listed. A downstream pipeline whose sources start there "
                "cannot be served: start it anew at or above the floor with "
                "`percolake-coordinator reset-pipeline --pipeline P --reason ... "
                f"--start-barrier {start}` (its next batches read the sources from there; "
                "the rows before it are not read)")
        by_input = view.is_downstream(canonical)
        commits = self.store.table_commits_in_range(canonical, after, upto, by_input,
                                                    view.now_ts)
        keyed_by_commit_ts = [c for c in commits if not (by_input and c.input_barrier)]
        if keyed_by_commit_ts:  # a root table's, or a downstream one's from its root era
            self._check_no_root_restore_inside(canonical, after, upto, keyed_by_commit_ts)
        changes = []
        for commit in commits:
            assert commit.delta_version is not None, f"unapplied below completed: {commit}"
            changes.append(TableChange(commit.delta_version, commit.commit_ts,
                                       commit.barrier(by_input), commit.txn_id))
        start = view.version_at(canonical, after)
        return TableChanges(canonical, tuple(sorted(changes, key=lambda c: c.delta_version)),
                            None if start is None else start.delta_version)

    def _check_no_root_restore_inside(self, table: str, after: int, upto: int,
                                      commits: list[TableCommit]) -> None:
        """Refuses a root table's range that holds a revision's restore: the commits before
        it were rolled back (the pipelines reading it restart after it)."""
        revisions = {r.txn_id for r in self._revisions_between(after, upto)}  # Revising's
        restore = next((c for c in commits if c.txn_id in revisions), None)
        if restore is not None:
            raise FailedPrecondition(
                f"table {table} was restored by revision {restore.txn_id} at timestamp "
                f"{restore.commit_ts}, inside barrier range ({after}, {upto}]: the changes "
                "before it were rolled back and cannot be read as a stream; read from after "
                "the restore (`percolake-coordinator reset-pipeline --pipeline P --reason ... "
                f"--start-barrier {restore.commit_ts}`)")

    # ---------------------------------------------------------------- writers (declarations)

    def _check_writer(self, pipeline_id: str, tables: Iterable[str]) -> None:
        """Refuses, under the lock, a pipeline declaring a table another pipeline owns (unless
        --shared-table-writers) or whose ownership would close a cycle; changes nothing."""
        names = list(tables)
        if pipeline_id == REVISE_PIPELINE or is_optimize_pipeline(pipeline_id):  # own nothing
            return
        if not self.config.shared_table_writers:
            for table, owner in self._lineage.foreign_owners(pipeline_id, names).items():
                raise FailedPrecondition(
                    f"table {table} is written by pipeline {owner!r}; a table has one writing "
                    f"pipeline (docs/topology.md): pipeline {pipeline_id!r} may not write it "
                    "(the coordinator serves with --shared-table-writers to let pipelines "
                    "share tables)")
        unowned = [t for t in names if t not in self._lineage.writers]
        if not unowned:
            return
        cycle = self._lineage.cycle_if_writes(pipeline_id, unowned)
        if cycle is not None:
            raise FailedPrecondition(
                f"pipeline {pipeline_id!r} writing {cycle[1]} would close the cycle "
                f"{describe_cycle(cycle)}; the topology has no cycles (docs/topology.md)")

    def _persist_writers(self, pipeline_id: str, tables: Iterable[str]) -> list[TableWriter]:
        """Inside the batch that declares ``tables`` (after ``_check_writer``): records the
        pipeline as the owner of each table without one. ``_own`` applies them once durable."""
        if is_optimize_pipeline(pipeline_id):  # a compaction makes no pipeline a writer
            return []
        now = wall_ms()
        owners = [TableWriter(t, pipeline_id, now) for t in tables
                  if t not in self._lineage.writers]
        for owner in owners:
            self.store.insert_table_writer(owner)
        return owners

    def _own(self, owners: Iterable[TableWriter]) -> None:
        for owner in owners:
            self._lineage.writers[owner.table] = owner.pipeline_id
