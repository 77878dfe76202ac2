"""Prometheus metrics of the daemon (docs/metrics.md), served on ``serve --metrics-port``.

Counters and histograms are updated on the request path by small hooks (prometheus-client's
own locks only); what describes the in-memory view (transactions by state, oldest ages, the
seconds since each pipeline's last commit) is computed when scraped, from the core serving
at that moment (none on a standby), under the core's lock for one pass over its view.
Labels are bounded: method names, status codes, states, error class names, abort
categories, and pipeline ids (one series each) — never a transaction id.

The HTTP endpoint that serves them is ``coordinator/metrics_endpoint.py``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from percolake.records import TxnRecord
from percolake.states import COMMITTED_STATES, LIVE_STATES, TxnState

REGISTRY = CollectorRegistry(auto_describe=True)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0)

RPCS = Counter("percolake_rpcs", "gRPC calls answered, by method and status code",
               ["method", "code"], registry=REGISTRY)
RPC_SECONDS = Histogram("percolake_rpc_duration_seconds", "Time to answer a gRPC call",
                        ["method"], buckets=_LATENCY_BUCKETS, registry=REGISTRY)
REFUSED = Counter("percolake_refused_requests",
                  "Requests the core refused (fenced, conflicts, limits, bad input...), by "
                  "the error class", ["reason"], registry=REGISTRY)
TRANSITIONS = Counter("percolake_transaction_transitions",
                      "Transactions entering a state", ["state"], registry=REGISTRY)
ABORTS = Counter("percolake_aborts", "Transactions aborted, by reason category",
                 ["reason"], registry=REGISTRY)
COMMIT_SECONDS = Histogram("percolake_commit_latency_seconds",
                           "Time from a transaction's open to its commit point",
                           buckets=_LATENCY_BUCKETS, registry=REGISTRY)
ROLL_FORWARDS = Counter("percolake_roll_forwards",
                        "Roll-forwards of a committed transaction on one table, by outcome "
                        "(ok, or the error class)", ["outcome"], registry=REGISTRY)
FLUSH_SECONDS = Histogram("percolake_store_flush_duration_seconds",
                          "Time a reply waited for the store to make its state durable "
                          "(group commit and fsync included)",
                          buckets=_LATENCY_BUCKETS, registry=REGISTRY)
TABLE_WAITS = Histogram("percolake_table_hold_wait_seconds",
                        "Time a request waited for another transaction's table hold",
                        buckets=_LATENCY_BUCKETS, registry=REGISTRY)

# abort_reason prefixes written by the core -> bounded category
_ABORT_CATEGORIES = (("expired", "timeout"), ("superseded", "superseded"),
                     ("fenced", "fenced"), ("pipeline reset", "reset"))


def abort_category(reason: str) -> str:
    for prefix, category in _ABORT_CATEGORIES:
        if reason.startswith(prefix):
            return category
    return "requested"  # Abort RPC: the client's own reason, free text


def transition(previous: TxnState | None, txn: TxnRecord) -> None:
    """Called by the core when ``txn`` (just made durable) leaves ``previous``."""
    TRANSITIONS.labels(txn.state.value).inc()
    if txn.state == TxnState.ABORTED:
        ABORTS.labels(abort_category(txn.abort_reason)).inc()
    elif (txn.state in COMMITTED_STATES and previous in LIVE_STATES  # the commit point
          and txn.created_ms and txn.updated_ms):
        COMMIT_SECONDS.observe(max(0.0, (txn.updated_ms - txn.created_ms) / 1000))


def refused(error: Exception) -> None:
    REFUSED.labels(type(error).__name__).inc()


def counted_roll_forward(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def counted(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception as exc:
            ROLL_FORWARDS.labels(type(exc).__name__).inc()
            raise
        ROLL_FORWARDS.labels("ok").inc()

    return counted


class RpcMetricsInterceptor(grpc.ServerInterceptor):
    """Outermost interceptor: counts every answered unary call by method and status code,
    including refusals made before the servicer (authentication, limits, malformed bytes)."""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streams (health Watch, reflection) are not counted
        method = handler_call_details.method.rsplit("/", 1)[-1]
        behavior = handler.unary_unary

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                return behavior(request, context)
            finally:
                code = context.code() or grpc.StatusCode.OK
                RPCS.labels(method, code.name).inc()
                RPC_SECONDS.labels(method).observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


class CoreCollector(Collector):
    """Gauges of the serving core's in-memory view, computed at scrape time."""

    def __init__(self, current_core: Callable[[], Any]) -> None:
        self.current_core = current_core

    def collect(self) -> Iterator[Metric]:
        core = self.current_core()
        leader = GaugeMetricFamily("percolake_leader",
                                   "1 while this process serves (leads), else 0")
        leader.add_metric([], 0 if core is None else 1)
        yield leader
        if core is not None:
            yield from _view_metrics(*core.metrics_view())
            quarantined = GaugeMetricFamily(
                "percolake_quarantined_tables",
                "Tables quarantined because a committed row-level write cannot be applied as "
                "it read them (docs/row-level-writes.md): each needs an operator's choice")
            quarantined.add_metric([], core.quarantined_count())
            yield quarantined
            yield from _topology_metrics(core)


