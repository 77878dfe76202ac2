"""A small gRPC client of the coordinator for the harness: retries while the daemon restarts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
COMMITTED_STATES = (pb.COMMITTED, pb.APPLIED)


class Client:
    """Calls the coordinator; transient errors (a restart) are retried for ``retry_s``."""

    def __init__(self, target: str, retry_s: float = 60.0, call_timeout_s: float = 10.0) -> None:
        self.target = target
        self.retry_s = retry_s
        self.call_timeout_s = call_timeout_s
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.CoordinatorStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        fn: Callable[..., Any] = getattr(self.stub, method)
        delay = 0.05
        while True:
            try:
                return fn(request, timeout=self.call_timeout_s)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def list_transactions(self, pipeline_id: str = "", **filters: Any) -> list[pb.Transaction]:
        """Every transaction (all pages), ordered by start_ts."""
        out: list[pb.Transaction] = []
        token = ""
        while True:
            reply = self.call("ListTransactions", pb.ListTransactionsRequest(
                pipeline_id=pipeline_id, page_size=1000, page_token=token, **filters))
            out.extend(reply.transactions)
            token = reply.next_page_token
            if not token:
                return out

    def transaction(self, txn_id: str, include_writes: bool = False) -> pb.Transaction:
        return self.call("GetTransaction", pb.GetTransactionRequest(
            txn_id=txn_id, include_writes=include_writes))

    def snapshot(self, tables: list[str], wait_ms: int = 0) -> pb.GetSnapshotResponse:
        return self.call("GetSnapshot", pb.GetSnapshotRequest(tables=tables,
                                                              wait_timeout_ms=wait_ms))

    def pipeline(self, pipeline_id: str) -> pb.Pipeline:
        return self.call("GetPipeline", pb.GetPipelineRequest(pipeline_id=pipeline_id))


def state_name(state: int) -> str:
    return pb.TransactionState.Name(state)
