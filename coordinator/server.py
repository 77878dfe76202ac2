"""Server set-up in one place: the servicer, health, reflection, limits, graceful shutdown.

TLS, mutual TLS and bearer-token interceptors slot in here without touching the core.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator import http_serving, metrics, metrics_endpoint, tls, web
from coordinator.auth.audit import AuditLog
from coordinator.auth.credentials import Credentials, SecurityFileError
from coordinator.auth.setup import Security, build_security
from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.leadership import Fatal, FixedCore, Leadership
from coordinator.limits import CountingExecutor, LimitsInterceptor, RateLimiter
from coordinator.servicer import CoordinatorServicer
from coordinator.status_codes import status_for
from coordinator.store import open_store
from coordinator.store.base import Store
from coordinator.tls import TransportSettingsError
from percolake.errors import InvalidArgument, StoreUnavailable
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from percolake.lake.write_check import WriteChecker
    from percolake.records import TableWriteRecord

log = logging.getLogger("percolake.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
_HANDLER_FACTORIES = {  # (request_streaming, response_streaming) -> grpc's handler factory
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class _Malformed:
    """Request bytes that did not parse as the method's request message."""

    def __init__(self, message_type: str, error: Exception) -> None:
        self.message_type = message_type
        self.error = error


class MalformedRequestInterceptor(grpc.ServerInterceptor):
    """Request bytes that are not a protobuf message of the method's request type (garbage, a
    truncated message, a string field that is not UTF-8) are answered INVALID_ARGUMENT naming
    the method; grpcio itself would answer INTERNAL. Covers every service of the server.

    The checked handler of a method is built once for each handler the inner interceptors
    return (the same object call after call, but for a refusal of their own)."""

    def __init__(self) -> None:
        self._checked: dict[str, tuple[Any, Any]] = {}  # method -> (inner, checked) handler

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        built = self._checked.get(method)
        if built is not None and built[0] is handler:
            return built[1]
        checked_handler = self._checked_handler(handler, method)
        self._checked[method] = (handler, checked_handler)
        return checked_handler

    @staticmethod
    def _checked_handler(handler: Any, method: str) -> Any:
        behavior = (handler.unary_unary or handler.unary_stream or handler.stream_unary
                    or handler.stream_stream)
        checked = (_checked_stream(behavior, method) if handler.request_streaming
                   else _checked_unary(behavior, method))
        factory = _HANDLER_FACTORIES[(handler.request_streaming, handler.response_streaming)]
        return factory(checked, request_deserializer=_lenient(handler.request_deserializer),
                       response_serializer=handler.response_serializer)


