"""The /metrics endpoint of ``serve --metrics-port`` (docs/metrics.md): the registry of
``coordinator/metrics.py`` in the Prometheus text format, with the serving core's gauges.

It asks of its callers what the gRPC port does (``http_serving``): HTTPS with the daemon's
certificate when it has one, a client certificate under ``--client-ca``, and under
``--authenticate`` a credential whose principal has DESCRIBE on every pipeline (the rule of
GetTopology: the metrics name every pipeline and table) — unless ``--metrics-open``, which
lets every caller in (still over HTTPS when the daemon has a certificate).
"""

from __future__ import annotations

import gzip
import urllib.parse
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client.exposition import choose_encoder, gzip_accepted

from coordinator.auth.access import AccessDenied, Checks
from coordinator.auth.identity import Unauthenticated
from coordinator.auth_records import Permission
from coordinator.http_serving import HTTP_EXPECTED, CallerHandler, HttpAccess, HttpServer
from coordinator.metrics import REGISTRY, CoreCollector


class MetricsServer:
    """The /metrics endpoint on ``host:port`` (read-only; see docs/metrics.md); ``access``
    what callers must present."""

    def __init__(self, host: str, port: int, current_core: Callable[[], Any],
                 access: HttpAccess) -> None:
        self.collector = CoreCollector(current_core)
        REGISTRY.register(self.collector)
        try:
            self._http = HttpServer(host, port, _MetricsHandler, access, "metrics")
        except BaseException:
            REGISTRY.unregister(self.collector)
            raise
        self.port = self._http.port

    def stop(self) -> None:
        self._http.stop()
        REGISTRY.unregister(self.collector)


class _MetricsHandler(CallerHandler):
    def do_GET(self) -> None:  # noqa: N802
        if urllib.parse.urlsplit(self.path).path not in ("/metrics", "/"):
            self._answer(404, b"no such page; the metrics are at /metrics\n")
            return
        try:
            principal = self.principal()
        except Unauthenticated as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                self._answer(503, f"{exc}\n".encode())
                return
            message = f"{exc}: {HTTP_EXPECTED}"
            self.audit_refusal("", "UNAUTHENTICATED", message)
            self._answer(401, f"{message}\n".encode(),
                         {"WWW-Authenticate": 'Bearer realm="percolake"'})
            return
        if principal is not None and self.access.credentials is not None:
            try:
                Checks(principal, self.access.credentials, None).every_pipeline(
                    Permission.DESCRIBE, "read the metrics (they name every pipeline and table)")
            except AccessDenied as exc:
                self.audit_refusal(principal, "PERMISSION_DENIED", str(exc))
                self._answer(403, f"{exc}\n".encode())
                return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(REGISTRY)
        headers = {"Content-Type": content_type}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._answer(200, body, headers)

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {}),
                            "Cache-Control": "no-store",
                            "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
