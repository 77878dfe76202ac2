"""A MERGE's source, materialized once for both of its passes, when delta-spark's MERGE does so.

A copy-on-write MERGE reads its source twice: once to find the files holding matched rows, once
to rewrite them. delta-spark materializes the source first (``MergeIntoMaterializeSource``), so
the second pass does not compute it again and a source that could change between two reads
cannot make the passes disagree (a row matched in the rewrite but in a file the first pass did
not find would be inserted a second time). Its rule, under its own setting
``spark.databricks.delta.merge.materializeSource`` (``auto``, ``all``, ``none``): in ``auto``, an
insert-only MERGE (one pass) and a deterministic source reading only Delta tables are used as
they are; any other source is checkpointed locally, eagerly, at the storage level of
``spark.databricks.delta.merge.materializeSource.rddStorageLevel`` (``DISK_ONLY``), and released
when the MERGE is done.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame

MODE_KEY = "spark.databricks.delta.merge.materializeSource"
STORAGE_KEY = "spark.databricks.delta.merge.materializeSource.rddStorageLevel"
DELTA_INDEX = "org.apache.spark.sql.delta.files.TahoeFileIndex"
FILE_RELATION = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"


def needs_materializing(source: DataFrame, insert_only: bool) -> bool:
    """Whether delta-spark's MERGE would materialize ``source`` (see the module doc)."""
    mode = (source.sparkSession.conf.get(MODE_KEY, "auto") or "auto").lower()
    if mode == "none":
        return False
    if mode != "auto":  # "all", or a value delta-spark does not know: it materializes then
        return True
    if insert_only:
        return False
    plan = source._jdf.queryExecution().analyzed()  # noqa: SLF001 - no public plan API
    return not (plan.deterministic() and _reads_only_delta(plan))


def _reads_only_delta(plan) -> bool:  # noqa: ANN001 - a JVM LogicalPlan
    leaves = plan.collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if not leaf.getClass().getName().endswith(".LogicalRelation"):
            return False
        relation = leaf.relation()
        if not _is_a(relation.getClass(), FILE_RELATION) \
                or not _is_a(relation.location().getClass(), DELTA_INDEX):
            return False
    return True


def _is_a(cls, name: str) -> bool:  # noqa: ANN001 - a java.lang.Class
    """Whether the JVM class ``cls`` is or extends the class ``name`` (delta-spark's classes
    live in Spark's own class loader, out of ``Class.forName``'s reach)."""
    while cls is not None:
        if cls.getName() == name:
            return True
        cls = cls.getSuperclass()
    return False


@dataclass(frozen=True)
class MergeSource:
    frame: DataFrame  # what the MERGE reads
    materialize_ms: int  # what materializing it took (delta-spark's materializeSourceTimeMs)


@contextmanager
def merge_source(source: DataFrame, insert_only: bool) -> Iterator[MergeSource]:
    """``source`` as the MERGE reads it: materialized once when delta-spark's would be
    (released on leaving), else as it is."""
    if not needs_materializing(source, insert_only):
        yield MergeSource(source, 0)
        return
    conf = source.sparkSession.conf
    level = getattr(StorageLevel, (conf.get(STORAGE_KEY, "DISK_ONLY") or "DISK_ONLY").upper(),
                    StorageLevel.DISK_ONLY)
    started = time.monotonic()
    materialized = source.localCheckpoint(eager=True, storageLevel=level)
    try:
        yield MergeSource(materialized, int((time.monotonic() - started) * 1000))
    finally:
        plan = materialized._jdf.queryExecution().analyzed()  # noqa: SLF001 - a LogicalRDD
        plan.rdd().unpersist(False)
