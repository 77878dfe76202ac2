"""Input checks shared by every request: precise, actionable InvalidArgument messages.

Every number a client sends that ends in an int64 reply field, a SQLite column or a lock wait is
bounded here, before anything is recorded: nothing may fail after COMMITTED (I10), so
an out-of-range value is refused at prewrite, never discovered by a reply about a committed
transaction. JSON a client sends (schemas, file stats) is parsed with a depth bound and checked
for the shape the rest of the code walks, so no RecursionError or TypeError can surface later.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from typing import Any

from percolake.errors import InvalidArgument, ResourceExhausted
from percolake.lake.read_set import ReadSet
from percolake.lake.warehouse import ATTEMPT_DIR
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

INT64_MAX = 2**63 - 1
MAX_ID_LENGTH = 256
MAX_TABLES = 1000
# Applied reports an OpenTransaction may carry (a driver's unconfirmed ReportApplied calls).
MAX_APPLIED_REPORTS = 64
MAX_REASON_LENGTH = 1000
# One data file: exact in every JSON reader, also those that read numbers as doubles.
MAX_FILE_ROWS = 2**53 - 1
MAX_FILE_BYTES = 2**53 - 1
# One table's write: TableParticipant.row_count (int64) is the sum of its files' numRecords.
# No reply sums over a whole transaction; a new one that does must bound that sum here too.
MAX_WRITE_ROWS = INT64_MAX
MAX_WRITE_BYTES = INT64_MAX
MAX_MODIFICATION_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
# Timeouts become monotonic deadlines, lock and condition waits (threading refuses waits above
# threading.TIMEOUT_MAX, about 292 years) and Heartbeat's expires_in_ms (int64).
MAX_TXN_TIMEOUT_MS = 24 * 3600 * 1000
MAX_WAIT_MS = 3600 * 1000
# Nesting of schema and stats JSON (a Delta struct nests about 3 levels per column level).
MAX_JSON_DEPTH = 128

_HEX = "[0-9a-fA-F]"
_QUERY_ID = re.compile(f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}")
_NESTED_TYPES = {"struct": ("fields",), "array": ("elementType",), "map": ("keyType", "valueType")}
_FLAGS = ("nullable", "containsNull", "valueContainsNull")
# Categories never allowed in reasons (free text): control (but newline and tab), format (bidi
# controls, zero-width characters), line and paragraph separators, private use, surrogates and
# unassigned code points.
_HIDDEN_IN_TEXT = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
REPLACEMENT = "\ufffd"


# ------------------------------------------------------------------ ids and text

def check_id(name: str, value: str) -> None:
    """An id (pipeline, transaction) is printable text: no control, invisible, direction-
    changing or unassigned characters, no separators but the ASCII space, no outer blanks."""
    if not value or not value.strip():
        raise InvalidArgument(f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH}")
    if not value.isprintable():  # Unicode "Other" and "Separator" categories but the space
        char = next(c for c in value if not c.isprintable())
        raise InvalidArgument(
            f"{name} {value[:80]!r} contains {describe_char(char)}: control characters, "
            "invisible or direction-changing characters and separators other than the space "
            "are not allowed in ids")
    if value != value.strip():
        raise InvalidArgument(f"{name} {value[:80]!r} has surrounding blanks")


def describe_char(char: str) -> str:
    """``U+202E (RIGHT-TO-LEFT OVERRIDE)``: a character named for a person to act on."""
    name = unicodedata.name(char, unicodedata.category(char))
    return f"U+{ord(char):04X} ({name})"


MAX_CATALOG_NAME = 1024  # characters of a table's catalog name (display only)


def check_text(name: str, value: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {limit}")


def clean_reason(reason: str) -> str:
    """A reason (free text, often an exception message) with every hidden character replaced
    by U+FFFD, keeping newlines and tabs. Never refused for its characters, so an abort cannot
    fail for its message; the length stays, so the length limit reads the same."""
    if reason.isprintable():
        return reason
    return "".join(REPLACEMENT if _hidden_in_text(c) else c for c in reason)


def _hidden_in_text(char: str) -> bool:
    return char not in "\n\t" and unicodedata.category(char) in _HIDDEN_IN_TEXT


def check_query_id(query_id: str | None) -> None:
    """A Spark streaming query id, when present, is a UUID in its canonical text form."""
    if query_id is None:
        return
    if not _QUERY_ID.fullmatch(query_id):
        raise InvalidArgument(
            f"query_id {query_id[:80]!r} is not a Spark query id (a UUID such as "
            "'c0ffee00-1234-4abc-8def-0123456789ab'); omit it or send the streaming query's id"
        )


# ------------------------------------------------------------------ numbers

def check_non_negative(name: str, value: int) -> None:
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")


def check_epoch(epoch: int | None) -> None:
    if epoch is not None and epoch < 0:
        raise InvalidArgument(f"epoch must be >= 0, got {epoch}")


def check_range(name: str, value: int, most: int, unit: str = "") -> None:
    """``0 <= value <= most``, or an InvalidArgument naming the bound."""
    check_non_negative(name, value)
    if value > most:
        raise InvalidArgument(f"{name} must be at most {most}{unit}, got {value}")


def check_timeout_ms(name: str, value: int, most: int) -> None:
    """A timeout in milliseconds: 0 (the coordinator's default) up to ``most``."""
    check_range(name, value, most, f" ms ({most / 1000:g} s)")


def check_count(name: str, count: int, most: int = MAX_TABLES) -> None:
    """How many items of one kind a request carries."""
    if count > most:
        raise ResourceExhausted(f"{count} {name} in one request; at most {most}")


# ------------------------------------------------------------------ JSON

def parse_json(what: str, text: str) -> Any:
    """Standard JSON (no NaN or Infinity) nested at most MAX_JSON_DEPTH levels."""
    try:
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidArgument(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # also too many digits, and the two hooks below
        raise InvalidArgument(f"{what} is not JSON ({exc})") from None
    # Each level needs its own opening bracket: with no more brackets than the limit in the
    # text (those inside strings only add to the count), no walk is needed.
    if (text.count("{") + text.count("[") > MAX_JSON_DEPTH
            and _deeper_than(value, MAX_JSON_DEPTH)):
        raise InvalidArgument(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


# json.loads with hooks builds a decoder per call; one shared decoder does the same parse
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


# ------------------------------------------------------------------ schemas

_ACCEPTED_SCHEMAS: dict[str, frozenset[str]] = {}  # schema_json -> its columns (pure)
MAX_ACCEPTED_SCHEMAS = 1024


def check_schema(table: str, schema_json: str) -> set[str]:
    """A Delta struct schema of the shape the applier and the schema checks walk.

    The verdict depends on the text alone; accepted schemas are remembered (a stream sends
    the same one every batch), refusals never.

    Returns:
        The names of its top-level columns.
    """
    accepted = _ACCEPTED_SCHEMAS.get(schema_json)
    if accepted is not None:
        return set(accepted)
    columns = _check_schema(table, schema_json)
    if len(_ACCEPTED_SCHEMAS) >= MAX_ACCEPTED_SCHEMAS:
        _ACCEPTED_SCHEMAS.clear()
    _ACCEPTED_SCHEMAS[schema_json] = frozenset(columns)
    return columns


def _check_schema(table: str, schema_json: str) -> set[str]:
    what = f"table {table}: schema_json"
    schema = parse_json(what, schema_json)
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        raise InvalidArgument(
            f'{what} must be a Delta struct schema ({{"type": "struct", "fields": [...]}})')
    if not schema.get("fields"):
        raise InvalidArgument(f"{what}: a table needs at least one column in fields")
    return _check_struct(what, schema, "the schema")


def _check_struct(what: str, struct: dict[str, Any], where: str) -> set[str]:
    fields = struct.get("fields")
    if not isinstance(fields, list):
        raise InvalidArgument(f"{what}: fields of {where} must be a list of fields")
    seen: set[str] = set()
    names: set[str] = set()
    for field in fields:
        name = _check_field(what, field, where)
        if name.lower() in seen:
            raise InvalidArgument(f"{what}: column {name!r} of {where} appears twice "
                                  "(column names are case-insensitive)")
        seen.add(name.lower())
        names.add(name)
    return names


def _check_field(what: str, field: object, where: str) -> str:
    if not isinstance(field, dict):
        raise InvalidArgument(f"{what}: each field of {where} must be an object with a name "
                              f"and a type, got {json.dumps(field)[:80]}")
    name = field.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what}: a field of {where} has no name (a non-empty string)")
    if "type" not in field:
        raise InvalidArgument(f"{what}: column {name!r} of {where} has no type")
    _check_flags(what, field, f"column {name!r}")
    if not isinstance(field.get("metadata", {}), dict):
        raise InvalidArgument(f"{what}: metadata of column {name!r} must be an object")
    _check_type(what, field["type"], f"column {name!r}")
    return name


def _check_type(what: str, data_type: object, where: str) -> None:
    if isinstance(data_type, str) and data_type:
        return  # a primitive type; its name is checked where the schema is parsed for Delta
    kind = data_type.get("type") if isinstance(data_type, dict) else None
    if not isinstance(kind, str) or kind not in _NESTED_TYPES:
        raise InvalidArgument(f"{what}: the type of {where} must be a type name or a struct, "
                              f"array or map type, got {json.dumps(data_type)[:80]}")
    for key in _NESTED_TYPES[kind]:
        if key not in data_type:
            raise InvalidArgument(f"{what}: the {kind} type of {where} has no {key}")
    _check_flags(what, data_type, where)
    if kind == "struct":
        _check_struct(what, data_type, where)
    else:
        for key in _NESTED_TYPES[kind]:
            _check_type(what, data_type[key], f"{where}.{key}")


def _check_flags(what: str, node: dict[str, Any], where: str) -> None:
    for flag in _FLAGS:
        if flag in node and not isinstance(node[flag], bool):
            raise InvalidArgument(f"{what}: {flag} of {where} must be true or false")


# ------------------------------------------------------------------ write intents

def check_table_write(write: TableWriteRecord, txn_id: str, max_bytes: int) -> None:
    """Checks one write intent: its schema, files inside the attempt's location with numbers
    in range, consistent partitions, and its size."""
    if not isinstance(write.mode, WriteMode):
        raise InvalidArgument(f"table {write.table}: unknown write mode {write.mode!r}")
    columns = check_schema(write.table, write.schema_json)
    check_text(f"table {write.table}: catalog_name", write.catalog_name, MAX_CATALOG_NAME)
    missing = [c for c in write.partition_by if c not in columns]
    if missing:
        raise InvalidArgument(f"table {write.table}: partition columns {missing} not in schema")
    rows = _check_files(write, txn_id)
    _check_partitions(write)
    _check_row_level(write, txn_id)
    size = len(write.json_text)  # the encoding the store keeps (encoded once, reused there)
    if size > max_bytes:
        raise ResourceExhausted(
            f"table {write.table}: write intent is {size} bytes, over the limit of {max_bytes}; "
            "write fewer, larger files per batch (it is never truncated)")
    write.remember_row_count(rows)


def _check_files(write: TableWriteRecord, txn_id: str) -> int:
    """The files' paths, numbers and stats; returns their rows (numRecords added up)."""
    if len({add.path for add in write.add_files}) != len(write.add_files):
        counts = Counter(add.path for add in write.add_files)
        twice = sorted(p for p, n in counts.items() if n > 1)[:3]
        raise InvalidArgument(f"table {write.table}: files listed twice: {twice}")
    partitions = set(write.partition_by)
    prefix = f"{ATTEMPT_DIR}/{txn_id}/"  # what is the same for every file, computed once
    rows = size = 0
    for add in write.add_files:
        _check_file_path(write.table, add.path, prefix)
        _check_file_numbers(write.table, add)
        if (partitions or add.partition_values) and set(add.partition_values) != partitions:
            raise InvalidArgument(
                f"table {write.table}: file {add.path} has partition values for "
                f"{sorted(add.partition_values)}, the table is partitioned by {sorted(partitions)}")
        rows += check_stats(write.table, add.path, add.stats) if add.stats else 0
        size += add.size
    if rows > MAX_WRITE_ROWS:
        raise InvalidArgument(
            f"table {write.table}: the files' numRecords add up to {rows} rows; at most "
            f"{MAX_WRITE_ROWS} rows in one table's write (split the batch)")
    if size > MAX_WRITE_BYTES:
        raise InvalidArgument(f"table {write.table}: the files' sizes add up to {size} bytes; "
                              f"at most {MAX_WRITE_BYTES} in one table's write")
    return rows


def _check_file_path(table: str, path: str, prefix: str) -> None:
    # String checks, same verdict as PurePosixPath's is_absolute/parts (this runs per file)
    parts = path.split("/")
    if (path.startswith("/") or not path.startswith(prefix)
            or "" in parts or "." in parts or ".." in parts):
        raise InvalidArgument(
            f"table {table}: file {path!r} must be a relative path under {prefix}")
    if "\x00" in path:
        raise InvalidArgument(f"table {table}: file path {path!r} contains a NUL character")


# WRITE: an append of the batch beside its row-level operations on the table
ROW_LEVEL_OPERATIONS = ("MERGE", "UPDATE", "DELETE", "OPTIMIZE", "WRITE")
REARRANGING_OPERATION = "OPTIMIZE"  # alone, and the only one with data_change=False


def _check_row_level(write: TableWriteRecord, txn_id: str) -> None:
    """A ROW_LEVEL write names the version it read, its operations and removes of files of
    the table (never of its own attempt folder); other modes carry none of these."""
    table = write.table
    if write.mode != WriteMode.ROW_LEVEL:
        if write.remove_files:
            raise InvalidArgument(f"table {table}: remove_files needs the ROW_LEVEL mode")
        if write.change_files:
            raise InvalidArgument(f"table {table}: change_files needs the ROW_LEVEL mode")
        if write.deletion_vectors:
            raise InvalidArgument(f"table {table}: deletion_vectors needs the ROW_LEVEL mode")
        return
    if write.read_version < 0:
        raise InvalidArgument(f"table {table}: a ROW_LEVEL write needs the read_version it "
                              "read (the table must exist)")
    operations = write.operation.split(",")
    if not all(op in ROW_LEVEL_OPERATIONS for op in operations):
        raise InvalidArgument(f"table {table}: operation {write.operation[:80]!r} must list "
                              f"{'/'.join(ROW_LEVEL_OPERATIONS)} separated by commas")
    if REARRANGING_OPERATION in operations and len(operations) > 1:
        raise InvalidArgument(f"table {table}: {REARRANGING_OPERATION} is a write of its own, "
                              "never composed with other operations")
    if (write.operation == REARRANGING_OPERATION) == write.data_change:
        raise InvalidArgument(f"table {table}: a write only rearranges rows "
                              "(rearranges_only, Delta's dataChange=false) exactly when its "
                              f"operation is {REARRANGING_OPERATION}")
    if write.operation_metrics:
        metrics = parse_json(f"table {table}: operation_metrics", write.operation_metrics)
        if not isinstance(metrics, dict):
            raise InvalidArgument(f"table {table}: operation_metrics must be a JSON object")
    if write.operation_parameters:
        parameters = parse_json(f"table {table}: operation_parameters",
                                write.operation_parameters)
        if not isinstance(parameters, dict) or not all(
                isinstance(v, str) for v in parameters.values()):
            raise InvalidArgument(f"table {table}: operation_parameters must be a JSON object "
                                  "of strings")
    if write.read_set:
        read_set = parse_json(f"table {table}: read_set", write.read_set)
        try:
            ReadSet.from_data(read_set)
        except ValueError as exc:
            raise InvalidArgument(f"table {table}: read_set: {exc}") from None
    removed = Counter(f.path for f in write.remove_files)
    twice = sorted(p for p, n in removed.items() if n > 1)[:3]
    if twice:
        raise InvalidArgument(f"table {table}: files removed twice: {twice}")
    added = {f.path for f in write.add_files} & set(removed)
    if added:
        raise InvalidArgument(f"table {table}: files both added and removed: "
                              f"{sorted(added)[:3]}")
    partitions = set(write.partition_by)
    _check_change_files(write, txn_id)
    _check_deletion_vectors(write, txn_id, set(removed))
    for remove in write.remove_files:
        parts = remove.path.split("/")
        if (remove.path.startswith("/") or "://" in remove.path
                or remove.path.startswith(f"{ATTEMPT_DIR}/{txn_id}/")
                or any(p in ("", ".", "..") for p in parts) or "\x00" in remove.path):
            raise InvalidArgument(f"table {table}: removed file {remove.path[:200]!r} must be a "
                                  "relative path of a data file of the table")
        if remove.size < 0:
            raise InvalidArgument(f"table {table}: removed file {remove.path} has negative "
                                  "size")
        if set(remove.partition_values) != partitions:
            raise InvalidArgument(
                f"table {table}: removed file {remove.path} has partition values for "
                f"{sorted(remove.partition_values)}, the table is partitioned by "
                f"{sorted(partitions)}")


_VECTOR_FILE = re.compile(r"deletion_vector_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                          r"[0-9a-f]{12}\.bin")


def _check_deletion_vectors(write: TableWriteRecord, txn_id: str, removed: set[str]) -> None:
    """Files kept with a deletion vector: each a file the write removes (as it was), once; its
    vector in a ``deletion_vector_<uuid>.bin`` file of the attempt's folder, whole inside it
    (version byte, then size, data and checksum), deleting at least one row."""
    table = write.table
    seen: set[str] = set()
    file_sizes: dict[str, int] = {}
    for vector in write.deletion_vectors:
        if vector.path in seen:
            raise InvalidArgument(f"table {table}: file {vector.path} has two deletion vectors")
        seen.add(vector.path)
        if vector.path not in removed:
            raise InvalidArgument(
                f"table {table}: file {vector.path} gets a deletion vector but is not among "
                "the removed files (the commit removes it as it was and adds it with the "
                "vector)")
        _check_file_path(table, vector.vector_path, f"{ATTEMPT_DIR}/{txn_id}/")
        if not _VECTOR_FILE.fullmatch(vector.vector_path.rsplit("/", 1)[-1]):
            raise InvalidArgument(f"table {table}: deletion vector file {vector.vector_path!r} "
                                  "must be named deletion_vector_<uuid>.bin")
        size = file_sizes.setdefault(vector.vector_path, vector.vector_file_size)
        if size != vector.vector_file_size:
            raise InvalidArgument(f"table {table}: deletion vector file {vector.vector_path} "
                                  "is given two sizes")
        if not (vector.offset >= 1 and vector.size_in_bytes > 0
                and vector.offset + vector.size_in_bytes + 8 <= vector.vector_file_size
                <= MAX_FILE_BYTES):
            raise InvalidArgument(
                f"table {table}: the deletion vector of {vector.path} (offset {vector.offset}, "
                f"{vector.size_in_bytes} bytes) does not lie inside its file of "
                f"{vector.vector_file_size} bytes")
        if not 1 <= vector.cardinality <= MAX_FILE_ROWS:
            raise InvalidArgument(f"table {table}: the deletion vector of {vector.path} has "
                                  f"cardinality {vector.cardinality}; 1 to {MAX_FILE_ROWS}")
        if not 0 <= vector.modification_time <= MAX_MODIFICATION_TIME_MS:
            raise InvalidArgument(f"table {table}: file {vector.path} has modification_time "
                                  f"{vector.modification_time}")
        if vector.stats:
            check_stats(table, vector.path, vector.stats)


def _check_change_files(write: TableWriteRecord, txn_id: str) -> None:
    """Change data files (cdc actions) lie in the attempt's folder, once each, apart from the
    add files, with sizes and the table's partition columns."""
    table = write.table
    paths = Counter(f.path for f in write.change_files)
    twice = sorted(p for p, n in paths.items() if n > 1)[:3]
    if twice:
        raise InvalidArgument(f"table {table}: change files listed twice: {twice}")
    also_added = sorted({f.path for f in write.add_files} & set(paths))[:3]
    if also_added:
        raise InvalidArgument(f"table {table}: files both added and change files: "
                              f"{also_added}")
    partitions = set(write.partition_by)
    for change in write.change_files:
        _check_file_path(table, change.path, f"{ATTEMPT_DIR}/{txn_id}/")
        if not 0 <= change.size <= MAX_FILE_BYTES:
            raise InvalidArgument(f"table {table}: change file {change.path} has size "
                                  f"{change.size}; 0 to {MAX_FILE_BYTES} bytes per file")
        if set(change.partition_values) != partitions:
            raise InvalidArgument(
                f"table {table}: change file {change.path} has partition values for "
                f"{sorted(change.partition_values)}, the table is partitioned by "
                f"{sorted(partitions)}")


def _check_file_numbers(table: str, add: AddFileRecord) -> None:
    if 0 <= add.size <= MAX_FILE_BYTES and 0 <= add.modification_time <= \
            MAX_MODIFICATION_TIME_MS:
        return  # the usual case in one test; the refusals below name what is wrong
    if add.size < 0:
        raise InvalidArgument(f"table {table}: file {add.path} has negative size")
    if add.size > MAX_FILE_BYTES:
        raise InvalidArgument(f"table {table}: file {add.path} has size {add.size}; at most "
                              f"{MAX_FILE_BYTES} bytes per file")
    if not 0 <= add.modification_time <= MAX_MODIFICATION_TIME_MS:
        raise InvalidArgument(
            f"table {table}: file {add.path} has modification_time {add.modification_time}; "
            f"it is unix milliseconds in 0..{MAX_MODIFICATION_TIME_MS} (before year 10000)")


def _check_partitions(write: TableWriteRecord) -> None:
    partitions = set(write.partition_by)
    if write.replace_partitions and write.mode != WriteMode.OVERWRITE_PARTITIONS:
        raise InvalidArgument(f"table {write.table}: replace_partitions needs OVERWRITE_PARTITIONS")
    if write.mode == WriteMode.OVERWRITE_PARTITIONS and not write.partition_by:
        raise InvalidArgument(
            f"table {write.table}: overwrite_partitions needs a partitioned table (partition_by)")
    for spec in write.replace_partitions:
        if set(spec) != partitions:
            raise InvalidArgument(
                f"table {write.table}: a replaced partition names {sorted(spec)}, "
                f"the table is partitioned by {sorted(partitions)}")


def check_stats(table: str, path: str, stats: str) -> int:
    """Delta file stats: a JSON object whose numRecords, when present, is a count of at most
    MAX_FILE_ROWS, and whose nullCount values are counts.

    Returns:
        numRecords (0 when absent).
    """
    parsed = parse_json(f"table {table}: stats of {path}", stats)
    if type(parsed) is not dict:  # json builds plain dicts: the same as isinstance
        raise InvalidArgument(f"table {table}: stats of {path} must be a JSON object")
    rows = parsed.get("numRecords", 0)
    if not (type(rows) is int and 0 <= rows <= MAX_FILE_ROWS):  # bool is not int here
        raise InvalidArgument(
            f"table {table}: numRecords in the stats of {path} must be a count of at most "
            f"{MAX_FILE_ROWS}, got {json.dumps(rows)[:40]}")
    if "nullCount" in parsed and not _counts_only(parsed["nullCount"]):
        raise InvalidArgument(
            f"table {table}: nullCount in the stats of {path} must map columns to counts of "
            f"at most {INT64_MAX}")
    return rows


def _is_count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _counts_only(value: object) -> bool:
    """nullCount: counts, or for struct columns objects of counts (depth already bounded).
    A flat object's counts are checked in the loop (this runs for every file)."""
    if type(value) is not dict:
        return _is_count(value, INT64_MAX)
    for count in value.values():
        if type(count) is int:
            if not 0 <= count <= INT64_MAX:
                return False
        elif not _counts_only(count):
            return False
    return True
