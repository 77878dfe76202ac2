"""Reading many tables at one consistent point in time.

GetSnapshot answers a snapshot_ts and a Delta version per table (the coordinator first rolls
forward committed writes that are not applied yet). Each table is then read at exactly that
version: with Spark's ``delta`` source when delta-spark is on the classpath, otherwise from the
version's file list (delta-rs) with Spark's Parquet reader, partition columns restored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple
from urllib.parse import unquote

import pyarrow
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from percolake.lake.warehouse import local_path
from percolake.v1 import coordinator_pb2 as pb
from sparkside.client import CoordinatorClient
from sparkside.errors import TableNotWritten

AsOf = int | tuple[str, int] | tuple[str, int, int] | None
FILE_COLUMN = "__percolake_file"
KNOWN_COLUMN = "__percolake_known"


class Snapshot:
    """The tables at one snapshot: ``table(name)``, ``snapshot_ts`` and ``versions``."""

    def __init__(self, spark: SparkSession, reply: pb.GetSnapshotResponse) -> None:
        self._spark = spark
        self.snapshot_ts: int = reply.snapshot_ts
        self.versions: dict[str, int | None] = {
            t.table: (t.delta_version if t.exists else None) for t in reply.tables}
        self._canonical = {t.table: t.canonical_table for t in reply.tables}

    def table(self, name: str) -> DataFrame:
        """The table as a Spark DataFrame at this snapshot.

        Raises:
            KeyError: ``name`` was not part of the snapshot.
            TableNotWritten: the table had no committed write at ``snapshot_ts``.
        """
        if name not in self.versions:
            raise KeyError(f"{name} is not in this snapshot; it has {sorted(self.versions)}")
        version = self.versions[name]
        if version is None:
            raise TableNotWritten(
                f"table {name} has no committed write at or before snapshot {self.snapshot_ts}")
        return read_table_version(self._spark, self._canonical[name], version)


class ConsistentReader:
    """Snapshots of several tables from the coordinator at ``target``."""

    def __init__(self, spark: SparkSession, target: str, retry_s: float = 30.0) -> None:
        self._spark = spark
        self._client = CoordinatorClient(target, retry_s)

    def snapshot(self, tables: Sequence[str], as_of: AsOf = None,
                 wait_s: float | None = None) -> Snapshot:
        """A consistent snapshot of ``tables``.

        Args:
            tables: absolute paths or ``file://`` URIs; ``Snapshot.table`` takes the same strings.
            as_of: None for the latest; a commit_ts to travel to; ``(pipeline, batch)`` for the
                state right after that batch of the current generation, or
                ``(pipeline, generation, batch)``.
            wait_s: how long the coordinator may spend rolling commits forward.
        """
        request = pb.GetSnapshotRequest(tables=list(tables))
        if isinstance(as_of, int) and not isinstance(as_of, bool):
            request.as_of_ts = as_of
        elif isinstance(as_of, tuple) and len(as_of) == 2:
            request.as_of_batch.CopyFrom(pb.BatchRef(pipeline_id=as_of[0], batch_id=as_of[1]))
        elif isinstance(as_of, tuple) and len(as_of) == 3:
            request.as_of_batch.CopyFrom(pb.BatchRef(pipeline_id=as_of[0], generation=as_of[1],
                                                     batch_id=as_of[2]))
        elif as_of is not None:
            raise ValueError("as_of is a commit_ts, (pipeline, batch) or "
                             f"(pipeline, generation, batch); got {as_of!r}")
        if wait_s is not None:
            request.wait_timeout_ms = int(wait_s * 1000)
        return Snapshot(self._spark, self._client.call("GetSnapshot", request))

    def close(self) -> None:
        self._client.close()


def _delta_spark_available(spark: SparkSession) -> bool:
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")  # type: ignore[union-attr]
        return True
    except Exception:
        return False


class TableFiles(NamedTuple):
    """One version of a Delta table as its log lists it: what Spark's Parquet reader needs."""

    schema: T.StructType
    partition_columns: list[str]
    files: dict[str, dict]  # local path of each data file -> its partition values


def table_files(table_uri: str, version: int) -> TableFiles:
    """The schema, partition columns and data files of a table's version, from its Delta log
    (delta-rs; no JVM). The log is read as metadata only: no Parquet scan, no Arrow threads."""
    path = local_path(table_uri)
    table = DeltaTable(path, version=version)
    schema = from_arrow_schema(pyarrow.schema(table.schema().to_arrow()),
                               prefer_timestamp_ntz=True)
    files: dict[str, dict] = {}
    for add in pyarrow.table(table.get_add_actions(flatten=False)).to_pylist():
        # the log's paths are URI-encoded relative paths
        files[f"{path}/{unquote(add['path'])}"] = add.get("partition") or {}
    return TableFiles(schema, list(table.metadata().partition_columns), files)


def read_table_version(spark: SparkSession, table_uri: str, version: int) -> DataFrame:
    """One Delta table at one version as a Spark DataFrame, columns in the table's order."""
    if _delta_spark_available(spark):
        return spark.read.format("delta").option("versionAsOf", version).load(
            local_path(table_uri))
    schema, partition_columns, files = table_files(table_uri, version)
    data_schema = T.StructType([f for f in schema.fields if f.name not in partition_columns])
    if not files:
        return spark.createDataFrame([], schema)
    scan = spark.read.schema(data_schema).parquet(*files)
    if not partition_columns:
        return scan.select(*schema.fieldNames())
    return _with_partition_values(spark, scan, schema, partition_columns, files)


def _with_partition_values(spark: SparkSession, scan: DataFrame, schema: T.StructType,
                           partition_columns: list[str], files: dict[str, dict]) -> DataFrame:
    """Adds each row's partition values, as the Delta log records them for its file.

    One scan of every file, joined (broadcast) with a small table of file -> partition values
    on the path Spark reports in ``_metadata.file_path`` (a URI; percent-decoded here to the
    local path, protecting ``+`` from form decoding). A file missing from that table fails the
    query loudly instead of giving a row wrong partition values.
    """
    mapping_schema = T.StructType(
        [T.StructField(FILE_COLUMN, T.StringType(), False)]
        + [T.StructField(c, schema[c].dataType, True) for c in partition_columns]
        + [T.StructField(KNOWN_COLUMN, T.BooleanType(), False)])
    mapping = spark.createDataFrame(
        [(file, *(values.get(c) for c in partition_columns), True)
         for file, values in files.items()], mapping_schema)
    decoded = F.regexp_replace(
        F.url_decode(F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B"))),
        "^file:(//)?", "")
    joined = scan.withColumn(FILE_COLUMN, decoded).join(F.broadcast(mapping), FILE_COLUMN,
                                                        "left")
    unknown = F.raise_error(F.concat(F.lit("percolake: no Delta partition values for file "),
                                     F.col(FILE_COLUMN)))
    return joined.select(*[
        F.when(F.col(KNOWN_COLUMN).isNull(), unknown).otherwise(F.col(c)).alias(c)
        if c in partition_columns else F.col(c) for c in schema.fieldNames()])
