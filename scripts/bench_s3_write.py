"""Writing one table's data files on S3: Spark's Parquet writer through s3a vs percolake's
executors writing through Arrow (why ``sparkside/object_writer.py`` exists).

Against one moto S3 server that this script starts on 127.0.0.1 (and stops), for DataFrames of
3 columns (``id`` long, ``part`` int with 4 values, ``amount`` double) of 1,000 and 100,000 rows
in 2 Spark partitions, written partitioned by ``part`` and unpartitioned:

- (a) the alternative: ``df.write.partitionBy("part").parquet("s3a://...")`` with Spark's
  default commit protocol (files written under ``_temporary``, then renamed at task and job
  commit: on S3 a rename is a server-side copy plus a delete per file), then the driver lists
  the files and reads each footer with Arrow's S3 filesystem (range reads) for Delta's stats;
- (b) percolake: ``sparkside.writer.write_files(df, table, location, partition_by)`` on an
  ``s3://`` location: the executors write each file once through Arrow and compute its stats
  as they write; the driver downloads nothing.

Runs alternate a b, b a, ... (pairs) after an unmeasured warm-up of both. Printed per case:
median seconds per table write of each, the ratio b/a of the medians with a 95 % bootstrap
interval over the pairs, and the S3 requests each write made (counted in moto's access log,
every request's line holds the run's own key prefix) and the bytes it uploaded or had copied.

    python scripts/bench_s3_write.py --quick --json /tmp/s3_write.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

from tests.s3_support import MotoServer  # noqa: E402

SIZES = {"small": 1_000, "large": 100_000}
PARTITIONINGS = {"by part": ["part"], "none": []}
PATHS = ("spark_s3a", "arrow")
LABELS = {"spark_s3a": "(a) Spark s3a + footers", "arrow": "(b) percolake write_files"}


def frame(spark, rows: int):  # noqa: ANN001, ANN201
    return spark.range(0, rows, 1, 2).selectExpr(
        "id", "cast(id % 4 as int) as part", "cast(id % 1000 as double) / 10 as amount")


def write_spark_s3a(df, table: str, location: str, partition_by: list[str]) -> dict:  # noqa: ANN001
    """Path (a): Spark's Parquet writer through s3a, then the footers read on the driver."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from percolake.lake import storage
    from percolake.lake.parquet_stats import delta_stats
    from percolake.records import AddFileRecord
    from sparkside.writer import _partition_values

    t0 = time.perf_counter()
    # as sparkside.writer writes local tables: Spark's writer, then pyarrow reads the footers
    writer = df.write.mode("overwrite").option("compression", "snappy")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(location.replace("s3://", "s3a://", 1))
    t1 = time.perf_counter()
    filesystem = storage.s3_filesystem()
    base = storage.arrow_path(location)
    table_base = storage.arrow_path(table)
    adds = []
    infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    for info in sorted(infos, key=lambda i: i.path):
        name = info.base_name
        if info.type != pafs.FileType.File or name.startswith(("_", ".")) \
                or not name.endswith(".parquet"):
            continue
        with filesystem.open_input_file(info.path) as source:  # a HEAD, then range GETs
            metadata = pq.read_metadata(source)
        if metadata.num_rows == 0:
            continue
        relative = PurePosixPath(info.path[len(base) + 1:])
        adds.append(AddFileRecord(
            path=info.path[len(table_base) + 1:], size=info.size,
            partition_values=_partition_values(relative, partition_by),  # type: ignore[arg-type]
            modification_time=(info.mtime_ns or 0) // 1_000_000,
            stats=json.dumps(delta_stats(metadata), separators=(",", ":"))))
    t2 = time.perf_counter()
    return {"seconds": t2 - t0, "write_s": t1 - t0, "footers_s": t2 - t1, "adds": adds}


def write_arrow(df, table: str, location: str, partition_by: list[str]) -> dict:  # noqa: ANN001
    """Path (b): percolake's writer (executors write through Arrow, stats as they write)."""
    from sparkside.writer import write_files

    t0 = time.perf_counter()
    adds = write_files(df, table, location, partition_by)
    return {"seconds": time.perf_counter() - t0, "adds": adds}


