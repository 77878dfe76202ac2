"""Delta version checksums (``<version>.crc``) of percolake's own log entries, without Spark:
the state a checksum records after an append, a remove, a deletion vector update and a
metadata change, derived from the previous version's checksum; none when the state is not
known exactly; and the files written by real applies, checked against the table's files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from percolake.lake.delta_commit import apply_table_write
from percolake.lake.version_checksum import (
    FILE_SIZE_BINS,
    checksum_uri,
    next_checksum,
    read_checksum,
    write_checksum,
    write_checksum_of_commit,
)
from percolake.records import WriteMode
from tests.test_write_check import data_file, intent, longs

KB = 1024
PROTOCOL = {"minReaderVersion": 1, "minWriterVersion": 2}
DV_PROTOCOL = {"minReaderVersion": 3, "minWriterVersion": 7,
               "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}


def metadata(**configuration: str) -> dict:
    return {"id": "t-1", "format": {"provider": "parquet", "options": {}},
            "schemaString": '{"type":"struct","fields":[]}', "partitionColumns": [],
            "configuration": dict(configuration), "createdTime": 1}


def histogram(*sizes: int) -> dict:
    counts, totals = [0] * len(FILE_SIZE_BINS), [0] * len(FILE_SIZE_BINS)
    for size in sizes:
        index = max(i for i, bound in enumerate(FILE_SIZE_BINS) if bound <= size)
        counts[index] += 1
        totals[index] += size
    return {"sortedBinBoundaries": list(FILE_SIZE_BINS), "fileCounts": counts,
            "totalBytes": totals}


def checksum(*sizes: int, protocol: dict = PROTOCOL, meta: dict | None = None,
             transactions: list | None = None, **fields: object) -> dict:
    return {"txnId": "old", "tableSizeBytes": sum(sizes), "numFiles": len(sizes),
            "numMetadata": 1, "numProtocol": 1,
            "setTransactions": [] if transactions is None else transactions,
            "domainMetadata": [], "metadata": meta or metadata(), "protocol": protocol,
            "fileSizeHistogram": histogram(*sizes), **fields}


def add(path: str, size: int, cardinality: int | None = None) -> dict:
    action = {"path": path, "partitionValues": {}, "size": size, "modificationTime": 1,
              "dataChange": True, "stats": "{}"}
    if cardinality is not None:
        action["deletionVector"] = {"storageType": "u", "pathOrInlineDv": "x", "offset": 1,
                                    "sizeInBytes": 10, "cardinality": cardinality}
    return {"add": action}


def remove(path: str, size: int | None, cardinality: int | None = None) -> dict:
    action = {"path": path, "dataChange": True, "deletionTimestamp": 2,
              "extendedFileMetadata": size is not None, "partitionValues": {}}
    if size is not None:
        action["size"] = size
    if cardinality is not None:
        action["deletionVector"] = add(path, 0, cardinality)["add"]["deletionVector"]
    return {"remove": action}


def commit(txn: str = "t2") -> dict:
    return {"commitInfo": {"timestamp": 5, "operation": "WRITE", "percolake.txn_id": txn}}


def txn(app: str, version: int) -> dict:
    return {"txn": {"appId": app, "version": version, "lastUpdated": 5}}


def test_an_append_adds_its_files_sizes_and_app_transaction():
    previous = checksum(10 * KB, 3 * KB, transactions=[{"appId": "a", "version": 1,
                                                        "lastUpdated": 1}])
    crc = next_checksum(previous, [commit(), txn("a", 2), txn("b", 7), add("p1", 20 * KB)],
                        "t2")
    assert crc is not None
    assert (crc["txnId"], crc["tableSizeBytes"], crc["numFiles"]) == ("t2", 33 * KB, 3)
    assert crc["fileSizeHistogram"] == histogram(10 * KB, 3 * KB, 20 * KB)
    assert sorted(crc["setTransactions"], key=lambda t: t["appId"]) == [
        {"appId": "a", "version": 2, "lastUpdated": 5},
        {"appId": "b", "version": 7, "lastUpdated": 5}]
    assert crc["metadata"] == previous["metadata"] and crc["protocol"] == PROTOCOL
    assert "allFiles" not in crc and "numDeletionVectorsOpt" not in crc
    assert previous["numFiles"] == 2  # the previous checksum is not changed


def test_a_remove_takes_its_file_out_and_an_emptied_table_lists_no_files():
    files = [add(p, s)["add"] | {"dataChange": False} for p, s in (("p0", 10 * KB),
                                                                    ("p1", 3 * KB))]
    for listing in (files, None):
        previous = checksum(10 * KB, 3 * KB, **({} if listing is None else
                                                {"allFiles": listing}))
        crc = next_checksum(previous, [commit(), remove("p0", 10 * KB)])
        assert crc is not None and (crc["tableSizeBytes"], crc["numFiles"]) == (3 * KB, 1)
        assert crc["fileSizeHistogram"] == histogram(3 * KB)
        empty = next_checksum(crc, [commit(), remove("p1", 3 * KB)])
        assert empty is not None and empty["numFiles"] == 0
        # an empty listing only where the derived listing says so; the count alone may be off
        assert empty.get("allFiles") == ([] if listing else None)


def test_an_emptied_count_lists_nothing_when_a_remove_missed_the_listing():
    """A remove spelled otherwise than the listed file's add (``%C3%BC`` for ``ü``) is
    another file to Delta's replay: the listed file stays, though the count says none."""
    listed = add("r=ü/f", KB)["add"] | {"dataChange": False}
    crc = next_checksum(checksum(KB, allFiles=[listed]), [commit(), remove("r=%C3%BC/f", KB)])
    assert crc is not None and crc["numFiles"] == 0 and "allFiles" not in crc


