"""Refusing, before the commit point, a write intent its Delta apply could not make (I10).

The coordinator calls ``WriteChecker.check`` for each table write while it holds the table and
before the durable write that commits it, so nothing can fail after COMMITTED. What is checked is
what ``apply_table_write`` (delta-rs 1.6) really does, measured:

- It commits with ``create_write_transaction(mode="append")`` plus explicit removes, which never
  changes a table's metadata: a batch with other columns is committed under the old schema and
  its columns read as nulls. So append, overwrite_partitions *and overwrite* must fit the table's
  current schema (``describe_schema_mismatch``) and exactly its partition columns; a table that
  does not exist yet is created with the write's schema and partition columns, which must be
  usable (delta-rs refuses partition columns missing from the schema or named twice).
- Add paths are the files' literal paths below the table root (delta-rs percent-encodes them
  in the log itself); a missing file or one of another size is committed without complaint
  and breaks every read; a ``.`` segment makes delta-rs name another file.
- delta-kernel parses every partition value with its column's type at commit; one that does not
  parse fails the apply for ever. The kernel itself decides: unseen values are committed once
  to a throwaway in-memory table, and the verdict is remembered.
- Removes (overwrites, row-level writes that remove or give a file a deletion vector) on a
  ``delta.appendOnly`` table fail; a row-level write that only adds files (a MERGE that only
  inserts) is an append there, as delta-spark takes it.
- delta-rs refuses to commit to a table whose protocol requires a feature it does not
  implement, and some features it accepts need what percolake does not write
  (``table_features``): the table's protocol, re-read with its layout, is checked each time.
- A ``merge_schema`` write may add columns, and widen a column's type on a table with
  ``delta.enableTypeWidening=true`` as delta-spark does: the apply commits them with the data in
  a log entry of its own (``percolake.lake.log_entry``); another type change cannot be merged.

Refusals: InvalidArgument for a malformed write, FailedPrecondition for one that does not fit
the table as it is now. ``LayoutCache`` reads a table's layout once per version that changed it.

Object-store tables are checked the same way through ``percolake.lake.storage``: files by one
listing of each attempt folder (sizes from the listing, nothing downloaded), started beside
the reads of the log entries (one GET each, all of one check at once): one round trip per
check in the steady state. A store that cannot be read refuses the commit (StorageUnavailable,
UNAVAILABLE: retry; StorageRefused, FAILED_PRECONDITION: bucket missing, access denied),
never guesses.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from deltalake import Schema
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, create_table_with_add_actions

from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake import storage
from percolake.lake.conflicts import check_row_level_write
from percolake.lake.delta_commit import (
    TableLayout,
    commit_file,
    describe_schema_mismatch,
    table_layout,
)
from percolake.lake.schema_evolution import (
    SchemaConflict,
    added_columns,
    column_mapping_problem,
    merged_schema,
    timestamp_ntz_problem,
)
from percolake.lake.table_cache import FileId, LogEntries, LogEntry, names_commit
from percolake.lake.table_features import refusal
from percolake.lake.warehouse import (
    ATTEMPT_DIR,
    check_table_location,
    is_object_store,
    local_path,
)
from percolake.parallel import leaf_submit
from percolake.records import AddFileRecord, ChangeFileRecord, TableWriteRecord, WriteMode

MAX_NAMED = 5  # files named in one refusal
MAX_REMEMBERED = 100_000  # partition value verdicts kept
MAX_SCHEMAS = 1024  # parsed schemas kept
LOCATION_CACHE_S = 1.0  # a table location that passed its check is not checked again so soon
READ_AHEAD = 2  # object-store commit files read past a cached layout's in the same round trip

class LayoutCache:
    """Each table's layout, loaded with delta-rs (tens of ms) only when its log may change it.

    A layout is kept with the version it is valid at and the identity of that version's commit
    file. A lookup reads the commit files after it (usually just the previous batch's own, which
    the report of that batch already summarised: ``table_cache.LogEntries``) and moves the
    version on; only a ``metaData`` or ``protocol`` action, an unreadable commit file, or the
    cached one replaced (table re-created) or gone (log cleanup) loads the log again. Every
    commit after the cached version is looked at, whoever wrote it. Safe to share between
    threads: a race at worst loads twice. On an object store a commit file's identity is its
    size and content hash (read with one GET; objects have no inode).
    """

    def __init__(self, entries: LogEntries | None = None) -> None:
        self.entries = entries or LogEntries()
        self._entries: dict[str, tuple[TableLayout, FileId]] = {}
        # object store: table -> the entry of the version after its cached layout's, read
        # (by an applied report's check) while that layout was cached
        self._successors: dict[str, tuple[int, LogEntry]] = {}
        # object store: (table, version) -> the read of that entry under way for a report's
        # check, which a concurrent check of the same entry waits for instead of reading
        self._reading: dict[tuple[str, int], Future[LogEntry | None]] = {}
        self._lock = threading.Lock()

    def is_commit_of(self, table: str, version: int, txn_id: str, app_id: str,
                     app_version: int) -> bool:
        """``LogEntries.is_commit_of`` (an applied report's check). On an object store the
        entry read, if it is the one after the cached layout's version, is kept for the
        table's next lookup, which then does not read it again: that lookup still reads the
        cached version's entry, and finding it unchanged says the log is the one both were
        read from (a table deleted and created again has another entry there)."""
        if not is_object_store(table):
            return self.entries.is_commit_of(table, version, txn_id, app_id, app_version)
        cached = self._entries.get(table)
        found = self._shared_entry(table, version)
        if found is not None and cached is not None and cached[0].version == version - 1 \
                and self._entries.get(table) is cached:  # cached before the read, still
            self._successors[table] = (version, found)
        return names_commit(found, txn_id, app_id, app_version)

    def get(self, table: str) -> TableLayout | None:
        """The table's current layout, None if it does not exist."""
        entry = self._entries.get(table)
        if entry is not None:
            current = self._advance(table, *entry)
            if current is not None:
                self._entries[table] = current
                return current[0]
        elif not _log_exists(table):
            return None
        layout = table_layout(table)
        file_id = self.entries.file_id(table, layout.version) if layout else None
        if layout is None or file_id is None:
            self._entries.pop(table, None)
        else:
            self._entries[table] = (layout, file_id)
        return layout

    def _shared_entry(self, table: str, version: int) -> LogEntry | None:
        """``entries.entry`` of an object-store table; a check of an entry whose read is
        already under way (a report sent in the background and the same report carried by
        the next Open) takes that read's entry instead of reading it again. Only an entry
        found is shared: a reported entry exists before either report is sent, so a read
        that found none (or failed) is made again by the waiter."""
        key = (table, version)
        with self._lock:
            under_way = self._reading.get(key)
            if under_way is None:
                mine: Future[LogEntry | None] = Future()
                self._reading[key] = mine
        if under_way is not None:
            try:
                found = under_way.result()
            except Exception:  # noqa: BLE001 - the waiter reads for itself
                found = None
            return found if found is not None else self.entries.entry(table, version)
        try:
            found = self.entries.entry(table, version)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(found)
            return found
        finally:
            with self._lock:
                self._reading.pop(key, None)

    def _advance(self, table: str, layout: TableLayout, file_id: FileId
                 ) -> tuple[TableLayout, FileId] | None:
        """The cached layout moved to the newest version, None if the log must be loaded
        again. One stat per commit file looked at; on an object store one GET each, the
        cached version's and the next ``READ_AHEAD`` at once (one round trip when fewer
        commits came since: usually one, the previous batch's own), or, when an applied
        report's check read the next one already (``is_commit_of``), the cached version's and
        the one after the known one."""
        ahead = READ_AHEAD if is_object_store(table) else 1  # a stat each is cheap locally
        successor = self._successors.pop(table, None)
        try:
            version = layout.version
            if successor is not None and successor[0] == version + 1:
                # the next entry is known (an applied report read it): the cached one and
                # the one after the known one, at once
                base, after = self.entries.entries(table, [version, version + 2])
                found = [successor[1], after]
            else:
                base, *found = self.entries.entries(table, range(version, version + 1 + ahead))
            if base is None or base.file_id != file_id:
                return None
            while True:
                for entry in found:
                    if entry is None:
                        return layout._replace(version=version), file_id
                    if entry.changes_layout or not entry.readable:
                        return None
                    version, file_id = version + 1, entry.file_id
                found = self.entries.entries(table, range(version + 1, version + 1 + ahead))
        except OSError:
            if is_object_store(table):
                raise
            return None  # a local entry that cannot be read: load the log with delta-rs


def _log_exists(table: str) -> bool:
    if is_object_store(table):
        return storage.prefix_exists(f"{table}/_delta_log")
    return commit_file(table, 0).parent.is_dir()


def parse_schema(table: str, schema_json: str) -> Schema:
    """The write's schema as delta-rs reads it.

    Raises:
        InvalidArgument: not JSON, nested deeper than the interpreter's recursion limit (the
            JSON is read first, so such a document never reaches delta-rs's parser), or not a
            Delta schema delta-rs accepts.
    """
    try:
        json.loads(schema_json)
        return Schema.from_json(schema_json)
    except RecursionError:
        raise InvalidArgument(f"table {table}: schema_json is nested too deeply") from None
    except BaseException as exc:  # noqa: BLE001 - a Rust panic is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise InvalidArgument(f"table {table}: schema_json is not a Delta schema delta-rs can "
                              f"use: {str(exc)[:200]}") from None