def run_once(spark, bucket: str, path: str, size: str, partitioning: str) -> dict:  # noqa: ANN001
    rows = SIZES[size]
    partition_by = PARTITIONINGS[partitioning]
    run = f"{path.replace('_', '')}-{uuid.uuid4().hex[:12]}"
    table = f"s3://{bucket}/bench/{run}"
    location = f"{table}/_percolake/{uuid.uuid4().hex}"
    df = frame(spark, rows)
    write = write_spark_s3a if path == "spark_s3a" else write_arrow
    result = write(df, table, location, partition_by)
    adds = result.pop("adds")
    counted = sum(json.loads(a.stats)["numRecords"] for a in adds)
    if counted != rows:
        raise AssertionError(f"{path} {size} {partitioning}: adds describe {counted} rows, "
                             f"not {rows}")
    if partition_by and {a.partition_values["part"] for a in adds} != {"0", "1", "2", "3"}:
        raise AssertionError(f"{path}: partition values {[a.partition_values for a in adds]}")
    # each file's path below the attempt folder (``_percolake/<txn>/``) -> its size
    sizes = {a.path.split("/", 2)[2]: a.size for a in adds}
    result.update(run=run, files=len(adds), bytes=sum(sizes.values()), sizes=sizes)
    return result


def classify(requests: list[tuple[str, str]], sizes: dict[str, int]) -> dict[str, float]:
    """Requests of one write by kind. moto's log does not show whether a PUT carries data or
    copies an object (``x-amz-copy-source``); a data file's first PUT (or multipart upload) is
    its upload, every later PUT of a key ending in the same file path is a rename's server-side
    copy (bytes: the file's size). PUTs of keys ending in ``/`` are directory markers."""
    kinds = bl.request_kinds(requests)
    counts = {"PUT upload": 0, "PUT copy": 0, "PUT dir marker": 0}
    copied = 0
    seen: set[str] = set()
    for method, raw in requests:
        key = raw.split("?", 1)[0]
        if method not in ("PUT", "POST") or not key.endswith(".parquet"):
            if method == "PUT" and "uploadId=" not in raw:
                counts["PUT dir marker" if key.endswith("/") else "PUT upload"] += 1
            continue
        file = next((f for f in sizes if key.endswith("/" + f)), key)
        if "uploadId=" in raw or method == "POST":
            seen.add(file)  # a multipart upload's request: counted as "multipart"
        elif file in seen:
            counts["PUT copy"] += 1
            copied += sizes.get(file, 0)
        else:
            counts["PUT upload"] += 1
            seen.add(file)
    puts = kinds.pop("PUT", 0)
    other_puts = puts - sum(counts.values())
    return {"total": len(requests), **counts, "multipart": kinds.pop("multipart", 0),
            "DELETE": kinds.pop("DELETE", 0), "HEAD": kinds.pop("HEAD", 0),
            "LIST": kinds.pop("LIST", 0), "GET": kinds.pop("GET", 0),
            "other": sum(kinds.values()) + other_puts, "copied_bytes": copied}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 pairs per case (~2 min)")
    parser.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    parser.add_argument("--pairs", type=int, help="a/b pairs per case (default 10, quick 3)")
    parser.add_argument("--no-append", action="store_true", help="do not touch benchmarks.md")
    parser.add_argument("--workdir", help="keep moto's log here (default: a temp dir, removed)")
    args = parser.parse_args()
    pairs = args.pairs or (3 if args.quick else 10)
    info = bl.machine_info()
    print(f"bench_s3_write: {bl.machine_line(info)}", flush=True)
    started = time.monotonic()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-s3-write-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "moto.log"
    log_path.unlink(missing_ok=True)
    moto = MotoServer(log_path=log_path).start()
    cases = [(size, partitioning) for size in SIZES for partitioning in PARTITIONINGS]
    runs: dict[tuple[str, str, str], list[dict]] = {}
    spark = None
    try:
        os.environ.update(moto.env())
        bucket = moto.create_bucket("bench")
        from sparkside import local_spark

        spark = local_spark("percolake-bench-s3-write",
                            conf={"spark.driver.host": "127.0.0.1",
                                  "spark.driver.bindAddress": "127.0.0.1"},
                            warehouse=f"s3://{bucket}/bench")
        spark.sparkContext.setLogLevel("ERROR")
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        committer = (f"s3a committer {hadoop.get('fs.s3a.committer.name') or 'file'}, "
                     "FileOutputCommitter algorithm version "
                     f"{hadoop.get('mapreduce.fileoutputcommitter.algorithm.version') or '1'}, "
                     f"{spark.conf.get('spark.sql.sources.commitProtocolClass')}")
        print(f"commit protocol of (a): {committer}", flush=True)
        # Warm-up, not measured: the first s3a write starts Hadoop's S3 client (~15 s), the
        # first mapInArrow starts the Python workers.
        for size, partitioning in cases:
            for path in PATHS:
                run_once(spark, bucket, path, size, partitioning)
        print(f"warm-up done after {time.monotonic() - started:.0f} s", flush=True)
        for pair in range(pairs):
            order = PATHS if pair % 2 == 0 else PATHS[::-1]
            for size, partitioning in cases:
                for path in order:
                    runs.setdefault((size, partitioning, path), []).append(
                        run_once(spark, bucket, path, size, partitioning))
            print(f"pair {pair}: " + ", ".join(
                f"{s}/{p} a {runs[(s, p, 'spark_s3a')][-1]['seconds']:.2f} s "
                f"b {runs[(s, p, 'arrow')][-1]['seconds']:.2f} s" for s, p in cases), flush=True)
    finally:
        if spark is not None:
            spark.stop()
        moto.stop()
    elapsed = time.monotonic() - started

    for measured in runs.values():
        for run in measured:
            run["requests"] = classify(bl.moto_requests(log_path, run["run"]), run["sizes"])
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)

    result: dict[str, object] = {"machine": info, "pairs": pairs, "commit_protocol_a": committer,
                                 "seconds_total": elapsed, "cases": []}
    time_rows = []
    request_rows = []
    kinds = ("PUT upload", "PUT copy", "multipart", "DELETE", "HEAD", "LIST", "GET",
             "PUT dir marker", "other", "total")
    for size, partitioning in cases:
        a = runs[(size, partitioning, "spark_s3a")]
        b = runs[(size, partitioning, "arrow")]
        ratio, low, high = bl.ratio_interval([[r["seconds"]] for r in b],
                                             [[r["seconds"]] for r in a])
        case = {
            "rows": SIZES[size], "partition_by": PARTITIONINGS[partitioning],
            "files": {"spark_s3a": a[0]["files"], "arrow": b[0]["files"]},
            "spark_s3a_median_s": statistics.median(r["seconds"] for r in a),
            "spark_s3a_write_median_s": statistics.median(r["write_s"] for r in a),
            "spark_s3a_footers_median_s": statistics.median(r["footers_s"] for r in a),
            "arrow_median_s": statistics.median(r["seconds"] for r in b),
            "ratio_b_over_a": ratio, "ratio_ci95": [low, high],
            "requests_median": {path: {k: statistics.median(r["requests"][k] for r in rs)
                                       for k in (*kinds, "copied_bytes")}
                                for path, rs in (("spark_s3a", a), ("arrow", b))},
            "bytes_uploaded": {"spark_s3a": a[0]["bytes"], "arrow": b[0]["bytes"]},
            "seconds": {"spark_s3a": [r["seconds"] for r in a],
                        "arrow": [r["seconds"] for r in b]},
        }
        result["cases"].append(case)  # type: ignore[union-attr]
        time_rows.append([f"{SIZES[size]:,}", partitioning,
                          f"{case['files']['spark_s3a']} / {case['files']['arrow']}",
                          case["spark_s3a_median_s"], case["spark_s3a_write_median_s"],
                          case["spark_s3a_footers_median_s"], case["arrow_median_s"],
                          bl.interval_text(ratio, low, high)])
        for path in PATHS:
            counted = case["requests_median"][path]
            copied = counted["copied_bytes"]
            request_rows.append([f"{SIZES[size]:,}", partitioning, LABELS[path],
                                 *(f"{counted[k]:g}" for k in kinds),
                                 f"{case['bytes_uploaded'][path] / 1e3:,.1f}",
                                 f"{copied / 1e3:,.1f}"])
    body = "\n".join([
        f"One table write per run on moto's S3 server (127.0.0.1), 3 columns, 2 Spark "
        f"partitions, {pairs} alternating pairs per case after a warm-up; (a) commit protocol: "
        f"{committer}. Seconds per table write (median):\n",
        bl.table(["rows", "partitioned", "files a / b", "(a) s3a + footers s",
                  "of which Spark write s", "of which footers s", "(b) percolake s",
                  "ratio b/a [95 % CI]"], time_rows),
        "\nS3 requests per table write (median; from moto's access log; a rename is a PUT "
        "copy + a DELETE; multipart = create + part + complete), kB uploaded by the writer "
        "and kB copied server-side by renames:\n",
        bl.table(["rows", "partitioned", "path", *kinds, "kB uploaded", "kB copied"],
                 request_rows),
        f"\nWhole run: {elapsed:.0f} s.",
    ])
    bl.publish("bench_s3_write", info, body, result, args.json, not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
