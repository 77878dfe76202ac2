"""Unit tests of the input checks (coordinator/validation.py) and of what they protect: the
codec's int64 reply fields, SQLite parameters, lock waits and every walker of client JSON.

Issue 13 item 4 (numbers bounded before the commit point) and item 14 (no input reaches an
unhandled exception). Generated inputs use fixed seeds, so a failure reproduces.
"""

from __future__ import annotations

import base64
import json
import random
import sys
import threading
import unicodedata
from typing import Any

import pytest

from coordinator import validation as v
from coordinator.servicer import _after_start_ts, _page_token
from percolake import codec
from percolake.errors import InvalidArgument, ResourceExhausted
from percolake.lake.delta_commit import describe_schema_mismatch
from percolake.records import AddFileRecord, TableEntry, TableWriteRecord, TxnRecord, WriteMode
from percolake.states import TxnState

TXN = "0123456789abcdef0123456789abcdef"
TABLE = "file:///wh/t"
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "day", "type": "string", "nullable": True, "metadata": {}}]})
BIG_INTENT = 1 << 40


def a_file(i: int, rows: object, size: int = 100, mtime: int = 1_700_000_000_000,
           stats: str | None = None) -> AddFileRecord:
    return AddFileRecord(path=f"_percolake/{TXN}/part-{i:05d}.parquet", size=size,
                         modification_time=mtime,
                         stats=json.dumps({"numRecords": rows}) if stats is None else stats)


def a_write(files: list[AddFileRecord], schema: str = SCHEMA) -> TableWriteRecord:
    return TableWriteRecord(table=TABLE, mode=WriteMode.APPEND, add_files=tuple(files),
                            schema_json=schema)


def encoded(write: TableWriteRecord) -> Any:
    """The write as every reply about its transaction carries it, serialised to bytes."""
    txn = TxnRecord(txn_id=TXN, pipeline_id="p", generation=0, batch_id=0, attempt=1, epoch=0,
                    query_id="", state=TxnState.COMMITTED, start_ts=1, commit_ts=2,
                    tables={TABLE: TableEntry(TABLE, f"{TABLE}/_percolake/{TXN}", write)})
    message = codec.txn_to_pb(txn, include_writes=True)
    message.SerializeToString()  # raises ValueError on an out-of-range int64
    return message.participants[0]


# ------------------------------------------------------------------ item 4: numbers


def test_the_largest_accepted_write_encodes_with_its_exact_row_count():
    files = [a_file(i, v.MAX_FILE_ROWS) for i in range(1024)] + [a_file(1024, 1023)]
    write = a_write(files)
    assert sum(f.row_count() for f in files) == v.INT64_MAX

    v.check_table_write(write, TXN, BIG_INTENT)

    assert encoded(write).row_count == v.INT64_MAX


def test_one_row_more_than_int64_is_refused():
    files = [a_file(i, v.MAX_FILE_ROWS) for i in range(1024)] + [a_file(1024, 1024)]
    with pytest.raises(InvalidArgument, match=f"add up to {2**63} rows"):
        v.check_table_write(a_write(files), TXN, BIG_INTENT)


@pytest.mark.parametrize("rows", [v.MAX_FILE_ROWS + 1, 2**63, 2**64, 10**40, -1, 1.5, True,
                                  "7", None])
def test_a_file_row_count_out_of_range_is_refused(rows):
    with pytest.raises(InvalidArgument, match="numRecords"):
        v.check_table_write(a_write([a_file(0, rows)]), TXN, BIG_INTENT)


def _random_rows(rng: random.Random) -> object:
    return rng.choice([0, 1, rng.randrange(10**6), v.MAX_FILE_ROWS, v.MAX_FILE_ROWS + 1,
                       rng.randrange(2**70), 2**63 - 1, 2**63, -rng.randrange(1, 10)])


def test_the_codec_cannot_overflow_for_any_accepted_write():
    """Generated writes (boundary row counts, many files): each is refused with
    InvalidArgument, or accepted and then encoded with its exact row count."""
    rng = random.Random(13)
    accepted = refused = 0
    for _ in range(300):
        count = rng.choice([1, 2, 10, rng.randrange(1, 2000)])
        files = [a_file(i, _random_rows(rng)) for i in range(count)]
        write = a_write(files)
        try:
            v.check_table_write(write, TXN, BIG_INTENT)
        except InvalidArgument:
            refused += 1
            continue
        accepted += 1
        assert encoded(write).row_count == sum(f.row_count() for f in files) <= v.INT64_MAX
    assert accepted > 50 and refused > 50, (accepted, refused)


