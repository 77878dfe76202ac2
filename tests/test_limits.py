"""Limits (docs/limits.md): each one hit and refused with RESOURCE_EXHAUSTED naming its serve
flag and value; large requests refused before per-table work; waiting for a held table never
starves unrelated calls. Protocol limits run on the core with the in-memory store, server limits
against real daemons."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.limits import CountingExecutor, LimitsInterceptor, RateLimiter
from coordinator.principal import acting_as
from coordinator.store import MemoryStore
from percolake.errors import Conflict, ResourceExhausted
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import expect_status, table_write, unique

RE = grpc.StatusCode.RESOURCE_EXHAUSTED
SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'
HUGE = 100_000


# ------------------------------------------------------------------ the core, in memory

def make_core(tmp_path, conflict_wait_s: float = 5, **limits) -> TransactionCoordinator:
    # pipelines of their own wait for one table here: --shared-table-writers
    config = CoordinatorConfig([str(tmp_path)], txn_timeout_s=60,
                               conflict_wait_s=conflict_wait_s, shared_table_writers=True,
                               **limits)
    return TransactionCoordinator(MemoryStore(), config, applier=lambda *a, **k: 0,
                                  remove_files=lambda _path: None)


def uri(tmp_path, name: str) -> str:
    return f"file://{tmp_path}/{name}"


def write(txn_id: str, table: str, files: int = 1, pad: int = 0) -> TableWriteRecord:
    stats = json.dumps({"numRecords": 1, "pad": "x" * pad}) if pad else '{"numRecords":1}'
    return TableWriteRecord(table, WriteMode.APPEND, tuple(
        AddFileRecord(f"_percolake/{txn_id}/part-{i}.parquet", 100, {}, 0, stats)
        for i in range(files)), SCHEMA)


class CountingResolver:
    """Stands in for the core's table-name resolution and counts the names it resolved."""

    def __init__(self, core: TransactionCoordinator) -> None:
        self.calls = 0
        self._inner = core._canonical

    def __call__(self, name: str) -> str:
        self.calls += 1
        return self._inner(name)


def test_a_huge_table_list_is_refused_before_any_table_is_resolved(tmp_path):
    core = make_core(tmp_path)
    resolver = core._canonical = CountingResolver(core)
    names = [uri(tmp_path, f"t{i}") for i in range(HUGE)]
    txn, _ = core.open_transaction("p", 0)
    calls = {
        "open": lambda: core.open_transaction("p", 1, tables=names),
        "declare": lambda: core.declare_tables(txn.txn_id, None, names),
        "commit tables": lambda: core.commit(txn.txn_id, None, names),
        "prewrite": lambda: core.prewrite(txn.txn_id, None, [write(txn.txn_id, names[0])] * HUGE),
        "commit writes": lambda: core.commit(txn.txn_id, None, (),
                                             [write(txn.txn_id, names[0])] * HUGE),
    }
    for what, call in calls.items():
        with pytest.raises(ResourceExhausted, match=r"--max-tables-per-txn 1000") as refused:
            call()
        assert str(HUGE) in str(refused.value), what
        assert resolver.calls == 0, f"{what} resolved {resolver.calls} names before refusing"


def test_duplicate_table_names_are_dropped_in_linear_time(tmp_path):
    core = make_core(tmp_path, max_tables_per_txn=2 * HUGE)
    core._canonical = lambda name: name  # the dedup alone, not the file system
    names = [f"file:///t{i}" for i in range(HUGE)]
    started = time.process_time()
    resolved = core._resolve_tables(names + names[::-1], 2 * HUGE)
    assert resolved == names  # each once, in request order
    # A quadratic scan of 10^5 names takes minutes; the linear one well under a second.
    assert time.process_time() - started < 10


def test_tables_per_transaction_count_every_declare_and_prewrite(tmp_path):
    core = make_core(tmp_path, max_tables_per_txn=3)
    a, b, c, d = (uri(tmp_path, n) for n in "abcd")
    txn, _ = core.open_transaction("p", 0, tables=[a, b])
    with pytest.raises(ResourceExhausted, match="would hold 4 tables.*--max-tables-per-txn 3"):
        core.declare_tables(txn.txn_id, None, [c, d])
    with pytest.raises(ResourceExhausted, match="--max-tables-per-txn 3"):
        core.declare_tables(txn.txn_id, None, [a, b, c, d])  # a request over it, at once
    core.declare_tables(txn.txn_id, None, [a, b, c])  # re-declaring counts each table once
    with pytest.raises(ResourceExhausted, match="would hold 4 tables"):
        core.prewrite(txn.txn_id, None, [write(txn.txn_id, d)])
    assert sorted(core.get_transaction(txn.txn_id).tables) == [a, b, c]


