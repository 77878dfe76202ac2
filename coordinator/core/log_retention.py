"""Log cleanup (docs/checkpoints.md): a table's Delta log entries older than its
``delta.logRetentionDuration`` are deleted, but never one that a version something still
reads needs: the versions vacuum protects (each live lease's version, a downstream pipeline's
range still to read, every version from the one at the time-travel floor on) keep the log
from the newest checkpoint at or below the oldest of them. Runs in the resolver after the
retention passes (the first one interval after start), and on demand (``clean_log``).
"""

from __future__ import annotations

import logging

from coordinator.core.state import CoreState
from coordinator.core.vacuum import VACUUM_OR_REVISION

log = logging.getLogger("percolake.coordinator")


class LogRetention(CoreState):
    """Cleanup of expired Delta log entries of the tables percolake writes."""

    def log_keep_from(self, table: str) -> int | None:
        """The oldest version of ``table`` something protected may still read (None: the
        coordinator knows no version of it, so it keeps its log as it is)."""
        protections = self._protections(table)  # type: ignore[attr-defined]  # Vacuuming's
        versions = [p.version for p in protections if p.version is not None]
        return min(versions) if versions else None

    def clean_log(self, table: str, now_ms: int | None = None) -> list[str]:
        """Deletes ``table``'s expired log entries that no protected version needs.

        Returns:
            The names of the ``_delta_log`` files deleted, oldest first.
        """
        from percolake.lake.delta_commit import open_table
        from percolake.lake.log_cleanup import clean_log

        canonical = self._canonical(table)
        with VACUUM_OR_REVISION:  # a revision reads an old version's files meanwhile
            keep_from = self.log_keep_from(canonical)
            lake = open_table(canonical) if keep_from is not None else None
            if lake is None or keep_from is None:
                return []
            keep_from = min(keep_from, lake.version())
            deleted = clean_log(canonical, keep_from, lake.metadata().configuration, now_ms)
        if deleted:
            log.info("cleaned the Delta log", extra={"table": canonical, "files": len(deleted),
                                                     "delta_version": keep_from})
        return deleted

    def clean_logs(self) -> int:
        """One cleanup of every table a pipeline writes; a table that fails is logged and
        tried again at the next pass. Returns the number of log files deleted."""
        with self._lock:
            tables = sorted(self._lineage.writers)
        deleted = 0
        for table in tables:
            try:
                deleted += len(self.clean_log(table))
            except Exception as exc:  # logged; the next pass tries again
                log.warning("log cleanup of %s failed: %s", table, exc, extra={"table": table})
        return deleted
