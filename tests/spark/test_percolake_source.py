"""The percolake streaming source (docs/topology.md): its Delta log reading, its file reads on
executors, and a real downstream query reading two tables of a root query through it."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

import sparkside
from percolake.barriers import LOGICAL_BITS
from percolake.lake import storage
from percolake.v1 import coordinator_pb2 as pb
from sparkside import ConsistentReader, Participant
from sparkside.checkpoint_offsets import batch_source_offsets
from sparkside.delta_log import TableLog
from sparkside.errors import BatchRefused, NotAppendOnly, TableNotWritten
from sparkside.source import (
    Offset,
    PercolakeStreamReader,
    SourceOptions,
    batch_range,
    next_offset,
)
from sparkside.source_files import FilePartition, read_file
from tests.spark.conftest import run_until
from tests.spark.helpers import committed_batches, rows

pytestmark = pytest.mark.spark


def arrow_schema_of(log: TableLog) -> pa.Schema:
    return to_arrow_schema(StructType.fromJson(json.loads(log.schema_json())), timezone="UTC")


def read_version(log: TableLog, version: int) -> list[dict]:
    schema = arrow_schema_of(log)
    found: list[dict] = []
    for file in log.data_files(version):
        for batch in read_file(FilePartition(log.table, version, file), schema):
            assert batch.schema.equals(schema)
            found.extend(batch.to_pylist())
    return found


def by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])


def test_each_version_yields_exactly_the_rows_it_appended_with_partition_values(
        tmp_path: Path) -> None:
    table = tmp_path / "events"
    first = pa.table({"id": [1, 2, 3], "day": ["2026-01-01", "2026-01-02", "2026-01-01"]})
    second = pa.table({"id": [4, 5], "day": ["2026-01-02", "2026-01-03 10:00"]})
    write_deltalake(str(table), first, partition_by=["day"])
    write_deltalake(str(table), second, partition_by=["day"], mode="append")
    log = TableLog(str(table))
    assert log.latest_version() == 1
    assert by_id(read_version(log, 0)) == by_id(first.to_pylist())
    assert by_id(read_version(log, 1)) == by_id(second.to_pylist())
    assert {dict(f.partition_values)["day"] for f in log.data_files(1)} == {
        "2026-01-02", "2026-01-03 10:00"}


def test_a_version_that_removed_rows_is_refused_naming_txn_read(tmp_path: Path) -> None:
    table = tmp_path / "dims"
    write_deltalake(str(table), pa.table({"id": [1]}))
    write_deltalake(str(table), pa.table({"id": [2]}), mode="overwrite")
    with pytest.raises(NotAppendOnly, match=r"txn\.read"):
        TableLog(str(table)).data_files(1)


def test_schema_is_the_newest_and_older_files_read_the_new_column_as_null(
        tmp_path: Path) -> None:
    table = tmp_path / "evolving"
    with pytest.raises(TableNotWritten, match="no Delta commit yet"):
        TableLog(str(table)).schema_json()
    write_deltalake(str(table), pa.table({"id": [1]}))
    write_deltalake(str(table), pa.table({"id": [2], "note": ["x"]}), mode="append",
                    schema_mode="merge")
    log = TableLog(str(table))
    assert [f["name"] for f in json.loads(log.schema_json())["fields"]] == ["id", "note"]
    assert read_version(log, 0) == [{"id": 1, "note": None}]
    assert read_version(log, 1) == [{"id": 2, "note": "x"}]


def test_schema_comes_from_the_checkpoint_once_older_entries_are_gone(tmp_path: Path) -> None:
    table = tmp_path / "checkpointed"
    write_deltalake(str(table), pa.table({"id": [1], "day": ["a"]}))
    write_deltalake(str(table), pa.table({"id": [2], "day": ["b"]}), mode="append")
    DeltaTable(str(table)).create_checkpoint()
    write_deltalake(str(table), pa.table({"id": [3], "day": ["c"]}), mode="append")
    for version in (0, 1):  # as log clean-up leaves a table: the checkpoint holds metaData
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    log = TableLog(str(table))
    assert [f["name"] for f in json.loads(log.schema_json())["fields"]] == ["id", "day"]
    assert read_version(log, 2) == [{"id": 3, "day": "c"}]
    with pytest.raises(TableNotWritten, match="does not exist"):
        log.data_files(1)


def test_an_object_store_table_is_read_through_arrows_s3_filesystem(
        s3_env: dict[str, str], s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/lake/events"
    options = storage.delta_storage_options(uri)
    first = pa.table({"id": [1, 2], "day": ["a", "b"]})
    second = pa.table({"id": [3], "day": ["b"]})
    write_deltalake(uri, first, partition_by=["day"], storage_options=options)
    write_deltalake(uri, second, partition_by=["day"], mode="append", storage_options=options)
    log = TableLog(uri)
    assert [f["name"] for f in json.loads(log.schema_json())["fields"]] == ["id", "day"]
    schema = arrow_schema_of(log)
    found = [row for file in log.data_files(1) for batch in read_file(
        FilePartition(log.table, 1, file, (storage.s3_settings(), storage.limits())), schema)
        for row in batch.to_pylist()]
    assert found == second.to_pylist()


def test_offsets_and_options_are_checked() -> None:
    assert Offset.parse('{"generation": 2, "barrier": 7, "after": 5}') == Offset(2, 7, 5)
    assert Offset.parse({"generation": 1, "barrier": 9, "after": 3}).to_dict() == {
        "generation": 1, "barrier": 9, "after": 3}
    # an offset written before the range start was recorded
    assert Offset.parse('{"generation": 2, "barrier": 7}') == Offset(2, 7, None)
    assert Offset.parse({"generation": 0, "barrier": 0}).to_dict() == {
        "generation": 0, "barrier": 0}
    for bad in ({"barrier": 1}, {"generation": 0, "barrier": 4, "after": 5}, "[1]"):
        with pytest.raises(ValueError, match="not a percolake source offset"):
            Offset.parse(bad)
    with pytest.raises(ValueError, match="coordinator, pipeline"):
        SourceOptions.of({"path": "/tmp/x"})


def test_a_checkpoint_location_is_checked_and_a_missing_offset_entry_is_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for bad in ("relative/ck", "hdfs://namenode/ck", ""):
        with pytest.raises(ValueError, match="checkpoint_location"):
            Participant("127.0.0.1:1", "ledger", checkpoint_location=bad)
    Participant("127.0.0.1:1", "ledger", checkpoint_location=f"file://{tmp_path}").close()
    with caplog.at_level("WARNING", logger="percolake.participant"):
        assert batch_source_offsets(str(tmp_path), 3) == ""
    assert f"{tmp_path}/offsets/3" in caplog.text


def plan_reply(generation: int, after: int, barrier: int) -> pb.PlanBarrierResponse:
    return pb.PlanBarrierResponse(generation=generation, start_barrier=0, after_barrier=after,
                                  barrier=barrier, has_changes=barrier > after)


def test_a_source_keeps_its_offset_only_when_nothing_is_due_where_it_stands() -> None:
    given = {"generation": 1, "barrier": 30, "after": 20}
    start = Offset.parse(given)
    assert next_offset(start, plan_reply(1, 30, 30), given) is given  # no batch for it
    # the round's plan: the same end, and the range it starts from, for every source
    assert next_offset(start, plan_reply(1, 30, 40), given) == {
        "generation": 1, "barrier": 40, "after": 30}
    # nothing due, but the pipeline's input stands further (or in another generation): it
    # moves there, reading nothing, so its next batch starts where its round-mates' does
    assert next_offset(start, plan_reply(1, 35, 35), given) == {
        "generation": 1, "barrier": 35, "after": 35}
    assert next_offset(start, plan_reply(2, 30, 30), given) == {
        "generation": 2, "barrier": 30, "after": 30}


def test_a_batchs_range_is_the_one_its_end_offset_records() -> None:
    end = Offset(1, 40, 30)
    # whatever Spark passes as the start (a replay, a source that was left behind)
    for start in (Offset(1, 30, 20), Offset(1, 10, 0), Offset(0, 50, 40)):
        assert batch_range(start, end, "ledger", "t") == (30, 40)
    assert batch_range(Offset(1, 40, 30), Offset(1, 40, 40), "ledger", "t") == (40, 40)
    # offsets without a recorded start: from the start offset within one generation
    assert batch_range(Offset(1, 20), Offset(1, 40), "ledger", "t") == (20, 40)
    assert batch_range(Offset(1, 20, 10), Offset(1, 40), "ledger", "t") == (20, 40)
    with pytest.raises(BatchRefused, match="new checkpoint location"):
        batch_range(Offset(0, 20), Offset(1, 40), "ledger", "t")


class FakeCoordinator:
    """Answers the source's calls from a script and records them."""

    def __init__(self, plans: list[pb.PlanBarrierResponse], changes: list[int]) -> None:
        self.plans, self.changes = plans, changes
        self.calls: list[tuple[str, object]] = []
        self.closed = 0

    def call(self, method: str, request: object) -> object:
        copy = type(request)()
        copy.CopyFrom(request)
        self.calls.append((method, copy))
        if method == "PlanBarrier":
            return self.plans.pop(0)
        if method == "GetTableChanges":
            return pb.GetTableChangesResponse(changes=[])
        return pb.RegisterReadsResponse()

    def close(self) -> None:
        self.closed += 1


