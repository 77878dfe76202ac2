"""The one server interceptor that decides who calls: every call, every service.

A call carrying metadata ``authorization: Bearer <token>`` is the token's principal (a bad
token is refused even when a client certificate came too); without it, under mutual TLS, the
principal is the client certificate's subject common name (CN). Anything else is refused
UNAUTHENTICATED, from memory alone (no store access). With ``open_health`` the gRPC health
and reflection services need no credential.

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
from coordinator.principal import ANONYMOUS, acting_as

log = logging.getLogger("percolake.rpc")
EXPECTED = ("send metadata 'authorization: Bearer <token>' or, where the coordinator "
            "requires client certificates, a certificate whose subject CN names you")
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


class Unauthenticated(Exception):
    def __init__(self, problem: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED):
        super().__init__(problem)
        self.code = code


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
        values = [v for k, v in context.invocation_metadata() if k == "authorization"]
        if len(values) > 1:
            raise Unauthenticated(f"{len(values)} authorization metadata entries; send one")
        if values:
            value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
            scheme, _, token = value.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise Unauthenticated("malformed authorization metadata (not 'Bearer <token>')")
            principal = self.credentials.principal_of(token)
            if principal is not None:
                return principal
            if not self.credentials.loaded:
                raise Unauthenticated("the coordinator has not loaded its tokens from the store "
                                      "yet (the store is unreachable); retry",
                                      grpc.StatusCode.UNAVAILABLE)
            raise Unauthenticated("unknown or revoked bearer token")
        common_names = context.auth_context().get("x509_common_name") or []
        if common_names:
            name = common_names[0].decode(errors="replace")
            if name and name.isprintable() and name == name.strip():
                return name
            raise Unauthenticated("the client certificate's subject CN is not a usable name")
        raise Unauthenticated("no credential")

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