def test_files_per_transaction_add_up_over_its_tables(tmp_path):
    core = make_core(tmp_path, max_files_per_txn=3)
    a, b = uri(tmp_path, "a"), uri(tmp_path, "b")
    txn, _ = core.open_transaction("p", 0)
    core.prewrite(txn.txn_id, None, [write(txn.txn_id, a, files=2)])
    with pytest.raises(ResourceExhausted, match="would list 4 files.*--max-files-per-txn 3"):
        core.prewrite(txn.txn_id, None, [write(txn.txn_id, b, files=2)])
    with pytest.raises(ResourceExhausted, match="4 files in one request.*--max-files-per-txn"):
        core.commit(txn.txn_id, None, (), [write(txn.txn_id, b, files=4)])
    assert b not in core.get_transaction(txn.txn_id).tables


def test_write_intents_of_a_transaction_are_bounded_in_total(tmp_path):
    one = len(write("0" * 32, uri(tmp_path, "a"), pad=5000).json_text)
    core = make_core(tmp_path, max_txn_intent_bytes=one * 3 // 2)
    a, b = uri(tmp_path, "a"), uri(tmp_path, "b")
    txn, _ = core.open_transaction("p", 0, tables=[a, b])
    core.prewrite(txn.txn_id, None, [write(txn.txn_id, a, pad=5000)])
    for call in (core.prewrite, lambda *args: core.commit(txn.txn_id, None, [a, b], args[2])):
        with pytest.raises(ResourceExhausted,
                           match=f"--max-txn-intent-bytes {one * 3 // 2}.*never truncated"):
            call(txn.txn_id, None, [write(txn.txn_id, b, pad=5000)])
    recorded = core.get_transaction(txn.txn_id)
    assert recorded.tables[b].write is None and recorded.state == TxnState.PREWRITTEN


def test_a_client_timeout_above_the_longest_allowed_is_refused(tmp_path):
    core = make_core(tmp_path, max_txn_timeout_s=10)
    for timeout_ms in (10_001, 2**62):
        with pytest.raises(ResourceExhausted, match=r"timeout_ms .*--max-txn-timeout 10 s"):
            core.open_transaction(unique("p"), 0, timeout_ms=timeout_ms)
    txn, _ = core.open_transaction(unique("p"), 0, timeout_ms=10_000)
    assert core.heartbeat(txn.txn_id, None) == (TxnState.OPEN, 10_000)


def test_live_transactions_of_a_pipeline_are_bounded(tmp_path):
    core = make_core(tmp_path, max_live_txns_per_pipeline=3)
    txns = [core.open_transaction("p", batch)[0] for batch in range(3)]
    with pytest.raises(ResourceExhausted, match="pipeline 'p' has 3 live transactions.*"
                                                "--max-live-txns-per-pipeline 3"):
        core.open_transaction("p", 3)
    core.open_transaction("p", 2)  # a new attempt replaces the live one: still 3
    core.open_transaction("other", 0)  # other pipelines are not affected
    core.abort(txns[0].txn_id, None)
    core.open_transaction("p", 3)
    core.commit(core.open_transaction("p", 3)[0].txn_id, None)  # empty: APPLIED at once
    core.open_transaction("p", 4)


def test_live_transactions_of_a_principal_are_bounded(tmp_path):
    core = make_core(tmp_path, max_live_txns_per_principal=2)
    with acting_as("alice"):
        core.open_transaction("a1", 0)
        core.open_transaction("a2", 0)
        with pytest.raises(ResourceExhausted, match="principal 'alice' has 2 live.*"
                                                    "--max-live-txns-per-principal 2"):
            core.open_transaction("a3", 0)
    with acting_as("bob"):
        core.open_transaction("a3", 0)
    core.open_transaction("x1", 0)  # without authentication: the one anonymous principal
    core.open_transaction("x2", 0)
    with pytest.raises(ResourceExhausted, match="the anonymous principal has 2 live"):
        core.open_transaction("x3", 0)
    restarted = TransactionCoordinator(core.store, core.config)  # counts come from the records
    with acting_as("alice"), pytest.raises(ResourceExhausted, match="'alice' has 2 live"):
        restarted.open_transaction("a4", 0)


def test_requests_waiting_for_tables_are_bounded(tmp_path):
    core = make_core(tmp_path, conflict_wait_s=3, max_table_waiters=2)
    held = uri(tmp_path, "held")
    holder, _ = core.open_transaction("holder", 0, tables=[held])
    waiters = [core.open_transaction(f"w{i}", 0)[0] for i in range(3)]
    results: dict[int, BaseException | None] = {}

    def wait(i: int) -> None:
        try:
            core.declare_tables(waiters[i].txn_id, None, [held])
            results[i] = None
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while core._table_waits.in_use < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert core._table_waits.in_use == 2
    with pytest.raises(ResourceExhausted, match=r"too many requests waiting for tables "
                                                r"\(limit 2, --max-table-waiters\)"):
        core.declare_tables(waiters[2].txn_id, None, [held])
    core.abort(holder.txn_id, None)
    for thread in threads:
        thread.join(10)
    # one waiter got the table; the other waited on it, then gave up naming it
    assert sorted(type(r).__name__ for r in results.values()) == ["Conflict", "NoneType"]
    assert all(r is None or isinstance(r, Conflict) for r in results.values())
    assert core._table_waits.in_use == 0


def test_rate_limiter_refills_at_its_rate():
    now = [0.0]
    limiter = RateLimiter(rate=2, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # each principal has its own bucket
    now[0] += 0.5
    assert limiter.allow("a") and not limiter.allow("a")
    assert "--rate-per-principal 2 requests/s" in limiter.refusal("a")
    assert RateLimiter(rate=0, burst=1).allow("a")  # 0: off


# ------------------------------------------------------------------ real daemons

@pytest.fixture(scope="module")
def waiting(daemon_factory) -> Iterator:
    """Default workers (32) and table waiters (8), small messages, a short conflict wait."""
    daemon = daemon_factory.start(["--max-message-bytes", str(1024 * 1024),
                                   "--max-txn-intent-bytes", str(4 * 1024 * 1024),
                                   "--conflict-wait", "8", "--max-txn-timeout", "600",
                                   "--roll-forward-after", "3600",
                                   "--shared-table-writers"], name="limits")
    yield daemon
    daemon.stop()


def open_txn(stub, pipeline: str, tables: list[str] = (), **fields) -> pb.Transaction:
    return stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, tables=tables, **fields), timeout=30).transaction