def test_the_reader_counts_planning_rounds_and_reads_the_end_offsets_range(
        tmp_path: Path) -> None:
    clients: list[FakeCoordinator] = []
    plans = [plan_reply(0, 0, 0), plan_reply(0, 0, 0), plan_reply(0, 0, 50),
             plan_reply(0, 50, 50)]

    class Options(SourceOptions):
        def client(self) -> FakeCoordinator:  # type: ignore[override]
            clients.append(FakeCoordinator(plans, []))
            return clients[-1]

    options = Options(f"file://{tmp_path}/debits", "127.0.0.1:1", "ledger")
    reader = PercolakeStreamReader(options, StructType.fromJson(
        {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True,
                                       "metadata": {}}]}))
    # the read edge is registered and the channel closed at once (a planning-only reader
    # is never stopped by Spark)
    assert [m for m, _ in clients[0].calls] == ["RegisterReads"] and clients[0].closed == 1
    initial = reader.initialOffset()
    assert initial == {"generation": 0, "barrier": 0, "after": 0}
    assert reader.latestOffset(initial) is initial  # round 1: nothing yet
    end = reader.latestOffset(initial)  # round 2
    assert end == {"generation": 0, "barrier": 50, "after": 0}
    assert reader.latestOffset(end) is end  # round 3: it stands where the input stands
    planning = [r for m, r in clients[1].calls if m == "PlanBarrier"]
    # initialOffset asks in the round its latestOffset is about to plan
    assert [r.round for r in planning] == [1, 1, 2, 3]
    assert [r.HasField("after_barrier") for r in planning] == [False, True, True, True]
    assert reader.partitions(initial, {"generation": 0, "barrier": 50, "after": 50}) == []
    assert reader.partitions({"generation": 0, "barrier": 20, "after": 0}, end) == []
    (changes,) = [r for m, r in clients[1].calls if m == "GetTableChanges"]
    assert (changes.after_barrier, changes.upto_barrier) == (0, 50)
    reader.stop()
    reader.stop()
    assert clients[1].closed == 1


