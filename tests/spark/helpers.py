"""Reading what the coordinator and the Delta tables hold, for assertions; running the same
row-level operations through percolake and delta-spark."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow
from deltalake import DeltaTable

from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb


def transactions(stub, pipeline: str) -> list[pb.Transaction]:  # noqa: ANN001
    found, token = [], ""
    while True:
        reply = stub.ListTransactions(pb.ListTransactionsRequest(
            pipeline_id=pipeline, page_size=1000, page_token=token), timeout=30)
        found.extend(reply.transactions)
        token = reply.next_page_token
        if not token:
            return found


def committed_batches(stub, pipeline: str) -> dict[int, pb.Transaction]:  # noqa: ANN001
    committed = [t for t in transactions(stub, pipeline)
                 if t.state in (pb.COMMITTED, pb.APPLIED)]
    batches = Counter(t.batch_id for t in committed)
    assert all(n == 1 for n in batches.values()), f"a batch committed twice: {batches}"
    return {t.batch_id: t for t in committed}


def rows(table: Path, version: int | None = None) -> list[dict]:
    return read_delta_table(str(table), version).to_pylist()


def files_of_every_version(table: Path) -> set[str]:
    """Every data file path any Delta version of the table references."""
    latest = DeltaTable(str(table)).version()
    paths: set[str] = set()
    for version in range(latest + 1):
        dt = DeltaTable(str(table), version=version)
        paths.update(pyarrow.table(dt.get_add_actions(flatten=False)).column("path").to_pylist())
    return paths


def commit_infos(table: Path) -> list[dict]:
    return [json.loads(json.dumps(h)) for h in DeltaTable(str(table)).history()]


def run_on_both(spark: Any, participant: Any, batch_id: int,  # noqa: ANN401 - Spark, Participant
                operations: Sequence[Callable[[Any, Any], object]], source: Any,
                ours: Path, theirs: Path) -> None:
    """Runs ``operations`` (each ``op(delta_table, source)``) in order in one percolake batch on
    ``ours`` (``txn.delta_table``), then with delta-spark's ``DeltaTable`` on ``theirs``."""
    from delta.tables import DeltaTable as SparkDeltaTable

    def batch(df: Any, b: int, txn: Any) -> None:  # noqa: ANN401
        for operation in operations:
            operation(txn.delta_table(str(ours)), source)

    participant.run_batch(spark.range(1), batch_id, batch)
    for operation in operations:
        operation(SparkDeltaTable.forPath(spark, str(theirs)), source)