def test_the_codec_saturates_a_stored_row_count_beyond_int64():
    """A record stored before the bounds (nothing accepts one now) still gets its replies."""
    write = a_write([a_file(0, 2**70), a_file(1, 2**70)])
    assert encoded(write).row_count == v.INT64_MAX


@pytest.mark.parametrize(("size", "mtime", "words"), [
    (-1, 0, "negative size"), (v.MAX_FILE_BYTES + 1, 0, "size"), (2**63 - 1, 0, "size"),
    (1, -1, "modification_time"), (1, v.MAX_MODIFICATION_TIME_MS + 1, "modification_time"),
])
def test_file_size_and_time_out_of_range_are_refused(size, mtime, words):
    with pytest.raises(InvalidArgument, match=words):
        v.check_table_write(a_write([a_file(0, 1, size, mtime)]), TXN, BIG_INTENT)


def test_sizes_adding_up_beyond_int64_are_refused():
    files = [a_file(i, 1, size=v.MAX_FILE_BYTES) for i in range(1025)]
    with pytest.raises(InvalidArgument, match="sizes add up"):
        v.check_table_write(a_write(files), TXN, BIG_INTENT)


@pytest.mark.parametrize("stats", [
    '{"numRecords": 1, "nullCount": {"id": 18446744073709551616}}',
    '{"numRecords": 1, "nullCount": {"id": -1}}',
    '{"numRecords": 1, "nullCount": {"s": {"x": "many"}}}',
    '{"numRecords": 1, "minValues": {"id": NaN}}',
    '{"numRecords": 1, "maxValues": {"id": -Infinity}}',
    '{"numRecords": 1, "maxValues": {"id": 1e400}}',
    '{"numRecords": ' + "9" * 5000 + "}",
])
def test_stats_numbers_that_no_delta_reader_takes_are_refused(stats):
    with pytest.raises(InvalidArgument, match="stats|nullCount"):
        v.check_stats(TABLE, "f", stats)


def test_timeouts_fit_every_wait_and_reply_they_reach():
    for most in (v.MAX_TXN_TIMEOUT_MS, v.MAX_WAIT_MS):
        assert most / 1000 < threading.TIMEOUT_MAX
        assert threading.Lock().acquire(timeout=most / 1000)
        assert int(most / 1000 * 1000) <= v.INT64_MAX  # Heartbeat's expires_in_ms
    with pytest.raises(OverflowError):  # what an unbounded wait_timeout_ms reached
        threading.Lock().acquire(timeout=v.INT64_MAX / 1000)
    with pytest.raises(InvalidArgument, match="at most 86400000 ms"):
        v.check_timeout_ms("timeout_ms", v.MAX_TXN_TIMEOUT_MS + 1, v.MAX_TXN_TIMEOUT_MS)
    with pytest.raises(InvalidArgument, match=">= 0"):
        v.check_timeout_ms("wait_timeout_ms", -1, v.MAX_WAIT_MS)
    v.check_timeout_ms("timeout_ms", 0, v.MAX_TXN_TIMEOUT_MS)


def test_request_list_lengths_are_bounded():
    v.check_count("tables", v.MAX_TABLES)
    with pytest.raises(ResourceExhausted, match="1001 tables in one request; at most 1000"):
        v.check_count("tables", v.MAX_TABLES + 1)


@pytest.mark.parametrize("start_ts", [0, 1, 470669654634266624, v.INT64_MAX])
def test_page_tokens_round_trip(start_ts):
    assert _after_start_ts(_page_token(start_ts)) == start_ts


@pytest.mark.parametrize("value", ["9" * 30, str(2**63), "-5", "+5", "05", " 5", "5_000",
                                   "\u0665", "\uff15", "", "1.0"])
def test_page_tokens_holding_anything_but_an_int64_are_refused(value):
    token = base64.urlsafe_b64encode(f"ts:{value}".encode()).decode()
    with pytest.raises(InvalidArgument, match="page_token"):
        _after_start_ts(token)