def test_waiters_on_a_held_table_leave_workers_for_other_calls(waiting):
    """40 requests for one held table used to occupy all 32 workers (a Heartbeat waited
    9.5 s): 8 wait, the others are refused at once, and other calls are answered promptly."""
    stub = waiting.stub
    held = str(waiting.warehouse / unique("held"))
    holder = open_txn(stub, unique("holder"), [held])
    contenders = [open_txn(stub, unique("contender")) for _ in range(40)]
    with futures.ThreadPoolExecutor(40) as pool:
        calls = [pool.submit(stub.DeclareTables, pb.DeclareTablesRequest(
            txn_id=t.txn_id, tables=[held]), timeout=30) for t in contenders]
        refused = []
        deadline = time.monotonic() + 5  # the waiters wait 8 s (--conflict-wait)
        while len(refused) < 32 and time.monotonic() < deadline:
            refused = [c for c in calls if c.done()]
            time.sleep(0.02)
        started = time.monotonic()
        beat = stub.Heartbeat(pb.HeartbeatRequest(txn_id=holder.txn_id), timeout=30)
        stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=holder.pipeline_id), timeout=30)
        answered_in = time.monotonic() - started
        waiters_left = sum(not c.done() for c in calls)
        errors = [c.exception() for c in calls]
    assert beat.state == pb.OPEN
    assert answered_in < 3.0, f"Heartbeat + GetPipeline took {answered_in:.1f} s"
    assert waiters_left == 8, f"{waiters_left} requests were still waiting, expected 8"
    codes = sorted(e.code().name for e in errors if e is not None)
    assert codes == ["ABORTED"] * 8 + ["RESOURCE_EXHAUSTED"] * 32, codes
    details = {e.details() for e in errors if e.code() == RE}
    assert details and all("too many requests waiting for tables (limit 8" in d
                           for d in details), details


