"""The one server interceptor that decides who calls: every call, every service.

Who calls is decided by ``identity.authenticate`` from the metadata ``authorization:
Bearer <token>`` and, under mutual TLS, the whole client certificate gRPC verified
(``x509_pem_cert``, never its cut-down ``x509_common_name``). A refusal is UNAUTHENTICATED,
decided from memory alone (no store access), with one audit line. With ``open_health`` the
gRPC health and reflection services need no credential.

It also records each call for the audit log and writes the line of a refusal nobody else
wrote (UNAUTHENTICATED here, malformed requests, limits refused before the servicer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from coordinator.auth import audit
from coordinator.auth.audit import AuditLog
from coordinator.auth.credentials import Credentials
from coordinator.auth.identity import EXPECTED, Unauthenticated, authenticate
from coordinator.principal import ANONYMOUS, acting_as

log = logging.getLogger("percolake.rpc")
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")
_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
# Not refusals: a standby's "not the leader", a shutting-down server (the client retries).
_NOT_AUDITED = (None, grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class AuthInterceptor(grpc.ServerInterceptor):
    """``credentials`` None: authentication off (every caller is ANONYMOUS)."""

    def __init__(self, credentials: Credentials | None, audit_log: AuditLog | None = None,
                 open_health: bool = False) -> None:
        self.credentials = credentials
        self.audit_log = audit_log
        self.open_health = open_health

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        checked = self.credentials is not None and not (
            self.open_health and method.startswith(OPEN_SERVICES))
        behavior = (handler.unary_unary or handler.unary_stream or handler.stream_unary
                    or handler.stream_stream)

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            with audit.recording(_short(method), context.peer()):
                principal = self._principal(context, method) if checked else ANONYMOUS
                with acting_as(principal):
                    try:
                        return behavior(request, context)
                    finally:
                        self._audit_refusal(principal, context)

        factory = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
        return factory(handle, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)

    def _principal(self, context: grpc.ServicerContext, method: str) -> str:
        try:
            return self.authenticate(context)
        except Unauthenticated as exc:
            message = f"{exc}: {EXPECTED}" if exc.code == grpc.StatusCode.UNAUTHENTICATED \
                else str(exc)
            log.info("refused", extra={"rpc": _short(method),
                                       "error": exc.code.name, "detail": str(exc),
                                       "peer": context.peer()})
            if self.audit_log is not None and exc.code == grpc.StatusCode.UNAUTHENTICATED:
                self.audit_log.write(principal="", action="refused", status=exc.code.name,
                                     message=message)
            context.abort(exc.code, message)
            raise AssertionError("unreachable") from exc

    def authenticate(self, context: grpc.ServicerContext) -> str:
        """The caller's principal; raises Unauthenticated saying what is wrong."""
        assert self.credentials is not None
        values = [v if isinstance(v, str) else v.decode(errors="replace")
                  for k, v in context.invocation_metadata() if k == "authorization"]
        certificates = context.auth_context().get("x509_pem_cert") or [None]
        return authenticate(self.credentials, values, certificates[0])

    def _audit_refusal(self, principal: str, context: grpc.ServicerContext) -> None:
        """A refusal answered below the servicer (or a failure) that no line recorded yet."""
        record = audit.current_call()
        code = context.code()
        if self.audit_log is None or record is None or record.audited or code in _NOT_AUDITED:
            return
        details = context.details() or ""
        if isinstance(details, bytes):
            details = details.decode(errors="replace")
        self.audit_log.write(principal=principal, action="refused", status=code.name,
                             message=details)
