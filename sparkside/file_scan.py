"""delta-spark's read of exactly some data files of one table version.

A row-level write rewrites the files holding rows it changes. Filtering the whole table on
``_metadata.file_path`` does not prune the scan (measured: Spark's Delta scan still reads every
file and drops the rows afterwards), so the rewrite reads a relation built from those files'
add actions, as delta-spark's own MERGE does (``DeltaLog.createDataFrame``): only they are
listed, so only they are read, with their partition values and deletion vectors applied.

Those add actions come from the query that found the files: delta-spark's scan of it holds the
add actions it listed (``PreparedDeltaFileIndex``), so looking them up costs no Spark job; only
when that scan is not there (another delta-spark, statistics skipping off) are they read from
the snapshot's state by a Spark job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from percolake.lake.log_entry import log_path
from percolake.lake.warehouse import spark_uri
from sparkside.jvm_names import jvm_class


@dataclass(frozen=True)
class FileScan:
    """The table's Delta snapshot at one version, as delta-spark's JVM side holds it."""

    spark: SparkSession
    log: Any  # org.apache.spark.sql.delta.DeltaLog
    snapshot: Any  # org.apache.spark.sql.delta.Snapshot

    @classmethod
    def at(cls, spark: SparkSession, table_uri: str, version: int) -> FileScan:
        jvm = spark._jvm
        log = jvm_class(jvm, "org.apache.spark.sql.delta.DeltaLog").forTable(spark._jsparkSession,
                                                               spark_uri(table_uri))
        none = jvm_class(jvm, "scala.Option").empty()
        return cls(spark, log, log.getSnapshotAt(version, none, none, False))

    def scanned(self, frame: DataFrame) -> dict[str, Any]:
        """The add actions, by ``path`` as the log spells it, that the already executed
        ``frame`` listed when it read this table at this snapshot's version ({} when its plan
        holds no such listing)."""
        found: dict[str, Any] = {}
        data_path = self.log.dataPath().toString()
        version = self.snapshot.version()
        leaves = frame._jdf.queryExecution().optimizedPlan().collectLeaves().iterator()
        while leaves.hasNext():
            leaf = leaves.next()
            if not leaf.getClass().getName().endswith(".LogicalRelation"):
                continue
            index = leaf.relation().location()
            if not index.getClass().getName().endswith(".PreparedDeltaFileIndex"):
                continue
            scan = index.preparedScan()
            if index.deltaLog().dataPath().toString() != data_path or scan.version() != version:
                continue
            found.update(_by_path(scan.files()))
        return found

    def listed(self) -> dict[str, Any] | None:
        """The version's add actions, by ``path`` as the log spells it, as its checksum lists
        them (``allFiles``; no Spark job); None when the checksum lists none."""
        checksum = self.snapshot.checksumOpt()
        files = checksum.get().allFiles() if checksum.isDefined() else None
        if files is None or not files.isDefined():
            return None
        return _by_path(files.get())

    def spark_path(self, relative: str) -> str:
        """The ``_metadata.file_path`` Spark gives the rows of the table's file at
        ``relative`` (its real path below the table root): delta-spark's own resolution of a
        log path against the table, URI-encoded as Spark spells file paths."""
        operations = jvm_class(self.spark._jvm,
                               "org.apache.spark.sql.delta.util.DeltaFileOperations")
        return operations.absolutePath(self.log.dataPath().toString(),
                                       log_path(relative)).toUri().toString()

    def add_actions(self, paths: Iterable[str]) -> list[Any]:
        """The snapshot's add actions whose ``path`` is one of ``paths`` (as the log spells
        them), from its state: a Spark job (``scanned`` needs none)."""
        wanted = sorted(set(paths))
        if not wanted:
            return []
        found = self.snapshot.allFiles().where(F.col("path").isin(wanted)._jc)
        return list(found.collectAsList())

    def rows(self, add_actions: list[Any]) -> DataFrame:
        """The rows of exactly these files (deletion vectors applied), in the table's
        columns; ``_metadata`` is available as on any file source."""
        jvm = self.spark._jvm
        scala = jvm_class(jvm, "scala.jdk.javaapi.CollectionConverters")
        files = scala.asScala(add_actions).toList()
        frame = self.log.createDataFrame(self.snapshot, files, False,
                                         jvm_class(jvm, "scala.Option").empty())
        return DataFrame(frame, self.spark)


def _by_path(adds: Any) -> dict[str, Any]:
    """A Scala collection of add actions by ``path`` as the log spells it."""
    found: dict[str, Any] = {}
    iterator = adds.iterator()
    while iterator.hasNext():
        add = iterator.next()
        found[add.path()] = add
    return found