def _view_metrics(unfinished: list[tuple[TxnState, int]],
                  last_commits: list[tuple[str, int]]) -> Iterator[Metric]:
    now_ms = time.time() * 1000
    by_state = GaugeMetricFamily("percolake_transactions",
                                 "Unfinished transactions by state", labels=["state"])
    counts = {TxnState.OPEN: 0, TxnState.PREWRITTEN: 0, TxnState.COMMITTED: 0}
    oldest: dict[str, int | None] = {"live": None, "committed": None}
    for state, created_ms in unfinished:
        counts[state] = counts.get(state, 0) + 1
        kind = "live" if state in LIVE_STATES else "committed"
        if oldest[kind] is None or created_ms < oldest[kind]:  # type: ignore[operator]
            oldest[kind] = created_ms
    for state, count in counts.items():
        by_state.add_metric([state.value], count)
    yield by_state
    for kind, help_text in (
            ("live", "Age (since open) of the oldest live (OPEN or PREWRITTEN) transaction; "
                     "0 when there is none"),
            ("committed", "Age (since open) of the oldest committed but not yet applied "
                          "transaction; 0 when there is none")):
        gauge = GaugeMetricFamily(f"percolake_oldest_{kind}_transaction_age_seconds",
                                  help_text)
        created = oldest[kind]
        gauge.add_metric([], 0.0 if created is None else max(0.0, (now_ms - created) / 1000))
        yield gauge
    since = GaugeMetricFamily("percolake_pipeline_seconds_since_last_commit",
                              "Seconds since the pipeline's last committed batch",
                              labels=["pipeline"])
    for pipeline_id, last_ms in last_commits:
        since.add_metric([pipeline_id], max(0.0, (now_ms - last_ms) / 1000))
    yield since


def _topology_metrics(core: Any) -> Iterator[Metric]:
    """The delays of docs/topology.md, from one GetTopology view of the serving core (its
    store reads run outside the core's lock); none if the store cannot answer now."""
    try:
        view = core.get_topology()
    except Exception:  # a scrape never fails for it; the RPCs report the store's trouble
        logging.getLogger("percolake.coordinator").warning("topology metrics skipped",
                                                           exc_info=True)
        return
    table_delay = GaugeMetricFamily(
        "percolake_table_delay_seconds",
        "Seconds since the wall time of the table's last completed global barrier",
        labels=["table"])
    for table in view.tables:
        if table.delay_ms is not None:
            table_delay.add_metric([table.table], table.delay_ms / 1000)
    yield table_delay
    own = GaugeMetricFamily(
        "percolake_pipeline_own_delay_seconds",
        "The pipeline's own share of its tables' delay (its tables' minus its sources')",
        labels=["pipeline"])
    end_to_end = GaugeMetricFamily(
        "percolake_pipeline_end_to_end_delay_seconds",
        "The largest delay of the pipeline's tables, from the roots", labels=["pipeline"])
    for pipeline in view.pipelines:
        if pipeline.own_delay_ms is not None:
            own.add_metric([pipeline.pipeline_id], pipeline.own_delay_ms / 1000)
        if pipeline.end_to_end_delay_ms is not None:
            end_to_end.add_metric([pipeline.pipeline_id], pipeline.end_to_end_delay_ms / 1000)
    yield own
    yield end_to_end
