"""A ``txn.write`` among a batch's MERGE, UPDATE and DELETE calls on one table
(``sparkside.batch_write_plan``, no Spark): which files it replaces, what it read, its Delta
parameters and metrics (docs/row-level-writes.md, "txn.write and txn.delta_table")."""

from __future__ import annotations

import json

from percolake.lake.read_set import PartitionMatcher, ReadSet
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from sparkside.batch_write_plan import partitions_predicate, plan_write

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "day", "type": "integer", "nullable": True, "metadata": {}},
    {"name": "at", "type": "timestamp", "nullable": True, "metadata": {}}]})
PARTITIONS = ["day", "at"]


def file(path: str, day: str | None, at: str | None, size: int = 100,
         rows: int = 10) -> AddFileRecord:
    return AddFileRecord(path, size, {"day": day, "at": at},
                         stats=json.dumps({"numRecords": rows}))


BASE = {f.path: f for f in [
    file("day=1/at=a/f1.parquet", "1", "2026-01-02 00:00:00", size=11),
    file("day=1/at=b/f2.parquet", "1", "2026-01-03 00:00:00", size=12),
    file("day=2/at=a/f3.parquet", "2", "2026-01-02 00:00:00", size=13),
    file("day=null/f4.parquet", None, None, size=14)]}
ADDED = {f.path: f for f in [
    file("_percolake/t/op0/day=1/at=a/g1.parquet", "1", "2026-01-02 00:00:00"),
    file("_percolake/t/op0/day=3/at=a/g2.parquet", "3", "2026-01-02 00:00:00")]}


def write(mode: WriteMode, adds: list[AddFileRecord], merge_schema: bool = False,
          partitions: tuple[dict, ...] = ()) -> TableWriteRecord:
    return TableWriteRecord("file:///lake/t", mode, tuple(adds), SCHEMA, tuple(PARTITIONS),
                            partitions, merge_schema)


NEW = [file("_percolake/t/write/day=1/at=a/n1.parquet", "1", "2026-01-02 00:00:00.000000",
            size=50, rows=3),
       file("_percolake/t/write/day=null/n2.parquet", "", None, size=60, rows=4)]


def test_an_overwrite_replaces_every_live_file_the_batchs_own_too_and_reads_the_whole_table(
        ) -> None:
    live = {p: f for p, f in BASE.items() if p != "day=1/at=b/f2.parquet"}  # one replaced before
    plan = plan_write(write(WriteMode.OVERWRITE, NEW), live, ADDED, SCHEMA, PARTITIONS)
    assert plan.removes == tuple(sorted(live))
    assert plan.drops == tuple(sorted(ADDED))
    assert plan.whole_table and plan.read_predicate is True
    assert plan.parameters == {"mode": "Overwrite", "partitionBy": '["day", "at"]'}
    assert plan.metrics == {"numFiles": 2, "numOutputRows": 7, "numOutputBytes": 110,
                            "numRemovedFiles": 3, "numRemovedBytes": 11 + 13 + 14}


def test_a_partition_overwrite_replaces_the_files_of_its_partitions_compared_as_typed_values(
        ) -> None:
    """Its rows fall in (day 1, 2026-01-02) and (null, null): a timestamp spelled with or
    without its fraction, and a null partition spelled "" or null, are one partition."""
    replaced = tuple(dict(f.partition_values) for f in NEW)
    plan = plan_write(write(WriteMode.OVERWRITE_PARTITIONS, NEW, partitions=replaced), BASE,
                      ADDED, SCHEMA, PARTITIONS)
    assert plan.removes == ("day=1/at=a/f1.parquet", "day=null/f4.parquet")
    assert plan.drops == ("_percolake/t/op0/day=1/at=a/g1.parquet",)
    assert not plan.whole_table
    assert plan.parameters["isDynamicPartitionOverwrite"] == "true"
    assert plan.metrics["numRemovedFiles"] == 2 and plan.metrics["numRemovedBytes"] == 25
    assert plan.read_predicate == partitions_predicate(replaced, PARTITIONS)


def test_a_partition_overwrite_reads_its_partitions() -> None:
    """As the conflict rules judge files by their partition values (a null one too)."""
    predicate = partitions_predicate(({"day": "1"}, {"day": ""}), ["day"])
    matcher = PartitionMatcher(ReadSet.from_json(
        ReadSet("WriteSerializable", predicate).to_json()).predicate, SCHEMA)
    assert matcher.may_match({"day": "1", "at": "2026-01-05 00:00:00"})
    assert matcher.may_match({"day": None, "at": None})
    assert not matcher.may_match({"day": "2", "at": None})


def test_an_append_replaces_nothing_and_reads_nothing() -> None:
    plan = plan_write(write(WriteMode.APPEND, NEW, merge_schema=True), BASE, ADDED, SCHEMA,
                      PARTITIONS)
    assert (plan.removes, plan.drops, plan.whole_table) == ((), (), False)
    assert plan.read_predicate is False
    assert plan.parameters == {"mode": "Append", "partitionBy": '["day", "at"]',
                               "canMergeSchema": "true"}
    assert plan.metrics == {"numFiles": 2, "numOutputRows": 7, "numOutputBytes": 110}


def test_a_partition_overwrite_of_no_rows_reads_no_partition() -> None:
    assert partitions_predicate((), PARTITIONS) is False
    plan = plan_write(write(WriteMode.OVERWRITE_PARTITIONS, []), BASE, ADDED, SCHEMA,
                      PARTITIONS)
    assert (plan.removes, plan.drops, plan.read_predicate) == ((), (), False)
