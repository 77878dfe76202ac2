"""Spark settings every JVM of the suite's Spark applications shares (the shared test
sessions, the crash suite's drivers and readers, the cluster's applications)."""

from __future__ import annotations

import os
from pathlib import Path

# The suite's JVMs (Spark sessions and drivers, the cluster's daemons and executors) live seconds
# to minutes: compiling with C1 alone costs them about a third less CPU than tiered C2 does, for
# the same results. C1 alone gets a 48 MB code cache by default, which a shared session fills
# within minutes (Spark's generated classes are new at every query): from then on the JVM threw
# compiled code away and compiled it again, and its sweeper walked the whole cache after every
# 240 KB of new code. The cache tiered compilation would have, swept after every 10 % of it:
# test_row_level.py alone 408-432 -> 335-357 CPU-s (the sweeper had taken 9 % of the JVM's CPU,
# the compiler 10 %).
JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -XX:SweeperThreshold=10"
# what a Spark application of the suite gives its own JVMs on their command line
JVM_OPTIONS = f"-XX:+UseSerialGC {JIT}"

# The tests' queries are many and their data tiny: generating and compiling Java code for each
# query (Spark's default) costs more CPU than interpreting it, with the same results (Spark's
# own tests run in both modes). The suite is CPU-bound on two cores.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false",
               "spark.sql.codegen.factoryMode": "NO_CODEGEN"}

# The tests' tables are a few small files; what Spark and delta-spark do by default for big ones
# costs CPU here (measured on test_row_level.py alone, one shared session: 460–478 CPU-s with none
# of these, 446 with the task counts, 408 with the plan text too, 367 with all three):
# - one task per shuffle and per rebuild of a table version's state (delta-spark's
#   snapshotPartitions) instead of one per core; the tables are written as before (a DataFrame
#   made from a range or a list still has one partition per core);
# - the plan text Spark keeps for its SQL listener of every query in the one-line form, not
#   the formatted one (nothing in the suite reads it);
# - the state delta-spark caches per table version kept as objects, not serialized.
SMALL_DATA = {"spark.sql.shuffle.partitions": "1",
              "spark.databricks.delta.snapshotPartitions": "1",
              "spark.sql.ui.explainMode": "simple",
              "spark.databricks.delta.snapshotCache.storageLevel": "MEMORY_ONLY"}

# The file listing the jars (delta-spark, Hadoop's S3 connector) every JVM of the suite puts on
# its class path, as the class archive has them (tests/jvm_class_archive.py); set by
# tests/conftest.py, the file written by the archive's maker
CLASS_PATH_ENV = "PERCOLAKE_TEST_JVM_CLASS_PATH"


def suite_conf(*, s3_connector: bool = False) -> dict[str, str]:
    """INTERPRETED and SMALL_DATA plus the suite's jars: once the class archive's maker has
    listed them, on the driver's and executors' class path (``configure_spark`` then fetches no
    package, and the JVM can map the archive); until then (or with ``PERCOLAKE_TEST_JVM_ARCHIVE=0``)
    ``configure_spark``'s Maven packages, with ``s3_connector`` Hadoop's S3 connector too."""
    settings = {**INTERPRETED, **SMALL_DATA}
    listed = os.environ.get(CLASS_PATH_ENV)
    if listed and Path(listed).is_file():
        jars = Path(listed).read_text().strip()
        return {**settings, "spark.driver.extraClassPath": jars,
                "spark.executor.extraClassPath": jars}
    return {**settings, **(s3_connector_packages() if s3_connector else {})}


def s3_connector_packages() -> dict[str, str]:
    """Hadoop's S3 connector as Maven packages (``configure_spark`` adds delta-spark's)."""
    from sparkside.session import S3_CONNECTOR, S3_CONNECTOR_EXCLUDES

    return {"spark.jars.packages": ",".join(S3_CONNECTOR),
            "spark.jars.excludes": ",".join(S3_CONNECTOR_EXCLUDES)}
