"""A typed client of the coordinator: bounded retries of transient errors, named failures."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from sparkside.channel import make_channel
from sparkside.errors import (
    BatchRefused,
    CoordinatorUnavailable,
    InvalidRequest,
    PercolakeError,
    TransactionAborted,
    WriteConflict,
)

log = logging.getLogger("percolake.client")
T = TypeVar("T")
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
CALL_TIMEOUT_S = 60.0


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in TRANSIENT


def translate(exc: grpc.RpcError) -> PercolakeError:
    """The Spark-side error for a coordinator status, carrying the coordinator's message."""
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return BatchRefused(detail)
    if code == grpc.StatusCode.ABORTED:
        return WriteConflict(detail) if "held by" in detail else TransactionAborted(detail)
    if code in TRANSIENT:
        return CoordinatorUnavailable(f"coordinator unavailable: {detail}")
    return InvalidRequest(f"{code.name}: {detail}")


class CoordinatorClient:
    """Calls the coordinator, retrying UNAVAILABLE and DEADLINE_EXCEEDED for ``retry_s``."""

    def __init__(self, target: str, retry_s: float = 60.0) -> None:
        self.target = target
        self.retry_s = retry_s
        self._channel = make_channel(target)
        self.stub = pb_grpc.CoordinatorStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        """One RPC by name; transient failures are retried, every other one is translated."""
        rpc: Callable[..., Any] = getattr(self.stub, method)
        budget = self.retry_s if retry_s is None else retry_s
        try:
            for attempt in Retrying(
                retry=retry_if_exception(_transient),
                stop=stop_after_delay(budget),
                wait=wait_exponential_jitter(multiplier=0.1, max=2.0),
                reraise=True,
            ):
                with attempt:
                    return rpc(request, timeout=min(CALL_TIMEOUT_S, max(budget, 1.0)),
                               wait_for_ready=True)
        except grpc.RpcError as exc:
            error = translate(exc)
            if isinstance(error, CoordinatorUnavailable):
                error = CoordinatorUnavailable(
                    f"coordinator at {self.target} did not answer {method} within "
                    f"{budget:.0f} s ({exc.code().name}: {exc.details()})")
            raise error from exc
        raise AssertionError("unreachable")

    # Thin helpers for the calls the participant and reader make.
    def register(self, pipeline_id: str, query_id: str | None) -> pb.RegisterPipelineResponse:
        request = pb.RegisterPipelineRequest(pipeline_id=pipeline_id)
        if query_id:
            request.query_id = query_id
        return self.call("RegisterPipeline", request)

    def get_transaction(self, txn_id: str, include_writes: bool = False) -> pb.Transaction:
        return self.call("GetTransaction",
                         pb.GetTransactionRequest(txn_id=txn_id, include_writes=include_writes))
