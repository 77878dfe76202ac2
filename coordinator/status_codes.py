"""The one place that maps error classes to gRPC status codes."""

from __future__ import annotations

import grpc

from percolake import errors

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),  # incl. Fenced, QueryId
    (errors.Conflict, grpc.StatusCode.ABORTED),
    (errors.TransactionAborted, grpc.StatusCode.ABORTED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.StoreConflict, grpc.StatusCode.ABORTED),
    (errors.CommitStateUnknown, grpc.StatusCode.UNAVAILABLE),
]


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status of an error; anything unexpected is INTERNAL (and logged loudly)."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL
