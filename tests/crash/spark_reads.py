"""delta-spark's view of Delta tables, version by version: a child Spark application of the
checker (one SparkContext per JVM, and the test process may have its own local session).

For each table (JSON: name, path, columns, versions) it reads every listed version with
``spark.read.format("delta").option("versionAsOf", v)``, through Hadoop's S3 connector
(``s3a://``) for an object-store table, and answers one JSON object:
``{table name: {version: [[txn_id, *columns], ...]}}``, the txn id taken from each row's file
(``_metadata.file_path``, its ``_percolake/<txn_id>/`` folder). The checker compares them with
what deltalake reads (``Checker.check_spark_reads``).

One-shot (a Spark application per check):

    python -m tests.crash.spark_reads --out reads.json --warehouse s3://bucket/lake \
        --table '{"name": "debits", "path": "s3://bucket/lake/debits",
                  "columns": ["batch", "i", "account", "amount"], "versions": [0, 1, 2]}' \
        [--master spark://127.0.0.1:7077 --spark-conf '{...}']

As a service (``--serve``, :class:`SparkReadService`): one Spark application answers request
after request (a JSON line on stdin: ``{"tables": [...], "out": path}``; the answer is written
to ``out``), so a test session pays the JVM's start and warm-up once. It stops when its standard
input closes, so it never outlives its parent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.crash.checker import is_object_store, txn_of_path
from tests.s3_support import end_child

ROOT = Path(__file__).resolve().parents[2]


def spark_path(path: str) -> str:
    """What Hadoop's filesystems open: ``s3a://`` for an object-store table."""
    if is_object_store(path):
        return "s3a://" + path.split("://", 1)[1]
    return path


def read_tables(spark: Any, tables: list[dict[str, Any]], threads: int = 8) -> dict[str, Any]:
    """Every listed version of every table, read with delta-spark: rows as [txn, *columns].
    Versions are read concurrently (each read is mostly waiting on the store and on Spark's
    scheduling of tiny jobs)."""
    from pyspark.sql import functions as F

    def read(table: dict[str, Any], version: int) -> list[list[Any]]:
        df = (spark.read.format("delta").option("versionAsOf", version)
              .load(spark_path(table["path"])))
        rows = df.select(F.col("_metadata.file_path").alias("_file"),
                         *table["columns"]).collect()
        return [[str(txn_of_path(r["_file"])), *(r[c] for c in table["columns"])]
                for r in rows]

    started = time.monotonic()
    pairs = [(t, v) for t in tables for v in t["versions"]]
    with ThreadPoolExecutor(max(1, min(threads, len(pairs)))) as pool:
        results = list(pool.map(lambda pair: read(*pair), pairs))
    out: dict[str, dict[str, list[list[Any]]]] = {t["name"]: {} for t in tables}
    for (table, version), rows in zip(pairs, results, strict=True):
        out[table["name"]][str(version)] = rows
    print(f"spark_reads: {len(pairs)} versions of {len(tables)} tables in "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return out


def warm_up(spark: Any, folder: str, warehouse: str) -> None:
    """Loads delta-spark's code paths (a write and a time-travel read of a tiny local table)
    and, for an object-store warehouse, Hadoop's S3 connector (a look-up of a path that does
    not exist) before the first request."""
    spark.range(3).write.format("delta").mode("overwrite").save(folder)
    spark.read.format("delta").option("versionAsOf", 0).load(folder).collect()
    if is_object_store(warehouse):
        # nothing is there: the look-up fails, with the connector loaded
        with contextlib.suppress(Exception):
            spark.read.format("delta").load(spark_path(warehouse) + "/percolake-warm-up-none")


def _write(path: str, answer: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(answer, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="where to write the answer (one-shot)")
    parser.add_argument("--serve", action="store_true", help="answer requests from stdin")
    parser.add_argument("--warehouse", required=True,
                        help="a table or root URI: s3:// adds Hadoop's S3 connector")
    parser.add_argument("--table", action="append", default=[], type=json.loads)
    parser.add_argument("--master", default=None)
    parser.add_argument("--spark-conf", default="{}")
    args = parser.parse_args(argv)

    from sparkside.session import local_spark
    from tests.spark_settings import JVM_OPTIONS, suite_conf

    conf = {**suite_conf(),
            "spark.driver.extraJavaOptions": JVM_OPTIONS,
            **json.loads(args.spark_conf)}
    spark = local_spark("percolake-crash-spark-reads", cores=2, conf=conf,
                        warehouse=args.warehouse, master=args.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if not args.serve:
            _write(args.out, read_tables(spark, args.table))
            return 0
        with tempfile.TemporaryDirectory(prefix="spark-reads-warm-up-") as folder:
            warm_up(spark, folder, args.warehouse)
        print("spark_reads: serving", file=sys.stderr, flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            try:
                answer = read_tables(spark, request["tables"])
            except Exception as exc:  # the parent shows it; the service goes on
                answer = {"error": f"{type(exc).__name__}: {exc}"[:4000]}
            _write(request["out"], answer)
        return 0
    finally:
        spark.stop()


class SparkReadService:
    """``python -m tests.crash.spark_reads --serve`` in a child process: ``read`` asks it for
    delta-spark's rows of table versions; ``stop`` (or the parent's death) ends it."""

    def __init__(self, root: str | Path, warehouse: str, master: str | None = None,
                 spark_conf: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.warehouse = warehouse
        self.master = master
        self.spark_conf = dict(spark_conf or {})
        self.env = dict(env or {})
        self.log_path = self.root / "spark-reads.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.requests = 0

    def start(self) -> SparkReadService:
        self.root.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "tests.crash.spark_reads", "--serve",
                   "--warehouse", self.warehouse]
        if self.master:
            command += ["--master", self.master]
        if self.spark_conf:
            command += ["--spark-conf", json.dumps(self.spark_conf)]
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log,
                                            stderr=log, cwd=ROOT, env=env)
        return self

    def read(self, requests: list[tuple[Any, list[int]]],
             timeout_s: float = 300.0) -> dict[str, Any]:
        """delta-spark's rows of each (TableSpec, versions) pair (see the module doc)."""
        assert self.process is not None and self.process.stdin is not None
        self.requests += 1
        out = self.root / f"answer-{self.requests}.json"
        tables = [{"name": t.name, "path": str(t.path), "columns": list(t.columns),
                   "versions": versions} for t, versions in requests]
        self.process.stdin.write((json.dumps({"tables": tables, "out": str(out)}) + "\n")
                                 .encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while not out.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"the delta-spark reader exited {self.process.returncode}"
                                     f":\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the delta-spark reader did not answer in "
                                     f"{timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)
        answer = json.loads(out.read_text())
        if "error" in answer:
            raise AssertionError(f"the delta-spark reader failed: {answer['error']}\n"
                                 f"{self.log_tail()}")
        return answer

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None:
            return
        end_child(self.process, timeout_s)
        self.process = None


if __name__ == "__main__":
    sys.exit(main())
