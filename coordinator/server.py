"""Server set-up in one place: the servicer, health, reflection, limits, graceful shutdown.

TLS, mutual TLS and bearer-token interceptors slot in here without touching the core.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.servicer import CoordinatorServicer
from coordinator.status_codes import status_for
from coordinator.store import SqliteStore
from percolake.errors import InvalidArgument
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc

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
    the method; grpcio itself would answer INTERNAL. Covers every service of the server."""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
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


class RunningServer:
    """A started gRPC server with its core and store; ``stop`` shuts all three down in order."""

    def __init__(self, core: TransactionCoordinator, options: ServerOptions) -> None:
        self.core = core
        self.options = options
        self.health = health.HealthServicer()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.max_workers,
                                       thread_name_prefix="rpc"),
            interceptors=[MalformedRequestInterceptor()],
            options=[
                ("grpc.max_receive_message_length", options.max_message_bytes),
                ("grpc.max_send_message_length", options.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(core), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        self.port = self.server.add_insecure_port(f"{options.host}:{options.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {options.host}:{options.port}")

    def start(self) -> None:
        self.server.start()
        self.core.start_background()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"host": self.options.host, "port": self.port})

    def stop(self) -> None:
        """Stops taking RPCs, lets in-flight ones finish, then closes the core and the store."""
        self.health.enter_graceful_shutdown()
        self.server.stop(self.options.shutdown_grace_s).wait()
        self.core.close()
        self.core.store.close()
        log.info("stopped")


def start_server(data_dir: str | Path, config: CoordinatorConfig,
                 options: ServerOptions) -> RunningServer:
    """Opens the store in ``data_dir`` (created if missing) and starts serving.

    Raises:
        StorageSettingsError: a warehouse root is on an object store whose settings (the AWS
            variables or profile) are missing or malformed; the message names the variable.
    """
    from percolake.lake import storage
    from percolake.lake.delta_commit import (  # deltalake loads only to serve
        apply_table_write,
        is_commit_of,
    )
    from percolake.lake.write_check import WriteChecker

    storage.configure(timeout_s=options.object_store_timeout_s)
    storage.check_settings(config.warehouse_roots)  # fail at start, naming the variable
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    store = SqliteStore(data_dir, group_commit=True)  # the servicer flushes before replies
    applier = functools.partial(apply_table_write, roots=config.warehouse_roots)
    checker = WriteChecker(roots=config.warehouse_roots)
    core = TransactionCoordinator(store, config, applier=applier,
                                  applied_check=is_commit_of, write_check=checker.check)
    running = RunningServer(core, options)
    running.start()
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


def serve_forever(data_dir: str | Path, config: CoordinatorConfig, options: ServerOptions,
                  port_file: str | None = None) -> int:
    """Serves until SIGTERM or SIGINT, then shuts down gracefully."""
    # The handler only sets a flag that the main thread polls: the kernel may deliver the
    # signal to a gRPC thread, and Python runs handlers only when the main thread executes
    # bytecode, so a main thread blocked in Event.wait() could sleep through it (and a
    # handler calling Event.set() can deadlock on the Event's own lock).
    received: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    from percolake.lake.storage import StorageSettingsError

    try:
        running = start_server(data_dir, config, options)
    except StorageSettingsError as exc:
        log.error("cannot start: the object store's settings are incomplete",
                  extra={"error": str(exc)})
        print(f"percolake-coordinator: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    if port_file:
        tmp = f"{port_file}.tmp"
        Path(tmp).write_text(str(running.port))
        os.replace(tmp, port_file)
    while not received:
        time.sleep(0.2)
    log.info("shutting down", extra={"signal": signal.Signals(received[0]).name})
    running.stop()
    return 0