def listed(crc: dict) -> list[tuple[str, int | None]]:
    """A checksum's file listing: each file's path and deletion vector cardinality."""
    return sorted((a["path"], (a.get("deletionVector") or {}).get("cardinality"))
                  for a in crc["allFiles"])


def test_the_file_listing_follows_each_version_as_delta_sparks_log_replay():
    first = next_checksum(None, [commit(), {"protocol": DV_PROTOCOL}, {"metaData": metadata()},
                                 add("p0", 5 * KB), add("p1", 9 * KB)], "t1")
    assert first is not None and listed(first) == [("p0", None), ("p1", None)]
    assert all(a["dataChange"] is False for a in first["allFiles"])  # as in the table's state
    # a deletion vector replaces the file's entry; a remove takes its file out
    second = next_checksum(first, [commit(), remove("p0", 5 * KB), add("p0", 5 * KB, 2),
                                   remove("p1", 9 * KB), add("p2", KB)])
    assert second is not None and listed(second) == [("p0", 2), ("p2", None)]
    third = next_checksum(second, [commit(), remove("p0", 5 * KB, 2), add("p0", 5 * KB, 4)])
    assert third is not None and listed(third) == [("p0", 4), ("p2", None)]
    assert first["allFiles"][0]["dataChange"] is False and len(first["allFiles"]) == 2


def test_no_file_listing_where_delta_spark_lists_none_or_it_is_not_known():
    base = next_checksum(None, [commit(), {"protocol": PROTOCOL}, {"metaData": metadata()},
                                add("p0", KB)])
    assert base is not None and len(base["allFiles"]) == 1
    # a version changing the schema
    evolved = {**metadata(), "schemaString": '{"type":"struct","fields":[{"name":"y"}]}'}
    assert "allFiles" not in next_checksum(base, [commit(), {"metaData": evolved}])
    # more files than delta-spark lists, and after that even when fewer again
    many = next_checksum(base, [commit(), *[add(f"q{i}", KB) for i in range(50)]])
    assert many is not None and many["numFiles"] == 51 and "allFiles" not in many
    fewer = next_checksum(many, [commit(), *[remove(f"q{i}", KB) for i in range(10)]])
    assert fewer is not None and "allFiles" not in fewer
    assert "allFiles" in next_checksum(base, [commit(), *[add(f"q{i}", KB) for i in range(49)]])
    # statistics of more columns than delta-spark lists files for; none kept in checkpoints
    wide = metadata(**{"delta.dataSkippingNumIndexedCols": "33"})
    assert "allFiles" not in next_checksum(base, [commit(), {"metaData": wide}, add("p1", KB)])
    no_stats = metadata(**{"delta.checkpoint.writeStatsAsJson": "false",
                           "delta.checkpoint.writeStatsAsStruct": "false"})
    assert "allFiles" not in next_checksum(base, [commit(), {"metaData": no_stats}])
    # a remove of a file the listing does not hold: the listing is not exact any more
    stray = next_checksum(base, [commit(), remove("elsewhere", KB), add("p1", KB)])
    assert stray is not None and "allFiles" not in stray


def test_a_remove_without_its_size_leaves_the_state_unknown():
    assert next_checksum(checksum(10 * KB), [commit(), remove("p0", None)]) is None


