"""The catalog names tables were written by, for the views that show tables by location
(pipelines, topology, leases; the CLI and the web view share it).

The coordinator keys tables by location; a writer that named a table in its session's catalog
(``txn.write(df, "db.orders")``) records the name with its write intent
(``TableParticipant.catalog_name``). A table's name here is the one its writing pipeline's
last committed batch used, where that batch wrote it by name: known, not guaranteed (a table
written by path, or not in the last batch, shows its location only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from percolake.v1 import coordinator_pb2 as pb

Call = Callable[[str, Any], Any]  # (RPC name, request) -> reply: the CLI's and the web's reads


def last_batch(call: Call, pipeline_id: str) -> list[pb.Transaction]:
    """The committed transaction(s) of the pipeline's last committed batch (none if it has
    not committed)."""
    pipeline = call("GetPipeline", pb.GetPipelineRequest(pipeline_id=pipeline_id))
    if not pipeline.HasField("last_committed_batch_id"):
        return []
    return list(call("ListTransactions", pb.ListTransactionsRequest(
        pipeline_id=pipeline_id, generation=pipeline.generation,
        batch_id=pipeline.last_committed_batch_id,
        states=[pb.COMMITTED, pb.APPLIED])).transactions)


def names_in(transactions: Iterable[pb.Transaction]) -> dict[str, str]:
    """Location -> catalog name of the tables these transactions wrote by name."""
    return {p.table: p.catalog_name for txn in transactions for p in txn.participants
            if p.catalog_name}


def catalog_names(call: Call, writers: Iterable[str]) -> dict[str, str]:
    """Location -> catalog name of the tables the ``writers`` pipelines' last batches wrote by
    name."""
    names: dict[str, str] = {}
    for pipeline_id in sorted(set(filter(None, writers))):
        names.update(names_in(last_batch(call, pipeline_id)))
    return names


def named(table: str, names: Mapping[str, str]) -> str:
    """A table as the text views show it: its location, and its catalog name where known."""
    name = names.get(table)
    return f"{table} ({name})" if name else table
