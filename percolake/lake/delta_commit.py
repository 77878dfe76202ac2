"""Applying a committed write to its Delta table: the protocol's secondaries.

An append is a log entry percolake writes itself (``percolake.lake.log_entry``: the same
commitInfo, app transaction and adds delta-rs's commit wrote), on every table: delta-rs's
commit rebuilds the state of every live file of the table, so its cost grows with the table's
age, while an append needs only the version, the app transactions and the layout, which a kept
table (``percolake.lake.kept_table``) advances by reading the entries written since. An
overwrite, whose removes name the live files, is committed by delta-rs (or by an entry of ours
where delta-rs commits nothing: ``needs_own_entry``, ``merge_schema``), as are row-level writes
by an entry of ours (``row_level_entry``).

Used by the participant right after the commit and by the coordinator's roll-forward, possibly
at the same time: every apply first reads the table's Delta app transaction version for the
pipeline generation and skips a write that is already there, and commits with no automatic
retry, so a concurrent apply makes ours fail and re-check instead of writing twice. No JVM here.

Object-store tables (``s3://``) are committed the same way, with the storage options of
``percolake.lake.storage``: percolake and delta-rs write the next log entry with a conditional
put (``If-None-Match: *``; delta-rs's ``conditional_put=etag``), so any other writer's commit of
that version, percolake's or not, makes ours fail and re-check; a log entry is never
overwritten and no lock service is needed.
Their log entries are read through the object store (one GET each), never listed in full.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

import pyarrow
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Schema, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from percolake.errors import CannotApplyAsRead, FailedPrecondition, Unavailable
from percolake.failpoints import fail_point
from percolake.lake import in_commit_timestamps, storage
from percolake.lake.checkpoints import last_checkpoint_version
from percolake.lake.deletion_vector_files import stored_descriptor
from percolake.lake.deletion_vectors import LoggedAdd, logged_adds
from percolake.lake.kept_table import KeptTable
from percolake.lake.log_entry import (
    add_action,
    app_transaction_action,
    change_action,
    commit_info,
    entry_bytes,
    log_path,
    metadata_action,
    now_ms,
    operation_commit_info,
    put_entry,
    remove_action,
)
from percolake.lake.partition_values import timestamp_partition_value, typed_partition_value
from percolake.lake.schema_evolution import (
    MAX_COLUMN_ID,
    SchemaConflict,
    added_columns,
    column_mapping_problem,
    extends,
    max_column_id,
    merged_schema,
    type_change_problem,
    type_widening_enabled,
)
from percolake.lake.table_cache import DeltaTables, read_entry
from percolake.lake.table_features import (
    TableProtocol,
    needs_own_entry,
    partition_filters,
    physical_names,
    refusal,
    table_protocol,
)
from percolake.lake.version_checksum import record_checksum
from percolake.lake.warehouse import check_table_location, delta_uri, is_object_store, local_path
from percolake.records import AddFileRecord, PartitionValues, TableWriteRecord, WriteMode

log = logging.getLogger("percolake.delta")

TXN_ID_KEY = "percolake.txn_id"
COMMIT_TS_KEY = "percolake.commit_ts"
OPERATION_KEY = "percolake.operation"  # a row-level commit's operations, as the write names them
MAX_ATTEMPTS = 20
# delta-rs's post-commit hook would checkpoint inline every 100th version and then delete log
# entries blind to leases: checkpoints come from percolake.lake.checkpoints (off the batch's
# path, at the table's delta.checkpointInterval), log cleanup from the coordinator.
NO_POST_COMMIT_HOOK = PostCommitHookProperties(create_checkpoint=False,
                                               cleanup_expired_logs=False)


class ApplyFailed(Unavailable, RuntimeError):
    """The write could not be applied after repeated concurrent-commit retries (someone else
    kept committing the table's next version): retry later (UNAVAILABLE in an RPC)."""


class ApplyRefused(FailedPrecondition, RuntimeError):
    """The table's protocol forbids this committed write: a broken invariant (I10), since the
    coordinator checks the protocol before the commit point; the table's features changed
    after it (an outside writer upgraded it). Never retried as a concurrent commit: the write
    stays committed and unapplied until the feature is dropped (FAILED_PRECONDITION)."""


UNSUPPORTED_FEATURES = "unsupported table features"  # delta-rs's protocol refusal


def open_table(table_uri: str, version: int | None = None) -> DeltaTable | None:
    """The Delta table at ``table_uri`` (at ``version`` if given), or None if none exists yet.

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError: an object-store table that
            cannot be read now (bucket missing, access denied, endpoint not answering).
    """
    if is_object_store(table_uri):
        options = storage.delta_storage_options(table_uri)
        try:  # not is_deltatable(): it holds the GIL while it waits for the store
            if version is None:
                return DeltaTable(table_uri, storage_options=options)
            return DeltaTable(table_uri, version=version, storage_options=options)
        except TableNotFoundError:
            return None
        except OSError as exc:
            raise storage.storage_error(exc, table_uri, "open the Delta table") from None
    path = local_path(table_uri)
    if not DeltaTable.is_deltatable(path):
        return None
    return DeltaTable(path, version=version) if version is not None else DeltaTable(path)


class VersionFiles(NamedTuple):
    """What a table holds at one version: its layout and its data files as add records."""

    schema_json: str
    partition_columns: tuple[str, ...]
    files: tuple[AddFileRecord, ...]


def files_of_version(table_uri: str, version: int, *, restore: bool = False) -> VersionFiles:
    """The data files of ``table_uri`` at ``version``, as write intents list them: real
    relative paths, partition values as Delta's strings, the stats delta-rs reports (row
    count, null counts; min and max of numbers, strings, booleans and dates; others left out,
    which only costs data skipping).

    Raises:
        FailedPrecondition: the table or that version cannot be read (no table, version
            removed by log cleanup), or, with ``restore`` (the files are to be added again),
            the table has deletion vectors at that version or now (not restorable this way:
            a file it holds again may carry a vector it gained after the version).
    """
    try:
        table = open_table(table_uri, version)
    except (DeltaError, OSError) as exc:
        raise FailedPrecondition(f"table {table_uri}: version {version} cannot be read "
                                 f"({exc})") from None
    if table is None:
        raise FailedPrecondition(f"table {table_uri} has no Delta log")
    if restore and _has_deletion_vectors(table_uri, table):
        raise FailedPrecondition(
            f"table {table_uri} has deletion vectors: a revision re-adds a version's files "
            "without them (delta-rs cannot write an add's deletion vector), so deleted rows "
            "would come back; restore it with delta-spark (RESTORE TABLE) instead")
    files = tuple(
        AddFileRecord(unquote(add["path"]), add["size_bytes"],
                      _normalise(add.get("partition") or {}), add["modification_time"] or 0,
                      _stats_json(add))
        for add in pyarrow.table(table.get_add_actions(flatten=False)).to_pylist())
    return VersionFiles(table.schema().to_json(),
                        tuple(table.metadata().partition_columns), files)


def _has_deletion_vectors(table_uri: str, at_version: DeltaTable) -> bool:
    """Whether the table's protocol has deletion vectors at the version loaded or at its
    latest version (a restore keeps a file the table still holds as it is now)."""
    if _layout_of(at_version).protocol.has("deletionVectors"):
        return True
    latest = table_layout(table_uri)
    return latest is not None and latest.protocol.has("deletionVectors")


def _stats_json(add: Mapping[str, object]) -> str:
    stats: dict[str, object] = {}
    if add.get("num_records") is not None:
        stats["numRecords"] = add["num_records"]
    for key, name in (("min", "minValues"), ("max", "maxValues"), ("null_count", "nullCount")):
        values = _stats_values(add.get(key))
        if values:
            stats[name] = values
    return json.dumps(stats, separators=(",", ":")) if stats else ""


def _stats_values(values: object) -> dict[str, object]:
    """The JSON-exact part of one stats struct (nested columns as nested objects)."""
    if not isinstance(values, Mapping):
        return {}
    kept: dict[str, object] = {}
    for column, value in values.items():
        if isinstance(value, Mapping):
            nested = _stats_values(value)
            if nested:
                kept[column] = nested
        elif isinstance(value, (bool, int, str)) or (
                isinstance(value, float) and value == value and abs(value) != float("inf")):
            kept[column] = value
        elif isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            kept[column] = value.isoformat()
    return kept


def apply_table_write(write: TableWriteRecord, *, app_id: str, app_version: int, txn_id: str,
                      commit_ts: int, roots: Sequence[str] | None = None,
                      tables: DeltaTables | None = None) -> int:
    """Idempotently commits the prewritten add actions of ``write`` to its Delta table.

    ``roots``: the warehouse roots the table's log must lie below (real paths, checked now);
    with or without them, a symlink on the path to the table's ``_delta_log`` is refused. An
    object-store table must be named canonically, below an object-store root. ``tables``: the
    caller's kept delta-rs tables (``table_cache``), advanced incrementally instead of loading
    the log again; without it the table is loaded for each try.

    Returns:
        The Delta version that holds the write (the existing one if it was applied before).

    Raises:
        ApplyFailed: concurrent commits kept winning for MAX_ATTEMPTS tries.
        ApplyRefused: the table's protocol forbids the write (a broken invariant; logged as
            an error, never retried here).
        UnsafeLocation: the table's log lies outside the roots or behind a symlink.
        StorageRefused, StorageUnavailable, StorageSettingsError: an object-store table could
            not be read or written now; retrying later is safe (the re-check finds a commit
            whose answer was lost).
    """
    check_table_location(write.table, roots)
    options = storage.delta_storage_options(write.table)
    properties = CommitProperties(
        # the same tags again in userMetadata, the one commitInfo field DESCRIBE HISTORY shows
        custom_metadata={TXN_ID_KEY: txn_id, COMMIT_TS_KEY: str(commit_ts),
                         "userMetadata": json.dumps({TXN_ID_KEY: txn_id,
                                                     COMMIT_TS_KEY: str(commit_ts)}),
                         **({OPERATION_KEY: write.operation}
                            if write.mode == WriteMode.ROW_LEVEL else {})},
        max_commit_retries=0,
        app_transactions=[Transaction(app_id, app_version, int(time.time() * 1000))],
    )
    schema = Schema.from_json(write.schema_json)
    for attempt in range(MAX_ATTEMPTS):
        table = open_table(write.table) if tables is None else tables.take(write.table,
                                                                           open_table)
        try:
            if table is None:
                create_table_with_add_actions(
                    delta_uri(write.table), schema, _adds(write, {}), mode="error",
                    partition_by=list(write.partition_by) or None,
                    commit_properties=properties, storage_options=options or None,
                    post_commithook_properties=NO_POST_COMMIT_HOOK)
                record_checksum(write.table, 0, [], txn_id, read_back=TXN_ID_KEY)
                return 0
            done = table.transaction_version(app_id)
            if done is not None and done >= app_version:
                return _version_of(table, txn_id, app_id, app_version, write.table)
            layout = _layout_of(table)
            refused = refusal(write.table, layout.protocol, write)
            if refused:
                raise _apply_refused(write.table, txn_id, refused)
            if write.mode == WriteMode.ROW_LEVEL:
                _refuse_changed_since_read(write, txn_id)
                entry = row_level_entry(write, layout, properties)
                evolved = evolved_schema(table, write)
                if evolved is not None:  # MERGE withSchemaEvolution: columns and data at once
                    entry.insert(2, metadata_action(table.metadata(), evolved,
                                                    _evolved_configuration(
                                                        table.metadata().configuration,
                                                        evolved)))
                version = _put_own_entry(table, write.table, entry, "row-level-entry",
                                         app_version)
                if version is not None:
                    return version
                _lost_race_pause(write.table, txn_id, attempt)
                continue
            # an append is ours on every table: delta-rs's commit rebuilds every file's state
            own_entry = (needs_own_entry(layout.protocol) or write.mode == WriteMode.APPEND
                         or _removes_escaped_paths(table, write, layout))
            mode, actions, filters = _write_actions(table, write, layout, explicit=own_entry)
            evolved = evolved_schema(table, write)
            if evolved is not None or own_entry:  # a commit delta-rs cannot make: ours
                if mode != "append":  # the write check refuses this before the commit point
                    raise _apply_refused(write.table, txn_id, "a merge_schema overwrite of a "
                                         "table with deletion vectors")
                entry = _entry_actions(write, actions, table, evolved, properties, layout)
                version = _put_own_entry(table, write.table, entry, "log-entry", app_version)
                if version is not None:
                    return version
                _lost_race_pause(write.table, txn_id, attempt)
                continue
            table.create_write_transaction(
                actions, mode, schema if mode == "append" else table.schema(),
                partition_by=list(write.partition_by) or None, partition_filters=filters,
                commit_properties=properties, post_commithook_properties=NO_POST_COMMIT_HOOK)
            table.update_incremental()
            version = _version_of(table, txn_id, app_id, app_version, write.table)
            record_checksum(write.table, version, [], txn_id, read_back=TXN_ID_KEY)
            return version
        except (DeltaError, TableNotFoundError) as exc:
            if UNSUPPORTED_FEATURES in str(exc).lower():
                raise _apply_refused(write.table, txn_id, f"delta-rs refuses it: {exc}") from None
            if not _lost_a_race(exc):
                raise
            _lost_race_pause(write.table, txn_id, attempt, str(exc))
        except OSError as exc:
            if not options:
                raise
            raise storage.storage_error(exc, write.table, "commit to") from None
        finally:  # kept for the next apply, unless this try raised (its state is unknown)
            if tables is not None and table is not None and sys.exc_info()[1] is None:
                tables.keep(write.table, table)
    raise ApplyFailed(f"could not apply transaction {txn_id} to {write.table} after "
                      f"{MAX_ATTEMPTS} concurrent-commit retries")


def _put_own_entry(table: DeltaTable, table_uri: str, entry: list[dict], point: str,
                   batch: int) -> int | None:
    """Puts ``entry`` (a log entry of ours) as the table's next version, between the
    failpoints ``before-<point>`` and ``after-<point>``; returns that version, None if another
    writer took it. On a table with in-commit timestamps, its commitInfo goes first and
    carries one.

    The put is put-if-absent, so the version holds exactly this entry: nothing is read back
    to find it (no GET of it on an object store; a kept table moves on by it unread), and the
    batch's applied report can go as soon as its tables' puts are done."""
    fail_point(f"before-{point}", batch)
    version = table.version() + 1
    if in_commit_timestamps.required(table.protocol().writer_features,
                                     table.metadata().configuration):
        entry = in_commit_timestamps.stamped(
            entry, in_commit_timestamps.previous_timestamp(table_uri, version - 1), now_ms())
    content = entry_bytes(entry)
    if not put_entry(table_uri, version, content):
        return None
    fail_point(f"after-{point}", batch)
    record_checksum(table_uri, version, entry, entry[0]["commitInfo"].get(TXN_ID_KEY))
    if isinstance(table, KeptTable):  # a table of no cache is dropped by the caller
        table.advance_own(version, content)
    return version



def _lost_race_pause(table_uri: str, txn_id: str, attempt: int, error: str = "") -> None:
    """Another writer took the version: wait a little, then the caller checks again."""
    log.info("concurrent Delta commit; re-checking", extra={
        "table": table_uri, "txn_id": txn_id, "attempt": attempt, "error": error})
    time.sleep(min(0.05 * 2**attempt, 1.0))


def _apply_refused(table: str, txn_id: str, reason: str) -> ApplyRefused:
    message = (f"BROKEN INVARIANT I10: committed transaction {txn_id} cannot be applied to "
               f"{table}: {reason}. The coordinator checked the table's protocol before the "
               "commit point, so its features changed since (an outside writer?). The write "
               "stays committed; drop the feature with delta-spark and the coordinator rolls "
               "it forward")
    log.error(message, extra={"table": table, "txn_id": txn_id})
    return ApplyRefused(message)


def evolved_schema(table: DeltaTable, write: TableWriteRecord) -> str | None:
    """The schema a ``merge_schema`` write gives the table, None if it keeps the table's (no
    new column, or an earlier apply or another writer added them already).

    Raises:
        SchemaConflict: the write no longer merges into the table as it is now (an outside
            writer changed a column's type, or took the column mapping ids of the new columns,
            since the coordinator's check).
    """
    if not write.merge_schema:
        return None
    current = table.schema().to_json()
    configuration = table.metadata().configuration
    mapped = (configuration.get("delta.columnMapping.mode") or "none") != "none"
    merged = merged_schema(current, write.schema_json, column_mapping=mapped,
                           type_widening=type_widening_enabled(configuration))
    if json.loads(merged) == json.loads(current):
        return None
    if mapped:
        problem = column_mapping_problem(current, merged, max_column_id(configuration, current))
        if problem:
            raise SchemaConflict(f"table {write.table}: {problem}")
    return merged


def _entry_actions(write: TableWriteRecord, actions: list[AddAction | RemoveAction],
                   table: DeltaTable, schema_json: str | None,
                   properties: CommitProperties, layout: TableLayout) -> list[dict]:
    """The log entry of a write delta-rs cannot commit: what delta-rs would commit for
    ``actions`` (explicit removes, each with the deletion vector of the file it removes),
    plus the ``metaData`` action of ``schema_json`` (None: the schema stays)."""
    now = now_ms()
    app = properties.app_transactions[0]
    entry = [commit_info("Append" if write.mode == WriteMode.APPEND else "Overwrite",
                         list(write.partition_by), properties.custom_metadata or {}, now,
                         merge_schema=write.merge_schema),
             app_transaction_action(app.app_id, app.version, now)]
    if schema_json is not None:
        entry.append(metadata_action(table.metadata(), schema_json, _evolved_configuration(
            table.metadata().configuration, schema_json)))
    removed = _logged_removes(write.table, table.version(),
                              [a.path for a in actions if isinstance(a, RemoveAction)], layout)
    by_path = {f.path: f for f in write.add_files}
    for action in actions:
        if isinstance(action, RemoveAction):
            logged = removed.get(action.path)
            entry.append(remove_action(action.path, action.size or 0,
                                       action.partition_values or {}, now,
                                       deletion_vector=logged and logged.descriptor(),
                                       spelled=logged and logged.path))
        else:  # partition values as the action keys them (physical names if column-mapped)
            entry.append(add_action(dataclasses.replace(
                by_path[action.path], partition_values=dict(action.partition_values or {}))))
    return entry


def row_level_entry(write: TableWriteRecord, layout: TableLayout,
                    properties: CommitProperties) -> list[dict]:
    """The log entry of a ROW_LEVEL write, as delta-spark's own operation writes it: its
    ``operation`` (MERGE, UPDATE, DELETE, OPTIMIZE; several operations of one batch are one
    commit named by them all, comma-separated in call order), ``operationParameters`` and
    ``operationMetrics``, ``readVersion``, the ``isolationLevel`` its conflicts were judged by;
    adds and removes with ``dataChange`` false when the write only rearranges rows; a ``cdc``
    action per change data file (a table with the change data feed; ``dataChange`` false); each
    remove of a file that carries a deletion vector with that vector (read from the log at the
    read version: the files the write removes are unchanged since, the caller checked).
    The percolake tags and the app transaction make it the transaction's idempotent commit."""
    now = now_ms()
    app = properties.app_transactions[0]
    metrics = json.loads(write.operation_metrics) if write.operation_metrics else {}
    parameters = json.loads(write.operation_parameters) if write.operation_parameters else {}
    physical = physical_names(layout.schema_json) \
        if layout.protocol.column_mapping != "none" else {}
    logged = _logged_removes(write.table, write.read_version,
                             [f.path for f in write.remove_files], layout)
    from percolake.lake.read_set import SNAPSHOT_ISOLATION, ReadSet  # it reads with this module

    info = operation_commit_info(
        write.operation, parameters, properties.custom_metadata or {}, now,
        readVersion=write.read_version,
        isolationLevel=ReadSet.from_json(write.read_set).isolation_level if write.data_change
        else SNAPSHOT_ISOLATION,
        isBlindAppend=False, operationMetrics=metrics)
    entry = [info, app_transaction_action(app.app_id, app.version, now)]
    for add in write.add_files:
        values = {physical.get(k, k): v for k, v in add.partition_values.items()}
        entry.append(add_action(dataclasses.replace(add, partition_values=values),
                                data_change=write.data_change))
    for change in write.change_files:
        values = {physical.get(k, k): v for k, v in change.partition_values.items()}
        entry.append(change_action(change.path, change.size, values))
    removes = {remove.path: remove for remove in write.remove_files}
    for remove in write.remove_files:
        values = {physical.get(k, k): v for k, v in remove.partition_values.items()}
        was = logged.get(remove.path)
        entry.append(remove_action(remove.path, remove.size, values, now,
                                   data_change=write.data_change,
                                   deletion_vector=was and was.descriptor(),
                                   spelled=was and was.path))
    for kept in write.deletion_vectors:  # the removed file again, with its new vector
        remove = removes[kept.path]
        values = {physical.get(k, k): v for k, v in remove.partition_values.items()}
        was = logged.get(kept.path)
        entry.append(add_action(
            AddFileRecord(kept.path, remove.size, values, kept.modification_time, kept.stats),
            data_change=write.data_change, deletion_vector=stored_descriptor(kept),
            spelled=was and was.path))
    return entry


def _logged_removes(table_uri: str, version: int, paths: list[str],
                    layout: TableLayout) -> dict[str, LoggedAdd]:
    """The log's add actions at ``version`` of the files a commit removes, where their removes
    need them: a file's deletion vector (a remove must carry it) and its path as the log
    spells it (delta-spark leaves some characters unescaped, e.g. non-ASCII partition values;
    a remove spelled otherwise would leave the file in the table for delta-spark)."""
    if not paths or not (layout.protocol.has("deletionVectors")
                         or any(log_path(p) != p for p in paths)):
        return {}
    return logged_adds(table_uri, version, paths)


def _evolved_configuration(configuration: Mapping[str, str],
                           schema_json: str) -> dict[str, str]:
    """The configuration with a column-mapped table's maxColumnId raised to the new schema's
    highest id, as delta-spark raises it."""
    updated = dict(configuration)
    if (configuration.get("delta.columnMapping.mode") or "none") != "none":
        updated[MAX_COLUMN_ID] = str(max_column_id(configuration, schema_json))
    return updated



def _refuse_changed_since_read(write: TableWriteRecord, txn_id: str) -> None:
    """I12 after COMMITTED: apply a row-level write only onto the table exactly as it read it
    (apart from this transaction's own commit, which the caller already looked for)."""
    from percolake.lake.conflicts import conflict_since_read  # it reads with this module

    problem = conflict_since_read(write, own_txn_id=txn_id, committed=True)
    if problem is not None:
        raise CannotApplyAsRead(
            f"table {write.table}: transaction {txn_id} is committed but its row-level write "
            f"cannot be applied as read (at version {write.read_version}): {problem}. It is "
            "not applied against other data; see docs/row-level-writes.md (Quarantine)",
            problem=f"read at version {write.read_version}: {problem}")


def _lost_a_race(exc: Exception) -> bool:
    """A concurrent writer won: our commit or our table creation found the version taken."""
    if isinstance(exc, (CommitFailedError, TableNotFoundError)):
        return True
    return "already exists" in str(exc).lower()


def _adds(write: TableWriteRecord, physical: dict[str, str]) -> list[AddAction]:
    """The write's add actions; a column-mapped table's partition values keyed by the
    columns' ``physical`` names, as its log keys them (the intent keys them by column)."""
    return [AddAction(f.path, f.size, {physical.get(k, k): v
                                       for k, v in f.partition_values.items()},
                      f.modification_time, True, f.stats or "{}") for f in write.add_files]


def _write_actions(table: DeltaTable, write: TableWriteRecord, layout: TableLayout,
                   explicit: bool = False) -> tuple[str, list[AddAction | RemoveAction],
                                                    list[tuple[str, str, list[str]]] | None]:
    """The commit of ``write``: delta-rs's mode, the actions, the partition filters.

    Its adds and, for an overwrite, the removes of what it replaces. A file the write lists
    that the table already holds is neither removed nor added again: it stays as it is, stats
    included (a revision overwrites a table with the files of an earlier version, most of which
    it still holds; one version may not both remove and add a path). On a table with deletion
    vectors the removes must carry each file's deletion vector, which only delta-rs's own
    overwrite writes: it derives them (all files, or those its partition filters name).
    ``explicit``: always explicit removes (a log entry of ours, which carries the deletion
    vectors itself: ``_entry_actions``).
    """
    physical = physical_names(layout.schema_json) \
        if layout.protocol.column_mapping != "none" else {}
    adds = _adds(write, physical)
    if write.mode == WriteMode.APPEND:
        return "append", adds, None
    listed = {f.path for f in write.add_files}
    removes, held = _removes(table, write, keep=listed, physical=physical)
    if layout.protocol.has("deletionVectors") and not listed & held and not explicit:
        filters = partition_filters(write) if write.mode == WriteMode.OVERWRITE_PARTITIONS \
            else None
        return "overwrite", adds, filters
    kept = [a for a, f in zip(adds, write.add_files, strict=True) if f.path not in held]
    return "append", kept + removes, None


def _removes_escaped_paths(table: DeltaTable, write: TableWriteRecord,
                           layout: TableLayout) -> bool:
    """Whether an overwrite removes a file whose path a log may spell in more than one way
    (non-ASCII or other characters escaped in a URI): delta-rs spells the removes it writes
    its own way (``%C3%A9``), where delta-spark's adds may keep the character (``é``); Delta
    matches a remove to its add by the spelling, so such an overwrite is a log entry of ours,
    each remove spelled as the log spells its add (``_entry_actions``)."""
    if write.mode not in (WriteMode.OVERWRITE, WriteMode.OVERWRITE_PARTITIONS):
        return False
    physical = physical_names(layout.schema_json) \
        if layout.protocol.column_mapping != "none" else {}
    removes, _ = _removes(table, write, keep={f.path for f in write.add_files},
                          physical=physical)
    return any(log_path(r.path) != r.path for r in removes)


def _removes(table: DeltaTable, write: TableWriteRecord, keep: set[str],
             physical: dict[str, str]) -> tuple[list[RemoveAction], set[str]]:
    """Remove actions for the files an overwrite replaces (explicit, so nothing else goes),
    except those in ``keep``; and the paths of every file the table holds.

    Partitions are compared as typed values (a timestamp written by Spark as
    ``2026-01-02 00:00:00`` is the one delta-rs hands back as a datetime), and each path is
    the file's real relative path: delta-rs reports add paths URI-encoded as the log stores
    them and encodes the paths it is given. delta-rs reports a column-mapped table's partition
    values by column name; the remove keys them by physical name, as the log does.
    """
    types = _partition_types(table)
    replaced = {_partition_key(p, types) for p in write.replace_partitions}
    now = int(time.time() * 1000)
    removes = []
    held: set[str] = set()
    for add in pyarrow.table(table.get_add_actions(flatten=False)).to_pylist():
        path = unquote(add["path"])
        held.add(path)
        values = add.get("partition") or {}
        if path in keep:
            continue
        if write.mode == WriteMode.OVERWRITE or _partition_key(values, types) in replaced:
            logged = {physical.get(k, k): v for k, v in _normalise(values).items()}
            removes.append(RemoveAction(path, True, now, add["size_bytes"], logged))
    return removes, held


def _partition_types(table: DeltaTable) -> dict[str, str]:
    """The Delta type name of each partition column (``"string"`` for nested or unknown)."""
    fields = json.loads(table.schema().to_json())["fields"]
    columns = set(table.metadata().partition_columns)
    return {f["name"]: f["type"] if isinstance(f["type"], str) else "string"
            for f in fields if f["name"] in columns}


def _partition_key(values: Mapping[str, object], types: dict[str, str]) -> tuple:
    """A hashable, typed form of one partition's values, equal for equal partitions."""
    return tuple(sorted((k, typed_partition_value(v, types.get(k, "string")))
                        for k, v in values.items()))


def _normalise(values: PartitionValues) -> dict[str, str | None]:
    """Partition values as Delta's strings (delta-rs hands them back typed)."""
    return {k: _partition_string(v) for k, v in values.items()}


def _partition_string(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return timestamp_partition_value(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _version_of(table: DeltaTable, txn_id: str, app_id: str, app_version: int,
                table_uri: str | None = None) -> int:
    """The Delta version whose commitInfo names ``txn_id``, read from the log's own files.

    Not ``DeltaTable.history()``: it numbers entries from the version the object loaded, so a
    commit landing meanwhile shifts every number. The table stays held until this write is
    reported applied, so the write is nearly always among the newest commits: read backwards,
    one entry at a time from the loaded version down (one GET each on an object store; never a
    listing of the whole log, whose length grows with the table's age); a missing entry ends
    the search (log cleanup removes the oldest first).

    The write's own entry may be cleaned up before it is reported (an outside writer's log
    cleanup, while no applier ran for longer than the table's log retention): its version can
    no longer be read, and the oldest version still in the log is reported instead. It holds
    the write and, the table being held until the write is reported, no later commit of ours.
    """
    uri = table_uri or table.table_uri
    version = table.version()
    while version >= 0:
        lines = _entry_lines(uri, version)
        if lines is None:  # cleaned up by log retention: older than the kept version
            break
        if _names_txn(lines, txn_id):
            return version
        version -= 1
    if version >= 0:  # the search ended at a cleaned-up entry
        done = table.transaction_version(app_id)
        oldest = _oldest_entry_above(uri, version, table.version())
        if done == app_version and oldest is not None:
            log.warning("the log entry of an applied write is cleaned up; reporting the "
                        "oldest version still in the log, which holds it",
                        extra={"table": uri, "txn_id": txn_id, "delta_version": oldest})
            return oldest
        raise FailedPrecondition(
            f"{uri}: the write of transaction {txn_id} is applied (app transaction {app_id} is "
            f"at {done}, at least {app_version}) but its log entry is cleaned up, so its "
            "version can no longer be told (a stale applier: whoever applied it reported it)")
    raise AssertionError(
        f"{uri} records app transaction {app_id} >= {app_version} but no commit of transaction "
        f"{txn_id}: written by something other than percolake?")


def _entry_lines(table_uri: str, version: int) -> list[str] | None:
    """The lines of one version's log entry, None if it has none."""
    if is_object_store(table_uri):
        entry = read_entry(table_uri, version)
        return None if entry is None else entry.decode().splitlines()
    try:
        return commit_file(table_uri, version).read_text().splitlines()
    except FileNotFoundError:
        return None


def _oldest_entry_above(table_uri: str, missing: int, held: int) -> int | None:
    """The oldest version above ``missing`` whose entry is still in the log: cleanup deletes
    only below a checkpoint, so it lies at or below ``_last_checkpoint`` (or ``held``)."""
    newest = max(held, last_checkpoint_version(table_uri) or -1)
    return next((v for v in range(missing + 1, newest + 1)
                 if _entry_lines(table_uri, v) is not None), None)


def _names_txn(lines: list[str], txn_id: str) -> bool:
    for line in lines:
        if '"commitInfo"' in line:
            return json.loads(line)["commitInfo"].get(TXN_ID_KEY) == txn_id
    return False


def is_commit_of(table_uri: str, version: int, txn_id: str, app_id: str,
                 app_version: int) -> bool:
    """Whether the table's commit at ``version`` is this transaction's secondary: its
    commitInfo names ``txn_id`` and it carries the app transaction ``(app_id, app_version)``.

    Raises:
        StorageRefused, StorageUnavailable, StorageSettingsError: an object-store table's log
            cannot be read now (nothing is decided: the caller may ask again).
    """
    if is_object_store(table_uri):
        entry = read_entry(table_uri, version)
        if entry is None:
            return False
        text = entry.decode(errors="replace")
    else:
        try:
            text = commit_file(table_uri, version).read_text(errors="replace")
        except OSError:  # missing, a folder, unreadable: not a commit we can vouch for
            return False
    names_txn = carries_app_txn = False
    try:
        for line in text.splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                names_txn = action["commitInfo"].get(TXN_ID_KEY) == txn_id
            elif "txn" in action:
                txn = action["txn"]
                carries_app_txn |= (txn.get("appId") == app_id
                                    and txn.get("version") == app_version)
    except (ValueError, AttributeError, TypeError):  # not a Delta log entry
        return False
    return names_txn and carries_app_txn


class TableLayout(NamedTuple):
    """What a write must fit: a table's schema and partition columns at a version."""

    version: int
    schema_json: str
    partition_columns: list[str]
    append_only: bool = False  # delta.appendOnly: no remove may change data
    protocol: TableProtocol = TableProtocol()  # the features it requires (table_features)
    constraints: tuple[tuple[str, str], ...] = ()  # delta.constraints.<name>: (name, SQL)
    column_mapping: str = "none"  # delta.columnMapping.mode
    max_column_id: int = 0  # delta.columnMapping.maxColumnId (or the highest id it holds)
    type_widening: bool = False  # delta.enableTypeWidening=true with the typeWidening feature


CONSTRAINT_PREFIX = "delta.constraints."


def table_constraints(configuration: Mapping[str, str | None]
                      ) -> tuple[tuple[str, str], ...]:
    """A table's CHECK constraints (``delta.constraints.<name>``) as ``(name, SQL)``, by name."""
    return tuple(sorted((key.removeprefix(CONSTRAINT_PREFIX), value or "")
                        for key, value in configuration.items()
                        if key.startswith(CONSTRAINT_PREFIX)))


def table_layout(table_uri: str) -> TableLayout | None:
    """The current layout of a table, or None if it does not exist."""
    table = open_table(table_uri)
    if table is None:
        return None
    return _layout_of(table)


def _layout_of(table: DeltaTable) -> TableLayout:
    metadata = table.metadata()
    configuration = metadata.configuration
    append_only = str(configuration.get("delta.appendOnly")).lower() == "true"
    versions = table.protocol()
    protocol = table_protocol(versions.min_reader_version, versions.min_writer_version,
                              versions.reader_features, versions.writer_features,
                              configuration)
    constraints = table_constraints(configuration)
    schema_json = table.schema().to_json()
    return TableLayout(table.version(), schema_json,
                       list(metadata.partition_columns), append_only, protocol, constraints,
                       configuration.get("delta.columnMapping.mode") or "none",
                       max_column_id(configuration, schema_json),
                       type_widening_enabled(configuration) and protocol.has("typeWidening"))


def commit_file(table_uri: str, version: int) -> Path:
    """The ``_delta_log`` file of one version of a local table."""
    return Path(f"{local_path(table_uri)}/_delta_log/{version:020d}.json")


def commit_uri(table_uri: str, version: int) -> str:
    """The URI of the ``_delta_log`` entry of one version of a table (any kind)."""
    return f"{table_uri.rstrip('/')}/_delta_log/{version:020d}.json"


def describe_schema_mismatch(existing_json: str, new_json: str, partition_by: list[str] | None,
                             existing_partitions: list[str],
                             type_widening: bool = False) -> str | None:
    """A message naming the columns that differ, or None when the new write fits the table.

    ``partition_by`` must equal the table's partition columns; None takes the table's.
    ``type_widening``: the table has ``delta.enableTypeWidening=true`` (a column the batch
    widens is refused saying that ``merge_schema=True`` widens it).
    """
    existing = {f["name"]: f for f in json.loads(existing_json)["fields"]}
    new = {f["name"]: f for f in json.loads(new_json)["fields"]}
    problems = []
    missing = sorted(set(existing) - set(new))
    extra = sorted(set(new) - set(existing))
    extra += [c for c in added_columns(existing_json, new_json) if "." in c]  # nested fields
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unknown columns {extra} (txn.write(..., merge_schema=True) adds them "
                        "to the table)")
    for name in sorted(set(existing) & set(new)):
        if _shape(existing[name]["type"]) != _shape(new[name]["type"]) \
                and not extends(existing[name]["type"], new[name]["type"]):
            problems.append(type_change_problem(name, existing[name]["type"], new[name]["type"],
                                                type_widening, merge_schema=False))
    if partition_by is not None and list(partition_by) != list(existing_partitions):
        problems.append(f"partitioned by {existing_partitions}, not {list(partition_by)}")
    return "; ".join(problems) or None


def _shape(delta_type: object) -> object:
    """A Delta type without nullability and metadata: what a write must match.

    Spark writes every column of a file as nullable, so only the types themselves, nested
    ones included, decide whether a batch fits a table.
    """
    if isinstance(delta_type, dict):
        return {k: _shape(v) for k, v in delta_type.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(delta_type, list):
        return [_shape(v) for v in delta_type]
    return delta_type