def test_a_deletion_vector_update_counts_the_deleted_rows_of_the_new_vector():
    on = metadata(**{"delta.enableDeletionVectors": "true"})
    counts = [0] * 10
    counts[0] = 2  # two files, no deletion vector
    previous = checksum(10 * KB, 4 * KB, protocol=DV_PROTOCOL, meta=on,
                        numDeletedRecordsOpt=0, numDeletionVectorsOpt=0,
                        deletedRecordCountsHistogramOpt={"deletedRecordCounts": counts})
    # a DELETE of 3 rows of p0 (no vector yet) by a vector, then 20 more rows of it
    first = next_checksum(previous, [commit(), remove("p0", 10 * KB), add("p0", 10 * KB, 3)])
    second = next_checksum(first, [commit(), remove("p0", 10 * KB, 3),
                                   add("p0", 10 * KB, 23)])
    assert first is not None and second is not None
    assert (first["numDeletedRecordsOpt"], first["numDeletionVectorsOpt"]) == (3, 1)
    assert (second["numDeletedRecordsOpt"], second["numDeletionVectorsOpt"]) == (23, 1)
    assert (second["tableSizeBytes"], second["numFiles"]) == (14 * KB, 2)
    assert first["deletedRecordCountsHistogramOpt"]["deletedRecordCounts"][:3] == [1, 1, 0]
    assert second["deletedRecordCountsHistogramOpt"]["deletedRecordCounts"][:3] == [1, 0, 1]
    # deletion vectors no longer created: delta-spark's derived checksum drops the counts
    off = next_checksum(second, [commit(), {"metaData": metadata()}])
    assert off is not None and "numDeletedRecordsOpt" not in off
    assert "deletedRecordCountsHistogramOpt" not in off


def test_a_metadata_change_is_the_new_versions_metadata():
    evolved = metadata(**{"delta.columnMapping.maxColumnId": "4"})
    evolved["schemaString"] = '{"type":"struct","fields":[{"name":"y"}]}'
    crc = next_checksum(checksum(KB), [commit(), {"metaData": evolved}, add("p1", KB)])
    assert crc is not None and crc["metadata"] == evolved and crc["numFiles"] == 2


def test_app_transactions_are_left_out_where_delta_spark_leaves_them_out():
    retained = metadata(**{"delta.setTransactionRetentionDuration": "interval 1 days"})
    assert "setTransactions" not in next_checksum(checksum(KB, meta=retained),
                                                  [commit(), txn("a", 1)])
    many = [{"appId": f"a{i}", "version": 1, "lastUpdated": 1} for i in range(100)]
    assert "setTransactions" not in next_checksum(checksum(KB, transactions=many),
                                                  [commit(), txn("new", 1)])
    unknown = checksum(KB)
    del unknown["setTransactions"]
    assert "setTransactions" not in next_checksum(unknown, [commit(), txn("a", 1)])


def test_no_checksum_where_the_state_is_not_known_exactly():
    incomplete = checksum(KB)
    del incomplete["metadata"]
    assert next_checksum(incomplete, [commit(), add("p", 1)]) is None
    timestamps = metadata(**{"delta.enableInCommitTimestamps": "true"})
    assert next_checksum(checksum(KB, meta=timestamps), [commit(), add("p", 1)]) is None
    domain = {"domainMetadata": {"domain": "d", "configuration": "{}", "removed": False}}
    assert next_checksum(checksum(KB), [commit(), domain]) is None
    # a first version needs its protocol and metadata in the entry
    assert next_checksum(None, [commit(), add("p", 1)]) is None


def test_a_first_version_is_counted_from_its_entry_alone():
    crc = next_checksum(None, [commit(), {"protocol": PROTOCOL}, {"metaData": metadata()},
                               txn("a", 0), add("p0", 5 * KB), add("p1", 9 * KB)], "t1")
    assert crc is not None
    assert (crc["tableSizeBytes"], crc["numFiles"]) == (14 * KB, 2)
    assert crc["setTransactions"] == [{"appId": "a", "version": 0, "lastUpdated": 5}]
    assert crc["domainMetadata"] == [] and crc["fileSizeHistogram"] == histogram(5 * KB, 9 * KB)


def test_write_checksum_needs_the_previous_one_and_never_overwrites(tmp_path: Path):
    uri = f"file://{tmp_path}"
    (tmp_path / "_delta_log").mkdir()
    assert not write_checksum(uri, 3, [commit(), add("p", KB)])  # no checksum of version 2
    assert not (tmp_path / "_delta_log" / f"{3:020d}.crc").exists()
    (tmp_path / "_delta_log" / f"{2:020d}.crc").write_text(json.dumps(checksum(KB)) + "\n")
    assert write_checksum(uri, 3, [commit(), add("p", KB)], "t3")
    assert read_checksum(uri, 3)["numFiles"] == 2
    assert not write_checksum(uri, 3, [commit(), add("q", 7 * KB)])
    assert read_checksum(uri, 3)["tableSizeBytes"] == 2 * KB
    (tmp_path / "_delta_log" / f"{4:020d}.crc").write_text("{not json")
    assert read_checksum(uri, 4) is None
    assert checksum_uri(uri, 4).endswith(f"_delta_log/{4:020d}.crc")


