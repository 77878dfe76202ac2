"""SparkSessions with what percolake needs.

``configure_spark(builder)`` adds delta-spark to a user's ``SparkSession.builder``: its jar
(fetched by Spark from Maven Central on first use, see ``spark.jars.packages``), its SQL
extension and catalog, and the executors' Python (``PYSPARK_PYTHON``); with a warehouse on S3
also Hadoop's S3 connector and ``fs.s3a.*`` from the AWS environment. ``local_spark`` is the
session of percolake's tests and demo (local, or on a cluster's master), built on it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from percolake.lake.storage import hadoop_s3a_options
from percolake.lake.warehouse import is_object_store

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
PYTHON_KEY = "spark.pyspark.python"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
SCALA_VERSION = "2.13"  # PySpark 4 is built for Scala 2.13 only

# Libraries delta-spark's Maven dependencies drag in (through delta-kernel-defaults) that
# PySpark already ships, in newer versions. Spark loads its own copy first (parent-first
# class loading), so a downloaded one would be dead weight: ~74 MB of the ~87 MB download.
SPARK_PROVIDED = (
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-jackson",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-annotations",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
    "com.github.luben:zstd-jni",
    "io.airlift:aircompressor",
    "org.roaringbitmap:RoaringBitmap",
    "com.google.code.findbugs:jsr305",
    "org.locationtech.jts:jts-core",
    "commons-pool:commons-pool",
)

# Hadoop's S3 connector for PySpark's Hadoop (3.5.0) and the AWS SDK v2 modules it uses, at the
# SDK version that Hadoop 3.5.0 is built with. hadoop-aws asks for the SDK's "bundle" (~600 MB,
# every AWS service); the S3 modules alone are ~18 MB with their dependencies.
HADOOP_AWS_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
S3_CONNECTOR = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
    f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
)
S3_CONNECTOR_EXCLUDES = ("software.amazon.awssdk:bundle",)
S3A_PREFIX = "spark.hadoop.fs.s3a."
# delta-spark rebuilds a table version's state (its checkpoint and the log entries after it) in
# this many tasks, 50 unless set: each read of a new version of a small table then runs 50
# tiny tasks. With a checkpoint every 10 versions (percolake.lake.checkpoints) a version's log
# is small; a local session gets one task per core, any other CLUSTER_SNAPSHOT_PARTITIONS.
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
CLUSTER_SNAPSHOT_PARTITIONS = 8

_announced: set[str] = set()


def delta_package() -> str:
    """The Maven coordinates of the delta-spark jar matching the installed ``delta-spark``
    and PySpark, e.g. ``io.delta:delta-spark_4.2_2.13:4.4.0``."""
    delta_version = importlib.metadata.version("delta-spark")
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_{SCALA_VERSION}:{delta_version}"


def configure_spark(builder: SparkSession.Builder, extra_packages: Iterable[str] = (),
                    warehouse: str | Sequence[str] | None = None) -> SparkSession.Builder:
    """``builder`` with what percolake needs; call it before ``getOrCreate()``.

    - delta-spark: its jar in ``spark.jars.packages`` (with ``extra_packages``), its SQL
      extension in ``spark.sql.extensions`` and its catalog as ``spark_catalog``. Spark
      fetches the jars from Maven Central into its Ivy cache (``spark.jars.ivy``, default
      ``~/.ivy2.5.2``) when the session starts: about 13 MB the first time, nothing after.
    - ``spark.pyspark.python`` and ``PYSPARK_PYTHON`` (the one a session started from Python
      reads): this interpreter (or the ``spark.pyspark.python`` the builder has), so that
      executors run the same Python; a ``PYSPARK_PYTHON`` already set is the user's choice.
    - ``spark.databricks.delta.snapshotPartitions`` (delta-spark's tasks for rebuilding a
      table version's state, 50 by default) sized for the small logs that checkpoints every
      10 versions leave: ``snapshot_partitions`` of the builder's master.
    - when ``warehouse`` (a root or table URI, or several) is on S3: Hadoop's S3 connector
      (``S3_CONNECTOR``, for delta-spark's reads through ``s3a://``) and ``spark.hadoop.fs.s3a.*``
      from the AWS variables or profile (``percolake.lake.storage``), each only where the
      builder has no value of its own. They hold credentials: Spark redacts them in its UI.

    A package whose jar the builder's ``spark.driver.extraClassPath`` already names (an
    offline machine's copy, as ``artifact-version.jar`` or Ivy's ``org_artifact-version.jar``;
    ``on_class_path``) is not fetched again: the jars given that way must then hold its
    dependencies too, and executors on a cluster need them in ``spark.executor.extraClassPath``.

    Settings the builder already has are kept: lists (packages, excludes, extensions) are
    extended, ``spark_catalog``, the snapshot partitions and ``spark.pyspark.python`` (or
    ``PYSPARK_PYTHON``) are left as they are. Calling it twice changes nothing the second time.
    """
    options = _options(builder)
    on_object_store = any(is_object_store(u) for u in _uris(warehouse))
    wanted = [delta_package(), *(S3_CONNECTOR if on_object_store else ()), *extra_packages]
    packages = [p for p in wanted if not on_class_path(options, p)]
    if packages:
        excludes = [*SPARK_PROVIDED, *(S3_CONNECTOR_EXCLUDES if on_object_store else ())]
        builder = _extend(builder, options, "spark.jars.packages", packages)
        builder = _extend(builder, options, "spark.jars.excludes", excludes)
    if on_object_store and not any(k.startswith(S3A_PREFIX) for k in options):
        # the user's own fs.s3a settings win whole: never mix their credentials with ours
        for key, value in hadoop_s3a_options().items():
            builder = builder.config(key, value)
    builder = _extend(builder, options, "spark.sql.extensions", [DELTA_EXTENSION])
    builder = _default(builder, options, "spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    builder = _default(builder, options, SNAPSHOT_PARTITIONS,
                       str(snapshot_partitions(options.get("spark.master", ""))))
    if not os.environ.get("PYSPARK_PYTHON"):
        builder = _default(builder, options, PYTHON_KEY, sys.executable)
        # PySpark started from Python takes its workers' interpreter from this variable alone
        # (read when the SparkContext starts); the setting only reaches spark-submit
        os.environ["PYSPARK_PYTHON"] = _options(builder)[PYTHON_KEY]
    _announce_first_fetch(_options(builder))
    return builder


def on_class_path(options: Mapping[str, str], package: str) -> bool:
    """Whether ``spark.driver.extraClassPath`` in ``options`` names the jar of the Maven
    ``package`` (``group:artifact:version``), by its file name."""
    _, artifact, version = package.split(":")
    jar = f"{artifact}-{version}.jar"
    entries = options.get("spark.driver.extraClassPath", "").split(os.pathsep)
    return any(name == jar or name.endswith(f"_{jar}")
               for name in (os.path.basename(e.strip()) for e in entries))


def snapshot_partitions(master: str) -> int:
    """delta-spark's state-reconstruction tasks for a session on ``master``: a local master's
    cores (``local[4]``: 4, ``local[*]``: this machine's), else CLUSTER_SNAPSHOT_PARTITIONS."""
    if master == "local":
        return 1
    if master.startswith("local["):
        cores = master[len("local["):].split(",")[0].rstrip("]")
        if cores == "*":
            return os.cpu_count() or 1
        if cores.isdigit() and int(cores) > 0:
            return int(cores)
    return CLUSTER_SNAPSHOT_PARTITIONS


def run_executors_on_driver_python(context: SparkContext) -> None:
    """Makes the Python workers of a running session's later jobs run the interpreter the user
    chose (``PYSPARK_PYTHON``, else ``spark.pyspark.python``), else this one.

    For sessions not built with ``configure_spark``, or built before ``PYSPARK_PYTHON`` was
    set: PySpark reads the variable once, when the SparkContext starts, and otherwise runs
    ``python3`` from the executors' ``PATH``, which may lack pyarrow or percolake. Python
    functions take the interpreter from the context when a job is planned, so setting it here
    covers every later job, whatever the import order.
    """
    chosen = os.environ.get("PYSPARK_PYTHON") or context.getConf().get(PYTHON_KEY, None)
    wanted = chosen or sys.executable
    if context.pythonExec != wanted:
        context.pythonExec = wanted


def local_spark(app_name: str = "percolake", cores: int = 2,
                conf: Mapping[str, str] | None = None,
                warehouse: str | Sequence[str] | None = None,
                master: str | None = None) -> SparkSession:
    """A SparkSession with delta-spark (``configure_spark``, with ``warehouse``): local with
    ``cores`` threads, or on ``master`` (e.g. ``spark://127.0.0.1:7077``) with at most ``cores``
    executor cores. ``conf`` is applied first, as a user's own settings."""
    builder = (SparkSession.builder.master(master or f"local[{cores}]").appName(app_name)
               .config("spark.sql.shuffle.partitions", str(cores))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC"))
    if master:
        builder = builder.config("spark.cores.max", str(cores))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return configure_spark(builder, warehouse=warehouse).getOrCreate()


def use_object_store_settings(spark: SparkSession) -> None:
    """Gives a running session's Hadoop configuration ``fs.s3a.*`` from the AWS variables or
    profile, unless the user configured ``fs.s3a`` credentials themselves (in the SparkConf or
    the Hadoop configuration). Hadoop caches a filesystem per bucket: call it before the
    session first touches a bucket. The session needs Hadoop's S3 connector from its start
    (``configure_spark(builder, warehouse="s3://...")``).

    Raises:
        StorageSettingsError: no settings to give, naming the variable to set.
    """
    if getattr(spark, "_percolake_s3a_done", False):
        return  # once per session: a few JVM round trips otherwise on every write
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    user_set = any(k.startswith(S3A_PREFIX) for k, _ in spark.sparkContext.getConf().getAll())
    if not (user_set or hadoop.get("fs.s3a.access.key") or hadoop.get("fs.s3a.session.token")):
        for key, value in hadoop_s3a_options().items():
            hadoop.set(key.removeprefix("spark.hadoop."), value)
    spark._percolake_s3a_done = True  # type: ignore[attr-defined]


def _uris(warehouse: str | Sequence[str] | None) -> list[str]:
    if warehouse is None:
        return []
    return [warehouse] if isinstance(warehouse, str) else [str(u) for u in warehouse]


def ivy_jars_dir(options: Mapping[str, str]) -> Path:
    """Where Spark puts the jars it resolved for ``spark.jars.packages``."""
    ivy = options.get("spark.jars.ivy") or os.path.join(os.path.expanduser("~"), ".ivy2.5.2")
    return Path(ivy) / "jars"


def first_fetch_notice(options: Mapping[str, str] | None = None) -> str | None:
    """The line to show before Spark first downloads delta-spark's jars (and Hadoop's S3
    connector when ``options`` ask for it), or None when they are in the Ivy cache already (or
    the user's own ``spark.jars.ivySettings`` decide)."""
    options = options or {}
    if "spark.jars.ivySettings" in options:
        return None
    jars = ivy_jars_dir(options)
    wanted = options.get("spark.jars.packages", "").split(",")
    missing = []
    for what, packages, size in (("delta-spark", (delta_package(),), 13),
                                 ("Hadoop's S3 connector", S3_CONNECTOR, 18)):
        if what != "delta-spark" and not set(packages) & set(wanted):
            continue
        if not all((jars / _jar_name(p)).exists() for p in packages):
            missing.append((what, packages[0], size))
    if not missing:
        return None
    names = " and ".join(f"{package} ({what})" for what, package, _ in missing)
    size = sum(size for *_, size in missing)
    return (f"percolake: first use of {' and '.join(w for w, *_ in missing)}: Spark downloads "
            f"{names} with their dependencies (about {size} MB) from Maven Central into "
            f"{jars.parent} as the session starts; later runs use that copy")


def _jar_name(package: str) -> str:
    group, artifact, version = package.split(":")
    return f"{group}_{artifact}-{version}.jar"


def _announce_first_fetch(options: Mapping[str, str]) -> None:
    """Says on stderr, once per process, that the session's start will download jars."""
    notice = first_fetch_notice(options)
    if notice and notice not in _announced:
        _announced.add(notice)
        print(notice, file=sys.stderr, flush=True)


def _options(builder: SparkSession.Builder) -> dict[str, str]:
    # the builder keeps its settings in ``_options``: the only way to read them before
    # getOrCreate (delta's configure_spark_with_delta_pip overwrites instead of reading)
    return {str(k): str(v) for k, v in getattr(builder, "_options", {}).items()}


def _extend(builder: SparkSession.Builder, options: Mapping[str, str], key: str,
            values: Iterable[str]) -> SparkSession.Builder:
    """``key`` set to its comma-separated list plus those of ``values`` it lacks."""
    have = [v.strip() for v in options.get(key, "").split(",") if v.strip()]
    merged = have + [v for v in dict.fromkeys(values) if v not in have]
    return builder.config(key, ",".join(merged)) if merged != have else builder


def _default(builder: SparkSession.Builder, options: Mapping[str, str], key: str,
             value: str) -> SparkSession.Builder:
    return builder if key in options else builder.config(key, value)
