"""A small gRPC client of the coordinator for the harness: retries while the daemon restarts.

Given several addresses (``"h1:p,h2:p"``) it follows the leader as the Spark side does
(:class:`percolake.leader.LeaderFollower`).
"""

from __future__ import annotations

from typing import Any

from percolake.leader import LeaderFollower
from percolake.v1 import coordinator_pb2 as pb

COMMITTED_STATES = (pb.COMMITTED, pb.APPLIED)


class Client:
    """Calls the coordinator (the leader of several); transient errors (a restart, a
    takeover) are retried for ``retry_s``, then raised as ``grpc.RpcError``."""

    def __init__(self, target: str, retry_s: float = 60.0, call_timeout_s: float = 10.0) -> None:
        # One address: fail fast while the daemon is down and poll, as before.
        self.follower = LeaderFollower(target, wait_for_ready=False, max_backoff_s=0.5)
        self.target = self.follower.target
        self.retry_s = retry_s
        self.call_timeout_s = call_timeout_s

    def close(self) -> None:
        self.follower.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        return self.follower.call(method, request, timeout_s=self.call_timeout_s,
                                  retry_s=self.retry_s if retry_s is None else retry_s)

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
