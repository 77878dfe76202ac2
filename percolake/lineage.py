"""The ETL topology's lineage as a pure graph (no I/O): which pipeline owns (writes) each table
and which tables each pipeline reads, with the two refusals of docs/topology.md: a second writer
of a table, and an edge that would close a cycle.

The graph has two kinds of nodes, pipelines and tables; a pipeline points to the tables it
writes, a table to the pipelines that read it. Pipeline ids and table names never mix: every
path alternates between them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Lineage:
    """Owners and read edges, as recorded; every method that checks leaves it unchanged."""

    writers: dict[str, str] = field(default_factory=dict)  # table -> its owning pipeline
    reads: dict[str, set[str]] = field(default_factory=dict)  # pipeline -> tables it reads
    # (pipeline, table read) -> the oracle timestamp the edge counts from, if not 0: a read
    # a pipeline gained while it already wrote tables (docs/topology.md, lineage transitions)
    since: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def of(cls, writers: Iterable[tuple[str, str]],
           reads: Iterable[tuple[str, str] | tuple[str, str, int]]) -> Lineage:
        """From (table, owner) pairs and (pipeline, table read[, since_ts]) tuples."""
        lineage = cls()
        for table, pipeline in writers:
            lineage.writers[table] = pipeline
        for pipeline, table, *since in reads:
            lineage.add_read(pipeline, table, since[0] if since else 0)
        return lineage

    def copy(self) -> Lineage:
        return Lineage(dict(self.writers), {p: set(t) for p, t in self.reads.items()},
                       dict(self.since))

    def add_read(self, pipeline: str, table: str, since_ts: int = 0) -> None:
        self.reads.setdefault(pipeline, set()).add(table)
        if since_ts:
            self.since[(pipeline, table)] = since_ts

    def read_since(self, pipeline: str, table: str) -> int:
        """The oracle timestamp from which ``pipeline``'s read of ``table`` counts (0: all)."""
        return self.since.get((pipeline, table), 0)

    # ---------------------------------------------------------------- views

    def pipelines(self) -> list[str]:
        """Every pipeline that owns or reads a table, sorted."""
        return sorted(set(self.writers.values()) | {p for p, t in self.reads.items() if t})

    def tables(self) -> list[str]:
        """Every table with an owner or a reader, sorted."""
        return sorted(set(self.writers) | {t for tables in self.reads.values() for t in tables})

    def writes_of(self, pipeline: str) -> list[str]:
        return sorted(t for t, owner in self.writers.items() if owner == pipeline)

    def reads_of(self, pipeline: str) -> list[str]:
        return sorted(self.reads.get(pipeline, ()))

    def readers_of(self, table: str) -> list[str]:
        return sorted(p for p, tables in self.reads.items() if table in tables)

    def is_root(self, pipeline: str) -> bool:
        """A root pipeline reads no percolake table (its source is external)."""
        return not self.reads.get(pipeline)

    # ---------------------------------------------------------------- refusals

    def foreign_owners(self, pipeline: str, tables: Iterable[str]) -> dict[str, str]:
        """The tables among ``tables`` another pipeline owns, with their owner."""
        return {t: owner for t in tables
                if (owner := self.writers.get(t)) is not None and owner != pipeline}

    def cycle_if_writes(self, pipeline: str, tables: Iterable[str]) -> list[str] | None:
        """The cycle that ``pipeline`` owning ``tables`` (in order) would close, as the nodes
        from ``pipeline`` back to it; None if none would. Tables it already owns add nothing."""
        if not self.reads.get(pipeline):  # a root pipeline: no path leads back into it
            return None
        trial = self.copy()
        for table in tables:
            if table in trial.writers:
                continue
            path = trial._path(table, False, pipeline)
            if path is not None:
                return [pipeline, *path]
            trial.writers[table] = pipeline
        return None

    def cycle_if_reads(self, pipeline: str, tables: Iterable[str]) -> list[str] | None:
        """The cycle that ``pipeline`` reading ``tables`` (in order) would close, as the nodes
        from ``pipeline`` back to it; None if none would."""
        trial = self.copy()
        for table in tables:
            path = trial._path(pipeline, True, table)
            if path is not None:
                return [*path, pipeline]
            trial.reads.setdefault(pipeline, set()).add(table)
        return None

    def _path(self, start: str, start_is_pipeline: bool, goal: str) -> list[str] | None:
        """A shortest path of nodes from ``start`` to ``goal`` (a node of the other kind: a
        pipeline id may be spelled like a table URI) following the edges: pipeline -> table it
        owns, table -> pipeline reading it. Breadth-first over sorted neighbours: deterministic."""
        goal_key = (goal, not start_is_pipeline)
        start_key = (start, start_is_pipeline)
        owned: dict[str, list[str]] = {}
        for table, owner in self.writers.items():
            owned.setdefault(owner, []).append(table)
        readers: dict[str, list[str]] = {}
        for reader, tables in self.reads.items():
            for table in tables:
                readers.setdefault(table, []).append(reader)
        came_from: dict[tuple[str, bool], tuple[str, bool]] = {}
        queue = deque([start_key])
        seen = {start_key}
        while queue:
            node, is_pipeline = key = queue.popleft()
            for following in sorted((owned if is_pipeline else readers).get(node, ())):
                next_key = (following, not is_pipeline)
                if next_key in seen:
                    continue
                seen.add(next_key)
                came_from[next_key] = key
                if next_key == goal_key:
                    path = [next_key]
                    while path[-1] != start_key:
                        path.append(came_from[path[-1]])
                    return [name for name, _ in reversed(path)]
                queue.append(next_key)
        return None


def describe_cycle(nodes: list[str]) -> str:
    """``bank -> /lake/debits -> ledger -> bank``."""
    return " -> ".join(nodes)
