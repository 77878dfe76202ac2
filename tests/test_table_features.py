"""Delta table features percolake cannot write are refused before the commit point (I10): by the
participant before it declares a table, by the coordinator's write check under the table hold,
and, should a table's protocol change after the check, loudly by the apply (never retried as a
concurrent commit). Tables made with ``write_deltalake`` whose protocol is then upgraded by a
hand-written log entry, as delta-spark's ``ALTER TABLE ... SET TBLPROPERTIES`` would; the Spark
module ``tests/spark/test_delta_features.py`` does the same with tables delta-spark made.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from percolake.errors import FailedPrecondition
from percolake.lake import delta_commit
from percolake.lake.checkpoints import PROTECTED_BEFORE_KEY, write_checkpoint
from percolake.lake.delta_commit import ApplyFailed, ApplyRefused, apply_table_write
from percolake.lake.table_features import (
    FEATURES,
    partition_filters,
    physical_schema,
    refusal,
    table_protocol,
)
from percolake.lake.write_check import WriteChecker
from percolake.records import TableWriteRecord, WriteMode
from sparkside.errors import UnsupportedTableFeature
from sparkside.schema_check import SchemaChecker
from tests.test_write_check import data_file, intent

REFUSED = sorted(name for name, f in FEATURES.items() if not f.supported)
SUPPORTED = sorted(name for name, f in FEATURES.items() if f.supported)


def upgrade(root: Path, feature: str) -> None:
    """Adds ``feature`` to the table's protocol in a new log entry, as delta-spark enabling it
    would."""
    log = root / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json")) + 1
    reader = FEATURES[feature].reader if feature in FEATURES else False
    protocol = {"minReaderVersion": 3 if reader else 1, "minWriterVersion": 7,
                "writerFeatures": [feature]}
    if reader:
        protocol["readerFeatures"] = [feature]
    actions = [{"commitInfo": {"operation": "SET TBLPROPERTIES"}}, {"protocol": protocol}]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"x": pa.array([1], pa.int64())}))
    return root


def append_of(root: Path, txn: str = "t1") -> TableWriteRecord:
    return intent(root, [data_file(root, txn, pa.table({"x": pa.array([7], pa.int64())}))])


@pytest.mark.parametrize("feature", REFUSED)
def test_each_refused_feature_is_refused_at_declare_and_by_the_write_check(table, feature):
    """Every feature FEATURES refuses: the participant's check (before the declare) and the
    coordinator's write check both name it and say what to do; nothing is committed."""
    upgrade(table, feature)
    with pytest.raises(UnsupportedTableFeature, match=f"feature '{feature}'.*To write it"):
        SchemaChecker().check_features(f"file://{table}")
    with pytest.raises(FailedPrecondition, match=f"feature '{feature}'.*To write it, ") as refused:
        WriteChecker().check(append_of(table))
    assert FEATURES[feature].how in str(refused.value)


@pytest.mark.parametrize("feature", SUPPORTED)
def test_each_supported_feature_passes_the_checks_and_applies(table, feature):
    upgrade(table, feature)
    write = append_of(table)
    assert SchemaChecker().check_features(f"file://{table}") is not None
    WriteChecker().check(write)
    assert apply_table_write(write, app_id="p-0", app_version=0, txn_id="t1", commit_ts=5) == 2


def test_a_feature_percolake_does_not_know_is_refused(table):
    upgrade(table, "someFutureFeature")
    with pytest.raises(FailedPrecondition, match=r"\['someFutureFeature'\].*does not know"):
        WriteChecker().check(append_of(table))


def test_every_refused_feature_of_a_table_is_named():
    message = refusal("t", table_protocol(1, 7, None, ["clustering", "domainMetadata",
                                                       "appendOnly"], {}))
    assert message is not None
    assert "features 'clustering' (writer), 'domainMetadata' (writer), which" in message
    assert "appendOnly" not in message


def test_legacy_writer_versions_imply_their_features():
    assert refusal("t", table_protocol(1, 5, None, None, {})) is None  # columnMapping: written
    message = refusal("t", table_protocol(1, 6, None, None, {}))
    assert message is not None and "'identityColumns'" in message