def digest(rows: list[tuple]) -> str:
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()


# ---------------------------------------------------------------- a real topology

INTERVAL_S = 1
ROOT_ROWS = 6


@pytest.fixture(scope="module")
def topo_daemon(daemon_factory):  # noqa: ANN001, ANN201 - tests/conftest.py's factory
    running = daemon_factory.start(["--barrier-interval", str(INTERVAL_S),
                                    "--roll-forward-after", "2"], name="topo")
    yield running
    running.stop()


def is_global_barrier(ts: int) -> bool:
    return ts > 0 and ts % ((INTERVAL_S * 1000) << LOGICAL_BITS) == 0


def run_query(query: StreamingQuery, done: Callable[[], bool], timeout_s: float = 300) -> None:
    """Waits until ``done()`` or the query stops by itself; then stops it."""
    deadline = time.monotonic() + timeout_s
    try:
        while not done() and query.isActive:
            if time.monotonic() > deadline:
                raise TimeoutError(f"streaming query did not reach its goal in time; progress: "
                                   f"{query.recentProgress[-3:]}")
            time.sleep(0.2)
    finally:
        query.stop()


def root_writer(lake: Path) -> Callable:
    def write_batch(df, batch_id, txn):  # noqa: ANN001, ANN202
        moves = df.select(F.lit(batch_id).cast("long").alias("batch"),
                          F.col("value").alias("move"), (F.col("value") % 7 + 1).alias("amount"))
        txn.write(moves, str(lake / "debits"))
        txn.write(moves, str(lake / "credits"))
    return write_batch


def percolake_stream(spark, daemon, pipeline: str, table: Path):  # noqa: ANN001, ANN201
    return (spark.readStream.format("percolake").option("coordinator", daemon.target)
            .option("pipeline", pipeline).load(str(table)))


