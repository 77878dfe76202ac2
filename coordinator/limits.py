"""Server-wide limits (docs/limits.md): concurrent RPCs, request rate per principal, reply size.

Every refusal is RESOURCE_EXHAUSTED naming the ``serve`` flag that sets the limit and its value.
The request size is refused by gRPC itself (``grpc.max_receive_message_length``) before any
handler runs; the limits of the protocol (tables, files, intents, live transactions, timeouts,
table waits) live in the core (``coordinator.core.quotas``).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from coordinator.principal import current_principal
from coordinator.validation import MAX_TXN_TIMEOUT_MS
from percolake.leader import RETRY_METADATA

log = logging.getLogger("percolake.rpc")

HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # probes: never rate limited nor refused here
MAX_TXN_TIMEOUT_S = MAX_TXN_TIMEOUT_MS / 1000  # timeouts become waits and int64 replies
MAX_BUCKETS = 10_000
_FACTORIES = {  # (request_streaming, response_streaming) -> grpc's handler factory
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}  # principals whose rate is tracked at once (idle, full buckets are dropped)


class CountingExecutor(futures.ThreadPoolExecutor):
    """The RPC worker pool, counting the calls handed to it and not yet finished (running or
    queued): the number of calls in flight, exactly as gRPC counts them."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="rpc")
        self._count_lock = threading.Lock()
        self.in_flight = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        with self._count_lock:
            self.in_flight += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: futures.Future | None) -> None:
        with self._count_lock:
            self.in_flight -= 1


