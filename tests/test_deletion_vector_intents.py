"""Row-level write intents that keep files with deletion vectors (no Spark): the codec, the
coordinator's validation, the pre-commit check of the vector files, the conflict rule (a file
kept with a new vector is a removal of the old logical file) and the apply's log entry: the
file's remove with its old vector, its add with the new one, the checksum's counts."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from coordinator import validation
from percolake import codec
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake.conflicts import RowLevelConflict, check_row_level_write
from percolake.lake.deleted_rows import deleted_rows
from percolake.lake.deletion_vector_files import bitmap_array, vector_file, vector_file_name
from percolake.lake.deletion_vectors import deletion_vectors
from percolake.lake.delta_commit import apply_table_write, files_of_version
from percolake.lake.version_checksum import read_checksum, write_checksum
from percolake.lake.warehouse import canonical_table_uri
from percolake.lake.write_check import WriteChecker
from percolake.records import DeletionVectorRecord, RemoveFileRecord, TableWriteRecord, WriteMode
from tests.test_optimize import table_with_a_deletion_vector

APP, TXN = "percolake:p:g0", "c" * 32


def kept_with_vectors(uri: str, root: Path, rows: dict[str, list[int]]) -> TableWriteRecord:
    """A DELETE of version 0 keeping each file of ``rows`` with a vector of those rows (its
    earlier vector's rows included), stored in one vector file of the attempt's folder."""
    files = {f.path: f for f in files_of_version(uri, 0).files}
    data = [bitmap_array(np.array(r)) for r in rows.values()]
    content, offsets = vector_file(data)
    vector_path = f"_percolake/{TXN}/op0/{vector_file_name(uuid.uuid4())}"
    (root / vector_path).parent.mkdir(parents=True)
    (root / vector_path).write_bytes(content)
    kept = tuple(DeletionVectorRecord(path, vector_path, len(content), offset, len(d),
                                      len(set(r)), files[path].modification_time,
                                      json.dumps({"numRecords": 5, "tightBounds": False}))
                 for (path, r), offset, d in zip(rows.items(), offsets, data, strict=True))
    return TableWriteRecord(
        uri, WriteMode.ROW_LEVEL, (), files_of_version(uri, 0).schema_json, ("part",),
        remove_files=tuple(RemoveFileRecord(p, files[p].size, {"part": "a"}) for p in rows),
        read_version=0, operation="DELETE",
        operation_metrics=json.dumps({"numDeletionVectorsAdded": "1",
                                      "numDeletionVectorsUpdated": "1"}),
        deletion_vectors=kept)


@pytest.fixture
def table(tmp_path: Path) -> tuple[str, Path]:
    root = table_with_a_deletion_vector(tmp_path / "dv")
    return canonical_table_uri(str(root)), root


def test_the_intent_survives_the_codec_and_the_record_json(table):
    uri, root = table
    write = kept_with_vectors(uri, root, {"part=a/0.parquet": [1, 2, 3]})
    assert codec.table_write_from_pb(codec.table_write_to_pb(write)) == write
    assert TableWriteRecord.from_json(json.loads(write.json_text)) == write
    plain = dataclasses.replace(write, deletion_vectors=())
    assert "deletion_vectors" not in plain.to_json(), "other writes keep their stored form"


def test_validation_refuses_vectors_that_cannot_be_meant(table):
    uri, root = table
    write = kept_with_vectors(uri, root, {"part=a/0.parquet": [1, 2, 3]})
    validation.check_table_write(write, TXN, 10**6)
    (vector,) = write.deletion_vectors

    def with_vector(**changes: object) -> TableWriteRecord:
        return dataclasses.replace(write, deletion_vectors=(
            dataclasses.replace(vector, **changes),))

    cases = {
        "needs the ROW_LEVEL mode": dataclasses.replace(write, mode=WriteMode.APPEND,
                                                        remove_files=()),
        "not among the removed files": with_vector(path="part=a/1.parquet"),
        "two deletion vectors": dataclasses.replace(write, deletion_vectors=(vector, vector)),
        "must be a relative path under": with_vector(
            vector_path=f"_percolake/{'d' * 32}/{vector.vector_path.rsplit('/')[-1]}"),
        "deletion_vector_<uuid>.bin": with_vector(vector_path=f"_percolake/{TXN}/x.bin"),
        "does not lie inside": with_vector(offset=vector.vector_file_size),
        "cardinality": with_vector(cardinality=0),
    }
    for message, bad in cases.items():
        with pytest.raises(InvalidArgument, match=message):
            validation.check_table_write(bad, TXN, 10**6)


def test_the_pre_commit_check_finds_a_vector_file_missing_or_of_another_size(table):
    uri, root = table
    write = kept_with_vectors(uri, root, {"part=a/0.parquet": [1, 2, 3]})
    WriteChecker().check(write)
    (vector,) = write.deletion_vectors
    grown = dataclasses.replace(vector, vector_file_size=vector.vector_file_size + 1)
    with pytest.raises(FailedPrecondition, match="another size"):
        WriteChecker().check(dataclasses.replace(write, deletion_vectors=(grown,)))
    (root / vector.vector_path).unlink()
    with pytest.raises(FailedPrecondition, match="missing"):
        WriteChecker().check(write)


def test_an_outside_rewrite_of_a_kept_file_conflicts(table):
    """The kept file is removed as it was: an outside commit removing it conflicts."""
    uri, root = table
    write = kept_with_vectors(uri, root, {"part=a/1.parquet": [0]})
    outside = [{"commitInfo": {"operation": "DELETE"}},
               {"remove": {"path": "part=a/1.parquet", "dataChange": True,
                           "partitionValues": {"part": "a"}}}]
    (root / "_delta_log" / f"{1:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in outside))
    with pytest.raises(RowLevelConflict, match="removed 1 file"):
        check_row_level_write(write)


def test_the_apply_removes_each_file_with_its_old_vector_and_adds_it_with_the_new(table):
    uri, root = table
    write = kept_with_vectors(uri, root, {"part=a/0.parquet": [1, 2, 3], "part=a/1.parquet": [0]})
    old = deletion_vectors(uri, 0)["part=a/0.parquet"]
    first = [json.loads(line) for line in
             (root / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    assert write_checksum(uri, 0, first)  # so the apply derives version 1's
    assert read_checksum(uri, 0)["numDeletedRecordsOpt"] == 2
    check_row_level_write(write)
    assert apply_table_write(write, app_id=APP, app_version=0, txn_id=TXN, commit_ts=5) == 1
    actions = [json.loads(line) for line in
               (root / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    adds = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
    assert removes["part=a/0.parquet"]["deletionVector"] == old
    assert "deletionVector" not in removes["part=a/1.parquet"]
    for path, rows in (("part=a/0.parquet", [1, 2, 3]), ("part=a/1.parquet", [0])):
        vector = adds[path]["deletionVector"]
        assert vector["storageType"] == "u"
        assert vector["pathOrInlineDv"].startswith(f"_percolake/{TXN}/op0")
        assert deleted_rows(uri, vector).tolist() == rows
        assert adds[path]["size"] == removes[path]["size"]
        assert adds[path]["partitionValues"] == {"part": "a"}
        assert json.loads(adds[path]["stats"])["tightBounds"] is False
    assert deletion_vectors(uri, 1) == {p: a["deletionVector"] for p, a in adds.items()}
    crc = read_checksum(uri, 1)  # the old vector's 2 rows out, the new vectors' 4 in
    assert (crc["numDeletionVectorsOpt"], crc["numDeletedRecordsOpt"]) == (2, 4)