def test_a_downstream_query_reads_barrier_ranges_exactly_and_replays_them(
        spark, topo_daemon, tmp_path: Path) -> None:  # noqa: ANN001
    lake = topo_daemon.warehouse / uuid.uuid4().hex[:8]
    lake.mkdir()
    stub = topo_daemon.stub
    root_ck, ledger_ck = tmp_path / "root-ck", tmp_path / "ledger-ck"
    root = Participant(topo_daemon.target, f"bank-{lake.name}", checkpoint_location=str(root_ck))
    run_until(spark, root, root_writer(lake), root_ck,
              lambda: len(committed_batches(stub, root.pipeline_id)) >= 3,
              rows_per_batch=ROOT_ROWS)
    roots = committed_batches(stub, root.pipeline_id)
    print(f"{time.strftime('%X')} root committed {sorted(roots)}")
    # the root recorded each batch's offsets from its checkpoint with the commit
    for batch_id, txn in roots.items():
        assert txn.source_offsets == batch_source_offsets(str(root_ck), batch_id) != ""

    sparkside.register(spark)
    pipeline = f"ledger-{lake.name}"
    seen: dict[int, list[tuple[int, int, str, list[tuple]]]] = {}
    debits_read: dict[int, int] = {}
    fail_once = [True]

    def ledger(df, batch_id, txn):  # noqa: ANN001, ANN202
        got = [tuple(r) for r in df.select("side", "batch", "move", "amount").collect()]
        print(f"{time.strftime('%X')} ledger batch {batch_id}: {len(got)} rows, input "
              f"({txn.input_after_barrier}, {txn.input_barrier}]")
        seen.setdefault(batch_id, []).append(
            (txn.input_barrier, txn.input_after_barrier, digest(got), got))
        debits_read[batch_id] = txn.read(str(lake / "debits")).count()
        if got and fail_once:
            fail_once.clear()
            raise RuntimeError("injected failure after reading the batch")
        if got:
            txn.write(df.select((F.col("move") % 3).alias("account"),
                                F.when(F.col("side") == "debit", -F.col("amount"))
                                .otherwise(F.col("amount")).alias("amount"),
                                F.lit(txn.input_barrier).cast("long").alias("input_barrier")),
                      str(lake / "ledger"))

    def start_ledger() -> StreamingQuery:
        debits = percolake_stream(spark, topo_daemon, pipeline, lake / "debits") \
            .withColumn("side", F.lit("debit"))
        credits = percolake_stream(spark, topo_daemon, pipeline, lake / "credits") \
            .withColumn("side", F.lit("credit"))
        participant = Participant(topo_daemon.target, pipeline)
        return (debits.unionByName(credits).writeStream.foreachBatch(participant.wrap(ledger))
                .option("checkpointLocation", str(ledger_ck))
                .trigger(processingTime="0 seconds").start())

    last_root_commit = max(t.commit_ts for t in roots.values())

    def consumed_all() -> bool:
        batches = committed_batches(stub, pipeline)
        return any(t.input_barrier >= last_root_commit for t in batches.values())

    first = start_ledger()
    run_query(first, lambda: not fail_once)
    assert first.exception() is not None and not fail_once, "the injected failure did not stop it"
    failed_batch = max(seen)
    run_query(start_ledger(), consumed_all)

    # the replayed batch read exactly what the failed attempt read (Spark's offset log)
    attempts = seen[failed_batch]
    assert len(attempts) >= 2 and len({a[:3] for a in attempts}) == 1, attempts

    ledger_txns = committed_batches(stub, pipeline)
    barriers = [ledger_txns[b].input_barrier for b in sorted(ledger_txns)]
    assert all(is_global_barrier(b) for b in barriers), barriers
    assert barriers == sorted(set(barriers)), f"input barriers not strictly increasing {barriers}"

    commit_of = {b: t.commit_ts for b, t in roots.items()}
    upstream = [(side, r["batch"], r["move"], r["amount"])
                for side in ("debit", "credit") for r in rows(lake / f"{side}s")]
    previous = 0
    for batch_id in sorted(ledger_txns):
        barrier = ledger_txns[batch_id].input_barrier
        input_barrier, after, _, got = seen[batch_id][-1]
        assert (input_barrier, after) == (barrier, previous)
        expected = [r for r in upstream if previous < commit_of[r[1]] <= barrier]
        assert sorted(got) == sorted(expected), f"batch {batch_id} read other rows"
        # txn.read: the table as it was at the batch's input barrier
        assert debits_read[batch_id] == sum(
            1 for r in upstream if r[0] == "debit" and commit_of[r[1]] <= barrier)
        previous = barrier
    assert sorted(r for b in ledger_txns for r in seen[b][-1][3]) == sorted(upstream)

    # both sources of every batch ended on the same barrier: the offset log's lines agree
    entries = [p for p in (ledger_ck / "offsets").iterdir() if p.name.isdigit()]
    for entry in sorted(entries, key=lambda p: int(p.name)):
        offsets = entry.read_text().splitlines()[2:]
        assert len(offsets) == 2 and offsets[0] == offsets[1], offsets
        if int(entry.name) in ledger_txns:
            assert json.loads(offsets[0])["barrier"] == ledger_txns[int(entry.name)].input_barrier

    # a topology snapshot shows the ledger exactly as the inputs it shows
    reader = ConsistentReader(spark, topo_daemon.target)
    tables = [str(lake / t) for t in ("debits", "credits", "ledger")]
    snap = reader.snapshot(tables, consistency="topology")
    assert snap.consistency == "topology" and is_global_barrier(snap.barrier_ts)
    counts = [snap.table(t).count() for t in tables]
    assert counts[2] == counts[0] + counts[1]
    assert reader.snapshot(tables, consistency="topology").barrier_ts >= snap.barrier_ts
    leased = reader.snapshot(tables, consistency="topology", barrier=snap.barrier_ts,
                             lease_s=60, lease_holder="test")
    assert leased.barrier_ts == snap.barrier_ts and leased.versions == snap.versions
    assert leased.lease_id and leased.release() and not leased.release()
    latest = reader.snapshot(tables, consistency="read_committed")
    assert latest.consistency == "read_committed" and latest.barrier_ts is None
    assert all(latest.versions[t] >= snap.versions[t] for t in tables)
    reader.close()
    root.close()


