"""A typed client of the coordinator: follows the leader, bounded retries, named failures."""

from __future__ import annotations

import functools
import logging
from typing import Any, TypeVar

import grpc

from percolake.credentials import ClientSecurity
from percolake.lake.conflicts import ROW_LEVEL_CONFLICT_MARK
from percolake.leader import LeaderFollower, LeaderNotReached, is_transient
from percolake.v1 import coordinator_pb2 as pb
from sparkside.channel import make_channel
from sparkside.errors import (
    BatchRefused,
    CoordinatorUnavailable,
    InvalidRequest,
    PercolakeError,
    RowLevelConflict,
    TransactionAborted,
    WriteConflict,
)

log = logging.getLogger("percolake.client")
T = TypeVar("T")
CALL_TIMEOUT_S = 60.0


def translate(exc: grpc.RpcError) -> PercolakeError:
    """The Spark-side error for a coordinator status, carrying the coordinator's message."""
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return BatchRefused(detail)
    if code == grpc.StatusCode.ABORTED:
        if "held by" in detail:
            return WriteConflict(detail)
        if ROW_LEVEL_CONFLICT_MARK in detail:
            return RowLevelConflict(detail)
        return TransactionAborted(detail)
    if is_transient(exc):  # not reached, or still shedding load when the retry time ran out
        return CoordinatorUnavailable(f"coordinator unavailable: {detail}")
    return InvalidRequest(f"{code.name}: {detail}")


class CoordinatorClient:
    """Calls the coordinator, retrying UNAVAILABLE and DEADLINE_EXCEEDED for ``retry_s``.

    ``target`` is one ``host:port`` or several separated by commas (``"h1:50051,h2:50051"``):
    calls go to the leader, following a standby's hint or trying the next address
    (:class:`percolake.leader.LeaderFollower`). ``security``: TLS files and bearer token of
    every channel (None: from the ``PERCOLAKE_*`` environment variables).

    Raises:
        ValueError: ``target`` is not HOST:PORT[,HOST:PORT...].
        SecuritySettingsError: (a ValueError) a security setting of the environment is unusable.
    """

    def __init__(self, target: str, retry_s: float = 60.0,
                 security: ClientSecurity | None = None) -> None:
        security = ClientSecurity.resolve() if security is None else security
        self.security = security
        self._follower = LeaderFollower(target, functools.partial(make_channel,
                                                                  security=security))
        self.target = self._follower.target
        self.retry_s = retry_s

    def close(self) -> None:
        self._follower.close()

    @property
    def leader(self) -> str:
        """The address the next call goes to first: the coordinator that answered last."""
        return self._follower.current

    def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        """One RPC by name; transient failures are retried, every other one is translated."""
        budget = self.retry_s if retry_s is None else retry_s
        try:
            return self._follower.call(method, request,
                                       timeout_s=min(CALL_TIMEOUT_S, max(budget, 1.0)),
                                       retry_s=budget)
        except LeaderNotReached as exc:
            raise CoordinatorUnavailable(
                f"coordinator at {self.target} did not answer {method} within {budget:.0f} s "
                f"({exc.code().name}; {exc.details()})") from exc
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    # Thin helpers for the calls the participant and reader make.
    def register(self, pipeline_id: str, query_id: str | None) -> pb.RegisterPipelineResponse:
        request = pb.RegisterPipelineRequest(pipeline_id=pipeline_id)
        if query_id:
            request.query_id = query_id
        return self.call("RegisterPipeline", request)

    def get_transaction(self, txn_id: str, include_writes: bool = False) -> pb.Transaction:
        return self.call("GetTransaction",
                         pb.GetTransactionRequest(txn_id=txn_id, include_writes=include_writes))
