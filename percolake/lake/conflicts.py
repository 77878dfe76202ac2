"""Row-level writes against the table version they read (I12, docs/row-level-writes.md).

A MERGE, UPDATE or DELETE of a batch is computed from the table at ``read_version``. Each
commit made since by someone else is judged by Delta's conflict rules (delta-spark's
ConflictChecker) for the write's isolation level, with what the write read (its ``ReadSet``: a
read predicate over partition columns; the files of the read version it selects and the files
the write replaces are the files read):

- a change of the table's metadata or protocol conflicts;
- files added with ``dataChange=true`` conflict if the read predicate may select them, unless
  the commit is a blind append (commitInfo ``isBlindAppend=true``, only adds) and the write
  commits under WriteSerializable without changing the metadata; a write that only rearranges
  rows (OPTIMIZE, SnapshotIsolation) has no such conflicts;
- a removed file conflicts if the write read it (whatever its ``dataChange``): a file of the
  read version the predicate selects, or one the write replaces. Files added after the read
  version were not read.

So a blind append, an outside MERGE, UPDATE or DELETE rewriting other partitions, or an outside
OPTIMIZE of other partitions does not conflict. The coordinator asks before the commit point
(``check_row_level_write``: a conflict aborts the attempt, which its participant retries from a
fresh read); the applier asks again after COMMITTED (``conflict_since_read``): a write that can
no longer be applied exactly as read is never applied against other data. A write that passes
lands after the outside commits, as Delta's would after its conflict check: its removes name
files still in the table (any removal of them conflicts), its adds are its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import unquote

from percolake.errors import Conflict, FailedPrecondition
from percolake.lake import storage
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import TXN_ID_KEY, commit_file, commit_uri, files_of_version
from percolake.lake.read_set import (
    SERIALIZABLE,
    SNAPSHOT_ISOLATION,
    WRITE_SERIALIZABLE,
    PartitionMatcher,
    ReadSet,
)
from percolake.lake.table_cache import read_entry
from percolake.lake.warehouse import is_object_store
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

MAX_NAMED = 3  # files named in one conflict message
ROW_LEVEL_CONFLICT_MARK = "conflicts with its row-level write"  # the participant retries these


class RowLevelConflict(Conflict):
    """Someone else changed the table since the row-level write read it (ABORTED: the
    participant retries the batch from a fresh read)."""


def log_entries_after(table_uri: str, version: int) -> Iterator[tuple[int, list[dict] | None]]:
    """The table's log entries after ``version``, oldest first, as parsed actions; None for an
    entry that exists but cannot be parsed. Stops at the first version not written yet."""
    current = version + 1
    while True:
        entry = read_entry(table_uri, current)
        if entry is None:
            return
        text = entry.decode(errors="replace")
        try:
            yield current, [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            yield current, None
        current += 1


class _WriteRead:
    """What a row-level write read and which outside changes it must have seen: Delta's
    ConflictChecker rules for the write's isolation level (see the module doc)."""

    def __init__(self, write: TableWriteRecord) -> None:
        read_set = ReadSet.from_json(write.read_set)
        self.read_version = write.read_version
        self.matcher = PartitionMatcher(read_set.predicate, write.schema_json)
        self.replaced = {f.path for f in write.remove_files}
        # a write that only rearranges rows commits under SnapshotIsolation, as Delta's
        # OPTIMIZE does: rows added meanwhile are not its concern
        self.isolation = read_set.isolation_level if write.data_change else SNAPSHOT_ISOLATION
        # under WriteSerializable a blind append may be ordered after the write, unless the
        # write changes the table's metadata (MERGE withSchemaEvolution)
        self.blind_appends_conflict = self.isolation == SERIALIZABLE or (
            self.isolation == WRITE_SERIALIZABLE and write.merge_schema)
        self.added_since: set[str] = set()  # files added after the read: never read by it

    def conflict(self, version: int, actions: list[dict] | None) -> str | None:
        """Why the commit at ``version`` conflicts with the write, or None; call for each
        commit after the read version in order."""
        if actions is None:
            return f"version {version} cannot be parsed as a Delta log entry"
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        made_by = f"version {version} ({info.get('operation', 'an unnamed operation')}" \
                  f"{', by ' + str(info['engineInfo']) if info.get('engineInfo') else ''})"
        if any("metaData" in a or "protocol" in a for a in actions):
            return f"{made_by} changed the table's metadata or protocol"
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        problem = self._removed(made_by, removes) or self._added(made_by, info, adds, removes)
        self.added_since.update(unquote(a["path"]) for a in adds)
        return problem

    def _added(self, made_by: str, info: dict, adds: list[dict],
               removes: list[dict]) -> str | None:
        """Files added with data this write should have read: changed data (not a blind
        append, unless the isolation level counts those) that its read predicate may
        select."""
        if self.isolation == SNAPSHOT_ISOLATION:
            return None
        if info.get("isBlindAppend") is True and not removes and not self.blind_appends_conflict:
            return None
        changed = [a for a in adds if a.get("dataChange", True)]
        selected = [a for a in changed if self.matcher.may_match(a.get("partitionValues"))]
        if not selected:
            return None
        partition = selected[0].get("partitionValues") or {}
        return (f"{made_by} added {len(selected)} file(s) whose rows this write's read "
                f"{'of the whole table' if self.matcher.predicate is True else 'predicate'} "
                f"may select and did not see (it read version {self.read_version}, "
                f"{self.isolation}), e.g. {[a['path'] for a in selected[:MAX_NAMED]]}"
                f"{f' in partition {partition}' if partition else ''}")

    def _removed(self, made_by: str, removes: list[dict]) -> str | None:
        """Files removed that this write read (of the read version, selected by its read
        predicate, or replaced by it)."""
        read = [r["path"] for r in removes if self._was_read(r)]
        if not read:
            return None
        return (f"{made_by} removed {len(read)} file(s) this write read at version "
                f"{self.read_version}, e.g. {read[:MAX_NAMED]}")

    def _was_read(self, remove: dict) -> bool:
        path = unquote(remove["path"])
        if path in self.replaced:
            return True
        return path not in self.added_since and self.matcher.may_match(
            remove.get("partitionValues"))


