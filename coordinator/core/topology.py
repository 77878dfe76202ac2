"""The ETL topology (docs/topology.md): lineage registration (each table's one writing
pipeline, the tables each pipeline reads), its refusals, and ``GetTopology``'s view with each
table's last completed global barrier.

The graph itself is pure code (``percolake.lineage``), so is the barrier arithmetic
(``percolake.barriers``); this module keeps the in-memory lineage equal to the durable one:
every change is written to the store first, then applied in memory, under the core's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator import validation
from coordinator.core.state import CoreState, wall_ms
from coordinator.store.base import ReadEdge, TableWriter
from percolake.barriers import root_completed_barrier, wall_ms_of_barrier
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lineage import Lineage, describe_cycle

log = logging.getLogger("percolake.coordinator")


@dataclass(frozen=True)
class PipelineNode:
    pipeline_id: str
    generation: int
    root: bool
    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class TableNode:
    table: str
    writer: str  # "" if no pipeline declared it yet
    readers: tuple[str, ...]
    completed_barrier: int | None  # an oracle timestamp; None while not known


@dataclass(frozen=True)
class TopologyView:
    pipelines: tuple[PipelineNode, ...]
    tables: tuple[TableNode, ...]
    barrier_interval_ms: int
    now_ts: int  # the oracle timestamp the view was taken at

    def delay_ms(self, table: TableNode) -> int | None:
        """Now minus the wall time of the table's last completed barrier."""
        if table.completed_barrier is None:
            return None
        return max(0, wall_ms_of_barrier(self.now_ts) - wall_ms_of_barrier(
            table.completed_barrier))


def completed_barrier(lineage: Lineage, table: str, now_ts: int,
                      first_unapplied_ts: int | None, interval_ms: int) -> int | None:
    """The last global barrier ``table`` completed, or None while it cannot be known.

    A root table's (its writer reads no percolake table) follows from the oracle and its
    unapplied commits (``percolake.barriers.root_completed_barrier``). A downstream table's
    needs the input barriers its writer's commits record, which the percolake streaming source
    will provide; until then it is not known. Neither is a table no pipeline writes.
    """
    writer = lineage.writers.get(table)
    if writer is None or not lineage.is_root(writer):
        return None
    return root_completed_barrier(now_ts, first_unapplied_ts, interval_ms)


class Topology(CoreState):
    """RegisterReads, GetTopology, and the writer registration of declared tables."""

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
            with self.store.batch():
                added = sum(self.store.insert_read_edge(ReadEdge(pipeline_id, t, now))
                            for t in new)
            self._lineage.reads.setdefault(pipeline_id, set()).update(new)
        log.info("reads registered", extra={"pipeline_id": pipeline_id, "tables": len(new)})
        return canonical, added

    def get_topology(self, tables: Iterable[str] = ()) -> TopologyView:
        """Pipelines, tables and each table's last completed barrier, read at one moment: an
        oracle timestamp taken under the lock, after which no commit can be at or below it.
        With ``tables``, only those (known to the lineage or not) and the pipelines writing or
        reading them."""
        wanted = self._resolve_tables(tables)
        interval_ms = max(1, round(self.config.barrier_interval_s * 1000))
        with self._lock:
            now_ts = self.oracle.next()
            lineage = self._lineage.copy()
            generations = {p: r.generation for p, r in self._pipelines.items()}
        shown = wanted or lineage.tables()
        # Outside the lock: commits at or below now_ts are fixed (commit_ts is taken under the
        # lock with its durable write); an apply meanwhile only moves an answer forward.
        first_unapplied: dict[str, int | None] = {}
        for table in shown:
            writer = lineage.writers.get(table)
            if writer is not None and lineage.is_root(writer):
                pending = self.store.unapplied_table_commits(table, now_ts)
                first_unapplied[table] = pending[0].commit_ts if pending else None
        names = set(generations) | set(lineage.pipelines()) if not wanted else {
            p for t in wanted for p in (lineage.writers.get(t), *lineage.readers_of(t)) if p}
        pipelines = tuple(
            PipelineNode(p, generations.get(p, 0), lineage.is_root(p),
                         tuple(lineage.reads_of(p)), tuple(lineage.writes_of(p)))
            for p in sorted(names))
        nodes = tuple(
            TableNode(t, lineage.writers.get(t, ""), tuple(lineage.readers_of(t)),
                      completed_barrier(lineage, t, now_ts, first_unapplied.get(t),
                                        interval_ms))
            for t in sorted(shown))
        return TopologyView(pipelines, nodes, interval_ms, now_ts)

    # ---------------------------------------------------------------- writers (declarations)

    def _check_writer(self, pipeline_id: str, tables: Iterable[str]) -> None:
        """Refuses, under the lock, a pipeline declaring a table another pipeline owns (unless
        --shared-table-writers) or whose ownership would close a cycle; changes nothing."""
        names = list(tables)
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
        now = wall_ms()
        owners = [TableWriter(t, pipeline_id, now) for t in tables
                  if t not in self._lineage.writers]
        for owner in owners:
            self.store.insert_table_writer(owner)
        return owners

    def _own(self, owners: Iterable[TableWriter]) -> None:
        for owner in owners:
            self._lineage.writers[owner.table] = owner.pipeline_id