def test_a_query_refuses_an_upstream_column_addition_naming_the_way_out_and_follows_it(
        spark, topo_daemon, tmp_path: Path) -> None:  # noqa: ANN001
    """Through ``.load``: an upstream merge_schema batch adding a column fails the running
    query naming the column, the restart and the option; restarted, the query reads it; with
    ``new_columns=ignore`` a later addition is left out and the query goes on."""
    lake = topo_daemon.warehouse / uuid.uuid4().hex[:8]
    lake.mkdir()
    orders, checkpoint = lake / "orders", tmp_path / "reader-ck"
    root = Participant(topo_daemon.target, f"orders-{lake.name}")

    def append(batch_id: int, sql: str) -> None:
        root.run_batch(spark.range(1), batch_id, lambda df, b, txn: txn.write(
            spark.sql(sql), str(orders), merge_schema=True))

    append(0, "SELECT 1L id")
    sparkside.register(spark)
    pipeline = f"orders-reader-{lake.name}"
    seen: list[tuple] = []

    def start(**options: str) -> StreamingQuery:
        stream = percolake_stream(spark, topo_daemon, pipeline, orders) if not options else (
            spark.readStream.format("percolake").option("coordinator", topo_daemon.target)
            .option("pipeline", pipeline).options(**options).load(str(orders)))
        participant = Participant(topo_daemon.target, pipeline)
        return (stream.writeStream.foreachBatch(participant.wrap(
            lambda df, batch_id, txn: seen.extend(tuple(r) for r in df.collect())))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="0 seconds").start())

    def running_until(query: StreamingQuery, row: tuple) -> None:
        deadline = time.monotonic() + 120
        while row not in seen:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the query did not read the row in time"
            time.sleep(0.2)

    first = start()
    running_until(first, (1,))
    append(1, "SELECT 2L id, 'EUR' currency")
    run_query(first, lambda: False, timeout_s=120)  # it stops by itself
    refused = str(first.exception())
    assert "UpstreamSchemaChanged" in refused and "['currency']" in refused
    assert "Restart the query" in refused and '.option("new_columns", "ignore")' in refused

    second = start(new_columns="ignore")  # restarted: the schema now has currency
    running_until(second, (2, "EUR"))
    append(2, "SELECT 3L id, 'USD' currency, 'late' note")
    running_until(second, (3, "USD"))
    run_query(second, lambda: True)
    assert second.exception() is None
    assert seen == [(1,), (2, "EUR"), (3, "USD")]
    root.close()