def test_applies_write_checksums_that_count_the_tables_files(tmp_path: Path):
    """Version 0 (delta-rs creates the table) and each percolake append after it get a
    checksum whose counts are those of the table's files as delta-rs reads them."""
    root = tmp_path / "t"
    for batch in range(3):
        write = intent(root, [data_file(root, f"t{batch}", longs(batch, batch + 1))])
        assert apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                                 commit_ts=batch) == batch
        crc = read_checksum(f"file://{root}", batch)
        files = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pydict()
        assert crc is not None and crc["txnId"] == f"t{batch}"
        assert (crc["numFiles"], crc["tableSizeBytes"]) == (len(files["path"]),
                                                            sum(files["size_bytes"]))
        assert crc["setTransactions"] == [{"appId": "app", "version": batch,
                                           "lastUpdated": crc["setTransactions"][0][
                                               "lastUpdated"]}]
    assert crc["metadata"]["id"] == DeltaTable(str(root)).metadata().id


def test_an_overwrite_committed_by_delta_rs_gets_its_checksum_from_its_entry(tmp_path: Path):
    """delta-rs's commit (an overwrite: removes with their sizes) is read back and derived
    from the previous checksum like an entry of ours; the appends after it go on from it."""
    root = tmp_path / "t"
    modes = (WriteMode.APPEND, WriteMode.APPEND, WriteMode.OVERWRITE, WriteMode.APPEND)
    for batch, mode in enumerate(modes):
        write = intent(root, [data_file(root, f"t{batch}", longs(*range(batch + 1)))],
                       mode=mode)
        apply_table_write(write, app_id="app", app_version=batch, txn_id=f"t{batch}",
                          commit_ts=batch)
    overwrite, after = read_checksum(f"file://{root}", 2), read_checksum(f"file://{root}", 3)
    assert overwrite is not None and overwrite["txnId"] == "t2" and overwrite["numFiles"] == 1
    files = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pydict()
    assert after is not None
    assert (after["numFiles"], after["tableSizeBytes"]) == (2, sum(files["size_bytes"]))


def test_no_checksum_for_a_version_another_writer_committed(tmp_path: Path):
    """The version read back names another transaction (it took the version first): its
    state is not what this apply knows, so no checksum."""
    root = tmp_path / "t"
    apply_table_write(intent(root, [data_file(root, "t0", longs(1))]), app_id="app",
                      app_version=0, txn_id="t0", commit_ts=0)
    assert not write_checksum_of_commit(f"file://{root}", 0, "percolake.txn_id", "other")
    (root / "_delta_log" / f"{0:020d}.crc").unlink()
    assert not write_checksum_of_commit(f"file://{root}", 0, "percolake.txn_id", "other")
    assert read_checksum(f"file://{root}", 0) is None
    assert write_checksum_of_commit(f"file://{root}", 0, "percolake.txn_id", "t0")


def test_a_listing_that_does_not_add_up_to_the_count_is_not_carried_on():
    """A previous checksum whose listing holds fewer files (or bytes) than it counts (another
    writer's, or one derived from a count that is off): the next version lists none."""
    listed = add("p0", KB)["add"] | {"dataChange": False}
    for previous in (checksum(KB, 2 * KB, allFiles=[listed]),
                     checksum(2 * KB, allFiles=[listed])):
        crc = next_checksum(previous, [commit(), add("p9", KB)])
        assert crc is not None and "allFiles" not in crc
    assert "allFiles" in next_checksum(checksum(KB, allFiles=[listed]), [commit(), add("p9", KB)])


def test_no_listing_once_an_entry_names_a_file_by_an_absolute_path():
    """delta-spark's replay qualifies an absolute path (``/t/f`` and ``file:///t/f`` are
    ``file:/t/f`` to it): the same file spelled two ways would be listed twice."""
    base = checksum(KB, allFiles=[add("file:///t/f", KB)["add"] | {"dataChange": False}])
    for entry in ([add("file:/t/f", KB)], [add("/t/g", KB)], [remove("file:/t/f", KB)]):
        crc = next_checksum(base, [commit(), *entry])
        assert crc is not None and "allFiles" not in crc, entry
    assert "allFiles" in next_checksum(base, [commit(), add("t/f", KB)])
