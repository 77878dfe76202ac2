"""A class-data-sharing archive of the classes a Spark driver loads, for the suite's JVMs.

The suite starts dozens of short-lived JVMs (crash and topology drivers, the cluster's daemons
and executors, readers) on two cores, and each spends seconds of CPU loading and verifying
Spark's ~17,000 classes. A JVM mapping them from an archive made once (JDK's AppCDS, made by
``-XX:ArchiveClassesAtExit``) loads them pre-parsed and pre-verified: about a third less CPU
for a driver that starts, writes a Delta table and stops (10.0 -> 6.8 CPU-seconds here).

Only classes of the JVM's own class path can be archived, and delta-spark's and Hadoop's S3
connector's come from Maven packages (``spark.jars.packages``), which Spark resolves with Ivy
at every start (seconds of CPU) and loads apart. So the maker first lets Spark resolve them
once and writes the jars (less those Spark ships itself, as Spark's parent-first loading would)
to ``spark-classes-<key>.classpath``; every JVM of the suite started after that has them on its
class path (``tests.spark_settings.suite_conf``; ``configure_spark`` then fetches nothing),
and so does the archive: 28 -> 19 CPU-seconds for a driver that starts, writes, merges into and
reads a Delta table here, against the archive of Spark's classes alone.

The archive is made once per JDK, Spark installation and Ivy cache, in the project's cache
(``tests/project_cache.py``; ``PERCOLAKE_TEST_JVM_ARCHIVE_DIR`` names another folder), by a
small Spark application that writes, merges and streams into a Delta table, run beside the
suite's first tests; ``PERCOLAKE_TEST_JVM_ARCHIVE=0`` turns both off. A JVM whose class
path is not the archive's (the cluster's daemons and executors order Spark's jars differently)
ignores it and loads its classes as before; the JVM's own warnings go to stderr, so that
nothing reaches a launcher's stdout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.project_cache import project_cache
from tests.spark_settings import CLASS_PATH_ENV

ROOT = Path(__file__).resolve().parent.parent

# A JVM's warnings go to stderr (spark-submit reads its launcher JVM's stdout as the command to
# run), but not those of an archive a JVM cannot use (the launcher's and the cluster's class
# paths are not the driver's): it runs without, as it would have.
JVM_WARNINGS = "-Xlog:disable -Xlog:all=warning,cds=off,cds+dynamic=off:stderr"

# Spark resolves the packages as configure_spark asks for them (delta-spark, the S3
# connector); its own copies win over Ivy's (parent-first), so those jars are left out
_RESOLVE = r'''
import os, re, sys
from pathlib import Path
from pyspark.find_spark_home import _find_spark_home
from sparkside import local_spark
from tests.spark_settings import s3_connector_packages

def artifact(name):
    return re.split(r"-\d", name, maxsplit=1)[0]

spark = local_spark("percolake-class-path", 1, conf=s3_connector_packages())
resolved = [j.removeprefix("file://").removeprefix("file:")
            for j in spark.sparkContext.getConf().get("spark.jars").split(",") if j]
spark.stop()
shipped = {artifact(j.name) for j in (Path(_find_spark_home()) / "jars").glob("*.jar")}
kept = [j for j in resolved if artifact(Path(j).name.split("_", 1)[-1]) not in shipped]
assert any("delta-spark" in j for j in kept), resolved
Path(sys.argv[1]).write_text(os.pathsep.join(kept))
'''

_APPLICATION = r'''
import sys, tempfile
from pathlib import Path
from delta.tables import DeltaTable
from sparkside import local_spark
from tests.spark_settings import suite_conf

archive = sys.argv[1]
spark = local_spark("percolake-class-archive", 1, conf={
    **suite_conf(),
    "spark.driver.extraJavaOptions":
        f"-XX:+UseSerialGC -Xlog:cds=off -XX:ArchiveClassesAtExit={archive}"})
assert "spark.jars.packages" not in dict(spark.sparkContext.getConf().getAll())
root = Path(tempfile.mkdtemp())
rows = spark.range(100).selectExpr("id", "id % 3 AS k")
rows.write.format("delta").partitionBy("k").save(str(root / "t"))
rows.write.format("delta").mode("append").save(str(root / "t"))
(DeltaTable.forPath(spark, str(root / "t")).alias("t").merge(rows.alias("s"), "t.id = s.id")
 .whenMatchedUpdate(set={"k": "s.k + 1"}).whenNotMatchedInsertAll().execute())
DeltaTable.forPath(spark, str(root / "t")).delete("id = 7")
(root / "in").mkdir()
(root / "in" / "0.json").write_text('{"id": 1}\n')
query = (spark.readStream.schema("id LONG").json(str(root / "in")).writeStream
         .option("checkpointLocation", str(root / "cp"))
         .foreachBatch(lambda batch, _: batch.selectExpr("id", "id % 3 AS k").write
                       .format("delta").mode("append").save(str(root / "t")))
         .trigger(availableNow=True).start())
query.awaitTermination()
spark.read.format("delta").load(str(root / "t")).groupBy("k").count().collect()
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the JVM exits at its stdin's end, writing the archive as it does
sys.exit(jvm.wait(timeout=120))
'''


def _fingerprint() -> str | None:
    """The JDK, Spark jars (where they are: a class path names them) and packages an archive
    is valid for, or None without Java or PySpark."""
    java = shutil.which("java")
    try:
        from pyspark.find_spark_home import _find_spark_home
        jars = Path(_find_spark_home()) / "jars"
    except Exception:  # noqa: BLE001 - no PySpark: no archive
        return None
    if java is None or not jars.is_dir():
        return None
    java_bin = Path(java).resolve()
    java_stat = java_bin.stat()
    from sparkside.session import S3_CONNECTOR, delta_package, ivy_jars_dir

    parts = [str(java_bin), str(java_stat.st_mtime_ns), str(java_stat.st_size), str(jars),
             str(ivy_jars_dir({})), delta_package(), *S3_CONNECTOR]
    parts += sorted(f"{jar.name}:{jar.stat().st_size}" for jar in jars.glob("*.jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _archive_dir() -> Path:
    return Path(os.environ.get("PERCOLAKE_TEST_JVM_ARCHIVE_DIR") or project_cache())


def start_archive() -> Path | None:
    """The path of this JDK's and these jars' archive (None without Java or PySpark); when there
    is none yet, a child process makes it beside the suite (JVMs started before it is ready run
    without it) and moves it into place only when complete, so that no JVM maps a partial one.
    The child outlives the run if it must; its output is in ``class-archive.log`` beside it."""
    key = _fingerprint()
    if key is None:
        return None
    path = _archive_dir() / f"spark-classes-{key}.jsa"
    if path.is_file():
        return path
    try:
        _start_maker(path)
    except OSError as error:  # no room or no right to write there: run without
        print(f"percolake tests: no class archive for the JVMs ({error}); they load their "
              "classes as usual", file=sys.stderr, flush=True)
        return None
    print(f"percolake tests: making the JVMs' class archive {path} beside the first tests "
          "(once per JDK and Spark jars)", file=sys.stderr, flush=True)
    return path


def class_path_file(archive: Path) -> Path:
    """Where the maker of ``archive`` lists the jars of its class path (and of every JVM of the
    suite started once the list exists)."""
    return archive.with_suffix(".classpath")


def _start_maker(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("making-*"):  # a maker killed halfway, an hour ago or more
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="making-", dir=path.parent))
    listed = class_path_file(path)
    env = {**os.environ, CLASS_PATH_ENV: str(listed), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    partial = scratch / path.name
    # $1 python, $2 resolve, $3 its partial list, $4 the list, $5 application, $6 its partial
    # archive, $7 the archive, $8 scratch
    script = ('{ [ -f "$4" ] || { "$1" -c "$2" "$3" && mv "$3" "$4"; }; } '
              '&& "$1" -c "$5" "$6" && mv "$6" "$7"; status=$?; rm -rf "$8"; '
              'echo "class archive maker exited with $status"; exit $status')
    with open(path.parent / "class-archive.log", "a") as log:
        arguments = [sys.executable, _RESOLVE, str(scratch / listed.name), str(listed),
                     _APPLICATION, str(partial), str(path), str(scratch)]
        maker = subprocess.Popen(["sh", "-c", script, "make-class-archive", *arguments],
                                 cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    (scratch / "pid").write_text(str(maker.pid))  # before any worker starts: they wait on it


def java_options(archive: Path) -> str:
    """What JAVA_TOOL_OPTIONS gains for every JVM of the suite to map ``archive`` once it exists
    (until then a JVM starts without class sharing, as with ``-Xshare:auto`` it may)."""
    return f"-XX:SharedArchiveFile={archive} {JVM_WARNINGS}"


def _maker_running(folder: Path) -> bool:
    for scratch in folder.glob("making-*"):
        try:
            os.kill(int((scratch / "pid").read_text()), 0)
            return True
        except (OSError, ValueError):
            continue
    return False


_waited = False


def wait_until_made(archive: Path, timeout_s: float = 300.0) -> None:
    """Once per process: until ``archive`` exists, while its maker runs (at most
    ``timeout_s``). A Spark test started before then would start its JVMs with Maven packages
    and no archive, and the shared sessions live through the whole run."""
    global _waited
    if _waited:
        return
    _waited = True
    deadline = time.monotonic() + timeout_s
    while not archive.is_file() and _maker_running(archive.parent) \
            and time.monotonic() < deadline:
        time.sleep(1.0)
