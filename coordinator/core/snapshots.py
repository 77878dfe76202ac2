"""Consistent snapshots and time travel (I1), below the retention floor refused; the
topology-consistent snapshot at a completed global barrier (T2) and read-committed reads."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable

from coordinator import validation
from coordinator.core.state import CoreState, Snapshot
from coordinator.core.topology import Completion
from coordinator.oracle import wall_ms_of
from percolake.barriers import is_global_barrier
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound
from percolake.states import COMMITTED_STATES

log = logging.getLogger("percolake.coordinator")


class Consistency(enum.Enum):
    """What a snapshot's versions agree on (docs/topology.md)."""

    SNAPSHOT = "snapshot"  # every table at one commit_ts
    TOPOLOGY = "topology"  # every table at its version at one completed global barrier
    READ_COMMITTED = "read_committed"  # each table's newest applied version


class Snapshots(CoreState):
    """GetSnapshot."""

    def get_snapshot(
        self,
        tables: Iterable[str],
        as_of_ts: int | None = None,
        as_of_batch: tuple[str, int | None, int] | None = None,
        wait_s: float | None = None,
        consistency: Consistency = Consistency.SNAPSHOT,
        as_of_barrier: int | None = None,
    ) -> Snapshot:
        """A snapshot_ts and, per table, the Delta version holding exactly the commits <= it.

        Committed-but-unapplied writes at or below snapshot_ts are rolled forward first (I1, I4).
        With ``Consistency.TOPOLOGY`` the snapshot_ts is a global barrier (see
        ``_topology_snapshot``); with ``READ_COMMITTED`` each table's newest applied version.

        Raises:
            DeadlineExceeded: a roll-forward did not finish within the wait.
        """
        canonical = self._resolve_tables(tables)
        if not canonical:
            raise InvalidArgument("name at least one table")
        if consistency != Consistency.SNAPSHOT and (as_of_ts is not None
                                                    or as_of_batch is not None):
            raise InvalidArgument(f"as_of_ts and as_of_batch read a snapshot at one commit_ts; "
                                  f"consistency {consistency.value} takes none of them")
        if as_of_barrier is not None and consistency != Consistency.TOPOLOGY:
            raise InvalidArgument("as_of_barrier needs consistency topology")
        if consistency == Consistency.TOPOLOGY:
            return self._topology_snapshot(canonical, as_of_barrier, wait_s)
        if consistency == Consistency.READ_COMMITTED:
            return self._read_committed(canonical)
        if as_of_ts is not None:
            validation.check_non_negative("as_of_ts", as_of_ts)
            with self._lock:
                newest = self.oracle.last
            if as_of_ts > newest:
                raise InvalidArgument(
                    f"as_of_ts {as_of_ts} is in the future (newest timestamp {newest})")
            snapshot_ts = as_of_ts
            what: str | None = f"as_of_ts {as_of_ts}"
            self._check_not_pruned(snapshot_ts, what)
        elif as_of_batch is not None:
            snapshot_ts = self._commit_ts_of_batch(*as_of_batch)
            what = f"batch {as_of_batch[2]} (commit_ts {snapshot_ts})"
            self._check_not_pruned(snapshot_ts, what)
        else:
            # Under the lock no commit is half-done, so every commit below a fresh ts is durable.
            with self._lock:
                snapshot_ts = self.oracle.next()
            # Above every commit: each table's newest row answers, and no prune deletes it.
            what = None
        deadline = time.monotonic() + (self.config.snapshot_wait_s if wait_s is None else wait_s)
        for table in canonical:
            for pending in self.store.unapplied_table_commits(table, snapshot_ts):
                self._roll_forward(pending.txn_id, table, deadline, take_slot=True)
        # A prune may have run since the check above: the floor read with the rows decides.
        view = self.store.table_commits_at(canonical, snapshot_ts)
        if what is not None:
            self._check_not_pruned(snapshot_ts, what, view.floor_ts)
        versions: dict[str, int | None] = {}
        for table, commit in view.commits.items():
            assert commit is None or commit.delta_version is not None, f"unapplied {commit}"
            versions[table] = commit.delta_version if commit else None
        return Snapshot(snapshot_ts, versions)

    def _topology_snapshot(self, canonical: list[str], as_of_barrier: int | None,
                           wait_s: float | None) -> Snapshot:
        """Each table at its version at one global barrier G every one of them completed: the
        newest such (never older than an earlier answer, T2), or ``as_of_barrier``. A derived
        table at G shows exactly the result of its inputs as they show at G."""
        view: Completion = self.completion()  # type: ignore[attr-defined]  # Topology's
        completed = {t: view.completed(t) for t in canonical}
        unknown = sorted(t for t, c in completed.items() if c is None)
        if unknown:
            raise FailedPrecondition(
                f"table {unknown[0]} has no completed global barrier yet (not completed yet: "
                "no pipeline writes it, or its sources are not known); read it with "
                "consistency snapshot or read_committed")
        newest = min(c for c in completed.values() if c is not None)
        barrier = newest
        if as_of_barrier is not None:
            validation.check_non_negative("as_of_barrier", as_of_barrier)
            if not is_global_barrier(as_of_barrier, view.interval_ms):
                raise InvalidArgument(
                    f"as_of_barrier {as_of_barrier} is not a global barrier (a multiple of "
                    f"{view.interval_ms} ms of oracle time, shifted left by 18 bits)")
            if as_of_barrier > newest:
                slowest = min(completed, key=lambda t: completed[t] or 0)
                raise FailedPrecondition(
                    f"barrier {as_of_barrier} is not completed yet by every table: {slowest} "
                    f"has completed barrier {newest}; wait, or read an earlier barrier")
            barrier = as_of_barrier
        what = f"global barrier {barrier}"
        self._check_not_pruned(barrier, what)
        deadline = time.monotonic() + (self.config.snapshot_wait_s if wait_s is None else wait_s)
        for table in canonical:  # completed implies applied; an apply running now finishes
            if not view.is_downstream(table):
                for pending in self.store.unapplied_table_commits(table, barrier):
                    self._roll_forward(pending.txn_id, table, deadline, take_slot=True)
        versions: dict[str, int | None] = {}
        for table in canonical:
            commit = view.version_at(table, barrier)
            assert commit is None or commit.delta_version is not None, f"unapplied {commit}"
            versions[table] = commit.delta_version if commit else None
        self._check_not_pruned(barrier, what)  # a prune may have run since the check above
        revised = max(self.store.newest_restore(t, view.now_ts) for t in canonical)
        return Snapshot(barrier, versions, revised)

    def _read_committed(self, canonical: list[str]) -> Snapshot:
        """Each table's newest applied version, rolling nothing forward: the versions need
        not agree on any point in time. snapshot_ts: the moment they were read."""
        with self._lock:
            now_ts = self.oracle.next()
        versions: dict[str, int | None] = {}
        for table in canonical:
            pending = self.store.unapplied_table_commits(table, now_ts)
            # per table at most the oldest unapplied commit and those after it are unapplied
            upto = pending[0].commit_ts - 1 if pending else now_ts
            commit = self.store.table_commit_at(table, upto)
            versions[table] = commit.delta_version if commit else None
        return Snapshot(now_ts, versions)

    def _commit_ts_of_batch(self, pipeline_id: str, generation: int | None, batch_id: int) -> int:
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_non_negative("batch_id", batch_id)
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id)
            if pipeline is None:
                raise NotFound(f"no pipeline {pipeline_id!r}")
            gen = pipeline.generation if generation is None else generation
        for attempt in self.store.attempts_of(pipeline_id, gen, batch_id):
            if attempt.state in COMMITTED_STATES:
                return attempt.commit_ts
        pruned = (" (or it committed before the retention floor and its record was pruned)"
                  if self.store.retention_floor_ts() else "")
        raise NotFound(f"batch {batch_id} of pipeline {pipeline_id!r} generation {gen} "
                       f"has not committed{pruned}")

    def _check_not_pruned(self, ts: int, what: str, floor: int | None = None) -> None:
        """Refuses ``ts`` below the retention floor (read now unless the caller read it)."""
        floor = self.store.retention_floor_ts() if floor is None else floor
        if ts < floor:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ms_of(floor) / 1000))
            raise FailedPrecondition(
                f"{what} is older than the retention floor ({when}, timestamp {floor}): that "
                "history was pruned (serve --retention-hours); read a later point in time")
