"""Version checksums (``<version>.crc``) of percolake's commits side by side with delta-spark's:
an append and a MERGE on a delta-spark-made table with deletion vectors, each done by
percolake on the table and by delta-spark on a copy, and a table percolake creates and then
overwrites (commits delta-rs makes); delta-spark's own checksum validation (the one its
checkpoints and commits run, fatal on a mismatch) accepts percolake's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession

from sparkside import Participant
from sparkside.jvm_names import jvm_class

pytestmark = pytest.mark.spark

SCHEMA = "id long, value long, region string"


def checksum(table: Path, version: int) -> dict:
    return json.loads((table / "_delta_log" / f"{version:020d}.crc").read_text())


def listing(crc: dict) -> list[tuple]:
    """A checksum's file listing (``allFiles``, which delta-spark's reads of the version take
    instead of replaying its log): each file's path, size, statistics and deletion vector."""
    return sorted((a["path"], a["size"], a["stats"],
                   (a.get("deletionVector") or {}).get("cardinality")) for a in crc["allFiles"])


def replayed(spark: SparkSession, table: Path) -> list[tuple]:
    """The same of the table's newest version, from delta-spark's own replay of its log."""
    snapshot = newest_snapshot(spark, table)
    files = DataFrame(snapshot.allFilesViaStateReconstruction().toDF(), spark).collect()
    return sorted((f.path, f.size, f.stats,
                   f.deletionVector.cardinality if f.deletionVector else None) for f in files)


def _every_field(add: object) -> tuple:
    """An AddFile's every field, as delta-spark holds it (no tags and empty tags alike: its
    reading of a checksum's listing makes the one the other)."""
    def text(value: object) -> str | None:
        return None if value is None else str(value)

    tags = add.tags()
    return (add.path(), text(add.partitionValues()), add.size(), add.modificationTime(),
            add.dataChange(), add.stats(), None if tags is None or tags.isEmpty() else str(tags),
            text(add.deletionVector()), text(add.baseRowId()),
            text(add.defaultRowCommitVersion()), text(add.clusteringProvider()))


def delta_log_of(spark: SparkSession) -> object:
    """delta-spark's ``DeltaLog`` object (its log cache) in ``spark``'s JVM."""
    return jvm_class(spark._jvm, "org.apache.spark.sql.delta.DeltaLog")


def forget(spark: SparkSession, table: Path) -> None:
    """Drops delta-spark's cached log of ``table`` alone: its next read lists and reads the
    table from storage. Other tables keep their cached states (clearing every table's made the
    listing tests rebuild their reference copies too: a quarter of their time)."""
    path = jvm_class(spark._jvm, "org.apache.hadoop.fs.Path")(str(table))
    delta_log_of(spark).invalidateCache(spark._jsparkSession, path)


def rows(spark: SparkSession, table: Path) -> list[tuple]:
    """The table's rows as delta-spark reads them through its cached log of the table, sorted:
    what storage holds for a table only delta-spark wrote, or one just read anew."""
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(table)).collect())


def rows_anew(spark: SparkSession, table: Path) -> list[tuple]:
    """The table's rows as delta-spark reads them from storage (``forget``), sorted."""
    forget(spark, table)
    return rows(spark, table)


def newest_snapshot(spark: SparkSession, table: Path, version: int | None = None) -> object:
    """delta-spark's snapshot of ``table``'s newest version, read anew (``version``: which it
    must be)."""
    forget(spark, table)
    log = delta_log_of(spark).forTable(spark._jsparkSession, str(table))
    snapshot = log.unsafeVolatileSnapshot()
    assert version is None or snapshot.version() == version
    return snapshot


def listed_as_replayed(spark: SparkSession, table: Path, version: int,
                       snapshot: object | None = None) -> None:
    """The newest version's file listing, as delta-spark reads it from the checksum, is its
    replay of the log in every field of every file (paths, partition values, sizes, times,
    statistics, tags, deletion vectors, row ids, clustering); ``snapshot``: that version's,
    already read."""
    snapshot = snapshot or newest_snapshot(spark, table, version)
    crc = snapshot.checksumOpt().get()
    assert crc.allFiles().isDefined(), f"version {version} lists no files"
    listed = crc.allFiles().get()
    assert sorted(_every_field(listed.apply(i)) for i in range(listed.size())) == sorted(
        _every_field(a) for a in snapshot.allFilesViaStateReconstruction().collectAsList()), \
        version


