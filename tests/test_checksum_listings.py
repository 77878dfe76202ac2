"""The file listing (``allFiles``) of the version checksums percolake derives, against an
independent replay of the same log entries (Delta's: a file is its path as the log spells it
and its deletion vector; an add puts it, a remove takes it out): every listing is exactly the
version's files, or there is none. Randomised runs of entries like those percolake, delta-rs
and delta-spark commit (escaped and unescaped spellings of one file, deletion vector updates,
``dataChange`` false rearrangements, schema changes, growth past 50 files), and real applies:
an OPTIMIZE of a deletion-vector table whose partition values are escaped on disk."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from percolake.lake import compaction
from percolake.lake.checkpoints import write_checkpoint
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.version_checksum import (
    next_checksum,
    read_checksum,
    write_checksum,
)
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

DV_PROTOCOL = {"minReaderVersion": 3, "minWriterVersion": 7,
               "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}
# one partition directory each, spelled in the log as percolake (percent-encoded) and as
# delta-spark (non-ASCII left as is) spell it: two spellings of one file are two files to
# Delta's replay
SPELLINGS = {"ü": ("region=%C3%BC", "region=ü"), "a b": ("region=a%20b", "region=a%20b"),
             "x=y": ("region=x%253Dy", "region=x%253Dy"), "50%": ("region=50%2525",) * 2,
             None: ("region=__HIVE_DEFAULT_PARTITION__",) * 2}


def replay(entries: Sequence[Sequence[Mapping[str, Any]]]) -> dict[tuple, dict[str, Any]]:
    """The files of the version after ``entries``, replayed as Delta does: each file's add
    (``dataChange`` false) by its path and deletion vector's unique id."""
    files: dict[tuple, dict[str, Any]] = {}
    for entry in entries:
        for action in entry:
            for kind in ("add", "remove"):
                if kind in action:
                    file = action[kind]
                    vector = file.get("deletionVector") or {}
                    key = (file["path"], vector.get("storageType"),
                           vector.get("pathOrInlineDv"), vector.get("offset"))
                    if kind == "add":
                        files[key] = {**file, "dataChange": False}
                    else:
                        files.pop(key, None)
    return files


def as_listed(files: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(json.dumps(f, sort_keys=True) for f in files)


def assert_exact_or_none(crc: Mapping[str, Any], entries: Sequence, version: int) -> None:
    if "allFiles" in crc:
        assert as_listed(crc["allFiles"]) == as_listed(list(replay(entries).values())), \
            f"version {version} lists other files than its replay"


def schema(columns: int) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": f"c{i}", "type": "long", "nullable": True, "metadata": {}}
        for i in range(columns)] + [
        {"name": "region", "type": "string", "nullable": True, "metadata": {}}]})


def metadata(columns: int, **configuration: str) -> dict[str, Any]:
    return {"metaData": {"id": "t", "format": {"provider": "parquet", "options": {}},
                         "schemaString": schema(columns), "partitionColumns": ["region"],
                         "configuration": {"delta.enableDeletionVectors": "true",
                                           **configuration}, "createdTime": 1}}


