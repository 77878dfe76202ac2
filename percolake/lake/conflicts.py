"""Row-level writes against the table version they read (I12, docs/row-level-writes.md).

A MERGE, UPDATE or DELETE of a batch is computed from the table at ``read_version``. Any commit
made since by someone else is judged by Delta's WriteSerializable rules, conservatively: the
write reads the whole table, so a commit that removes a file (an outside DELETE, OPTIMIZE, ...),
adds data (even a blind append: it may add rows the MERGE's condition matches) or changes the
table's metadata or protocol conflicts. A commit of only ``txn`` and ``commitInfo`` actions, or
of adds with ``dataChange=false`` and no removes, does not. The coordinator asks before the
commit point (``check_row_level_write``: a conflict aborts the attempt, which its participant
retries from a fresh read); the applier asks again after COMMITTED (``conflict_since_read``): a
write that can no longer be applied exactly as read is never applied against other data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import unquote

from percolake.errors import Conflict, FailedPrecondition
from percolake.lake import storage
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import TXN_ID_KEY, commit_file, commit_uri, files_of_version
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


def describe_conflict(version: int, actions: list[dict] | None, read_version: int) -> str | None:
    """Why the commit at ``version`` conflicts with a whole-table read at ``read_version``,
    or None when it does not (WriteSerializable, conservative)."""
    if actions is None:
        return f"version {version} cannot be parsed as a Delta log entry"
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    made_by = f"version {version} ({info.get('operation', 'an unnamed operation')}" \
              f"{', by ' + str(info['engineInfo']) if info.get('engineInfo') else ''})"
    if any("metaData" in a or "protocol" in a for a in actions):
        return f"{made_by} changed the table's metadata or protocol"
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    if removed:
        return (f"{made_by} removed {len(removed)} file(s) this write read at version "
                f"{read_version}, e.g. {removed[:MAX_NAMED]}")
    added = [a["add"]["path"] for a in actions
             if "add" in a and a["add"].get("dataChange", True)]
    if added:
        return (f"{made_by} added {len(added)} file(s) whose rows this write did not see "
                f"(it read version {read_version}), e.g. {added[:MAX_NAMED]}")
    return None


def conflict_since_read(write: TableWriteRecord, own_txn_id: str | None = None,
                        committed: bool = False) -> str | None:
    """The first conflicting commit since ``write.read_version`` (commits naming
    ``own_txn_id`` in their commitInfo are this write's own and skipped), or None.

    With ``committed`` (the apply after COMMITTED) the question is whether the write can still
    be applied exactly: a rearrangement (every add and remove ``dataChange=false``, e.g. an
    outside OPTIMIZE) that removes none of the files the write removes keeps the same rows
    everywhere the write does not touch, so it does not stop the apply.
    """
    removed_by_write = {f.path for f in write.remove_files}
    for version, actions in log_entries_after(write.table, write.read_version):
        if own_txn_id is not None and actions is not None and any(
                a.get("commitInfo", {}).get(TXN_ID_KEY) == own_txn_id for a in actions):
            continue
        if committed and actions is not None and _rearranges_only_elsewhere(
                actions, removed_by_write):
            continue
        problem = describe_conflict(version, actions, write.read_version)
        if problem is not None:
            return problem
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