def test_open_streams_are_bounded_and_leave_workers_for_other_calls(waiting):
    """Each health Watch holds a worker while open: 40 of them used to leave no worker for
    any other call. Beyond --max-streams (4) they are refused; slots come back on close."""
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(waiting.target))
    streams = [health.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(40)]
    outcomes = []
    for stream in streams:
        try:
            outcomes.append(health_pb2.HealthCheckResponse.ServingStatus.Name(next(stream).status))
        except grpc.RpcError as exc:
            assert exc.code() == RE and "--max-streams 4" in exc.details(), exc
            outcomes.append(exc.code().name)
    assert sorted(outcomes) == ["RESOURCE_EXHAUSTED"] * 36 + ["SERVING"] * 4
    expect_status(waiting.stub.GetPipeline, pb.GetPipelineRequest(pipeline_id="none"),
                  grpc.StatusCode.NOT_FOUND, timeout=2)
    for stream in streams:
        stream.cancel()
    deadline = time.monotonic() + 10
    while True:  # the cancelled streams' slots come back
        try:
            fresh = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
            assert next(fresh).status == health_pb2.HealthCheckResponse.SERVING
            fresh.cancel()
            break
        except grpc.RpcError as exc:
            assert exc.code() == RE and time.monotonic() < deadline, exc
            time.sleep(0.1)


def test_too_many_tables_in_a_transaction_over_the_wire(waiting):
    stub = waiting.stub
    txn = open_txn(stub, unique("tables"))
    tables = [str(waiting.warehouse / f"t{i}") for i in range(1001)]
    for call, request in [
        (stub.OpenTransaction, pb.OpenTransactionRequest(pipeline_id=unique("t"),
                                                         tables=tables)),
        (stub.DeclareTables, pb.DeclareTablesRequest(txn_id=txn.txn_id, tables=tables)),
        (stub.CommitTransaction, pb.CommitTransactionRequest(txn_id=txn.txn_id, tables=tables)),
        (stub.Prewrite, pb.PrewriteRequest(txn_id=txn.txn_id, writes=[
            pb.TableWrite(table=t) for t in tables])),
    ]:
        expect_status(call, request, RE, "1001", "--max-tables-per-txn 1000")


def test_client_timeout_over_the_longest_allowed_over_the_wire(waiting):
    expect_status(waiting.stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=unique("timeout"), timeout_ms=2**62), RE, "--max-txn-timeout 600 s")
    txn = open_txn(waiting.stub, unique("timeout"), timeout_ms=600_000)
    beat = waiting.stub.Heartbeat(pb.HeartbeatRequest(txn_id=txn.txn_id), timeout=30)
    assert beat.expires_in_ms == 600_000


def test_live_transactions_per_pipeline_over_the_wire(waiting):
    pipeline = unique("live")
    for batch in range(64):
        waiting.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=batch), timeout=30)
    expect_status(waiting.stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=64), RE, "64 live", "--max-live-txns-per-pipeline 64")


def padded_write(table: str, txn_id: str, pad: int) -> pb.TableWrite:
    """A valid write intent of one (existing) file whose stats carry ``pad`` extra bytes."""
    write_ = table_write(table, txn_id)
    write_.add_files[0].stats = json.dumps({"numRecords": 1, "pad": "x" * pad})
    return write_


def test_messages_over_the_size_limit_are_refused_both_ways(waiting):
    stub = waiting.stub
    a, b = (str(waiting.warehouse / unique(n)) for n in "ab")
    txn = open_txn(stub, unique("size"), [a, b])
    expect_status(stub.Prewrite, pb.PrewriteRequest(txn_id=txn.txn_id, writes=[
        padded_write(a, txn.txn_id, 2 * 1024 * 1024)]), RE, "larger than max",
        str(1024 * 1024))
    # two intents of 0.7 MB each fit their requests; the reply carrying both does not
    for table in (a, b):
        stub.Prewrite(pb.PrewriteRequest(txn_id=txn.txn_id, writes=[
            padded_write(table, txn.txn_id, 700_000)]), timeout=30)
    expect_status(stub.GetTransaction, pb.GetTransactionRequest(
        txn_id=txn.txn_id, include_writes=True), RE, "--max-message-bytes 1048576")
    assert stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id),
                               timeout=30).state == pb.PREWRITTEN