@pytest.mark.parametrize("token", ["not a token!", "é", "dHM6MQ", "=" * 8, "ts:1"])
def test_page_tokens_that_are_not_base64_are_refused(token):
    with pytest.raises(InvalidArgument, match="page_token"):
        _after_start_ts(token)


# ------------------------------------------------------------------ item 14: JSON


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"a":' * 100_000 + "1" + "}" * 100_000,
                                  "[" * (v.MAX_JSON_DEPTH + 1) + "]" * (v.MAX_JSON_DEPTH + 1)])
def test_deep_json_is_refused_not_a_recursion_error(text):
    with pytest.raises(InvalidArgument, match="nested more than 128 levels"):
        v.parse_json("stats", text)


def test_deep_json_is_refused_also_on_a_deep_stack():
    """The bound holds however deep the caller's stack already is (the C parser raises
    RecursionError earlier there)."""
    def at_depth(n: int) -> None:
        if n:
            return at_depth(n - 1)
        with pytest.raises(InvalidArgument, match="nested"):
            v.parse_json("schema_json", "[" * 500 + "]" * 500)
    at_depth(sys.getrecursionlimit() - 100)


def test_json_at_the_depth_bound_is_accepted():
    depth = v.MAX_JSON_DEPTH
    assert v.parse_json("x", "[" * depth + "]" * depth) is not None