def test_the_write_check_rereads_a_protocol_changed_by_a_commit_without_metadata(table):
    """A cached layout moves on over commits that hold no metaData; a protocol action alone
    (a feature enabled) must make the check read the table again."""
    checker = WriteChecker()
    checker.check(append_of(table))  # caches the layout
    upgrade(table, "rowTracking")
    with pytest.raises(FailedPrecondition, match="'rowTracking'"):
        checker.check(append_of(table, "t2"))


def test_apply_refuses_loudly_once_when_the_protocol_changed_after_the_check(table):
    write = append_of(table)
    WriteChecker().check(write)
    upgrade(table, "identityColumns")  # after the commit point: an outside writer's change
    started = time.monotonic()
    with pytest.raises(ApplyRefused, match="BROKEN INVARIANT I10.*identityColumns"):
        apply_table_write(write, app_id="p-0", app_version=0, txn_id="t1", commit_ts=5)
    assert time.monotonic() - started < 2
    assert not (table / "_delta_log" / f"{2:020d}.json").exists()


def test_a_delta_rs_feature_refusal_is_not_retried_as_a_concurrent_commit(table, monkeypatch):
    """Should percolake's own table miss a feature delta-rs refuses, the apply's delta-rs error
    ("Unsupported table features required") fails it at once, loudly, not after 20 retries.
    An overwrite: delta-rs commits it (an append is a log entry of percolake's own, which
    honours what ``FEATURES`` says and nothing else)."""
    upgrade(table, "allowColumnDefaults")
    monkeypatch.setattr(delta_commit, "refusal", lambda *args, **kwargs: None)
    attempts = []
    real_sleep = time.sleep
    monkeypatch.setattr(delta_commit.time, "sleep", lambda s: attempts.append(s) or real_sleep(0))
    overwrite = dataclasses.replace(append_of(table), mode=WriteMode.OVERWRITE)
    try:
        apply_table_write(overwrite, app_id="p-0", app_version=0, txn_id="t1", commit_ts=5)
    except ApplyFailed:
        pytest.fail("a protocol refusal was retried as a concurrent commit")
    except ApplyRefused as refused:
        assert "Unsupported table features required" in str(refused)
    else:
        pytest.fail("delta-rs committed to a table with a feature it does not support")
    assert attempts == []


def test_overwrite_partitions_of_a_deletion_vector_table_is_refused_where_filters_cannot_name_it(
        tmp_path):
    root = tmp_path / "dv"
    write_deltalake(str(root), pa.table({"x": pa.array([1], pa.int64()), "p": ["a"],
                                         "q": ["b"]}), partition_by=["p", "q"])
    upgrade(root, "deletionVectors")
    schema = pa.schema([("x", pa.int64()), ("p", pa.string()), ("q", pa.string())])
    rows = pa.table({"x": pa.array([2], pa.int64())})
    checker = WriteChecker()

    def write(*partitions: dict) -> TableWriteRecord:
        files = [data_file(root, "t1", rows, f"p={v['p']}/q={v['q']}", v) for v in partitions]
        return intent(root, files, schema, WriteMode.OVERWRITE_PARTITIONS, ("p", "q"),
                      tuple(partitions))

    checker.check(write({"p": "a", "q": "b"}))
    with pytest.raises(FailedPrecondition, match="one partition per batch there"):
        checker.check(write({"p": "a", "q": "b"}, {"p": "c", "q": "d"}))
    with pytest.raises(FailedPrecondition, match="whose value is null"):
        checker.check(write({"p": "a", "q": None}))
    single = intent(root, [], schema, WriteMode.OVERWRITE_PARTITIONS, ("p",),
                    ({"p": "a"}, {"p": "c"}))
    assert partition_filters(single) == [("p", "in", ["a", "c"])]


def test_a_revision_of_a_deletion_vector_table_is_refused(table):
    upgrade(table, "deletionVectors")
    with pytest.raises(FailedPrecondition, match="deletion vectors.*RESTORE TABLE"):
        delta_commit.files_of_version(f"file://{table}", 1, restore=True)
    assert delta_commit.files_of_version(f"file://{table}", 1).files  # other readers are served
    # a version from before the table took deletion vectors: a file it still holds may carry
    # one it gained since, which a revision would keep (its rows deleted after the barrier)
    with pytest.raises(FailedPrecondition, match="deletion vectors.*RESTORE TABLE"):
        delta_commit.files_of_version(f"file://{table}", 0, restore=True)