def conflict_since_read(write: TableWriteRecord, own_txn_id: str | None = None,
                        committed: bool = False) -> str | None:
    """The first commit since ``write.read_version`` that conflicts with what the write read,
    or None.

    A commit naming ``own_txn_id`` in its commitInfo is the write itself, applied: the walk
    ends there, since what was committed after it came after the write (an applier that
    checked before another applier's commit landed must not take a later outside commit for a
    conflict: its own commit attempt loses the race and it finds the write applied).

    With ``committed`` (the apply after COMMITTED) the question is whether the write can still
    be applied exactly: a rearrangement (every add and remove ``dataChange=false``, e.g. an
    outside OPTIMIZE) that removes none of the files the write removes keeps the same rows
    everywhere the write does not touch, so it does not stop the apply either.

    Log cleanup deletes whole versions, oldest first: a walk that ends at a missing version
    whose predecessor is gone too did not reach the newest commit, and what it did not read
    cannot be taken for no conflict.
    """
    read = _WriteRead(write)
    last = write.read_version
    for version, actions in log_entries_after(write.table, write.read_version):
        last = version
        if own_txn_id is not None and actions is not None and any(
                a.get("commitInfo", {}).get(TXN_ID_KEY) == own_txn_id for a in actions):
            return None
        if committed and actions is not None and _rearranges_only_elsewhere(
                actions, read.replaced):
            read.added_since.update(unquote(a["add"]["path"]) for a in actions if "add" in a)
            continue
        problem = read.conflict(version, actions)
        if problem is not None:
            return problem
    if not _entry_exists(write.table, last):
        return (f"the log entries after version {last} are cleaned up (log retention), so the "
                "commits made since cannot be checked")
    return None


def _rearranges_only_elsewhere(actions: list[dict], removed_by_write: set[str]) -> bool:
    """A commit that only rearranges rows (no data change, no metadata or protocol change)
    and removes none of ``removed_by_write``."""
    if any("metaData" in a or "protocol" in a for a in actions):
        return False
    files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    if any(f.get("dataChange", True) for f in files):
        return False
    return not any(unquote(a["remove"]["path"]) in removed_by_write
                   for a in actions if "remove" in a)


def check_row_level_write(write: TableWriteRecord) -> None:
    """Before the commit point, with the table held: the write may commit only if nothing
    conflicting landed since its read and every file it removes is in the table now.

    Raises:
        RowLevelConflict: an outside commit conflicts; retry the batch from a fresh read.
        FailedPrecondition: the read version is gone from the log, or a removed file is not
            in the table (a malformed intent).
    """
    if write.mode != WriteMode.ROW_LEVEL:
        return
    if not _entry_exists(write.table, write.read_version):
        raise FailedPrecondition(
            f"table {write.table}: the version this row-level write read, "
            f"{write.read_version}, is no longer in the Delta log; retry the batch")
    problem = conflict_since_read(write)
    if problem is not None:
        raise RowLevelConflict(
            f"table {write.table}: a commit made outside this transaction "
            f"{ROW_LEVEL_CONFLICT_MARK} (read at version {write.read_version}): {problem}. "
            "The attempt is aborted; the batch is retried from a fresh read")
    if write.remove_files:
        held = {f.path: f for f in files_of_version(write.table, write.read_version).files}
        absent = [f.path for f in write.remove_files if f.path not in held]
        if absent:
            raise FailedPrecondition(
                f"table {write.table}: the row-level write removes files that are not in the "
                f"table at version {write.read_version}: {absent[:MAX_NAMED]}")
        if not write.data_change:
            _check_same_rows(write, [held[f.path] for f in write.remove_files])


def _check_same_rows(write: TableWriteRecord, removed: list[AddFileRecord]) -> None:
    """A write that only rearranges rows adds as many rows as the files it removes held
    (when every file's statistics count them), less the rows their deletion vectors delete:
    a compaction never loses or doubles a row."""
    if not all(f.stats for f in [*removed, *write.add_files]):
        return
    before = sum(f.row_count() for f in removed)
    after = sum(f.row_count() for f in write.add_files)
    if before != after:  # the log is read only when the counts differ: vectors, or a bug
        vectors = deletion_vectors(write.table, write.read_version, [f.path for f in removed])
        before -= sum(int(v.get("cardinality", 0)) for v in vectors.values())
    if before != after:
        raise FailedPrecondition(
            f"table {write.table}: a write that only rearranges rows ({write.operation}) adds "
            f"{after} rows in place of the {before} rows of the files it removes")


def _entry_exists(table_uri: str, version: int) -> bool:
    if is_object_store(table_uri):
        return storage.read_object(commit_uri(table_uri, version)) is not None
    return commit_file(table_uri, version).is_file()
