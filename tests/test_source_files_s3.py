"""An executor's read of a percolake source partition on an object store: the partition carries
the driver's S3 settings, so a Python worker with no AWS variables, no AWS profile and no
deltalake (a cluster executor's worker) reads the file from the driver's endpoint with the
driver's credentials. No Spark: the partition is pickled as Spark ships it and read in a fresh
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import cloudpickle

from percolake.lake import storage
from sparkside.delta_log import DataFile
from sparkside.source_files import FilePartition

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])

# The executor's side: no deltalake importable; unpickle (partition, schema), read, print rows.
EXECUTOR = """
import pickle, sys
sys.modules["deltalake"] = None  # an executor's Python without delta-rs
from sparkside.source_files import read_file
partition, schema = pickle.loads(sys.stdin.buffer.read())
rows = [row for batch in read_file(partition, schema) for row in batch.to_pylist()]
print(repr(rows))
"""


def executor_env(home: Path) -> dict[str, str]:
    """A worker's environment with nothing of AWS in it but the switch that keeps any SDK off
    the instance-metadata address."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), AWS_EC2_METADATA_DISABLED="true")
    return env


def test_an_executor_without_aws_variables_reads_with_the_drivers_s3_settings(
        moto_server, tmp_path: Path) -> None:  # noqa: ANN001 - MotoServer
    bucket = moto_server.create_bucket()
    key = "lake/events/day=b/part-0.parquet"
    with moto_server.filesystem().open_output_stream(f"{bucket}/{key}") as out:
        pq.write_table(pa.table({"id": [3, 4]}), out)
    driver = storage.s3_settings(moto_server.env())
    partition = FilePartition(f"s3://{bucket}/lake/events", 1,
                              DataFile(f"{bucket}/{key}", 0, (("day", "b"),)),
                              (driver, storage.limits()))

    shipped = cloudpickle.dumps((partition, SCHEMA))
    worker = subprocess.run([sys.executable, "-c", EXECUTOR], input=shipped,
                            capture_output=True, env=executor_env(tmp_path), cwd=tmp_path,
                            timeout=120)

    assert worker.returncode == 0, worker.stderr.decode(errors="replace")[-2000:]
    rows = worker.stdout.decode()
    assert rows.strip() == repr([{"id": 3, "day": "b"}, {"id": 4, "day": "b"}])
    assert moto_server.secret not in repr(partition)