class RateLimiter:
    """A token bucket per principal: ``rate`` requests a second, bursts of ``burst``; a rate
    of 0 turns it off."""

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # principal -> (tokens, at)

    def allow(self, principal: str) -> bool:
        """Takes one token of ``principal``'s bucket; False when it is empty."""
        if self.rate <= 0:
            return True
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(principal, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[principal] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._drop_full(now)
            return allowed

    def _drop_full(self, now: float) -> None:
        """Forgets buckets that have refilled: forgetting them changes no decision."""
        full = [p for p, (tokens, at) in self._buckets.items()
                if tokens + (now - at) * self.rate >= self.burst]
        for principal in full:
            del self._buckets[principal]

    def refusal(self, principal: str) -> str:
        who = f"principal {principal!r}" if principal else "the anonymous principal"
        return (f"request rate of {who}: over the limit --rate-per-principal {self.rate:g} "
                f"requests/s (bursts of --rate-burst {self.burst}); slow down and retry")


class StreamSlots:
    """Streaming calls (health Watch, reflection) open at once. Each holds a worker thread for
    as long as its client keeps it open, so they are bounded well below the worker count."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.open = 0

    def take(self) -> bool:
        with self._lock:
            if self.open >= self.limit:
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.open -= 1


class LimitsInterceptor(grpc.ServerInterceptor):
    """Refuses calls beyond --max-concurrent-rpcs (without reading their request), streams
    beyond --max-streams, calls over the caller's request rate, and replies larger than
    --max-message-bytes.

    Must come after the authentication interceptor in the server's list: the rate is counted
    per principal, which that interceptor sets for the call.
    """

    def __init__(self, executor: CountingExecutor, max_concurrent_rpcs: int,
                 max_message_bytes: int, rate: RateLimiter, max_streams: int = 4) -> None:
        self.executor = executor
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.max_message_bytes = max_message_bytes
        self.rate = rate
        # method -> (the servicer's handler, its limited handler): built once per method, as
        # the servicer's handler never changes (a call over the limit gets its own refusal)
        self._limited_handlers: dict[str, tuple[Any, Any]] = {}
        self.streams = StreamSlots(max_streams)

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method == HEALTH_CHECK:
            return handler
        # Runs in gRPC's polling thread just before the call is handed to the pool, so
        # in_flight is exact here.
        if self.executor.in_flight >= self.max_concurrent_rpcs:
            return self._refusing(handler, (
                f"{self.executor.in_flight} requests in flight: over the limit "
                f"--max-concurrent-rpcs {self.max_concurrent_rpcs}; retry with backoff"))
        if handler.request_streaming or handler.response_streaming:
            return self._bounded_stream(handler)
        built = self._limited_handlers.get(method)
        if built is not None and built[0] is handler:
            return built[1]
        limited = grpc.unary_unary_rpc_method_handler(
            self._limited(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
        self._limited_handlers[method] = (handler, limited)
        return limited

    def _limited(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            principal = current_principal()
            if not self.rate.allow(principal):
                refuse(context, self.rate.refusal(principal), shed=True)
            reply = behavior(request, context)
            size = reply.ByteSize() if hasattr(reply, "ByteSize") else 0
            if size > self.max_message_bytes:
                refuse(context, (
                    f"the reply is {size} bytes: over the limit --max-message-bytes "
                    f"{self.max_message_bytes}; ask for less (without include_writes, a "
                    "smaller page_size)"))
            return reply

        return handle

    def _bounded_stream(self, handler: Any) -> Any:
        """A streaming handler whose call holds one of the --max-streams slots while open."""
        if not handler.response_streaming:
            def handle(requests: Any, context: grpc.ServicerContext) -> Any:
                self._take_stream_slot(context)
                try:
                    return handler.stream_unary(requests, context)
                finally:
                    self.streams.give_back()
        else:
            behavior = handler.unary_stream or handler.stream_stream

            def handle(request: Any, context: grpc.ServicerContext) -> Any:
                return self._stream(behavior, request, context)

        factory = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
        return factory(handle, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)

    def _stream(self, behavior: Callable[..., Any], request: Any,
                context: grpc.ServicerContext) -> Iterator[Any]:
        # The slot is taken once gRPC starts iterating and given back when the generator ends
        # or is closed (a cancelled call's is dropped): never taken, never leaked.
        self._take_stream_slot(context)
        try:
            yield from behavior(request, context)
        finally:
            self.streams.give_back()

    def _take_stream_slot(self, context: grpc.ServicerContext) -> None:
        if not self.streams.take():
            refuse(context, shed=True, message=(
                f"{self.streams.open} streaming calls (health Watch, reflection) open: over "
                f"the limit --max-streams {self.streams.limit}; close one or retry"))

    @staticmethod
    def _refusing(handler: Any, message: str) -> Any:
        """A handler that answers at once; declared request-streaming so that gRPC does not
        read the request message first (the wire is the same for the client)."""

        def answer(_requests: Any, context: grpc.ServicerContext) -> Any:
            refuse(context, message, shed=True)

        factory = (grpc.stream_stream_rpc_method_handler if handler.response_streaming
                   else grpc.stream_unary_rpc_method_handler)
        return factory(answer, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)


def refuse(context: grpc.ServicerContext, message: str, shed: bool = False) -> None:
    """Answers RESOURCE_EXHAUSTED (``shed``: load shed, marked so that clients retry), logged
    once with its reason."""
    log.info("refused", extra={"error": "ResourceExhausted", "detail": message,
                               "peer": context.peer()})
    if shed:
        context.set_trailing_metadata(RETRY_METADATA)
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


# ------------------------------------------------------------------ serve flags

def _at_least(kind: type, least: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value >= least:  # also NaN
            raise argparse.ArgumentTypeError(f"must be >= {least:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of every limit (docs/limits.md)."""
    group = serve.add_argument_group(
        "limits", "each refusal is RESOURCE_EXHAUSTED naming the flag and its value; "
        "with authentication off every caller is one (anonymous) principal")
    group.add_argument("--max-concurrent-rpcs", type=_at_least(int, 1), default=256,
                       metavar="N", help="calls in flight (running or queued for a worker) at "
                       "once; more are refused without reading their request (health checks "
                       "are let through up to twice this)")
    group.add_argument("--max-streams", type=_at_least(int, 1), default=4, metavar="N",
                       help="streaming calls (health Watch, server reflection) open at once; "
                       "each holds a worker thread while open")
    group.add_argument("--rate-per-principal", type=_at_least(float, 0), default=2000.0,
                       metavar="PER_SECOND", help="requests a second each principal may send "
                       "(token bucket); 0 turns the rate limit off")
    group.add_argument("--rate-burst", type=_at_least(int, 1), default=4000, metavar="N",
                       help="requests a principal may send at once above its rate")
    group.add_argument("--max-live-txns-per-pipeline", type=_at_least(int, 1), default=64,
                       metavar="N", help="OPEN or PREWRITTEN transactions of one pipeline")
    group.add_argument("--max-live-txns-per-principal", type=_at_least(int, 1), default=1024,
                       metavar="N", help="OPEN or PREWRITTEN transactions opened by one "
                       "principal, across pipelines")
    group.add_argument("--max-live-leases-per-principal", type=_at_least(int, 1),
                       default=1000, metavar="N", help="live snapshot leases (GetSnapshot "
                       "with lease_ms) taken by one principal; each is a store row kept up "
                       "to 30 days")
    group.add_argument("--max-tables-per-txn", type=_at_least(int, 1), default=1000,
                       metavar="N", help="tables one transaction may declare or write; a "
                       "request naming more is refused before any per-table work")
    group.add_argument("--max-files-per-txn", type=_at_least(int, 1), default=100_000,
                       metavar="N", help="data files listed by one transaction's write intents")
    group.add_argument("--max-txn-intent-bytes", type=_at_least(int, 1),
                       default=32 * 1024 * 1024, metavar="BYTES",
                       help="total size of one transaction's write intents (each table's is "
                       "also at most --max-intent-bytes); keep it below --max-message-bytes "
                       "so GetTransaction with include_writes fits in a reply")
    group.add_argument("--max-txn-timeout", type=_at_least(float, 0.001), default=3600.0,
                       metavar="SECONDS", help="longest timeout_ms a client may ask for at "
                       f"Open (at most {MAX_TXN_TIMEOUT_S:g})")
    group.add_argument("--max-table-waiters", type=_at_least(int, 1), default=8, metavar="N",
                       help="requests waiting for a table held by another transaction at once; "
                       "must be below --max-workers so waiters never occupy every worker")


def settings_error(args: argparse.Namespace) -> str | None:
    """Why the limit flags cannot be used together, or None."""
    if args.max_txn_timeout > MAX_TXN_TIMEOUT_S:
        return f"--max-txn-timeout must be at most {MAX_TXN_TIMEOUT_S:g} s"
    if args.txn_timeout > args.max_txn_timeout:
        return (f"--txn-timeout {args.txn_timeout:g} is above --max-txn-timeout "
                f"{args.max_txn_timeout:g}")
    if args.max_table_waiters + args.max_streams >= args.max_workers:
        return (f"--max-table-waiters {args.max_table_waiters} plus --max-streams "
                f"{args.max_streams} must be below --max-workers {args.max_workers}: they "
                "would occupy every worker")
    return None


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The CoordinatorConfig fields the limit flags set."""
    return {"max_tables_per_txn": args.max_tables_per_txn,
            "max_files_per_txn": args.max_files_per_txn,
            "max_txn_intent_bytes": args.max_txn_intent_bytes,
            "max_txn_timeout_s": args.max_txn_timeout,
            "max_live_txns_per_pipeline": args.max_live_txns_per_pipeline,
            "max_live_txns_per_principal": args.max_live_txns_per_principal,
            "max_table_waiters": args.max_table_waiters,
            "max_live_leases_per_principal": args.max_live_leases_per_principal}


def option_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields the limit flags set."""
    return {"max_concurrent_rpcs": args.max_concurrent_rpcs, "max_streams": args.max_streams,
            "rate_per_principal": args.rate_per_principal, "rate_burst": args.rate_burst}