def validated(spark: SparkSession, table: Path, version: int, *,
              listing: bool = False) -> object:
    """delta-spark's snapshot of ``table`` at its newest version, read from its checksum and
    validated against the state it reconstructs from the log (raises on a mismatch); with
    ``listing``, also ``listed_as_replayed`` on the same snapshot (one reconstruction)."""
    snapshot = newest_snapshot(spark, table, version)
    assert snapshot.checksumOpt().isDefined(), "delta-spark read no checksum of the version"
    assert snapshot.validateChecksum(getattr(snapshot, "validateChecksum$default$1")())
    if listing:
        listed_as_replayed(spark, table, version, snapshot)
    return snapshot.checksumOpt().get()


def assert_like_delta_sparks(ours: dict, theirs: dict, *, same_files: bool) -> None:
    """The same fields (the file listing too), the same table description; with
    ``same_files`` (both sides wrote the same rows into one file each) the same counts, except
    sizes (two Parquet writers)."""
    assert set(ours) == set(theirs), (set(ours), set(theirs))
    for field in ("numMetadata", "numProtocol", "metadata", "protocol", "domainMetadata"):
        assert ours[field] == theirs[field], field
    assert ours["fileSizeHistogram"]["sortedBinBoundaries"] \
        == theirs["fileSizeHistogram"]["sortedBinBoundaries"]
    reference_apps = {t["appId"] for t in theirs["setTransactions"]}
    assert [t for t in theirs["setTransactions"]] \
        == [t for t in ours["setTransactions"] if t["appId"] in reference_apps]
    assert len(ours["setTransactions"]) == len(theirs["setTransactions"]) + 1  # the pipeline's
    if same_files:
        for field in ("numFiles", "numDeletedRecordsOpt", "numDeletionVectorsOpt",
                      "deletedRecordCountsHistogramOpt"):
            assert ours[field] == theirs[field], field
        assert ours["fileSizeHistogram"]["fileCounts"] \
            == theirs["fileSizeHistogram"]["fileCounts"]


def test_forget_drops_one_tables_cached_log_and_keeps_the_others(spark, tmp_path) -> None:  # noqa: ANN001
    delta_log = delta_log_of(spark)
    tables = [tmp_path / "a", tmp_path / "b"]
    for table in tables:
        spark.range(1).write.format("delta").save(str(table))

    def log_of(table: Path) -> object:
        return delta_log.forTable(spark._jsparkSession, str(table))

    first, second = (log_of(t) for t in tables)
    assert log_of(tables[0]).equals(first), "delta-spark caches a table's log"
    forget(spark, tables[0])
    assert not log_of(tables[0]).equals(first)
    assert log_of(tables[1]).equals(second)