def _lenient(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    message = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    message_type = message.full_name if message is not None else "request"

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError, and whatever else a parser raises
            return _Malformed(message_type, exc)

    return parse


def _refuse(context: grpc.ServicerContext, method: str, request: _Malformed) -> None:
    error = InvalidArgument(
        f"{method}: the request bytes are not a protobuf {request.message_type} message "
        f"({type(request.error).__name__}: {request.error}); send the message the method's "
        ".proto declares")
    log.info("refused", extra={"rpc": method, "error": "MalformedRequest",
                               "detail": str(request.error)})
    context.abort(status_for(error), str(error))


def _checked_unary(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            _refuse(context, method, request)
        return behavior(request, context)

    return handle


def _checked_stream(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behavior(_checked_requests(requests, context, method), context)

    return handle


def _checked_requests(requests: Iterator[Any], context: grpc.ServicerContext,
                      method: str) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, _Malformed):
            _refuse(context, method, request)
        yield request


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    max_workers: int = 32
    max_message_bytes: int = 64 * 1024 * 1024
    shutdown_grace_s: float = 10.0
    object_store_timeout_s: float = 30.0  # each object-store request, retried at most 3 times
    store_url: str = ""  # "" or "sqlite": SQLite under the data dir; postgresql://...: leases
    advertise: str = ""  # HOST:PORT clients reach this process at; "" = host:bound port
    lease_s: float = 2.0
    node_id: str = ""  # "" = host:pid:random
    # limits (docs/limits.md): in-flight calls (running or queued) and requests per second of
    # each principal (0: no rate limit), in bursts of rate_burst
    max_concurrent_rpcs: int = 256
    max_streams: int = 4  # health Watch and reflection streams open at once
    rate_per_principal: float = 2000.0
    rate_burst: int = 4000
    # security (issue 17): transport (TLS, mTLS, --insecure) ...
    tls_cert: str = ""
    tls_key: str = ""
    client_ca: str = ""  # set: a client certificate is required (mTLS)
    insecure: bool = False  # allow a non-loopback address without TLS and authentication
    # ... and authentication: every call needs a valid bearer token or client certificate
    authenticate: bool = False
    open_health: bool = False  # health and reflection answer without a credential
    audit_log: str = ""  # a file: refusals and administrative actions, one JSON line each
    admin_token_file: str = ""  # the bootstrap admin's token (created if missing)
    metrics_port: int = 0  # Prometheus /metrics on host:metrics_port; 0: off
    # /metrics answers without a credential even under --authenticate or --client-ca
    metrics_open: bool = False
    http_port: int = 0  # the read-only web view on host:http_port; 0: off


class RunningServer:
    """A started gRPC server with its cores; ``stop`` shuts everything down in order.

    With a store that supports leases the cores come and go with the leadership; otherwise
    one core serves for the life of the process.
    """

    def __init__(self, options: ServerOptions, redact: Callable[[str], str] = str,
                 security: Security | None = None) -> None:
        self.options = options
        self.redact = redact
        self.security = security
        self.health = health.HealthServicer()
        self.leadership: Leadership | None = None
        self.fixed: FixedCore | None = None
        self.executor = CountingExecutor(options.max_workers)
        limits = LimitsInterceptor(self.executor, options.max_concurrent_rpcs,
                                   options.max_message_bytes,
                                   RateLimiter(options.rate_per_principal, options.rate_burst),
                                   options.max_streams)
        self.server = grpc.server(
            self.executor,
            # LimitsInterceptor last: it counts the rate of the principal authentication set
            # authentication first (docs/security.md): the others see the caller
            interceptors=[*([metrics.RpcMetricsInterceptor()] if options.metrics_port else []),
                          *(security.interceptors() if security else []),
                          MalformedRequestInterceptor(), limits],
            # gRPC's own cap (its refusal names no flag) only backs up LimitsInterceptor's,
            # which lets health checks through
            maximum_concurrent_rpcs=2 * options.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", options.max_message_bytes),
                ("grpc.max_send_message_length", options.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        self.port = tls.add_port(self.server, options)  # TLS/mTLS when configured
        if self.port == 0:
            raise OSError(f"cannot listen on {options.host}:{options.port}")
        host = socket.gethostname() if options.host in ("0.0.0.0", "::", "") else options.host
        self.advertise = options.advertise or f"{host}:{self.port}"
        self.metrics = self._serve_metrics() if options.metrics_port else None
        self.web = self._serve_web() if options.http_port else None
        self.set_serving(False)

    def _serve_metrics(self) -> metrics_endpoint.MetricsServer:
        """/metrics on the gRPC host, asking what gRPC asks unless open (docs/metrics.md)."""
        open_because = tls.metrics_open_because(self.options)
        access = http_serving.HttpAccess(
            http_serving.tls_context(self.options, client_certificates=not open_because),
            None if open_because else self._credentials(), self._audit_log())
        served = metrics_endpoint.MetricsServer(self.options.host, self.options.metrics_port,
                                                lambda: self.core, access)
        loopback = tls.is_loopback(self.options.host)
        if open_because:
            who = f"anyone who reaches the port ({open_because}"
            who += ", loopback only)" if loopback else ")"
        else:
            who = _credential_needed(access)
            if access.credentials is not None:
                who += " with DESCRIBE on every pipeline"
        log.log(logging.INFO if loopback or not open_because else logging.WARNING,
                "serving Prometheus metrics over %s to %s", access.scheme.upper(), who,
                extra={"host": self.options.host, "metrics_port": served.port,
                       "scheme": access.scheme, "open": bool(open_because),
                       "open_because": open_because})
        return served

    def _serve_web(self) -> web.WebServer:
        """The web view on the gRPC host, asking what gRPC asks (docs/operations.md)."""
        access = http_serving.HttpAccess(http_serving.tls_context(self.options),
                                         self._credentials(), self._audit_log())
        served = web.WebServer(self.options.host, self.options.http_port,
                               lambda: self.fixed or self.leadership, access)
        loopback = tls.is_loopback(self.options.host)
        clear = access.tls is None and access.credentials is not None
        exposed = access.tls is None or not (access.credentials or access.client_certificates)
        log.log(logging.INFO if loopback or not exposed else logging.WARNING,
                "serving the web view over %s to %s%s", access.scheme.upper(),
                _credential_needed(access), " (bearer tokens travel in clear)" if clear else "",
                extra={"host": self.options.host, "http_port": served.port,
                       "scheme": access.scheme, "authenticated": access.credentials is not None})
        return served

    def _credentials(self) -> Credentials | None:
        return self.security.credentials if self.security else None

    def _audit_log(self) -> AuditLog | None:
        return self.security.audit_log if self.security else None

    @property
    def core(self) -> TransactionCoordinator | None:
        """The core serving now (None on a standby)."""
        return self.fixed.term.core if self.fixed else self.leadership and self.leadership.core

    def set_serving(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            self.health.set(service, status)
        if serving and self.security is not None:
            self.security.serving()  # e.g. a standby took over: reload its credentials now

    def start(self, cores: FixedCore | Leadership) -> None:
        """Serves with one fixed core (started here) or a leadership (its loop started here)."""
        servicer = (self.security.servicer(cores, self.redact) if self.security
                    else CoordinatorServicer(cores, self.redact))
        pb_grpc.add_CoordinatorServicer_to_server(servicer,
                                                  self.server)
        self.server.start()
        if isinstance(cores, Leadership):
            self.leadership = cores.start()
            log.info("listening; a standby until the lease is acquired",
                     extra={"host": self.options.host, "port": self.port,
                            "advertise": self.advertise, "node_id": cores.node_id,
                            "lease_s": cores.lease_s})
            return
        self.fixed = cores
        cores.term.core.start_background()
        self.set_serving(True)
        log.info("serving", extra={"host": self.options.host, "port": self.port})

    def stop(self) -> None:
        """Stops taking RPCs, lets in-flight ones finish, then closes the core and the store.

        A leader first releases its lease, so a standby takes over at once; calls still in
        flight here then end UNAVAILABLE (their writes are refused by the store)."""
        self.health.enter_graceful_shutdown()
        if self.web is not None:
            self.web.stop()  # first: its requests use the core closed below
        if self.leadership is not None:
            self.leadership.stop()
        self.server.stop(self.options.shutdown_grace_s).wait()
        if self.security is not None:
            self.security.close()
        if self.leadership is not None:
            self.leadership.close()
        if self.fixed is not None:
            core = self.fixed.term.core
            core.close()
            core.store.close()
        if self.metrics is not None:
            self.metrics.stop()
        log.info("stopped")


def _credential_needed(access: http_serving.HttpAccess) -> str:
    """Who an HTTP endpoint answers, for the start-up log."""
    certificate = access.client_certificates
    if access.credentials is None:
        return ("callers with a client certificate of --client-ca" if certificate
                else "anyone who reaches the port (authentication is off)")
    return ("callers whose bearer token or client certificate (of --client-ca, required) "
            "names a principal" if certificate else "callers whose bearer token names a "
            "principal")


class LakeEngines:
    """A core's applier and write checks on the lake's engines (delta-rs, pyarrow), loaded and
    built at the first request that needs them: a daemon that serves no table (a standby, an
    operator's or a test's) never loads them. Each table's log state is kept across requests
    and advanced, never reloaded whole: the reports' entries, the write check's layouts and
    the roll-forward's delta-rs tables."""

    def __init__(self, roots: list[str]) -> None:
        self._roots = roots
        self._lock = threading.Lock()
        self._built: tuple[Callable[..., int], WriteChecker] | None = None

    def _engines(self) -> tuple[Callable[..., int], WriteChecker]:
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                from percolake.lake.checkpoints import Checkpointer, checkpointing
                from percolake.lake.delta_commit import apply_table_write
                from percolake.lake.table_cache import TableCache
                from percolake.lake.write_check import LayoutCache, WriteChecker

                tables = TableCache()
                # what the roll-forward applies gets its scheduled checkpoints (off the
                # request's path)
                applier = checkpointing(functools.partial(
                    apply_table_write, roots=self._roots, tables=tables.tables), Checkpointer())
                # the reports' checks through the layouts: an entry they read is not read
                # again by the next write check of its table
                self._built = (applier, WriteChecker(LayoutCache(tables.entries),
                                                     roots=self._roots))
            return self._built

    def apply(self, write: TableWriteRecord, **kwargs: Any) -> int:
        return self._engines()[0](write, **kwargs)

    def is_commit_of(self, table: str, version: int, txn_id: str, app_id: str,
                     app_version: int) -> bool:
        return self._engines()[1].layouts.is_commit_of(table, version, txn_id, app_id,
                                                       app_version)

    def check(self, write: TableWriteRecord) -> None:
        self._engines()[1].check(write)


def _core_builder(config: CoordinatorConfig) -> Callable[[Store], TransactionCoordinator]:
    """Builds a core on a store: loads pipelines, unfinished transactions, the oracle mark."""
    engines = LakeEngines(config.warehouse_roots)

    def build(store: Store) -> TransactionCoordinator:
        return TransactionCoordinator(store, config, applier=engines.apply,
                                      applied_check=engines.is_commit_of,
                                      write_check=engines.check)

    return build


def is_sqlite(store_url: str) -> bool:
    return store_url in ("", "sqlite")


def start_server(data_dir: str | Path | None, config: CoordinatorConfig,
                 options: ServerOptions, redact: Callable[[str], str] = str) -> RunningServer:
    """Opens the store (SQLite in ``data_dir``, created if missing, unless
    ``options.store_url`` names another) and starts serving; on a store with leases as a
    standby that becomes the leader when it acquires the lease.

    Raises:
        TransportSettingsError: a TLS file is unusable, or a non-loopback address lacks
            TLS or authentication without ``insecure`` (checked before the store opens).
        StorageSettingsError: a warehouse root is on an object store whose settings (the AWS
            variables or profile) are missing or malformed; the message names the variable.
        Fatal: the store cannot be used (e.g. its schema is newer than this coordinator).
    """
    from percolake.lake import storage

    tls.check(options)  # the TLS files and the non-loopback rule, before anything starts
    storage.configure(timeout_s=options.object_store_timeout_s)
    storage.check_settings(config.warehouse_roots)  # fail at start, naming the variable
    if is_sqlite(options.store_url):
        if data_dir is None:
            raise ValueError("the SQLite store needs a data dir")
        Path(data_dir).mkdir(parents=True, exist_ok=True)

    # On PostgreSQL a frozen leader's open write transaction is ended after about one lease
    # (so it cannot hold up a takeover), and an acquisition waits at most half a lease.
    postgres_options = {} if is_sqlite(options.store_url) else {
        "idle_in_txn_timeout_s": options.lease_s,
        "lease_lock_timeout_s": min(1.0, options.lease_s / 2)}

    def open_() -> Store:
        return open_store(options.store_url, data_dir, **postgres_options)

    try:
        store: Store | None = open_()
    except StoreUnavailable as exc:  # the leadership loop keeps trying, NOT_SERVING meanwhile
        log.warning("store unreachable; retrying", extra={"error": redact(str(exc))})
        store = None
    except Exception as exc:
        raise Fatal(redact(str(exc))) from exc
    build = _core_builder(config)
    security = build_security(
        authenticate=options.authenticate, open_health=options.open_health,
        audit_log=options.audit_log, admin_token_file=options.admin_token_file, store=store,
        open_store=lambda: open_store(options.store_url, data_dir), redact=redact)
    running = RunningServer(options, redact, security)
    if store is not None and not store.supports_leases:
        running.start(FixedCore(build(store)))
    else:
        node_id = options.node_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
        running.start(Leadership(open_, build, node_id=node_id, advertise=running.advertise,
                                 lease_s=options.lease_s, on_serving=running.set_serving,
                                 store=store))
    _probe_object_stores(config.warehouse_roots)
    return running


def _probe_object_stores(roots: list[str]) -> None:
    """Looks, in the background, whether each object-store root's bucket answers, and logs a
    warning naming the problem if not (the daemon serves anyway: the store may come back)."""
    from percolake.lake import storage
    from percolake.lake.warehouse import is_object_store

    def probe() -> None:
        for root in roots:
            if not is_object_store(root):
                continue
            problem = storage.probe(root)
            if problem:
                log.warning("warehouse root not usable now", extra={"root": root,
                                                                    "problem": problem})
            else:
                log.info("warehouse root reachable", extra={"root": root})

    if any(is_object_store(r) for r in roots):
        threading.Thread(target=probe, name="store-probe", daemon=True).start()


def serve_forever(data_dir: str | Path | None, config: CoordinatorConfig,
                  options: ServerOptions, port_file: str | None = None) -> int:
    """Serves until SIGTERM or SIGINT, then shuts down gracefully."""
    # The handler only sets a flag that the main thread polls: the kernel may deliver the
    # signal to a gRPC thread, and Python runs handlers only when the main thread executes
    # bytecode, so a main thread blocked in Event.wait() could sleep through it (and a
    # handler calling Event.set() can deadlock on the Event's own lock).
    received: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    from percolake.lake.storage import StorageSettingsError

    redact = redactor(options.store_url)
    redact_logs(redact)
    log.info("opening the store", extra={"store": redact(options.store_url) or "sqlite",
                                         "data_dir": str(data_dir or "")})
    try:
        running = start_server(data_dir, config, options, redact)
    except StorageSettingsError as exc:
        log.error("cannot start: the object store's settings are incomplete",
                  extra={"error": str(exc)})
        print(f"percolake-coordinator: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    except TransportSettingsError as exc:
        log.error("cannot start: the transport settings are refused",
                  extra={"error": str(exc)})
        print(f"percolake-coordinator: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    except SecurityFileError as exc:  # --admin-token-file, --audit-log
        log.error("cannot start: a security file cannot be used", extra={"error": str(exc)})
        print(f"percolake-coordinator: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    except Fatal as exc:
        log.error("cannot start: the store cannot be used", extra={"error": str(exc)})
        print(f"percolake-coordinator: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    if port_file:
        tmp = f"{port_file}.tmp"
        Path(tmp).write_text(str(running.port))
        os.replace(tmp, port_file)
    leadership = running.leadership
    while not received and (leadership is None or leadership.fatal is None):
        time.sleep(0.05 if leadership is not None else 0.2)
    if received:
        log.info("shutting down", extra={"signal": signal.Signals(received[0]).name})
    running.stop()
    if leadership is not None and leadership.fatal is not None:
        message = redact(str(leadership.fatal))
        print(f"percolake-coordinator: cannot use the store: {message}", file=sys.stderr,
              flush=True)
        return 2
    return 0


def redactor(store_url: str) -> Callable[[str], str]:
    """A function that replaces the store URL's password, wherever it appears, with ***."""
    secrets: list[str] = []
    with contextlib.suppress(ValueError):
        parts = urllib.parse.urlsplit(store_url)
        if parts.password:
            secrets += [parts.password, urllib.parse.unquote(parts.password)]
        for value in urllib.parse.parse_qs(parts.query).get("password", []):
            secrets += [value, urllib.parse.quote(value, safe="")]
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return redact


class _RedactingFormatter(logging.Formatter):
    def __init__(self, inner: logging.Formatter, redact: Callable[[str], str]) -> None:
        super().__init__()
        self._inner = inner
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(self._inner.format(record))


def redact_logs(redact: Callable[[str], str]) -> None:
    """Every line the root logger's handlers write goes through ``redact``."""
    for handler in logging.getLogger().handlers:
        inner = handler.formatter or logging.Formatter()
        if not isinstance(inner, _RedactingFormatter):
            handler.setFormatter(_RedactingFormatter(inner, redact))
