"""The lake side of ``Vacuum`` (docs/topology.md, safe expiry): which files a vacuum would
remove, which of them given versions still read, and their removal. What must be kept is the
coordinator's decision (``coordinator.core.vacuum``); nothing here knows leases.

Candidates are the files delta-rs' vacuum would remove (``dry_run``, without its retention
check) and, because delta-rs never vacuums below a folder starting with ``_`` (where every
percolake data file lies, ``_percolake/<txn_id>/``), the files the log removed longer than the
retention ago that no newer version added again. Each removal's version comes from the log's
commit entries; a file whose removal entry is gone (log cleanup) counts as removed at the
newest version, so every protected range keeps it. The removal deletes exactly the checked
candidates, on one loaded snapshot: a commit meanwhile changes nothing of what was checked.

Change data files (``cdc`` actions: percolake's lie in ``_percolake/<txn_id>/op<N>/_change_data/``,
which neither delta-rs' nor delta-spark's vacuum lists) are referenced by no version, only by
the commit that wrote them: they expire as delta-spark's do, once that commit is older than the
retention (its time as Delta readers take it: the in-commit timestamp, else the log entry's
modification time). They count as removed at that commit's version, so a protected range that
reads the table's changes after a version keeps the change files of every later commit.
A table with a feature percolake cannot write is not vacuumed (``protocol_refusal``).

Paths are relative to the table root, as stored (partition folders percent-encoded as delta-rs
writes them), so the sets compare exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from deltalake import DeltaTable

from percolake.lake import storage
from percolake.lake.cleanup import walk_folders
from percolake.lake.defaults import DEFAULT_RETENTION_HOURS
from percolake.lake.delta_commit import commit_file, commit_uri, open_table
from percolake.lake.log_cleanup import interval_ms, log_listing
from percolake.lake.table_features import refusal, table_protocol
from percolake.lake.warehouse import (
    UnsafeLocation,
    check_table_location,
    is_object_store,
    local_path,
)

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEVER = 2**62  # a commit time later than any cutoff: its change files are never old enough


@dataclass(frozen=True)
class Removal:
    version: int  # the version whose commit removed the file (a change file: wrote it)
    deletion_ms: int  # its deletionTimestamp (a change file: its commit's time)


RETENTION_KEY = "delta.deletedFileRetentionDuration"
HOUR_MS = 3_600_000


def interval_hours(text: str) -> int | None:
    """A Delta table property's duration in whole hours, rounded up; None if it is not one."""
    ms = interval_ms(text)
    return None if ms is None else math.ceil(ms / HOUR_MS)