def test_physical_schema_renames_every_struct_field_and_numbers_it():
    def field(name: str, data_type: object, number: int) -> dict:
        return {"name": name, "type": data_type, "nullable": True,
                "metadata": {"delta.columnMapping.id": number,
                             "delta.columnMapping.physicalName": f"col-{number}"}}
    inner = {"type": "struct", "fields": [field("a", "integer", 3)]}
    schema = {"type": "struct", "fields": [
        field("id", "long", 1),
        field("s", {"type": "array", "elementType": inner, "containsNull": True}, 2)]}
    physical = physical_schema(schema)
    assert [f["name"] for f in physical["fields"]] == ["col-1", "col-2"]
    assert physical["fields"][0]["metadata"] == {"parquet.field.id": 1}
    nested = physical["fields"][1]["type"]["elementType"]["fields"][0]
    assert (nested["name"], nested["metadata"]) == ("col-3", {"parquet.field.id": 3})
    del schema["fields"][0]["metadata"]["delta.columnMapping.id"]
    with pytest.raises(ValueError, match="'id' has no column mapping metadata"):
        physical_schema(schema)


def test_object_store_files_carry_the_field_ids_of_every_nested_field(tmp_path):
    """The object-store writer's Arrow schema: the ids of a column-mapped table's physical
    schema on every field, inside structs, lists and maps, as pyarrow writes them."""
    import pyarrow.parquet as pq

    from sparkside.object_writer import with_field_ids

    def field(name: str, data_type: object, number: int) -> dict:
        return {"name": name, "type": data_type, "nullable": True,
                "metadata": {"delta.columnMapping.id": number,
                             "delta.columnMapping.physicalName": f"col-{number}"}}
    inner = {"type": "struct", "fields": [field("a", "integer", 4)]}
    physical = physical_schema({"type": "struct", "fields": [
        field("id", "long", 1),
        field("l", {"type": "array", "elementType": inner, "containsNull": True}, 2),
        field("m", {"type": "map", "keyType": "string", "valueType": inner,
                    "valueContainsNull": True}, 3)]})
    data = pa.table({
        "col-1": pa.array([1], pa.int64()),
        "col-2": pa.array([[{"col-4": 5}]], pa.list_(pa.struct([("col-4", pa.int32())]))),
        "col-3": pa.array([[("k", {"col-4": 6})]],
                          pa.map_(pa.string(), pa.struct([("col-4", pa.int32())])))})
    pq.write_table(data.cast(with_field_ids(data.schema, physical)), tmp_path / "f.parquet")
    written = pq.ParquetFile(tmp_path / "f.parquet").schema
    assert str(written).count("field_id=4 col-4;") == 2  # in the list and in the map
    arrow = pq.read_schema(tmp_path / "f.parquet")
    assert arrow.field("col-1").metadata[b"PARQUET:field_id"] == b"1"
    assert arrow.field("col-2").metadata[b"PARQUET:field_id"] == b"2"
    assert arrow.field("col-3").metadata[b"PARQUET:field_id"] == b"3"
    assert arrow.field("col-2").type.value_type.field(0).metadata[b"PARQUET:field_id"] == b"4"
    assert arrow.field("col-3").type.item_type.field(0).metadata[b"PARQUET:field_id"] == b"4"


@pytest.mark.parametrize(("feature", "what_percolake_does_not_do", "what_to_do"), [
    ("allowColumnDefaults", "percolake does not write a column's DEFAULT value",
     "re-create it without column defaults (delta-spark cannot drop this feature"),
])
def test_a_refusal_says_what_percolake_does_not_do_and_what_can_be_done(
        table, feature, what_percolake_does_not_do, what_to_do):
    """Appends are percolake's own log entries: a refusal blames what percolake lacks, not
    only delta-rs (which commits overwrites), and offers what delta-spark 4.4.0 allows."""
    upgrade(table, feature)
    with pytest.raises(FailedPrecondition) as refused:
        WriteChecker().check(append_of(table))
    assert what_percolake_does_not_do in str(refused.value)
    assert what_to_do in str(refused.value)