@pytest.fixture(scope="module")
def tight(daemon_factory) -> Iterator:
    """At most 3 calls in flight, 3 of them may wait for tables; default message size."""
    daemon = daemon_factory.start(["--max-concurrent-rpcs", "3", "--max-table-waiters", "3",
                                   "--conflict-wait", "3", "--shared-table-writers"],
                                  name="tight")
    yield daemon
    daemon.stop()


def test_a_huge_open_is_refused_without_per_table_work(tight):
    """10^5 table names (the message fits the default size) are refused at once, before any
    name is resolved; it took 43 s of daemon CPU when the limit was checked last."""
    tables = [f"{tight.warehouse}/t{i}" for i in range(HUGE)]
    started = time.monotonic()
    expect_status(tight.stub.OpenTransaction, pb.OpenTransactionRequest(
        pipeline_id=unique("huge"), tables=tables), RE, str(HUGE), "--max-tables-per-txn 1000")
    assert time.monotonic() - started < 10
    txn = open_txn(tight.stub, unique("files"))
    files = [pb.AddFile(path=f"f{i}", size=1) for i in range(HUGE + 1)]
    expect_status(tight.stub.Prewrite, pb.PrewriteRequest(txn_id=txn.txn_id, writes=[
        pb.TableWrite(table=tables[0], add_files=files)]), RE, "--max-files-per-txn 100000")


def test_calls_beyond_the_concurrency_limit_are_refused(tight):
    """Three calls wait for a held table: a fourth call is refused naming the limit, while
    health checks still answer; once the waits end, calls are served again."""
    stub = tight.stub
    held = str(tight.warehouse / unique("held"))
    holder = open_txn(stub, unique("holder"), [held])
    contenders = [open_txn(stub, unique("c")) for _ in range(3)]
    with futures.ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(stub.DeclareTables, pb.DeclareTablesRequest(
            txn_id=t.txn_id, tables=[held]), timeout=30) for t in contenders]
        time.sleep(0.5)  # all three wait now (for 3 s: the table stays held)
        assert not any(c.done() for c in calls)
        expect_status(stub.GetPipeline, pb.GetPipelineRequest(pipeline_id=holder.pipeline_id),
                      RE, "--max-concurrent-rpcs 3", "in flight")
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(tight.target)).Check(
            health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        codes = [c.exception().code() for c in calls]
    assert codes == [grpc.StatusCode.ABORTED] * 3  # they gave up naming the holder
    assert stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=holder.pipeline_id),
                            timeout=30).pipeline_id == holder.pipeline_id


def test_request_rate_per_principal_is_limited(daemon_factory):
    daemon = daemon_factory.start(["--rate-per-principal", "0.5", "--rate-burst", "5"],
                                  name="rate")
    try:
        stub = daemon.stub
        request = pb.GetPipelineRequest(pipeline_id="none")
        for _ in range(5):
            expect_status(stub.GetPipeline, request, grpc.StatusCode.NOT_FOUND)
        expect_status(stub.GetPipeline, request, RE, "anonymous principal",
                      "--rate-per-principal 0.5", "--rate-burst 5")
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(daemon.target)).Check(
            health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        daemon.stop()


class PrincipalFromMetadata(grpc.ServerInterceptor):
    """Stands in for the authentication interceptor: runs each call as the principal its
    ``x-principal`` metadata names."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        principal = dict(handler_call_details.invocation_metadata).get("x-principal", "")

        def handle(request, context):
            with acting_as(principal):
                return handler.unary_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(handle)


def test_the_rate_is_counted_per_authenticated_principal():
    executor = CountingExecutor(4)
    limits = LimitsInterceptor(executor, 16, 1024, RateLimiter(rate=0.001, burst=2))
    server = grpc.server(executor, interceptors=[PrincipalFromMetadata(), limits])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/t.Echo/Echo")

            def call(principal: str) -> str:
                try:
                    return echo(b"hi", timeout=10, metadata=[("x-principal", principal)]).decode()
                except grpc.RpcError as exc:
                    assert exc.code() == RE, exc
                    return exc.details()

            assert [call("alice"), call("alice")] == ["hi", "hi"]
            refused = call("alice")
            assert "principal 'alice'" in refused and "--rate-per-principal 0.001" in refused
            assert call("bob") == "hi"  # another principal's bucket is full
    finally:
        server.stop(0)
