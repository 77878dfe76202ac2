"""Vacuum (docs/topology.md, safe expiry; invariant T3): a table's unreferenced files are removed
with delta-rs' vacuum only when no live lease, no downstream pipeline's range still to read and
no time travel above the retention floor reads any of them; otherwise the refusal names the
first that does.

What is protected, per table: each live lease's version of it; for each pipeline reading it,
every version from its version at the pipeline's last committed input barrier (or its
generation's start) on; every version from its version at the retention floor on; and every
file the write intent of an unfinished transaction on it names (PREWRITTEN, or COMMITTED and
not yet applied: a revision adds back files the log removed, and must find them when it is
applied). The reads are ordered against concurrent lease taking: the floor first, then the
leases (see ``Leases.take_lease``), and the intents before the table is loaded (one applied
meanwhile shows in the loaded log instead). The check and the removal work on one loaded Delta
snapshot, and the removal deletes exactly the candidates checked. A vacuum and a revision never
run at once (``VACUUM_OR_REVISION``): a revision reads the files of a version before its write
intent names them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from coordinator import validation
from coordinator.core.leases import describe_lease
from coordinator.core.state import CoreState
from coordinator.oracle import wall_ms_of
from coordinator.store.base import TableCommit
from percolake.errors import FailedPrecondition

if TYPE_CHECKING:
    from percolake.lake.vacuum import TableVacuum

log = logging.getLogger("percolake.coordinator")

MAX_RETENTION_HOURS = 100 * 365 * 24
# Vacuums and revisions of this process run one at a time (the leader is the only process
# serving them).
VACUUM_OR_REVISION = threading.Lock()


@dataclass(frozen=True)
class Protection:
    """Versions of the table something still reads: ``version`` alone, or (``onwards``) it
    and every later one; or (``paths``) files an unapplied write intent names."""

    what: str  # names the blocker in a refusal
    label: str  # the short form VacuumResponse.kept_for lists
    version: int | None
    onwards: bool = False
    paths: frozenset[str] = frozenset()


@dataclass(frozen=True)
class VacuumResult:
    table: str
    removed_files: list[str]  # relative to the table root (a dry run: would be)
    oldest_needed_version: int | None
    kept_for: list[str]
    dry_run: bool


class Vacuuming(CoreState):
    """Vacuum."""

    def vacuum(self, table: str, retention_hours: int | None = None,
               dry_run: bool = False) -> VacuumResult:
        """Removes the table's files delta-rs' vacuum finds (removed from the table longer
        than ``retention_hours`` ago; None: the table's ``delta.deletedFileRetentionDuration``,
        a week by default, as delta-spark's VACUUM), percolake's own files the log removed that
        long ago and the change data files of commits that old, if nothing protected reads any
        of them.

        Raises:
            FailedPrecondition: a protected version still reads a file vacuum would remove;
                the message names the first such lease, pipeline range or the floor. Or the
                table has a Delta table feature percolake cannot write (named).
        """
        from percolake.lake.vacuum import TableVacuum

        canonical = self._canonical(table)
        if retention_hours is not None:
            validation.check_range("retention_hours", retention_hours, MAX_RETENTION_HOURS)
        with VACUUM_OR_REVISION:
            protections = self._protections(canonical)
            lake = TableVacuum(canonical, self.warehouse.roots)
            # as delta-spark's VACUUM without RETAIN: the table's deletedFileRetentionDuration
            hours = lake.retention_hours() if retention_hours is None else retention_hours
            refused = lake.protocol_refusal()
            if refused:
                raise FailedPrecondition(
                    f"vacuum of {canonical} refused, nothing was removed: a vacuum must "
                    f"implement every feature of the table (VACUUM it with delta-spark): {refused}")
            candidates = lake.candidates(hours)
            for protection in protections:
                needed = _needed(lake, protection, candidates)
                if needed:
                    raise FailedPrecondition(
                        f"vacuum of {canonical} refused: {len(needed)} of the "
                        f"{len(candidates)} files it would remove (first: {needed[0]}) are "
                        f"still needed by {protection.what}; nothing was removed")
            removed = candidates if dry_run else lake.remove(candidates)
        oldest = min((p.version for p in protections if p.version is not None), default=None)
        if not dry_run:
            log.info("vacuumed", extra={"table": canonical, "files": len(removed),
                                        "retention_hours": hours})
        return VacuumResult(canonical, removed, oldest, [p.label for p in protections], dry_run)

    def _protections(self, table: str) -> list[Protection]:
        """Leases first, then downstream ranges, then the floor: the order refusals name
        them in. The floor is read before the leases (``Leases.take_lease`` relies on it)."""
        floor = self.store.retention_floor_ts()
        found = [Protection(f"{describe_lease(lease)} (it reads version {version})",
                            f"lease {lease.lease_id}", version, False)
                 for lease in self.live_leases()  # Leases' (the core has both)
                 for leased, version in lease.tables if leased == table]
        completion = self.completion()  # Topology's
        indexed = self.store.table_commit_at(table, completion.now_ts) is not None
        for pipeline in completion.lineage.readers_of(table):
            last = completion.last_input(pipeline)
            version = _first_version(completion.version_at(table, last), indexed)
            if version is not None:
                found.append(Protection(
                    f"pipeline {pipeline!r}'s range from barrier {last} (versions {version} "
                    "and later, not read yet)", f"pipeline {pipeline}", version, True))
        version = _first_version(self.store.table_commit_at(table, floor), indexed)
        if version is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                 time.gmtime(wall_ms_of(floor) / 1000))
            found.append(Protection(
                f"the time-travel floor ({when}, timestamp {floor}): snapshots may still read "
                f"versions {version} and later (serve --retention-hours)",
                "the time-travel floor", version, True))
        return found + self._intent_protections(table)

    def _intent_protections(self, table: str) -> list[Protection]:
        """The files each unfinished transaction's unapplied write intent on ``table`` adds
        (as stored and percent-decoded: candidates are compared in both forms)."""
        with self._lock:
            pending = [(txn, entry.write) for txn in self._unfinished.values()
                       if (entry := txn.tables.get(table)) is not None
                       and entry.write is not None and not entry.applied]
        return [Protection(
            f"the write intent of transaction {txn.txn_id} (pipeline {txn.pipeline_id!r}, "
            f"{txn.state.value}, not applied yet), which adds them to the table",
            f"transaction {txn.txn_id}", None,
            paths=frozenset(p for path in (*(f.path for f in write.add_files),
                                           *(f.path for f in write.change_files),
                                           *(v.vector_path for v in write.deletion_vectors))
                            for p in (path, unquote(path))))
            for txn, write in sorted(pending, key=lambda pair: pair[0].start_ts)]


def _first_version(at: TableCommit | None, indexed: bool) -> int | None:
    """The first version a reader from some point on may read: the table's version at that
    point; 0 (everything) when it is not applied yet or the table has none there but commits
    after it (``indexed``); None when the table has no commit at all."""
    if at is None:
        return 0 if indexed else None
    return 0 if at.delta_version is None else at.delta_version


def _needed(lake: TableVacuum, protection: Protection, candidates: list[str]) -> list[str]:
    """The candidates the protected versions read, sorted."""
    if not candidates:
        return []
    if protection.paths:
        return [f for f in candidates if f in protection.paths]
    if protection.version is None:
        return []
    if protection.onwards:
        return lake.read_after(protection.version, candidates)
    files = lake.files_of_version(protection.version)
    return [f for f in candidates if f in files]
