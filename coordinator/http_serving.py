"""The daemon's HTTP endpoints (the web view, /metrics): one threaded server, HTTPS with the
daemon's certificate when it has one, and the caller's identity by the gRPC port's rules
(docs/security.md, "The HTTP endpoints").

With ``--client-ca`` the TLS handshake requires a client certificate signed by it, as on the
gRPC port; with ``--authenticate`` a request names its principal by ``Authorization: Bearer
<token>`` or that certificate (``identity.authenticate``). The handshake runs in the request's
own thread, with a timeout, so a client that never completes it holds up nobody else.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from coordinator.auth.audit import AuditLog
from coordinator.auth.credentials import Credentials
from coordinator.auth.identity import authenticate

log = logging.getLogger("percolake.http")
REQUEST_TIMEOUT_S = 30.0  # a connection idle this long (handshake or request) is closed
HTTP_EXPECTED = ("send the header 'Authorization: Bearer <token>' or, where the coordinator "
                 "requires client certificates, a certificate whose subject has one common "
                 "name (CN) that is a valid principal name")


class TlsFiles(Protocol):
    """The fields of ``ServerOptions`` the HTTPS context is made of."""

    tls_cert: str
    tls_key: str
    client_ca: str


def tls_context(options: TlsFiles, *, client_certificates: bool = True) -> ssl.SSLContext | None:
    """The HTTPS context of the daemon's certificate; None without one (plain HTTP). With
    ``--client-ca`` (and ``client_certificates``) a client certificate signed by it is
    required, as on the gRPC port. The files were checked at start (``tls.check``)."""
    if not options.tls_cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.tls_cert, options.tls_key)
    if options.client_ca and client_certificates:
        context.load_verify_locations(cafile=options.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass(frozen=True)
class HttpAccess:
    """What an endpoint asks of its callers: ``tls`` None serves plain HTTP; ``credentials``
    None lets every caller in (authentication off, or an endpoint opened on purpose)."""

    tls: ssl.SSLContext | None
    credentials: Credentials | None
    audit_log: AuditLog | None = None

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    @property
    def client_certificates(self) -> bool:
        return self.tls is not None and self.tls.verify_mode == ssl.CERT_REQUIRED


class CallerHandler(BaseHTTPRequestHandler):
    """A request handler that knows its endpoint's :class:`HttpAccess`."""

    access: HttpAccess
    timeout = REQUEST_TIMEOUT_S
    server_version = "percolake"
    sys_version = ""

    def principal(self) -> str | None:
        """The caller's principal, None with authentication off.

        Raises:
            Unauthenticated: no usable credential (written to the audit log).
        """
        credentials = self.access.credentials
        if credentials is None:
            return None
        return authenticate(credentials, self.headers.get_all("Authorization") or [],
                            self._peer_certificate())

    def _peer_certificate(self) -> bytes | None:
        if isinstance(self.connection, ssl.SSLSocket):
            return self.connection.getpeercert(binary_form=True)
        return None

    def peer(self) -> str:
        """The client's address as gRPC's peer strings name it (``ipv4:127.0.0.1:5300``)."""
        host, port = self.client_address[:2]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def audit_refusal(self, principal: str, status: str, message: str) -> None:
        if self.access.audit_log is not None:
            self.access.audit_log.write(principal=principal, action="refused", status=status,
                                        message=message, method=f"GET {self.path[:200]}",
                                        peer=self.peer())

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("http request", extra={"request": format % args})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        # the handshake happens at the handler's first read, in its own thread
        return self.tls.wrap_socket(sock, server_side=True,
                                    do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a failed handshake (no or a foreign client certificate, plain HTTP to HTTPS), a
        # client gone: the client learns it from its connection; nothing to alarm about
        log.debug("http connection failed", exc_info=True, extra={"peer": str(client_address)})


class HttpServer:
    """``handler`` served on ``host:port`` (0: a free port) in a thread of its own."""

    def __init__(self, host: str, port: int, handler: type[CallerHandler], access: HttpAccess,
                 name: str, **handler_fields: Callable[..., Any] | object) -> None:
        handler_class = type(handler.__name__, (handler,), {"access": access, **handler_fields})
        server_class = type("Server", (_Server,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET,
            "tls": access.tls})
        self._server = server_class((host, port), handler_class)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