def _random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(8 if depth < 4 else 5)
    scalars = [None, True, 5, -1, 2.5, "", "long", "struct", "array", "map", "id"]
    if kind < 5:
        return rng.choice(scalars)
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    keys = ["type", "fields", "name", "elementType", "keyType", "valueType", "nullable",
            "metadata", "containsNull"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def _mutated_schema(rng: random.Random) -> object:
    field = {"name": "id", "type": "long", "nullable": True, "metadata": {}}
    nested = {"name": "s", "type": {"type": "struct", "fields": [dict(field)]}}
    schema: dict[str, Any] = {"type": "struct", "fields": [dict(field), nested]}
    target = rng.choice([schema, schema["fields"][0], nested, nested["type"],
                         nested["type"]["fields"][0]])
    target[rng.choice(list(target) + ["elementType"])] = _random_json(rng)
    return schema


def test_schemas_of_any_shape_are_refused_or_walkable():
    """Generated schema JSON: refused with InvalidArgument, or accepted and then walked by the
    schema comparison without a TypeError or KeyError."""
    rng = random.Random(14)
    outcomes = {"accepted": 0, "refused": 0}
    for _ in range(3000):
        schema = _mutated_schema(rng) if rng.random() < 0.8 else _random_json(rng)
        text = json.dumps(schema)
        try:
            columns = v.check_schema(TABLE, text)
        except InvalidArgument:
            outcomes["refused"] += 1
            continue
        outcomes["accepted"] += 1
        assert columns == {f["name"] for f in schema["fields"]}
        assert describe_schema_mismatch(text, text, [], []) is None
    assert min(outcomes.values()) > 100, outcomes


@pytest.mark.parametrize(("schema", "words"), [
    ({"fields": 5, "type": "struct"}, "must be a list"),
    ({"type": "struct", "fields": [1, 2]}, "must be an object"),
    ({"type": "struct", "fields": []}, "at least one column"),
    ({"fields": [{"name": "a", "type": "long"}]}, "struct schema"),
    ({"type": "struct", "fields": [{"name": "", "type": "long"}]}, "no name"),
    ({"type": "struct", "fields": [{"name": "a", "type": ""}]}, "type name"),
    ({"type": "struct", "fields": [{"name": "a", "type": {"type": "map", "keyType": "x"}}]},
     "no valueType"),
    ({"type": "struct", "fields": [{"name": "a", "type": {"type": "udt"}}]}, "struct, array"),
    ({"type": "struct", "fields": [{"name": "a", "type": "long", "nullable": "yes"}]},
     "nullable"),
    ({"type": "struct", "fields": [{"name": "a", "type": "long", "metadata": []}]},
     "metadata"),
    ({"type": "struct", "fields": [{"name": "a", "type": "long"}, {"name": "A", "type": "int"}]},
     "twice"),
])
def test_schema_shapes_are_named(schema, words):
    with pytest.raises(InvalidArgument, match=words):
        v.check_schema(TABLE, json.dumps(schema))


def test_nested_schemas_of_real_tables_are_accepted():
    schema = {"type": "struct", "fields": [
        {"name": "m", "type": {"type": "map", "keyType": "string", "valueType": {
            "type": "array", "elementType": {"type": "struct", "fields": [
                {"name": "x", "type": "decimal(10,2)", "nullable": True, "metadata": {}}]},
            "containsNull": True}, "valueContainsNull": True}, "nullable": True,
         "metadata": {"comment": "c"}}]}
    assert v.check_schema(TABLE, json.dumps(schema)) == {"m"}


def test_stats_of_any_shape_are_refused_or_counted():
    rng = random.Random(15)
    for _ in range(2000):
        stats = {"numRecords": rng.choice([1, 0, -1, None, "x", 2**63, 2**53 - 1, [1]])}
        for key in rng.sample(["minValues", "maxValues", "nullCount", "tightBounds"], 2):
            stats[key] = _random_json(rng)
        text = json.dumps(stats)
        try:
            rows = v.check_stats(TABLE, "f", text)
        except InvalidArgument:
            continue
        assert rows == a_file(0, None, stats=text).row_count() <= v.MAX_FILE_ROWS


@pytest.mark.parametrize("path", [f"_percolake/{TXN}/a\x00b.parquet", f"_percolake/{TXN}/",
                                  f"_percolake/{TXN}//x.parquet", f"_percolake/{TXN}/./x"])
def test_file_paths_the_filesystem_cannot_take_are_refused(path):
    write = a_write([AddFileRecord(path=path, size=1)])
    with pytest.raises(InvalidArgument, match="path"):
        v.check_table_write(write, TXN, BIG_INTENT)


# ------------------------------------------------------------------ item 14: ids and text

REFUSED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"}
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_ids_refuse_every_hidden_character_and_only_those():
    """Every code point: refused in an id exactly when it is a control, format (bidi, zero
    width), separator other than the space, private-use, surrogate or unassigned one."""
    wrong = []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        category = unicodedata.category(char)
        if category in ("Cn", "Co", "Cs") and code % 61:
            continue  # about a million code points of three categories: a sample of them
        hidden = category in REFUSED_CATEGORIES or (category == "Zs" and char != " ")
        try:
            v.check_id("pipeline_id", f"a{char}b")
            refused = False
        except InvalidArgument as exc:
            refused = True
            assert f"U+{code:04X}" in str(exc)
        if refused != hidden:
            wrong.append(f"U+{code:04X} {category}")
    assert not wrong, wrong[:20]


@pytest.mark.parametrize("char", list(BIDI_CONTROLS))
def test_ids_refuse_each_bidi_control_by_name(char):
    with pytest.raises(InvalidArgument, match=unicodedata.name(char)):
        v.check_id("pipeline_id", f"orders{char}")


@pytest.mark.parametrize("value", ["orders", "Zahlungen-Ausgänge", "注文 2026", "a.b_c:d/e",
                                   "🦆 pipeline"])
def test_ids_of_printable_text_are_accepted(value):
    v.check_id("pipeline_id", value)


def test_reasons_keep_their_length_and_lose_hidden_characters():
    reason = "ValueError: bad\n\tline \u202eexe.\u200b\x00\x85 ok \u00a0 ü"
    cleaned = v.clean_reason(reason)
    assert cleaned == "ValueError: bad\n\tline \ufffdexe.\ufffd\ufffd\ufffd ok \u00a0 ü"
    assert len(cleaned) == len(reason)
    assert v.clean_reason(cleaned) == cleaned


@pytest.mark.parametrize("query_id", ["00000000-0000-4000-8000-000000000001",
                                      "C0FFEE00-1234-4ABC-8DEF-0123456789AB"])
def test_canonical_query_ids_are_accepted(query_id):
    v.check_query_id(query_id)


@pytest.mark.parametrize("query_id", [
    "{00000000-0000-4000-8000-000000000001}", "urn:uuid:00000000-0000-4000-8000-000000000001",
    "00000000000040008000000000000001", "\u0660" * 8 + "-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000001\n", "", "x"])
def test_other_spellings_of_query_ids_are_refused(query_id):
    with pytest.raises(InvalidArgument, match="query_id"):
        v.check_query_id(query_id)
