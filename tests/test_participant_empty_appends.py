"""The participant leaves a downstream batch's empty appends out of its commit request (no
change of the table: the coordinator leaves them out too, docs/topology.md); a root batch's are
sent as ever. No Spark: the request is captured."""

from types import SimpleNamespace

import pytest

from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.v1 import coordinator_pb2 as pb
from sparkside.participant import Participant

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


class CapturingClient:
    def __init__(self) -> None:
        self.requests: list[pb.CommitTransactionRequest] = []

    def call(self, method, request, **_):
        assert method == "CommitTransaction"
        self.requests.append(request)
        return pb.CommitTransactionResponse(transaction=pb.Transaction(txn_id=request.txn_id))


def _write(table: str, files: int, mode: WriteMode = WriteMode.APPEND) -> TableWriteRecord:
    adds = tuple(AddFileRecord(f"_percolake/t/part-{i}.parquet", 10, {}, 0, "{}")
                 for i in range(files))
    return TableWriteRecord(table, mode, adds, SCHEMA)


@pytest.mark.parametrize(("input_barrier", "sent"), [
    (5 << 18, ["file:///w/full", "file:///w/truncated"]),
    (0, ["file:///w/empty", "file:///w/full", "file:///w/truncated"]),
])
def test_empty_appends_are_left_out_of_a_downstream_commit(input_barrier, sent):
    participant = Participant("127.0.0.1:1", "ledger")
    client = participant.client = CapturingClient()
    try:
        writes = {w.table: w for w in (
            _write("file:///w/empty", 0), _write("file:///w/full", 1),
            _write("file:///w/truncated", 0, WriteMode.OVERWRITE))}
        handle = SimpleNamespace(txn_id="t", batch_id=3, writes=writes,
                                 input_barrier=input_barrier)
        participant._commit(handle)
        [request] = client.requests
        assert list(request.tables) == sent
        assert [w.table for w in request.writes] == sent
        assert request.release_unwritten  # the left-out table is released, not refused
    finally:
        participant._reports.close(0)
