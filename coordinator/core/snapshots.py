"""Consistent snapshots and time travel (I1), below the retention floor refused."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from coordinator import validation
from coordinator.core.state import CoreState, Snapshot
from coordinator.oracle import wall_ms_of
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound
from percolake.states import COMMITTED_STATES

log = logging.getLogger("percolake.coordinator")


class Snapshots(CoreState):
    """GetSnapshot."""

    def get_snapshot(
        self,
        tables: Iterable[str],
        as_of_ts: int | None = None,
        as_of_batch: tuple[str, int | None, int] | None = None,
        wait_s: float | None = None,
    ) -> Snapshot:
        """A snapshot_ts and, per table, the Delta version holding exactly the commits <= it.

        Committed-but-unapplied writes at or below snapshot_ts are rolled forward first (I1, I4).

        Raises:
            DeadlineExceeded: a roll-forward did not finish within the wait.
        """
        canonical = self._resolve_tables(tables)
        if not canonical:
            raise InvalidArgument("name at least one table")
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
