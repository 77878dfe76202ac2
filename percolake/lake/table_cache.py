"""What a long-lived process (the coordinator) knows of each table's Delta log, kept and
advanced instead of read again.

Two caches, both safe to share between threads:

- ``LogEntries``: the log entries read so far, each summarised once (the transaction its
  commitInfo names, its app transactions, whether it may change the table's layout), keyed by
  table and version *and* by the identity of the entry's file. A local entry is looked up with
  one ``stat``: a file replaced since (the table deleted and created again, log cleanup) has
  another identity and is read again, so a cached summary is never taken for another entry.
  An object-store entry is read with one GET each time (objects have no cheap identity) and
  only its summary is reused (by content hash).
- ``DeltaTables``: one delta-rs table per table (``KeptTable``), moved to the newest version
  by reading the log entries written since (``percolake.lake.kept_table``: delta-rs rebuilds
  its files' state only when a write needs the live files or an entry changes the layout)
  instead of loading the log again from its last checkpoint. A cached table is used only while
  the log entry of the version it holds is still the one it was loaded from (checked as
  above); otherwise it is loaded again. A table is used by one caller at a time (``take``,
  then ``keep``).

Outside writers: nothing here assumes percolake wrote the log. ``LogEntries.entry`` reports
whatever file is at a version now; a caller that walks versions upwards until one is missing
(``percolake.lake.write_check.LayoutCache``) sees every commit made by anyone, and
``KeptTable.update_incremental`` reads every entry after the version held.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from percolake.lake import storage
from percolake.lake.kept_table import KeptTable
from percolake.lake.warehouse import is_object_store, local_path

TXN_ID_KEY = "percolake.txn_id"  # as percolake.lake.delta_commit writes it in commitInfo
MAX_ENTRIES = 8192  # log entry summaries kept (a few per table suffices)
MAX_TABLES = 1024  # DeltaTable objects kept

FileId = tuple  # local: (inode, mtime ns, size); object store: (size, content hash)


class LogEntry(NamedTuple):
    """One Delta log entry as the coordinator uses it."""

    file_id: FileId
    txn_id: str | None  # its commitInfo's percolake.txn_id (None: no commitInfo names one)
    app_transactions: frozenset[tuple[str, int]]  # (appId, version) of its txn actions
    changes_layout: bool  # a metaData or protocol action (schema, partitioning, features)
    readable: bool  # every line is a JSON object (else nothing else here is trusted)


def entry_path(table: str, version: int) -> str:
    """The file of one version's log entry of a local table."""
    return f"{_log_folder(table)}/{version:020d}.json"


def _log_folder(table: str) -> str:
    return f"{local_path(table)}/_delta_log"


def entry_uri(table: str, version: int) -> str:
    return f"{table.rstrip('/')}/_delta_log/{version:020d}.json"


def read_entry(table: str, version: int) -> bytes | None:
    """One version's log entry as stored (one GET on an object store), None if there is none.

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError: an object-store log cannot
            be read now.
    """
    if is_object_store(table):
        return storage.read_object(entry_uri(table, version))
    try:
        with open(entry_path(table, version), "rb") as entry:
            return entry.read()
    except FileNotFoundError:
        return None


def summarise(file_id: FileId, content: bytes) -> LogEntry:
    """Parses a log entry once into what the coordinator asks of it.

    Entries are read as Delta writers write them, one action (a JSON object) per line with
    its keys unescaped: a line that names neither ``commitInfo`` nor ``txn`` (the add actions,
    the bulk of an entry) is only checked to be an object, not parsed.
    """
    txn_id: str | None = None
    apps: set[tuple[str, int]] = set()
    readable = True
    try:
        for line in content.decode(errors="replace").splitlines():
            line = line.strip()
            if not line:
                continue
            if '"commitInfo"' not in line and '"txn"' not in line:
                readable &= line.startswith("{") and line.endswith("}")
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                named = action["commitInfo"].get(TXN_ID_KEY)
                txn_id = named if isinstance(named, str) else None
            elif "txn" in action:
                txn = action["txn"]
                app, version = txn.get("appId"), txn.get("version")
                if isinstance(app, str) and isinstance(version, int):
                    apps.add((app, version))
    except (ValueError, AttributeError, TypeError):  # not a Delta log entry
        readable = False
    return LogEntry(file_id, txn_id, frozenset(apps),
                    b'"metaData"' in content or b'"protocol"' in content, readable)


def names_commit(found: LogEntry | None, txn_id: str, app_id: str, app_version: int) -> bool:
    """Whether a log entry is this transaction's secondary: its commitInfo names ``txn_id``
    and it carries the app transaction ``(app_id, app_version)``."""
    return (found is not None and found.readable and found.txn_id == txn_id
            and (app_id, app_version) in found.app_transactions)


def _local_id(info: os.stat_result) -> FileId:
    return info.st_ino, info.st_mtime_ns, info.st_size


def content_id(content: bytes) -> FileId:
    return len(content), hashlib.sha256(content).hexdigest()