def test_percolakes_checksums_are_delta_sparks_and_pass_its_validation(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    participant = Participant(lake_daemon.target, pipeline_id=f"crc-{lake.name}")
    ours, theirs = lake / "crc", lake / "crc-reference"
    (spark.createDataFrame([(i, i, "eu") for i in range(1, 7)], SCHEMA).coalesce(1)
     .write.format("delta").option("delta.enableDeletionVectors", "true").save(str(ours)))
    spark.sql(f"DELETE FROM delta.`{ours}` WHERE id = 3")  # version 1: a deletion vector
    shutil.copytree(ours, theirs)
    assert checksum(ours, 1)["numDeletionVectorsOpt"] == 1

    appended = spark.createDataFrame([(7, 7, "us"), (8, 8, "us")], SCHEMA).coalesce(1)
    participant.run_batch(spark.range(1), 0, lambda df, b, txn: txn.write(appended, str(ours)))
    appended.write.format("delta").mode("append").save(str(theirs))
    append = checksum(ours, 2)
    assert_like_delta_sparks(append, checksum(theirs, 2), same_files=True)
    assert validated(spark, ours, 2).numFiles() == 2
    assert listing(append) == replayed(spark, ours)

    source = spark.createDataFrame([(2, 20, "eu"), (9, 9, "ap")], SCHEMA)

    def merge(dt) -> None:  # noqa: ANN001 - deletes id 2 by the file's vector, inserts anew
        (dt.alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    def batch(df: DataFrame, batch_id: int, txn) -> None:  # noqa: ANN001
        merge(txn.delta_table(str(ours)))

    participant.run_batch(spark.range(1), 1, batch)
    merge(DeltaTable.forPath(spark, str(theirs)))
    merged = checksum(ours, 3)
    assert_like_delta_sparks(merged, checksum(theirs, 3), same_files=False)
    # merge-on-read: the file keeps a vector of both rows, as delta-spark's MERGE leaves it
    assert (merged["numDeletionVectorsOpt"], merged["numDeletedRecordsOpt"]) == (1, 2)
    # the files with deleted rows alike (the first bin counts files without: the new files,
    # which the two writers split differently)
    assert merged["deletedRecordCountsHistogramOpt"]["deletedRecordCounts"][1:] \
        == checksum(theirs, 3)["deletedRecordCountsHistogramOpt"]["deletedRecordCounts"][1:]
    assert validated(spark, ours, 3).tableSizeBytes() == merged["tableSizeBytes"]
    assert listing(merged) == replayed(spark, ours)

    # the validation is live: a checksum one file off fails it, as it would delta-spark's writes
    broken = lake / "crc-broken"
    shutil.copytree(ours, broken)
    (broken / "_delta_log" / f"{3:020d}.crc").write_text(
        json.dumps({**merged, "numFiles": merged["numFiles"] + 1}) + "\n")
    with pytest.raises(Py4JJavaError, match="Number of files"):
        validated(spark, broken, 3)

    # a table percolake creates (delta-rs's version 0) and overwrites (delta-rs's commit)
    made, reference = lake / "made", lake / "made-reference"
    participant.run_batch(spark.range(1), 2, lambda df, b, txn: txn.write(appended, str(made)))
    appended.write.format("delta").save(str(reference))
    first = checksum(made, 0)
    assert set(first) == set(checksum(reference, 0))
    assert first["numFiles"] == checksum(reference, 0)["numFiles"] == 1
    validated(spark, made, 0)
    assert listing(first) == replayed(spark, made)
    participant.run_batch(spark.range(1), 3, lambda df, b, txn: txn.write(
        source, str(made), mode="overwrite"))
    assert validated(spark, made, 1).numFiles() == checksum(made, 1)["numFiles"]
    assert listing(checksum(made, 1)) == replayed(spark, made)


# each needs escaping in a path; delta-spark's log spells "ü" unescaped, percolake's "%C3%BC"
# (a remove of delta-spark's file must take its add's spelling, or the file stays)
ODD_REGIONS = ["a b", "50%", "x=y", "a/b", None, "ü"]


def test_listings_match_delta_sparks_replay_through_every_kind_of_commit(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """Each version percolake commits on delta-spark-made tables lists exactly the files
    delta-spark's replay of the log holds, or lists none; delta-spark reads (from that listing)
    the rows its own operations leave on a copy: partition values whose paths are escaped,
    copy-on-write UPDATE/DELETE/MERGE (by join keys alone: the find pass
    reads the listing; with other aliases; with a target-only conjunct; after
    an UPDATE and an append of the same batch), an UPDATE, a MERGE and a DELETE in one batch
    each reading the files the ones before wrote into escaped partitions (copy-on-write, and
    merge-on-read after an append), partition overwrites, overwrites."""
    from tests.spark.helpers import run_on_both

    participant = Participant(lake_daemon.target, pipeline_id=f"crc-odd-{lake.name}")

    def check(ours: Path, theirs: Path, version: int, *, lists: bool | None = None) -> None:
        crc = checksum(ours, version)
        if lists is not None:
            assert ("allFiles" in crc) is lists, version
        if "allFiles" in crc:
            validated(spark, ours, version, listing=True)  # reads ``ours`` anew
            assert rows(spark, ours) == rows(spark, theirs), version
        else:
            assert rows_anew(spark, ours) == rows(spark, theirs), version

    # a partitioned, copy-on-write table whose partition values need escaping in paths
    ours, theirs = lake / "odd", lake / "odd-reference"
    (spark.createDataFrame([(i, i, r) for i, r in enumerate(ODD_REGIONS)], SCHEMA)
     .write.format("delta").partitionBy("region").save(str(ours)))
    shutil.copytree(ours, theirs)
    listed_as_replayed(spark, ours, 0)  # delta-spark's own listing: the comparison holds
    appended = spark.createDataFrame([(10 + i, i, r) for i, r in enumerate(ODD_REGIONS)],
                                     SCHEMA)
    participant.run_batch(spark.range(1), 0, lambda df, b, txn: txn.write(appended, str(ours)))
    appended.write.format("delta").mode("append").save(str(theirs))
    check(ours, theirs, 1, lists=True)

    source = spark.createDataFrame([(i, 100 + i, r) for i, r in enumerate(ODD_REGIONS)]
                                   + [(50, 50, "a b")], SCHEMA)

    def update(dt, s) -> None:  # noqa: ANN001
        dt.update("id % 2 = 0", {"value": "value + 1000"})

    def delete(dt, s) -> None:  # noqa: ANN001
        dt.delete("id = 13")

    def merge_by_keys(dt, s) -> None:  # noqa: ANN001 - the find pass reads the listing
        (dt.alias("t").merge(s.alias("s"), "t.id = s.id")
         .whenMatchedUpdate(set={"value": "t.value + s.value"}).whenNotMatchedInsertAll()
         .execute())

    for batch_id, operation in enumerate([update, delete, merge_by_keys], start=10):
        run_on_both(spark, participant, batch_id, [operation], source, ours, theirs)
    check(ours, theirs, 4)

    def merge_on_columns(dt, s) -> None:  # noqa: ANN001 - other aliases, the listing's find
        dt.alias("x").merge(s.alias("y"), "x.id = y.id").whenMatchedDelete().execute()

    def merge_pruned(dt, s) -> None:  # noqa: ANN001 - a target-only conjunct: pruned path
        (dt.alias("t").merge(s.alias("s"), "t.id = s.id AND t.region = 'x=y'")
         .whenMatchedUpdate(set={"value": "s.value"}).execute())

    source2 = spark.createDataFrame([(2, 7, "x=y"), (1, 7, "50%")], SCHEMA)
    run_on_both(spark, participant, 13, [merge_pruned], source2, ours, theirs)
    check(ours, theirs, 5)
    run_on_both(spark, participant, 14, [merge_on_columns], source2, ours, theirs)
    check(ours, theirs, 6)

    replaced = spark.createDataFrame([(60, 60, "50%"), (61, 61, None)], SCHEMA)
    participant.run_batch(spark.range(1), 15, lambda df, b, txn: txn.write(
        replaced, str(ours), mode="overwrite_partitions"))
    (replaced.write.format("delta").mode("overwrite")
     .option("partitionOverwriteMode", "dynamic").save(str(theirs)))
    check(ours, theirs, 7)

    # an append then a MERGE by keys of the same batch (reads the append)
    def appended_then_merged(df, b, txn) -> None:  # noqa: ANN001
        txn.write(spark.createDataFrame([(70, 70, "ü")], SCHEMA), str(ours))
        merge_by_keys(txn.delta_table(str(ours)), spark.createDataFrame([(70, 1, "ü")], SCHEMA))

    participant.run_batch(spark.range(1), 16, appended_then_merged)
    spark.createDataFrame([(70, 70, "ü")], SCHEMA).write.format("delta").mode(
        "append").save(str(theirs))
    merge_by_keys(DeltaTable.forPath(spark, str(theirs)),
                  spark.createDataFrame([(70, 1, "ü")], SCHEMA))
    check(ours, theirs, 8)

    # several operations of one batch, each reading the files the ones before it wrote into
    # escaped partitions: an UPDATE, a MERGE updating those rows and inserting into every
    # partition, a DELETE of rows it inserted
    inserted = spark.createDataFrame([(0, 5, ODD_REGIONS[0])] + [
        (80 + i, 80 + i, r) for i, r in enumerate(ODD_REGIONS)], SCHEMA)
    sequence = [update, merge_by_keys, lambda dt, s: dt.delete("id IN (81, 82, 84, 85)")]
    run_on_both(spark, participant, 17, sequence, inserted, ours, theirs)
    check(ours, theirs, 9)

    participant.run_batch(spark.range(1), 18, lambda df, b, txn: txn.write(
        replaced, str(ours), mode="overwrite"))
    replaced.write.format("delta").mode("overwrite").save(str(theirs))
    check(ours, theirs, 10)

    # the same sequence merge-on-read, after an append of the batch (deletion vectors on the
    # table's files, the batch's own files rewritten)
    ours, theirs = lake / "odd-dv", lake / "odd-dv-reference"
    (spark.createDataFrame([(i + 7 * k, i, r) for k in range(2)  # an even and an odd id a file
                            for i, r in enumerate(ODD_REGIONS)], SCHEMA).coalesce(1)
     .write.format("delta").partitionBy("region")
     .option("delta.enableDeletionVectors", "true").save(str(ours)))
    shutil.copytree(ours, theirs)
    appended_rows = [(90 + i, i, r) for i, r in enumerate(ODD_REGIONS)]

    def appended_then_sequence(df, b, txn) -> None:  # noqa: ANN001
        txn.write(spark.createDataFrame(appended_rows, SCHEMA), str(ours))
        for operation in sequence:
            operation(txn.delta_table(str(ours)), inserted)

    participant.run_batch(spark.range(1), 19, appended_then_sequence)
    spark.createDataFrame(appended_rows, SCHEMA).write.format("delta").mode(
        "append").save(str(theirs))
    for operation in sequence:
        operation(DeltaTable.forPath(spark, str(theirs)), inserted)
    check(ours, theirs, 1)
    assert checksum(ours, 1)["numDeletionVectorsOpt"] > 0, "merge-on-read: the UPDATE's vectors"


def test_listings_of_merge_on_read_column_mapped_and_evolved_tables_match_delta_sparks_replay(
        spark, lake_daemon, lake) -> None:  # noqa: ANN001
    """A partitioned table with deletion vectors and column mapping (name), partition values
    escaped on disk: percolake's merge-on-read UPDATE, DELETE and MERGE list exactly delta-spark's
    replay (statistics keyed by physical names, the files again with their new vectors);
    delta-spark's own commit after percolake's derives its listing from percolake's and it is
    its replay too; a schema change (merge_schema) and the versions after it list none. Then
    a column-mapped (id) table's append."""
    from tests.spark.helpers import run_on_both

    participant = Participant(lake_daemon.target, pipeline_id=f"crc-mor-{lake.name}")

    def check(version: int, *, lists: bool) -> dict:
        crc = checksum(ours, version)
        assert ("allFiles" in crc) is lists, version
        if lists:  # what delta-spark reads from the listing: its copy's rows
            listed_as_replayed(spark, ours, version)  # reads ``ours`` anew
            assert rows(spark, ours) == rows(spark, theirs), version
        return crc

    ours, theirs = lake / "mor", lake / "mor-reference"
    spark.sql(f"CREATE TABLE delta.`{ours}` ({SCHEMA}) USING delta PARTITIONED BY (region) "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
              "'delta.columnMapping.mode' = 'name')")
    (spark.createDataFrame([(10 * i + j, j, r) for i, r in enumerate(ODD_REGIONS)
                            for j in range(3)], SCHEMA).coalesce(1)
     .write.format("delta").mode("append").save(str(ours)))
    shutil.copytree(ours, theirs)
    first = check(1, lists=True)
    physical = {f["name"]: f["metadata"]["delta.columnMapping.physicalName"]
                for f in json.loads(first["metadata"]["schemaString"])["fields"]}
    source = spark.createDataFrame([(10 * i + 1, 100 + i, r) for i, r in enumerate(ODD_REGIONS)]
                                   + [(99, 99, "ü")], SCHEMA)

    def update(dt, s) -> None:  # noqa: ANN001
        dt.update("id % 10 = 0", {"value": "value + 1000"})

    def delete(dt, s) -> None:  # noqa: ANN001
        dt.delete("id % 10 = 2")

    def merge(dt, s) -> None:  # noqa: ANN001
        (dt.alias("t").merge(s.alias("s"), "t.id = s.id")
         .whenMatchedUpdate(set={"value": "t.value + s.value"}).whenNotMatchedInsertAll()
         .execute())

    for version, (batch_id, operation) in enumerate([(0, update), (1, delete), (2, merge)],
                                                    start=2):
        run_on_both(spark, participant, batch_id, [operation], source, ours, theirs)
        crc = check(version, lists=True)
        if operation is not merge:  # merge-on-read (the MERGE deletes the files' last rows)
            assert crc["numDeletionVectorsOpt"] > 0, version
        for file in crc["allFiles"]:
            assert set(json.loads(file["stats"])["minValues"]) <= set(physical.values())

    # delta-spark's commit after percolake's: its listing is derived from percolake's
    for table in (ours, theirs):
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 1")
    check(5, lists=True)

    # a schema change lists no files, nor do percolake's versions after it
    wider = spark.createDataFrame([(70, 70, "a b", "new")],
                                  SCHEMA + ", note string")
    participant.run_batch(spark.range(1), 3, lambda df, b, txn: txn.write(
        wider, str(ours), merge_schema=True))
    check(6, lists=False)
    participant.run_batch(spark.range(1), 4, lambda df, b, txn: txn.write(wider, str(ours)))
    check(7, lists=False)

    # column mapping by id: statistics keyed by the physical names
    ours = lake / "mapped-by-id"
    spark.sql(f"CREATE TABLE delta.`{ours}` ({SCHEMA}) USING delta "
              "TBLPROPERTIES ('delta.columnMapping.mode' = 'id')")
    appended = spark.createDataFrame([(1, 1, "eu"), (2, 2, "ü")], SCHEMA).coalesce(1)
    participant.run_batch(spark.range(1), 5, lambda df, b, txn: txn.write(appended, str(ours)))
    crc = checksum(ours, 1)
    listed_as_replayed(spark, ours, 1)
    physical = {f["metadata"]["delta.columnMapping.physicalName"]
                for f in json.loads(crc["metadata"]["schemaString"])["fields"]}
    (file,) = crc["allFiles"]
    assert set(json.loads(file["stats"])["minValues"]) == physical