class TableVacuum:
    """One table, loaded once at its newest version."""

    def __init__(self, table_uri: str, roots: Iterable[str] | None = None) -> None:
        check_table_location(table_uri, list(roots) if roots is not None else None)
        self.table_uri = table_uri
        self.table: DeltaTable | None = open_table(table_uri)
        self._local = not is_object_store(table_uri)
        root = local_path(table_uri) if self._local else table_uri
        self._roots = (root.rstrip("/") + "/", self.table.table_uri.rstrip("/") + "/") \
            if self.table is not None else ()
        self._removals: dict[str, Removal] | None = None
        self._entry_times: dict[str, int] | None = None

    def protocol_refusal(self) -> str | None:
        """Why percolake may not vacuum the table, None when it may: a vacuum deletes only
        files of tables whose every feature percolake implements (what ``vacuumProtocolCheck``
        requires of a vacuum; a feature it does not know may keep files in ways it cannot
        see)."""
        if self.table is None:
            return None
        versions = self.table.protocol()
        protocol = table_protocol(versions.min_reader_version, versions.min_writer_version,
                                  versions.reader_features, versions.writer_features,
                                  self.table.metadata().configuration)
        return refusal(self.table_uri, protocol)

    def retention_hours(self) -> int:
        """The table's ``delta.deletedFileRetentionDuration`` in whole hours (rounded up), what
        delta-spark's VACUUM keeps without RETAIN; a week when the table sets none (or a value
        this cannot read)."""
        if self.table is None:
            return DEFAULT_RETENTION_HOURS
        text = self.table.metadata().configuration.get(RETENTION_KEY)
        hours = interval_hours(text) if text else None
        return DEFAULT_RETENTION_HOURS if hours is None else hours

    @property
    def newest_version(self) -> int | None:
        return None if self.table is None else self.table.version()

    def candidates(self, retention_hours: int, now_ms: int | None = None) -> list[str]:
        """The files a vacuum would remove now (removed from the table longer than
        ``retention_hours`` ago, not read by its newest version), sorted."""
        if self.table is None:
            return []
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff_ms = now_ms - retention_hours * 3600 * 1000
        theirs = self.table.vacuum(retention_hours=retention_hours, dry_run=True,
                                   enforce_retention_duration=False)
        live = self.files_of_version(self.table.version())
        ours = [path for path, removal in self.removals().items()
                if removal.deletion_ms <= cutoff_ms and path not in live]
        return sorted(self._present(sorted(set(theirs) | set(ours))))

    def files_of_version(self, version: int) -> frozenset[str]:
        """The data files version ``version`` reads."""
        table = open_table(self.table_uri, version)
        assert table is not None, f"{self.table_uri} vanished while it was vacuumed"
        return frozenset(self._relative(uri) for uri in table.file_uris())

    def read_after(self, version: int, paths: Iterable[str]) -> list[str]:
        """Those of ``paths`` some version from ``version`` on reads: removed after it (or at
        a version the log no longer tells), sorted."""
        removals = self.removals()
        newest = self.newest_version or 0
        return sorted(p for p in paths
                      if (removals[p].version if p in removals else newest) > version)

    def removals(self) -> dict[str, Removal]:
        """Every file the log's commit entries remove (and no later entry adds again), with
        the removing version, and every change file they write, with the writing version and
        its commit's time; read newest first down to the oldest entry still there."""
        if self._removals is not None:
            return self._removals
        removed: dict[str, Removal] = {}
        added_later: set[str] = set()
        for version in range(self.newest_version or 0, -1, -1):
            entry = self._log_entry(version)
            if entry is None:
                break
            actions = [json.loads(line) for line in entry.splitlines() if line.strip()]
            changes = [unquote(a["cdc"]["path"]) for a in actions if "cdc" in a]
            if changes:
                written_ms = self._commit_ms(version, actions)
                for path in changes:
                    if not _outside(path):  # a file outside the table is not its to delete
                        removed.setdefault(path, Removal(version, written_ms))
            for action in actions:
                if "add" in action:
                    added_later.add(unquote(action["add"]["path"]))
                remove = action.get("remove")
                if remove is None or remove.get("deletionTimestamp") is None:
                    continue  # without its time it never counts as old enough
                path = unquote(remove["path"])
                if path not in added_later and path not in removed:
                    removed[path] = Removal(version, int(remove["deletionTimestamp"]))
        self._removals = removed
        return removed

    def remove(self, paths: Iterable[str]) -> list[str]:
        """Deletes exactly these files (a missing one is fine); never a log file, never
        through a symlink. Returns them, sorted."""
        done = sorted(set(paths))
        for path in done:
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or "" in parts or parts[0] == "_delta_log":
                raise UnsafeLocation(f"refusing to vacuum {path!r} of {self.table_uri}")
        if not self._local:
            storage.delete_objects(self.table_uri, done)
            return done
        root = os.path.realpath(local_path(self.table_uri))
        for path in done:
            _unlink_below(root, path.split("/"))
        return done

    def _present(self, paths: list[str]) -> set[str]:
        """Those of ``paths`` still there: a file an earlier vacuum deleted stays named by the
        log until log cleanup, and is neither removed nor needed again."""
        if not paths:
            return set()
        if not self._local:
            return set(paths) & set(storage.list_files(self.table_uri.rstrip("/")))
        root = local_path(self.table_uri)
        return {p for p in paths if os.path.lexists(os.path.join(root, p))}

    def _commit_ms(self, version: int, actions: list[dict]) -> int:
        """The commit's time as Delta readers take it: its in-commit timestamp, else its log
        entry's modification time (never old enough when that is not known)."""
        for action in actions:
            stamp = action.get("commitInfo", {}).get("inCommitTimestamp")
            if stamp is not None:
                return int(stamp)
        if self._entry_times is None:
            self._entry_times = log_listing(self.table_uri)
        return self._entry_times.get(f"{version:020d}.json", _NEVER)

    def _log_entry(self, version: int) -> str | None:
        if not self._local:
            entry = storage.read_object(commit_uri(self.table_uri, version))
            return None if entry is None else entry.decode()
        try:
            return commit_file(self.table_uri, version).read_text()
        except FileNotFoundError:
            return None

    def _relative(self, uri: str) -> str:
        for root in self._roots:
            if uri.startswith(root):
                return uri[len(root):]
        return uri


def _outside(path: str) -> bool:
    return path.startswith("/") or "://" in path


def _unlink_below(root: str, parts: list[str]) -> None:
    """Unlinks ``root/parts...`` if it is a regular file, walking folders without following
    any symlink (one swapped in is refused, never followed out of the table)."""
    def refusal(name: str, exc: OSError) -> UnsafeLocation:
        return UnsafeLocation(f"refusing to vacuum below {root}/{name}: {exc}")

    fd = walk_folders(os.open(root, _OPEN_DIR), parts[:-1], refusal)
    if fd is None:
        return
    try:
        try:
            mode = os.lstat(parts[-1], dir_fd=fd).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISREG(mode):
            raise UnsafeLocation(f"refusing to vacuum {root}/{'/'.join(parts)}: not a file")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)