class RandomLog:
    """Log entries of random commits on a partitioned table with deletion vectors, each made
    as one of the writers might make it."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.live: dict[tuple, dict[str, Any]] = {}  # what the commits meant to keep
        self.columns = 1
        self.serial = 0

    def new_add(self, *, data_change: bool = True) -> dict[str, Any]:
        value = self.random.choice(list(SPELLINGS))
        folder = self.random.choice(SPELLINGS[value])
        self.serial += 1
        return {"path": f"{folder}/part-{self.serial:05d}.parquet",
                "partitionValues": {"region": value}, "size": self.random.randint(1, 9000),
                "modificationTime": self.serial, "dataChange": data_change,
                "stats": json.dumps({"numRecords": self.random.randint(1, 9)})}

    def vector(self) -> dict[str, Any]:
        self.serial += 1
        return {"storageType": "u", "pathOrInlineDv": f"ab^-aqEH.-t@S}}K{self.serial:05d}",
                "offset": 1, "sizeInBytes": 36, "cardinality": self.random.randint(1, 5)}

    @staticmethod
    def remove_of(add: Mapping[str, Any], *, path: str | None = None,
                  data_change: bool = True) -> dict[str, Any]:
        remove = {"path": path or add["path"], "dataChange": data_change,
                  "deletionTimestamp": 9, "extendedFileMetadata": True,
                  "partitionValues": dict(add["partitionValues"]), "size": add["size"]}
        if add.get("deletionVector"):
            remove["deletionVector"] = dict(add["deletionVector"])
        return {"remove": remove}

    def entry(self) -> list[dict[str, Any]]:
        actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": 1, "operation": "X"}}]
        live = list(self.live.values())
        # the commits after which no listing can follow are rarer, so most versions list files
        kind = self.random.choices(
            ["append", "many", "delete_vector", "remove", "optimize", "respelled_remove",
             "readd", "schema", "config", "stale_remove"],
            weights=[40, 6, 40, 20, 15, 2, 2, 2, 4, 2])[0]
        if kind in ("remove", "delete_vector", "optimize", "respelled_remove", "readd") \
                and not live:
            kind = "append"
        if kind in ("append", "many"):
            for _ in range(self.random.randint(1, 3) if kind == "append"
                           else self.random.randint(5, 20)):
                actions.append({"add": self.new_add()})
        elif kind == "delete_vector":  # merge-on-read: the file again with a new vector
            for old in self.random.sample(live, self.random.randint(1, min(3, len(live)))):
                actions.append(self.remove_of(old))
                actions.append({"add": {**old, "dataChange": True,
                                        "deletionVector": self.vector()}})
        elif kind == "remove":
            for old in self.random.sample(live, self.random.randint(1, min(20, len(live)))):
                actions.append(self.remove_of(old))
        elif kind == "optimize":  # files of one partition into one, dataChange false
            region = self.random.choice(live)["partitionValues"]["region"]
            same = [f for f in live if f["partitionValues"]["region"] == region]
            actions.extend(self.remove_of(f, data_change=False) for f in same)
            actions.append({"add": self.new_add(data_change=False)
                            | {"partitionValues": {"region": region}}})
        elif kind == "respelled_remove":  # the other spelling of the path: another file
            old = self.random.choice(live)
            folder, name = old["path"].rsplit("/", 1)
            other = [f for f in SPELLINGS[old["partitionValues"]["region"]] if f != folder]
            if other:
                actions.append(self.remove_of(old, path=f"{other[0]}/{name}"))
        elif kind == "readd":  # the same file again (statistics recomputed), dataChange false
            old = self.random.choice(live)
            actions.append({"add": {**old, "dataChange": False, "stats": json.dumps(
                {"numRecords": 1, "tightBounds": False})}})
        elif kind == "schema":
            self.columns += 1
            actions.append(metadata(self.columns))
        elif kind == "config":
            actions.append(metadata(self.columns, **self.random.choice([
                {"delta.dataSkippingNumIndexedCols": "40"}, {}, {}, {},
                {"delta.checkpoint.writeStatsAsJson": "false",
                 "delta.checkpoint.writeStatsAsStruct": "false"}])))
        elif kind == "stale_remove":  # a file removed before: no file of the version
            actions.append(self.remove_of(self.new_add()))
        for action in actions:  # what a replay keeps, to draw the next commit from
            for verb in ("add", "remove"):
                if verb in action:
                    file = action[verb]
                    key = (file["path"], json.dumps(file.get("deletionVector")))
                    if verb == "add":
                        self.live[key] = {**file, "dataChange": True}
                    else:
                        self.live.pop(key, None)
        return actions


@pytest.mark.parametrize("seed", range(60))
def test_every_listing_is_the_versions_files_or_absent(seed: int) -> None:
    log = RandomLog(seed)
    first = [{"commitInfo": {"timestamp": 1}}, {"protocol": DV_PROTOCOL}, metadata(1)] \
        + [{"add": log.new_add()} for _ in range(log.random.randint(0, 5))]
    entries = [first]
    crc = next_checksum(None, first, "t0")
    assert crc is not None and "allFiles" in crc
    assert_exact_or_none(crc, entries, 0)
    for version in range(1, 40):
        entries.append(log.entry())
        crc = next_checksum(crc, entries[-1])
        assert crc is not None
        assert_exact_or_none(crc, entries, version)


def log_entries(root: Path) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted((root / "_delta_log").glob("*.json"))]


def escaped_table_with_vectors(root: Path) -> list[dict[str, Any]]:
    """A partitioned table with deletion vectors, as delta-spark writes one: partition values
    escaped on disk (the log spells ``ü`` unescaped, the rest percent-encoded), two files
    each, the first with an inline vector deleting its rows 1 and 3. Returns its entry."""
    from tests.test_deleted_rows import vector_data, z85_encode

    data = vector_data([1, 3])
    vector = {"storageType": "i", "pathOrInlineDv": z85_encode(data + b"\0" * (-len(data) % 4)),
              "sizeInBytes": len(data), "cardinality": 2}
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": 1, "operation": "WRITE"}},
                                     {"protocol": DV_PROTOCOL}, metadata(0)]
    folders = {"ü": "region=ü", "a b": "region=a b", "x=y": "region=x%3Dy",
               "50%": "region=50%25", None: "region=__HIVE_DEFAULT_PARTITION__"}
    for value, folder in folders.items():
        spelled = SPELLINGS[value][1]
        for number in range(2):
            file = root / folder / f"part-{number}.parquet"
            file.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"c0": pa.array(range(5 * number, 5 * number + 5),
                                                    pa.int64())}), file)
            add = {"path": f"{spelled}/part-{number}.parquet",
                   "partitionValues": {"region": value}, "size": file.stat().st_size,
                   "modificationTime": 1, "dataChange": True,
                   "stats": json.dumps({"numRecords": 5}), "tags": {"origin": "spark"}}
            actions.append({"add": {**add, "deletionVector": vector} if number == 0 else add})
    (root / "_delta_log").mkdir()
    (root / "_delta_log" / f"{0:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))
    return actions


def test_an_optimize_of_escaped_partitions_with_vectors_lists_the_replays_files(tmp_path):
    """percolake's OPTIMIZE (compaction: removes of files with vectors, spelled as the log
    spells their adds, one new file per partition, ``dataChange`` false) and an append after
    it: each version lists exactly the files of Delta's replay and of delta-rs's read."""
    root = tmp_path / "t"
    uri = canonical_table_uri(str(root))
    assert write_checksum(uri, 0, escaped_table_with_vectors(root))
    # percolake's checkpoint (delta-rs's) of the version: a replay from it holds the files as
    # listed (path spellings, statistics, tags, vectors); the compaction reads it too
    write_checkpoint(uri, 0)
    (checkpoint,) = (root / "_delta_log").glob("*.checkpoint.parquet")
    from_checkpoint = [{k: v for k, v in row["add"].items() if v is not None}
                       for row in pq.read_table(checkpoint).to_pylist() if row["add"]]
    for add in from_checkpoint:
        add["partitionValues"] = dict(add["partitionValues"])
        add["tags"] = dict(add["tags"])
        add["deletionVector"] = {k: v for k, v in add.get("deletionVector", {}).items()
                                 if v is not None} or None
    assert as_listed(read_checksum(uri, 0)["allFiles"]) == as_listed(
        list(replay([[{"add": {k: v for k, v in a.items() if v is not None}}
                      for a in from_checkpoint]]).values()))
    plan = compaction.plan(uri)
    assert len(plan.groups) == 5
    write = compaction.rewrite(uri, plan, "_percolake/" + "c" * 32)
    assert apply_table_write(write, app_id="p", app_version=0, txn_id="t1", commit_ts=1) == 1
    appended = root / "region=ü" / "appended.parquet"
    pq.write_table(pa.table({"c0": pa.array([99], pa.int64())}), appended)
    append = TableWriteRecord(uri, WriteMode.APPEND, (AddFileRecord(
        "region=ü/appended.parquet", appended.stat().st_size, {"region": "ü"}, 2,
        json.dumps({"numRecords": 1})),), write.schema_json, ("region",))
    assert apply_table_write(append, app_id="p", app_version=1, txn_id="t2", commit_ts=2) == 2
    for version in (0, 1, 2):
        crc = read_checksum(uri, version)
        assert crc is not None and "allFiles" in crc, version
        entries = log_entries(root)[:version + 1]
        assert as_listed(crc["allFiles"]) == as_listed(list(replay(entries).values()))
    files = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pydict()
    listed = read_checksum(uri, 2)["allFiles"]
    assert sorted((a["path"], a["size"]) for a in listed) \
        == sorted(zip(files["path"], files["size_bytes"], strict=True))
    assert all(a["dataChange"] is False and "deletionVector" not in a for a in listed)