class WriteChecker:
    """Refuses a write intent its apply could not make; keeps layouts and verdicts for reuse.

    One per coordinator (thread-safe as ``LayoutCache`` is). ``layouts`` may be shared.
    """

    def __init__(self, layouts: LayoutCache | None = None,
                 roots: Sequence[str] | None = None) -> None:
        """``roots``: the warehouse roots the apply will check the table's log against."""
        self.layouts = layouts or LayoutCache()
        self.roots = roots
        # table -> monotonic time until which its location passed check_table_location
        self._locations: dict[str, float] = {}
        self._parsed: set[tuple[str, str]] = set()  # (Delta type, value) the kernel parses
        # schema_json -> (delta-rs's JSON of it, its fields by name): a pure function of the
        # text, and a stream sends the same schema every batch (refusals are not kept)
        self._schemas: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {}
        self._fits: set[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = set()

    def check(self, write: TableWriteRecord) -> None:
        """Call with the table held by the transaction, before its durable commit write.

        Raises:
            InvalidArgument: malformed: schema, partition columns, mode combination, add paths,
                partition values that do not parse as their column's type.
            FailedPrecondition: does not fit the table as it is now: a table feature percolake
                cannot write (``table_features``), columns, partition columns, an overwrite of
                an append-only table, files missing or of another size.
        """
        table = write.table
        schema, fields = self._schema(table, write.schema_json)
        _check_form(write, fields)
        self._check_location(table)  # the apply refuses what this refuses (I10)
        listings = _start_listings(write)  # on an object store, beside the layout's reads
        try:
            layout = self.layouts.get(table)
        except DeltaError as exc:
            raise FailedPrecondition(
                f"table {table}: delta-rs cannot read the table's log, so nothing can be "
                f"committed to it ({exc})") from None
        if layout is not None:
            refused = refusal(table, layout.protocol, write)
            if refused:
                raise FailedPrecondition(refused)
            if write.merge_schema and write.mode != WriteMode.APPEND \
                    and layout.protocol.has("deletionVectors"):
                raise FailedPrecondition(
                    f"table {table}: merge_schema=True with mode {write.mode.value!r} on a "
                    "table with deletion vectors is not supported (the new columns and the "
                    "removes cannot be committed together); add the columns with an append "
                    "(merge_schema=True) first, or with delta-spark's ALTER TABLE ADD COLUMNS")
            problem = (merge_problem(layout, schema, write.partition_by) if write.merge_schema
                       else self._mismatch(layout, schema, write.partition_by))
            if problem:
                raise FailedPrecondition(f"table {table}: the batch does not fit the table at "
                                         f"version {layout.version}: {problem}")
            if write.deletion_vectors and not layout.protocol.has("deletionVectors"):
                raise FailedPrecondition(
                    f"table {table}: the row-level write keeps files with deletion vectors, "
                    "but the table's protocol has no deletionVectors feature (any more); "
                    "retry the batch from a fresh read")
            if write.mode == WriteMode.ROW_LEVEL and write.read_version > layout.version:
                raise FailedPrecondition(f"table {table}: read at version {write.read_version}"
                                         f", but its latest version is {layout.version}")
            if layout.append_only and not _adds_only(write):
                raise FailedPrecondition(f"table {table} has delta.appendOnly=true: a "
                                         f"{write.mode.value} write cannot remove its files")
        elif write.mode == WriteMode.ROW_LEVEL:
            raise FailedPrecondition(f"table {table}: a row-level write needs an existing table")
        _check_files(write, listings)
        self._check_partition_values(write, fields)
        check_row_level_write(write)  # I12: after the layout, so a schema change names itself

    def _check_location(self, table: str) -> None:
        """``check_table_location``, its pass remembered for LOCATION_CACHE_S: following a
        path's symlinks costs a system call per component and the roots' and the table's
        path rarely change. It is the policy of the coordinator's own name resolution
        (``RESOLVE_CACHE_S``): a symlink planted under a root takes effect within that time,
        and the apply checks again before it writes (refusals are never remembered)."""
        now = time.monotonic()
        if self._locations.get(table, 0.0) > now:
            return
        check_table_location(table, self.roots)
        if len(self._locations) >= MAX_SCHEMAS:
            self._locations.clear()
        self._locations[table] = now + LOCATION_CACHE_S

    def _schema(self, table: str, schema_json: str) -> tuple[str, dict[str, dict[str, Any]]]:
        """The write's schema as delta-rs writes it, and its fields by name (read-only)."""
        known = self._schemas.get(schema_json)
        if known is not None:
            return known
        schema = parse_schema(table, schema_json).to_json()
        if "\\u0000" in schema:  # delta-rs takes it, but no reader can name the column
            raise InvalidArgument(f"table {table}: a column name contains a NUL character")
        known = schema, {f["name"]: f for f in json.loads(schema)["fields"]}
        if len(self._schemas) >= MAX_SCHEMAS:
            self._schemas.clear()
        self._schemas[schema_json] = known
        return known

    def _mismatch(self, layout: TableLayout, schema: str,
                  partition_by: tuple[str, ...]) -> str | None:
        """``describe_schema_mismatch``, a pure function: a fit is remembered."""
        key = (layout.schema_json, schema, partition_by, tuple(layout.partition_columns))
        if key in self._fits:
            return None
        problem = describe_schema_mismatch(layout.schema_json, schema, list(partition_by),
                                           layout.partition_columns, layout.type_widening)
        if problem is None:
            if len(self._fits) >= MAX_SCHEMAS:
                self._fits.clear()
            self._fits.add(key)
        return problem

    def _check_partition_values(self, write: TableWriteRecord,
                                fields: dict[str, dict[str, Any]]) -> None:
        for column in write.partition_by:
            delta_type = json.dumps(fields[column]["type"])
            values = {a.partition_values.get(column) for a in write.add_files}
            unseen = sorted(v for v in values if v is not None
                            and (delta_type, v) not in self._parsed)
            if not unseen:
                continue
            try:
                _probe(fields[column], unseen)
            except BaseException as exc:  # noqa: BLE001 - a Rust panic is a BaseException
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                raise InvalidArgument(
                    f"table {write.table}: partition column {column!r} ({fields[column]['type']}"
                    f") has a value delta-rs cannot read as that type: {str(exc)[:200]}"
                ) from None
            if len(self._parsed) > MAX_REMEMBERED:
                self._parsed.clear()
            self._parsed.update((delta_type, v) for v in unseen)


def merge_problem(layout: TableLayout, schema: str,
                   partition_by: tuple[str, ...]) -> str | None:
    """Why a ``merge_schema`` write cannot be committed to the table, None if it can: its
    columns' types must be the table's, or widen them on a table with
    ``delta.enableTypeWidening=true`` (new columns and widened types are committed by the
    apply's own log entry)."""
    problems = []
    if list(partition_by) != list(layout.partition_columns):
        problems.append(f"partitioned by {layout.partition_columns}, not {list(partition_by)}")
    mapped = layout.column_mapping != "none"
    try:
        merged = merged_schema(layout.schema_json, schema, column_mapping=mapped,
                               type_widening=layout.type_widening)
    except SchemaConflict as conflict:
        problems.append(str(conflict))
    else:  # the new columns' ids and physical names are those the batch's files carry
        ntz = timestamp_ntz_problem(merged, layout.protocol.features)
        if ntz:
            problems.append(ntz)
        mapping = column_mapping_problem(layout.schema_json, merged, layout.max_column_id) \
            if mapped and added_columns(layout.schema_json, schema) else None
        if mapping:
            problems.append(f"{mapping} (on a column-mapped table ({layout.column_mapping}) "
                            "the write carries the table's schema with its new columns' ids "
                            "and physical names; write it with sparkside's txn.write)")
    return "; ".join(problems) or None


def _probe(field: dict[str, Any], values: list[str]) -> None:
    """Commits ``values`` of the partition column ``field`` to a throwaway in-memory table:
    delta-kernel parses them exactly as the apply will."""
    # without its metadata: delta-rs creates no table with column mapping ids
    schema = Schema.from_json(json.dumps({"type": "struct", "fields": [{**field, "metadata": {}}]}))
    adds = [AddAction(f"{i}.parquet", 1, {field["name"]: v}, 0, True, "{}")
            for i, v in enumerate(values)]
    create_table_with_add_actions(f"memory:///{uuid.uuid4().hex}", schema, adds,
                                  partition_by=[field["name"]])


def _check_form(write: TableWriteRecord, fields: dict[str, dict[str, Any]]) -> None:
    """What a write must be whatever the table: mode, partition columns, add paths."""
    table = write.table
    if not fields:
        raise InvalidArgument(f"table {table}: the schema has no columns")
    if write.replace_partitions and write.mode != WriteMode.OVERWRITE_PARTITIONS:
        raise InvalidArgument(f"table {table}: replace_partitions needs overwrite_partitions")
    if write.mode == WriteMode.OVERWRITE_PARTITIONS and not write.partition_by:
        raise InvalidArgument(f"table {table}: overwrite_partitions needs partition columns")
    columns = list(write.partition_by)
    if len(set(columns)) != len(columns):
        raise InvalidArgument(f"table {table}: a partition column is named twice in {columns}")
    missing = [c for c in columns if c not in fields]
    if missing:
        raise InvalidArgument(f"table {table}: partition columns {missing} are not in the "
                              f"schema (names are case-sensitive)")
    nested = [c for c in columns if not isinstance(fields[c]["type"], str)]
    if nested:
        raise InvalidArgument(f"table {table}: partition columns {nested} are not of a "
                              "primitive type")
    for add in write.add_files:
        segments = add.path.split("/")
        if "\x00" in add.path or "" in segments or "." in segments or ".." in segments:
            raise InvalidArgument(f"table {table}: file {add.path!r} has an empty, '.' or "
                                  "'..' segment or a NUL character")


def _check_files(write: TableWriteRecord,
                 listings: dict[str, Future[dict[str, tuple[int, int | None]]]]) -> None:
    """Every added file (and change data file) exists at ``<table>/<path>`` with the stated
    size (one stat each)."""
    if is_object_store(write.table):
        _check_objects(write, listings)
        return
    root = local_path(write.table)
    # below the table's folder whatever the path (a leading '/' never leaves it)
    folder = root if root.endswith("/") else f"{root}/"
    missing: list[str] = []
    wrong: list[str] = []
    for add in _written_files(write):
        try:
            info = os.stat(folder + add.path)
        except OSError:
            missing.append(add.path)
            continue
        if not stat.S_ISREG(info.st_mode):
            missing.append(add.path)
        elif info.st_size != add.size:
            wrong.append(f"{add.path} has {info.st_size} bytes, not {add.size}")
    _refuse_files(write, missing, wrong)


def _written_files(write: TableWriteRecord) -> list[AddFileRecord | ChangeFileRecord]:
    """The files the write's attempt wrote: adds, change data files and deletion vector files
    (each once, however many vectors it holds)."""
    vectors = {v.vector_path: ChangeFileRecord(v.vector_path, v.vector_file_size)
               for v in write.deletion_vectors}
    return [*write.add_files, *write.change_files, *vectors.values()]


def _start_listings(write: TableWriteRecord
                    ) -> dict[str, Future[dict[str, tuple[int, int | None]]]]:
    """On an object store, the listings ``_check_objects`` needs, started now: one recursive
    listing per attempt folder the add paths name (``_percolake/<txn_id>/``, one per write)."""
    if not is_object_store(write.table):
        return {}
    folders = {"/".join(add.path.split("/")[:2])
               for add in _written_files(write)
               if add.path.startswith(f"{ATTEMPT_DIR}/") and add.path.count("/") >= 2}
    return {folder: leaf_submit(storage.list_files, f"{write.table}/{folder}")
            for folder in sorted(folders)}


def _check_objects(write: TableWriteRecord,
                   listings: dict[str, Future[dict[str, tuple[int, int | None]]]]) -> None:
    """``_check_files`` on an object store: sizes compared from the listings of the attempt
    folders (``_start_listings``); a path elsewhere (the coordinator refuses those before)
    costs one HEAD."""
    sizes: dict[str, int] = {}
    for folder, listing in listings.items():
        sizes.update({f"{folder}/{path}": size for path, (size, _) in listing.result().items()})
    missing: list[str] = []
    wrong: list[str] = []
    for add in _written_files(write):
        listed_folder = "/".join(add.path.split("/")[:2]) in listings
        size = sizes.get(add.path) if listed_folder else storage.object_size(
            f"{write.table}/{add.path}")
        if size is None:
            missing.append(add.path)
        elif size != add.size:
            wrong.append(f"{add.path} has {size} bytes, not {add.size}")
    if missing:
        no_bucket = storage.missing_bucket_error(write.table, "check the files of")
        if no_bucket is not None:
            raise no_bucket
    _refuse_files(write, missing, wrong)


def _refuse_files(write: TableWriteRecord, missing: list[str], wrong: list[str]) -> None:
    problems = []
    if missing:
        problems.append(f"{len(missing)} files missing: {missing[:MAX_NAMED]}")
    if wrong:
        problems.append(f"{len(wrong)} files of another size: {'; '.join(wrong[:MAX_NAMED])}")
    if problems:
        raise FailedPrecondition(f"table {write.table}: {'; '.join(problems)}")


def _adds_only(write: TableWriteRecord) -> bool:
    """Whether a write only adds files: an append, or a row-level write that removes no file
    and gives none a deletion vector (delta-spark's MERGE that only inserts, which a
    ``delta.appendOnly`` table takes)."""
    return write.mode == WriteMode.APPEND or (
        write.mode == WriteMode.ROW_LEVEL and not write.remove_files
        and not write.deletion_vectors)
