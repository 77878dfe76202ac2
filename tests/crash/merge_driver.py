"""A driver whose batch 0 is one MERGE into a table, without Spark, for the merge crash points.

``python -m tests.crash.merge_driver TARGET TABLE PIPELINE QUERY_ID`` runs the protocol as the
participant does for ``txn.delta_table(t).merge(...)``: RegisterPipeline, Open (the table held),
the copy-on-write rewrite of the files of the version read (id 2 gets +5, id 4 is inserted)
into the attempt's folder, CommitTransaction carrying the ROW_LEVEL write, then the table's
Delta commit with ``apply_table_write`` and ReportApplied. A restarted driver (same query id)
finds batch 0 committed and only finishes it. The transaction id is printed before the apply.
Failpoints come from ``PERCOLAKE_FAILPOINTS``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from percolake import codec
from percolake.lake.arrow_read import read_delta_table
from percolake.lake.delta_commit import apply_table_write, files_of_version, open_table
from percolake.records import (
    AddFileRecord,
    RemoveFileRecord,
    TableWriteRecord,
    WriteMode,
    delta_app_id,
)
from percolake.v1 import coordinator_pb2 as pb
from tests.crash.checker import local_path
from tests.crash.rpc import Client

BATCH = 0


def merged(rows: pa.Table) -> pa.Table:
    """The MERGE of source {(2, +5), (4, 40)} on id: update the match, insert the rest."""
    value = pc.if_else(pc.equal(rows["id"], 2), pc.add(rows["value"], 5), rows["value"])
    updated = pa.table({"id": rows["id"], "value": value})
    return pa.concat_tables([updated, pa.table({"id": pa.array([4], pa.int64()),
                                                "value": pa.array([40], pa.int64())})])


def merge_write(table: str, txn_id: str, location: str) -> TableWriteRecord:
    version = open_table(table).version()
    files = files_of_version(table, version)
    output = merged(read_delta_table(table, version=version))
    folder = f"{local_path(location)}/op0"
    os.makedirs(folder, exist_ok=True)
    pq.write_table(output, f"{folder}/part-0.parquet")
    add = AddFileRecord(f"_percolake/{txn_id}/op0/part-0.parquet",
                        os.path.getsize(f"{folder}/part-0.parquet"), {},
                        int(time.time() * 1000), json.dumps({"numRecords": output.num_rows}))
    return TableWriteRecord(
        table, WriteMode.ROW_LEVEL, (add,), files.schema_json,
        remove_files=tuple(RemoveFileRecord(f.path, f.size, {}) for f in files.files),
        read_version=version, operation="MERGE",
        operation_metrics=json.dumps({"numTargetRowsUpdated": "1", "numTargetRowsInserted": "1",
                                      "numTargetRowsCopied": str(output.num_rows - 2)}))


def finish(client: Client, txn_id: str, epoch: int) -> None:
    txn = client.transaction(txn_id, include_writes=True)
    applied = []
    for part in txn.participants:
        if not part.applied:
            version = apply_table_write(
                codec.table_write_from_pb(part.write),
                app_id=delta_app_id(txn.pipeline_id, txn.generation), app_version=txn.batch_id,
                txn_id=txn.txn_id, commit_ts=txn.commit_ts)
            applied.append(pb.AppliedTable(table=part.table, delta_version=version))
    if applied:
        client.call("ReportApplied", pb.ReportAppliedRequest(txn_id=txn_id, epoch=epoch,
                                                             tables=applied))


def main(target: str, table: str, pipeline: str, query_id: str) -> None:
    with Client(target, retry_s=30) as client:
        epoch = client.call("RegisterPipeline", pb.RegisterPipelineRequest(
            pipeline_id=pipeline, query_id=query_id)).epoch
        opened = client.call("OpenTransaction", pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=BATCH, epoch=epoch, query_id=query_id,
            tables=[table]))
        txn_id = opened.transaction.txn_id
        if not opened.already_committed:
            location = opened.locations[0].write_location
            write = merge_write(opened.locations[0].table, txn_id, location)
            client.call("CommitTransaction", pb.CommitTransactionRequest(
                txn_id=txn_id, epoch=epoch, tables=[table],
                writes=[codec.table_write_to_pb(write)]))
        print(json.dumps({"txn_id": txn_id, "replayed": opened.already_committed}), flush=True)
        finish(client, txn_id, epoch)


if __name__ == "__main__":
    main(*sys.argv[1:5])