class LogEntries:
    """Summaries of log entries, each read once per identity of its file."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: OrderedDict[tuple[str, int], LogEntry] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.reads = 0  # entries read and parsed (for tests and benchmarks)

    def entry(self, table: str, version: int) -> LogEntry | None:
        """The log entry at ``version`` now, None if there is none (or it is no file).

        Raises:
            StorageRefused, StorageUnavailable, StorageSettingsError: an object-store log
                cannot be read now.
            OSError: a local entry exists but cannot be read.
        """
        key = (table, version)
        if is_object_store(table):
            content = storage.read_object(entry_uri(table, version))
            return None if content is None else self._summarised(key, content)
        return self._local_entry(key, entry_path(table, version))

    def _local_entry(self, key: tuple[str, int], path: str) -> LogEntry | None:
        """``entry`` of a local table's version, its file at ``path``."""
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        cached = self._get(key)
        if cached is not None and cached.file_id == _local_id(info):
            return cached
        try:
            with open(path, "rb") as file:
                info = os.fstat(file.fileno())  # the identity of what is read
                content = file.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return self._put(key, summarise(_local_id(info), content))

    def entries(self, table: str, versions: Sequence[int]) -> list[LogEntry | None]:
        """``entry`` of each of ``versions``, in order; an object store's read all at once
        (one round trip)."""
        if not is_object_store(table):  # the log's folder named once for all versions
            log = _log_folder(table)
            return [self._local_entry((table, v), f"{log}/{v:020d}.json") for v in versions]
        if len(versions) <= 1:
            return [self.entry(table, v) for v in versions]
        contents = storage.read_objects([entry_uri(table, v) for v in versions])
        return [None if content is None else self._summarised((table, v), content)
                for v, content in zip(versions, contents, strict=True)]

    def _summarised(self, key: tuple[str, int], content: bytes) -> LogEntry:
        file_id = content_id(content)
        cached = self._get(key)
        if cached is not None and cached.file_id == file_id:
            return cached
        return self._put(key, summarise(file_id, content))

    def written(self, table: str, version: int, content: bytes) -> LogEntry | None:
        """The summary of an object-store entry this process has just put (put-if-absent:
        ``content`` is what the store holds at ``version``), kept as if read: never read
        back. None for a local table, whose entries are known by their file's identity."""
        if not is_object_store(table):
            return None
        return self._summarised((table, version), content)

    def file_id(self, table: str, version: int) -> FileId | None:
        """The identity of the entry's file now (one stat, or one GET), None if none."""
        found = self.entry(table, version)
        return None if found is None else found.file_id

    def is_commit_of(self, table: str, version: int, txn_id: str, app_id: str,
                     app_version: int) -> bool:
        """Whether the commit at ``version`` is this transaction's secondary: its commitInfo
        names ``txn_id`` and it carries the app transaction ``(app_id, app_version)``
        (``percolake.lake.delta_commit.is_commit_of``, answered from the cached summary)."""
        try:
            found = self.entry(table, version)
        except OSError as exc:
            if is_object_store(table):
                raise
            del exc  # unreadable: not a commit we can vouch for
            return False
        return names_commit(found, txn_id, app_id, app_version)

    def _get(self, key: tuple[str, int]) -> LogEntry | None:
        with self._lock:
            return self._entries.get(key)

    def _put(self, key: tuple[str, int], entry: LogEntry) -> LogEntry:
        with self._lock:
            self.reads += 1
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return entry


class DeltaTables:
    """delta-rs tables kept open per table and advanced incrementally."""

    def __init__(self, entries: LogEntries, max_tables: int = MAX_TABLES) -> None:
        self.entries = entries
        self._tables: OrderedDict[str, tuple[KeptTable, int, FileId]] = OrderedDict()
        self._max = max_tables
        self._lock = threading.Lock()
        self.loads = 0  # full loads of a log (for tests and benchmarks)
        self.advances = 0  # kept tables moved to the newest version

    def take(self, table: str, open_table: Callable[[str], DeltaTable | None]
             ) -> KeptTable | None:
        """The table at its newest version (None if it has no log), for this caller alone:
        a kept one advanced, else ``open_table(table)``. Hand it back with ``keep`` when done
        (not after an error that may have left it half-updated: it is then loaded again)."""
        with self._lock:
            kept = self._tables.pop(table, None)
        advanced = self._advanced(table, kept) if kept is not None else None
        if advanced is not None:
            return advanced
        delta = open_table(table)
        self.loads += delta is not None
        return None if delta is None else KeptTable(table, delta, self.entries, open_table)

    def keep(self, table: str, kept: KeptTable) -> None:
        """Keeps ``kept`` for the next ``take``, with the identity of the entry of the
        version it holds."""
        try:
            version = kept.version()
            file_id = kept.own_entry_id(version) or self.entries.file_id(table, version)
        except (DeltaError, OSError):
            return
        if file_id is None:
            return
        with self._lock:
            self._tables[table] = (kept, version, file_id)
            self._tables.move_to_end(table)
            while len(self._tables) > self._max:
                self._tables.popitem(last=False)

    def _advanced(self, table: str, kept: tuple[KeptTable, int, FileId]) -> KeptTable | None:
        held, version, file_id = kept
        on_store = is_object_store(table)
        try:
            if on_store:  # the held entry and the next at once: one round trip
                base, after = self.entries.entries(table, [version, version + 1])
            else:
                base, after = self.entries.entry(table, version), None
            if base is None or base.file_id != file_id:
                return None  # the log was replaced under it: load it again
            if after is not None or not on_store:  # on a store, no next entry: nothing new
                held.update_incremental(after)
        except (DeltaError, OSError):
            return None
        self.advances += 1
        return held


class TableCache:
    """The coordinator's per-table state of Delta logs: entry summaries and open tables."""

    def __init__(self) -> None:
        self.entries = LogEntries()
        self.tables = DeltaTables(self.entries)
