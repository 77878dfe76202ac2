"""The bank workload on a real Spark standalone cluster writing S3 tables (issue 15).

A master and two workers (``spark_cluster``, each its own JVM, executors in JVMs of their own)
run each driver's application; the executors write every batch's Parquet files straight to the
S3 API server (``moto_server``); the coordinator commits the three tables there. Every driver is
a child process (one SparkContext per JVM) on the crash harness (``tests/crash``): the checker
reads every Delta version with deltalake and with delta-spark through Hadoop's S3 connector
(``s3a://``, a Spark application of its own, ``tests/crash/spark_reads.py``), and a snapshot
reader reads all three tables at coordinator snapshots while the drivers run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crash import scenarios
from tests.crash.checker import Checker, Report, bank_tables, read_versions
from tests.crash.spark_reads import SparkReadService

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(600)]

K = 3
TABLES = 3
BATCHES = 6


@pytest.fixture(scope="module")
def spark_reader(moto_server, tmp_path_factory: pytest.TempPathFactory  # noqa: ANN001
                 ) -> Iterator[SparkReadService]:
    """delta-spark reads for the checker: one local Spark application for the module (an
    application on the cluster would hold its cores for its whole life, and the drivers need
    them). It starts in the background while the first driver runs."""
    service = SparkReadService(tmp_path_factory.mktemp("spark-reads"), "s3://percolake-reads",
                               env=moto_server.env()).start()
    yield service
    service.stop()


@pytest.fixture
def on_cluster_s3(moto_server, s3_bucket: str, s3_env: dict[str, str],  # noqa: ANN001
                  spark_cluster, spark_reader: SparkReadService) -> dict[str, Any]:  # noqa: ANN001
    """A scenario's settings: tables below a new bucket, drivers on the cluster, every child
    (coordinator, drivers, reader) with the server's AWS variables, checked through
    delta-spark too. ``s3_env`` gives this process (the checker) the same variables."""
    return {"warehouse": f"s3://{s3_bucket}/lake", "master": spark_cluster.master_url,
            "spark_conf": spark_cluster.app_conf(), "env": moto_server.env(),
            "spark_check": True, "spark_reader": spark_reader}


def _apps(cluster) -> list[dict[str, Any]]:  # noqa: ANN001 - SparkCluster
    state = cluster.state() or {}
    return [*state.get("activeapps", []), *state.get("completedapps", [])]


def _assert_clean(outcome: scenarios.Outcome, cluster, tmp_path: Path) -> None:  # noqa: ANN001
    if outcome.violations:
        pytest.fail(f"{outcome.summary()}\n\ncluster logs:\n{cluster.logs(10)}\n"
                    f"scenario files in {tmp_path}")


def test_bank_workload_on_a_spark_cluster_through_c2_and_c7_lands_every_batch_once_in_s3(
        tmp_path, on_cluster_s3, spark_cluster, spark_reader, moto_server,  # noqa: ANN001
        s3_bucket):
    """The bank workload, three tables on S3, every driver's executors on the cluster's
    workers. A driver dies at C2 in batch 0 (mid-prewrite, after the second table's files
    reached S3), the next at C7 in batch 1 (after one table's Delta commit); a last driver
    replays batch 1 and runs the rest while a snapshot reader reads. C2's attempt is aborted
    and its objects deleted (I3), its batch written again; C7's batch is finished without the
    user's function running again (I2, I4). Every batch is in every table exactly once, by
    value, in exactly one Delta version (I2, I4), delta-spark reads every version with exactly
    deltalake's rows, and every snapshot read taken while the job ran was consistent across
    the three tables (I1)."""
    points = ["C2", "C7"]
    apps_before = {a["id"] for a in _apps(spark_cluster)}
    outcome = scenarios.driver_crash_chain(tmp_path, points, k=K,
                                           more_batches=BATCHES - len(points) - 1,
                                           **on_cluster_s3)
    _assert_clean(outcome, spark_cluster, tmp_path)
    crashes = {c["point"]: c for c in outcome.notes["crashes"]}
    committed = {point: c["committed_before_replay"] for point, c in crashes.items()}
    assert committed == {"C2": False, "C7": True}, outcome.notes
    # C2 died with two tables' files in the bucket; the checker found none left (I3).
    assert crashes["C2"]["uncommitted_files_after_crash"] >= 2, outcome.notes
    report = outcome.report
    assert report.aborted >= 1, outcome.summary()  # C2's attempt
    assert report.batches_verified == BATCHES, outcome.summary()
    assert report.versions_checked == BATCHES * TABLES, outcome.summary()
    assert report.spark_versions_checked == BATCHES * TABLES, outcome.summary()
    assert report.snapshot_reads_checked >= 3, outcome.summary()
    assert outcome.notes["distinct_snapshots_read"] >= 3, outcome.notes  # read while it ran
    # Every driver ran on the cluster; the last one (that ran most batches) as an application
    # with executors on both workers ...
    apps = sorted((a for a in _apps(spark_cluster) if a["id"] not in apps_before),
                  key=lambda a: a["starttime"])
    assert [a["name"] for a in apps] == ["percolake-crash"] * (len(points) + 1), apps
    assert apps[-1]["cores"] == spark_cluster.cores, apps
    # ... and the tables are in the bucket: each batch's files under its attempt's prefix.
    keys = moto_server.keys(s3_bucket, "lake/")
    for table in ("debits", "credits", "balances"):
        logs = [k for k in keys if k.startswith(f"lake/{table}/_delta_log/")
                and k.endswith(".json")]
        data = [k for k in keys if k.startswith(f"lake/{table}/_percolake/")]
        assert len(logs) == BATCHES and data, (table, keys)

    # The delta-spark comparison is not vacuous: an answer that lost a row, or holds a row of
    # another value, is reported for exactly the versions concerned.
    balances = next(t for t in bank_tables(on_cluster_s3["warehouse"], K)
                    if t.name == "balances")

    def tampered(requests: list[tuple[Any, list[int]]]) -> dict[str, Any]:
        answer = spark_reader.read(requests)
        answer["balances"]["1"].pop()
        answer["balances"]["2"][0][2] += 1  # [txn, account, balance, batch]: the balance
        return answer

    checker = Checker(None, [balances], spark_reads=tampered)
    checker.versions = {"balances": read_versions(balances.path)[:3]}
    damaged = Report()
    checker.check_spark_reads(damaged)
    assert len(damaged.violations) == 2 and damaged.spark_versions_checked == 3, \
        damaged.violations
    assert "balances v1: delta-spark reads 4 rows, deltalake's files hold 5" \
        in damaged.violations[0], damaged.violations
    assert "balances v2:" in damaged.violations[1], damaged.violations