@pytest.mark.parametrize("feature", ["checkpointProtection", "inCommitTimestamp",
                                     "typeWidening", "vacuumProtocolCheck"])
def test_an_overwrite_of_a_table_delta_rs_cannot_commit_to_is_our_own_log_entry(
        table, feature):
    """delta-rs 1.6 commits nothing to these tables: the overwrite is a log entry percolake
    writes itself, removing the table's files explicitly."""
    upgrade(table, feature)
    old = {json.loads(line)["add"]["path"] for line in
           (table / "_delta_log" / f"{0:020d}.json").read_text().splitlines() if '"add"' in line}
    overwrite = dataclasses.replace(append_of(table), mode=WriteMode.OVERWRITE)
    WriteChecker().check(overwrite)
    assert apply_table_write(overwrite, app_id="p-0", app_version=0, txn_id="t1",
                             commit_ts=5) == 2
    actions = [json.loads(line) for line in
               (table / "_delta_log" / f"{2:020d}.json").read_text().splitlines()]
    assert actions[0]["commitInfo"]["operationParameters"]["mode"] == "Overwrite"
    assert {a["remove"]["path"] for a in actions if "remove" in a} == old
    assert [a["add"]["path"] for a in actions if "add" in a] == \
        [f.path for f in overwrite.add_files]


def test_no_checkpoint_is_written_below_the_version_checkpoint_protection_requires(table):
    """delta-spark's DROP FEATURE leaves ``checkpointProtection`` and
    ``delta.requireCheckpointProtectionBeforeVersion``: no checkpoint below that version."""
    log = table / "_delta_log"
    set_protocol(table, "checkpointProtection", {PROTECTED_BEFORE_KEY: "1"},
                 {"operation": "DROP FEATURE"})
    write_checkpoint(f"file://{table}", 0)
    assert not list(log.glob("*.checkpoint.parquet"))
    write_checkpoint(f"file://{table}", 1)
    assert [p.name for p in log.glob("*.checkpoint.parquet")] == \
        [f"{1:020d}.checkpoint.parquet"]


def set_protocol(root: Path, feature: str, configuration: dict[str, str],
                 commit_info: dict) -> None:
    """A log entry giving the table ``feature`` (writer only) and ``configuration``, as
    delta-spark's ALTER TABLE would."""
    log = root / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json")) + 1
    metadata = next(json.loads(line)["metaData"] for line in
                    (log / f"{0:020d}.json").read_text().splitlines() if '"metaData"' in line)
    metadata["configuration"] = configuration
    actions = [{"commitInfo": commit_info}, {"metaData": metadata},
               {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                             "writerFeatures": [feature]}}]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_each_own_log_entry_carries_an_in_commit_timestamp_above_the_previous(
        table, monkeypatch):
    """commitInfo first, inCommitTimestamp = timestamp, strictly increasing: the clock's time,
    or the previous commit's plus 1 when the clock is behind it."""
    set_protocol(table, "inCommitTimestamp", {"delta.enableInCommitTimestamps": "true"},
                 {"inCommitTimestamp": 2_000_000_000_000, "timestamp": 2_000_000_000_000,
                  "operation": "SET TBLPROPERTIES"})  # a commit from a clock far ahead

    def first_action(version: int) -> dict:
        line = (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()[0]
        return json.loads(line)["commitInfo"]

    assert apply_table_write(append_of(table), app_id="p-0", app_version=0, txn_id="t1",
                             commit_ts=5) == 2
    assert first_action(2)["inCommitTimestamp"] == first_action(2)["timestamp"] == \
        2_000_000_000_001
    monkeypatch.setattr(delta_commit, "now_ms", lambda: 2_000_000_000_500)
    overwrite = dataclasses.replace(append_of(table, "t2"), mode=WriteMode.OVERWRITE)
    assert apply_table_write(overwrite, app_id="p-0", app_version=1, txn_id="t2",
                             commit_ts=6) == 3
    assert first_action(3)["inCommitTimestamp"] == first_action(3)["timestamp"] == \
        2_000_000_000_500
    assert first_action(3)["operationParameters"]["mode"] == "Overwrite"
