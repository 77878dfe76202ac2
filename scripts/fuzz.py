#!/usr/bin/env python
"""Bounded fuzz run of the coordinator's RPCs against a real daemon it starts (issue 17 item 7).

Sends ``--requests`` requests (default 10,000) within ``--seconds`` across every RPC of every
service in ``percolake/v1`` (read from the service descriptors, so an RPC added to the proto is
fuzzed too) and the health and reflection services, from ``--threads`` threads, to a daemon on
127.0.0.1 in a fresh folder. Each request is one of:

- valid: built from what earlier replies returned (pipelines, epochs, query ids, transactions,
  tables, with real attempt files on disk), so the protocol's deeper paths run; an RPC without a
  hand-written builder gets a random message of its request type instead;
- mutated: a valid request with one to three fields replaced by boundary values (int64 limits,
  negative numbers, huge or deeply nested JSON, JSON of the wrong shape, invisible or
  direction-changing characters, NUL, percent-encoded names, long or duplicated lists, unknown
  enum values);
- raw: a valid request serialised and its bytes mutated (flipped, truncated, spliced);
- random: a message of the RPC's request type with random fields set (from its descriptor);
- garbage: bytes that are not protobuf at all (random bytes, invalid wire types and field
  numbers, unterminated varints and groups, groups nested thousands deep, lengths past the end,
  text, a message over the size limit).

The first requests cover every (RPC, kind) pair once; the rest are drawn at random. Each request
has a deadline of 5 s: one that takes that long is a hang.

Prints a table of status codes per RPC (with the slowest answer), then checks the store: every
listed transaction answers GetTransaction with its writes, every pipeline GetPipeline, no batch
has two committed attempts, every acknowledged commit and abort stands, every committed write
applies (GetSnapshot rolls it forward), and all of it again after a graceful restart.

Exits 1 if a reply was INTERNAL or UNKNOWN, a request hung, the daemon died, or a check failed.

    python scripts/fuzz.py --requests 100000 --seed 7 [--threads 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.launcher import DaemonProcess  # noqa: E402
from percolake.lake.warehouse import canonical_table_uri, local_path  # noqa: E402
from percolake.v1 import coordinator_pb2 as pb  # noqa: E402
from percolake.v1 import coordinator_pb2_grpc as pb_grpc  # noqa: E402

SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"]
FAILING = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
HANG_S = 5.0  # each request's deadline: one that takes this long hung
# GetSnapshot rolls forward for at most --snapshot-wait: well below HANG_S
DAEMON_ARGS = ["--txn-timeout", "5", "--conflict-wait", "0.2", "--snapshot-wait", "2",
               "--roll-forward-after", "2", "--max-intent-bytes", "262144",
               "--max-message-bytes", str(4 * 1024 * 1024), "--log-level", "warning",
               "--shutdown-grace", "5"]
INT64_MAX = 2**63 - 1
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "day", "type": "string", "nullable": True, "metadata": {}}]})
COMMITTED = (pb.COMMITTED, pb.APPLIED)
# Table names a file system takes; each is refused or must commit and apply like any other.
ODD_NAMES = ["a b", "ü", "sales%2025", "t#1", "t+1", "q?x", "ünï cödé", "日本", "r[1]", "a|b",
             "a^b", "a\\b", "tab\tx", "nl\nx", "del\x7fx", "nbsp\u00a0x", "lrm\u200ex"]
MAX_COPIED_BYTES = 4096  # a list is copied a thousand times only inside a message this small


# ---------------------------------------------------------------------------- boundary values

INTS64 = [0, 1, -1, 2, 7, 2**31 - 1, 2**31, 2**32, 2**53 - 1, 2**53, 2**62, INT64_MAX,
          -(2**63), 86_400_000, 86_400_001, 3_600_000, 3_600_001]
INTS32 = [0, 1, -1, 100, 1000, 1001, 2**31 - 1, -(2**31)]
ENUMS = [0, 1, 2, 3, 4, 5, 6, 42, -1, 2**31 - 1]
HIDDEN = ["\x00", "\n", "\t", "\x7f", "\x85", "\u200b", "\u200e", "\u202e", "\u2066", "\u2028",
          "\u2029", "\ue000", "\u0378", "\ufeff", "\u00a0", "\u3000"]


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


JSON_TEXTS = [
    "", "null", "[]", "{}", "5", '"x"', "[1, 2]", "{oops", "NaN", '{"numRecords": NaN}',
    '{"fields": 5}', '{"type": "struct", "fields": 5}', '{"type": "struct", "fields": [1, 2]}',
    '{"type": "struct", "fields": []}', '{"type": "struct", "fields": [{"name": "id"}]}',
    '{"type": "struct", "fields": [{"name": 7, "type": "long"}]}',
    '{"type": "struct", "fields": [{"name": "id", "type": {"type": "array"}}]}',
    '{"type": "struct", "fields": [{"name": "id", "type": {"type": {"a": 1}}}]}',
    '{"type": "struct", "fields": [{"name": "id", "type": "no_such_type"}]}',
    json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long"},
                                             {"name": "ID", "type": "long"}]}),
    '{"type": "struct", "fields": [{"name": "a\\u0000b", "type": "long"}]}',
    json.dumps({"numRecords": 2**63}), json.dumps({"numRecords": 2**64}),
    json.dumps({"numRecords": 2**53}), json.dumps({"numRecords": -1}),
    json.dumps({"numRecords": 1, "nullCount": {"id": 2**70}}),
    '{"numRecords": 1, "minValues": {"id": 1e999}}', '{"numRecords": ' + "9" * 5000 + "}",
    _nested(100_000, "list"), _nested(50_000, "dict"), _nested(129, "list"),
    _nested(900, "dict"), SCHEMA,
]


def id_values(rng: random.Random, known: list[str]) -> list[str]:
    base = rng.choice(known) if known else "p"
    return ["", " ", " x", "x" * 257, "x" * 256, base + rng.choice(HIDDEN), base.upper(),
            rng.choice(HIDDEN) + base, base + "\u0665", "🦆", "%00", "a/b", base * 3]


def table_values(rng: random.Random, wh: str, known: list[str]) -> list[str]:
    base = rng.choice(known) if known else f"{wh}/t0"
    return ["", "/", "t", "./t", "s3://b/t", f"hdfs://{wh}/t", f"file://host{wh}/t",
            f"{wh}", f"{wh}/../x", f"{wh}/a/../b", f"file://{wh}/%2e%2e/x", f"{wh}/a%00b",
            f"file://{wh}/a%00b", f"file://{wh}/a%2Fb", f"{wh}/t%2Fx", f"{wh}/t#1",
            f"{wh}/t?x", f"{wh}/sales%2025", f"file://{wh}/sales%2025", f"{wh}/a b",
            f"{wh}/ü", f"{wh}/t/_percolake/x", f"{wh}/{'x' * 5000}", f"{wh}/{'y' * 255}",
            base + rng.choice(HIDDEN), base + "/", "file://" + base, base + "//x",
            f"{wh}/t+1", f"file://{wh}/t%2B1"]


def token_values(rng: random.Random) -> list[str]:
    def b64(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode()
    return ["x", "!!!", "é", b64("ts:" + "9" * 30), b64("ts:-1"), b64("ts:\u0665"),
            b64(f"ts:{INT64_MAX}"), b64(f"ts:{2**63}"), b64("offset:5"), b64("ts:"),
            b64(f"ts:{rng.randrange(2**60)}"), base64.urlsafe_b64encode(b"ts:\xff").decode()]


def string_values(rng: random.Random, name: str, pools: Pools) -> list[str]:
    """Boundary strings for a field, chosen by what the field holds."""
    with pools.lock:
        pipelines, txns, tables = list(pools.pipelines), list(pools.txns), list(pools.tables)
    if name in ("schema_json", "stats"):
        return JSON_TEXTS + [json.dumps(random_json(rng))]
    if name in ("table", "tables"):
        return table_values(rng, pools.warehouse, tables)
    if name == "page_token":
        return token_values(rng)
    if name in ("query_id",):
        good = str(uuid.uuid4())
        return [good, good.upper(), "{" + good + "}", good.replace("-", ""), "urn:uuid:" + good,
                "\u0660" * 8 + good[8:], good + "\n", "", "not-a-uuid"]
    if name == "txn_id":
        return id_values(rng, txns) + [uuid.uuid4().hex]
    if name == "path":
        txn = rng.choice(txns) if txns else "0" * 32
        return [f"_percolake/{txn}/a\x00b", f"_percolake/{txn}/", f"_percolake/{txn}/./x",
                f"/_percolake/{txn}/x", f"_percolake/{txn}/../../x", "data/x.parquet",
                f"_percolake/{txn}/" + "x" * 4000, f"_percolake/{txn}/ü\u202e.parquet"]
    return id_values(rng, pipelines) + ["x" * 1001, "why\n\tnot \u202e", "r"]


def random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind < 5:
        return rng.choice([None, True, 0, -1, 2**63, 1.5, "", "long", "struct", "array", "map"])
    if kind == 5:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    keys = ["type", "fields", "name", "elementType", "keyType", "valueType", "nullable",
            "metadata", "numRecords", "nullCount", "minValues"]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


# ---------------------------------------------------------------------------- what replies taught


@dataclass
class PipelineState:
    epoch: int = 0
    query_id: str = ""
    generation: int = 0
    next_batch: int = 0


@dataclass
class TxnInfo:
    pipeline: str
    tables: list[str] = field(default_factory=list)
    state: int = pb.OPEN


@dataclass
class Pools:
    """What the replies so far returned; shared by the threads under ``lock``."""

    warehouse: str
    tables: list[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    pipelines: dict[str, PipelineState] = field(default_factory=dict)
    txns: dict[str, TxnInfo] = field(default_factory=dict)
    committed: set[str] = field(default_factory=set)  # acknowledged COMMITTED or APPLIED
    aborted: set[str] = field(default_factory=set)  # acknowledged ABORTED
    page_tokens: list[str] = field(default_factory=list)

    def observe_txn(self, txn: pb.Transaction) -> None:
        if not txn.txn_id:
            return
        with self.lock:
            info = self.txns.setdefault(txn.txn_id, TxnInfo(txn.pipeline_id))
            info.state = txn.state
            info.tables = [p.table for p in txn.participants] or info.tables
            if txn.state in COMMITTED:
                self.committed.add(txn.txn_id)
            elif txn.state == pb.ABORTED:
                self.aborted.add(txn.txn_id)

    def observe_pipeline(self, pipeline: pb.Pipeline) -> None:
        with self.lock:
            state = self.pipelines.setdefault(pipeline.pipeline_id, PipelineState())
            state.epoch, state.query_id = pipeline.epoch, pipeline.query_id
            state.generation = pipeline.generation

    def caller(self, pipeline: str) -> tuple[int | None, str | None]:
        """The epoch and query id a well-behaved driver of ``pipeline`` sends now."""
        with self.lock:
            state = self.pipelines.get(pipeline)
        if state is None:
            return None, None
        return (state.epoch or None), (state.query_id or None)


# ---------------------------------------------------------------------------- valid requests


def pick_pipeline(rng: random.Random, pools: Pools) -> str:
    with pools.lock:
        known = list(pools.pipelines)
    if not known or rng.random() < 0.1:
        name = f"fuzz-{rng.randrange(12)}"
        with pools.lock:
            pools.pipelines.setdefault(name, PipelineState())
        return name
    return rng.choice(known)


def pick_txn(rng: random.Random, pools: Pools, live: bool = True) -> tuple[str, TxnInfo]:
    with pools.lock:
        items = [(t, i) for t, i in pools.txns.items()
                 if not live or i.state in (pb.OPEN, pb.PREWRITTEN)]
    if not items:
        return uuid.uuid4().hex, TxnInfo(pick_pipeline(rng, pools))
    return rng.choice(items[-50:]) if rng.random() < 0.8 else rng.choice(items)


def set_caller(request: Message, pools: Pools, pipeline: str, rng: random.Random) -> None:
    epoch, query_id = pools.caller(pipeline)
    if epoch is not None and rng.random() < 0.95:
        request.epoch = epoch
    if query_id is not None and "query_id" in request.DESCRIPTOR.fields_by_name:
        request.query_id = query_id


def attempt_files(table: str, txn_id: str, rng: random.Random, count: int,
                  partitioned: bool) -> list[pb.AddFile]:
    """Real files in the attempt's folder (the coordinator checks they exist with their size)."""
    try:
        root = Path(local_path(canonical_table_uri(table)))
    except Exception:  # noqa: BLE001 - a name the coordinator refuses too
        root = None
    files = []
    for i in range(count):
        size = rng.randrange(1, 2000)
        relative = f"_percolake/{txn_id}/part-{i:05d}-{rng.randrange(10**6)}.parquet"
        if root is not None:
            try:
                (root / relative).parent.mkdir(parents=True, exist_ok=True)
                (root / relative).write_bytes(os.urandom(size))
            except OSError:  # the daemon deleted the folder meanwhile (an abort): the write
                pass  # then names a missing file, as a late executor's would
        values = {"day": f"2026-01-0{rng.randrange(1, 4)}"} if partitioned else {}
        files.append(pb.AddFile(path=relative, size=size, partition_values=values,
                                modification_time=int(time.time() * 1000),
                                stats=json.dumps({"numRecords": rng.randrange(1, 10**6)})))
    return files


def table_write(rng: random.Random, pools: Pools, table: str, txn_id: str) -> pb.TableWrite:
    partitioned = table.rstrip("/").endswith(("p0", "p1", "p2"))
    write = pb.TableWrite(table=table, schema_json=SCHEMA,
                          add_files=attempt_files(table, txn_id, rng, rng.randrange(0, 4),
                                                  partitioned))
    write.mode = rng.choice([pb.APPEND] * 6 + [pb.OVERWRITE] + ([pb.OVERWRITE_PARTITIONS]
                                                                 if partitioned else []))
    if partitioned:
        write.partition_by.append("day")
    if write.mode == pb.OVERWRITE_PARTITIONS:
        for f in write.add_files:
            write.replace_partitions.add(values=dict(f.partition_values))
    return write


def txn_tables(rng: random.Random, pools: Pools, info: TxnInfo) -> list[str]:
    if info.tables and rng.random() < 0.8:
        return rng.sample(info.tables, rng.randrange(1, len(info.tables) + 1))
    return rng.sample(pools.tables, rng.randrange(1, 3))


def valid_register(rng: random.Random, pools: Pools) -> Message:
    pipeline = pick_pipeline(rng, pools)
    _, query_id = pools.caller(pipeline)
    request = pb.RegisterPipelineRequest(pipeline_id=pipeline)
    if query_id or rng.random() < 0.5:
        request.query_id = query_id or str(uuid.uuid4())
    return request


def valid_open(rng: random.Random, pools: Pools) -> Message:
    pipeline = pick_pipeline(rng, pools)
    with pools.lock:
        state = pools.pipelines[pipeline]
        batch = state.next_batch if rng.random() < 0.8 else rng.randrange(state.next_batch + 1)
        state.next_batch += 1
    request = pb.OpenTransactionRequest(pipeline_id=pipeline, batch_id=batch,
                                        timeout_ms=rng.choice([0, 5000, 20_000]))
    request.tables.extend(rng.sample(pools.tables, rng.randrange(0, 3)))
    set_caller(request, pools, pipeline, rng)
    return request


def valid_declare(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools)
    request = pb.DeclareTablesRequest(txn_id=txn_id, tables=rng.sample(pools.tables, 2))
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_prewrite(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools)
    writes = [table_write(rng, pools, t, txn_id) for t in txn_tables(rng, pools, info)]
    request = pb.PrewriteRequest(txn_id=txn_id, writes=writes)
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_commit(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools)
    request = pb.CommitTransactionRequest(txn_id=txn_id, release_unwritten=rng.random() < 0.7)
    if rng.random() < 0.6:
        tables = txn_tables(rng, pools, info)
        request.tables.extend(tables)
        request.writes.extend(table_write(rng, pools, t, txn_id) for t in tables)
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_abort(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools, live=rng.random() < 0.8)
    request = pb.AbortTransactionRequest(txn_id=txn_id, reason=rng.choice(
        ["", "fuzz", "ValueError: boom\n\tat x", "\u202eevil"]))
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_report(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools, live=False)
    request = pb.ReportAppliedRequest(txn_id=txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=rng.randrange(3)) for t in info.tables[:2]])
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_heartbeat(rng: random.Random, pools: Pools) -> Message:
    txn_id, info = pick_txn(rng, pools)
    request = pb.HeartbeatRequest(txn_id=txn_id)
    set_caller(request, pools, info.pipeline, rng)
    return request


def valid_get(rng: random.Random, pools: Pools) -> Message:
    txn_id, _ = pick_txn(rng, pools, live=False)
    return pb.GetTransactionRequest(txn_id=txn_id, include_writes=rng.random() < 0.5)


def valid_list(rng: random.Random, pools: Pools) -> Message:
    request = pb.ListTransactionsRequest(page_size=rng.choice([0, 1, 5, 1000]))
    if rng.random() < 0.5:
        request.pipeline_id = pick_pipeline(rng, pools)
    if rng.random() < 0.3:
        request.states.extend(rng.sample([1, 2, 3, 4, 5], 2))
    with pools.lock:
        tokens = list(pools.page_tokens[-20:])
    if tokens and rng.random() < 0.4:
        request.page_token = rng.choice(tokens)
    return request


def valid_snapshot(rng: random.Random, pools: Pools) -> Message:
    request = pb.GetSnapshotRequest(tables=rng.sample(pools.tables, rng.randrange(1, 4)),
                                    wait_timeout_ms=rng.choice([0, 2000]))
    if rng.random() < 0.3:
        request.as_of_batch.pipeline_id = pick_pipeline(rng, pools)
        request.as_of_batch.batch_id = rng.randrange(5)
    return request


def valid_get_pipeline(rng: random.Random, pools: Pools) -> Message:
    return pb.GetPipelineRequest(pipeline_id=pick_pipeline(rng, pools))


def valid_reset(rng: random.Random, pools: Pools) -> Message:
    pipeline = pick_pipeline(rng, pools)
    with pools.lock:
        generation = pools.pipelines[pipeline].generation
    request = pb.ResetPipelineRequest(pipeline_id=pipeline, reason="fuzz reset",
                                      require_idle=rng.random() < 0.5)
    if rng.random() < 0.7:
        request.expected_generation = generation
    if rng.random() < 0.3:
        request.query_id = str(uuid.uuid4())
    return request


BUILDERS: dict[str, Callable[[random.Random, Pools], Message]] = {
    "RegisterPipeline": valid_register, "OpenTransaction": valid_open,
    "DeclareTables": valid_declare, "Prewrite": valid_prewrite,
    "CommitTransaction": valid_commit, "AbortTransaction": valid_abort,
    "ReportApplied": valid_report, "Heartbeat": valid_heartbeat,
    "GetTransaction": valid_get, "ListTransactions": valid_list, "GetSnapshot": valid_snapshot,
    "GetPipeline": valid_get_pipeline, "ResetPipeline": valid_reset,
    "Health/Check": lambda rng, _: health_pb2.HealthCheckRequest(
        service=rng.choice(["", SERVICE.full_name])),
    "Reflection": lambda rng, _: reflection_pb2.ServerReflectionRequest(list_services=""),
}
# how often each RPC is drawn, relative to 1 (an RPC without an entry, one added later: 1)
WEIGHTS = {"OpenTransaction": 3, "Prewrite": 3, "CommitTransaction": 3, "DeclareTables": 2,
           "AbortTransaction": 2, "Heartbeat": 2, "RegisterPipeline": 1, "ResetPipeline": 1,
           "Health/Check": 0.2, "Health/List": 0.2, "Reflection": 0.2}


# ---------------------------------------------------------------------------- the RPCs


@dataclass(frozen=True)
class Rpc:
    """One RPC the fuzzer calls: its name in the table, its path and its message types."""

    name: str
    path: str
    request_type: type[Message]
    reply_type: type[Message]
    client_streaming: bool
    server_streaming: bool
    learns: bool  # an RPC of percolake's own services: its replies feed the pools


def _rpc(name: str, method: MethodDescriptor, learns: bool) -> Rpc:
    return Rpc(name, f"/{method.containing_service.full_name}/{method.name}",
               message_factory.GetMessageClass(method.input_type),
               message_factory.GetMessageClass(method.output_type),
               method.client_streaming, method.server_streaming, learns)


def proto_services() -> list[ServiceDescriptor]:
    """Every service of every generated module in percolake/v1, so a new RPC is fuzzed too."""
    services: list[ServiceDescriptor] = []
    for module in sorted((ROOT / "percolake" / "v1").glob("*_pb2.py")):
        loaded = importlib.import_module(f"percolake.v1.{module.stem}")
        services.extend(loaded.DESCRIPTOR.services_by_name.values())
    return services


def all_rpcs() -> dict[str, Rpc]:
    """percolake's RPCs (by method name; other services' as ``Service/Method``), health's
    unary RPCs and reflection."""
    rpcs: dict[str, Rpc] = {}
    for service in proto_services():
        for method in service.methods:
            own = service.full_name == SERVICE.full_name
            name = method.name if own else f"{service.name}/{method.name}"
            rpcs[name] = _rpc(name, method, learns=True)
    for method in health_pb2.DESCRIPTOR.services_by_name["Health"].methods:
        if not method.server_streaming:  # Watch streams until cancelled, by design
            rpcs[f"Health/{method.name}"] = _rpc(f"Health/{method.name}", method, False)
    info = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].methods[0]
    rpcs["Reflection"] = _rpc("Reflection", info, False)
    return rpcs


RPCS = all_rpcs()
RPC_NAMES = sorted(RPCS)
MODES = ("valid", "mutated", "raw", "random", "garbage")
MODE_WEIGHTS = (30, 35, 15, 10, 10)


# ---------------------------------------------------------------------------- mutations


def leaf_fields(message: Message) -> Iterator[tuple[Message, FieldDescriptor]]:
    """Every field of ``message`` and of the sub-messages it holds."""
    for descriptor in message.DESCRIPTOR.fields:
        yield message, descriptor
        if descriptor.type != FieldDescriptor.TYPE_MESSAGE or _is_map(descriptor):
            continue
        if descriptor.is_repeated:
            for item in getattr(message, descriptor.name):
                yield from leaf_fields(item)
        elif message.HasField(descriptor.name):
            yield from leaf_fields(getattr(message, descriptor.name))


def _is_map(descriptor: FieldDescriptor) -> bool:
    return (descriptor.type == FieldDescriptor.TYPE_MESSAGE
            and descriptor.message_type.GetOptions().map_entry)


def scalar_value(rng: random.Random, descriptor: FieldDescriptor, pools: Pools) -> Any:
    kind = descriptor.type
    if kind == FieldDescriptor.TYPE_STRING:
        return rng.choice(string_values(rng, descriptor.name, pools))
    if kind == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.TYPE_ENUM:
        return rng.choice(ENUMS)
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32,
                FieldDescriptor.TYPE_SFIXED32):
        return rng.choice(INTS32)
    if kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return rng.choice([0, 1, 2**31, 2**32 - 1])
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return rng.choice([0, 1, 2**63, 2**64 - 1])
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e308, -1e-308, float("nan"), float("inf")])
    if kind == FieldDescriptor.TYPE_BYTES:
        return rng.choice([b"", b"\x00", os.urandom(rng.randrange(1, 64)), b"x" * 5000])
    return rng.choice(INTS64 + [rng.randrange(-(2**63), 2**63)])


def random_message(rng: random.Random, message: Message, pools: Pools, depth: int = 0) -> str:
    """Sets random fields of ``message`` (and of its sub-messages, three levels deep), from its
    descriptor alone; returns a short description."""
    changes = []
    for descriptor in message.DESCRIPTOR.fields:
        if rng.random() < 0.4:
            continue
        name = descriptor.name
        try:
            if _is_map(descriptor) or (descriptor.is_repeated
                                       and descriptor.type != FieldDescriptor.TYPE_MESSAGE):
                for _ in range(rng.randrange(1, 4)):
                    changes.append(mutate_field(rng, message, descriptor, pools))
            elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                if depth < 3:
                    items = getattr(message, name)
                    for _ in range(rng.randrange(1, 3) if descriptor.is_repeated else 1):
                        child = items.add() if descriptor.is_repeated else items
                        child.SetInParent()
                        random_message(rng, child, pools, depth + 1)
                    changes.append(f"{name}={{...}}")
            else:
                changes.append(mutate_field(rng, message, descriptor, pools))
        except (ValueError, TypeError):  # a value the field's type cannot hold (closed enum)
            continue
    return ", ".join(changes)[:200] or "empty"


def mutate_field(rng: random.Random, message: Message, descriptor: FieldDescriptor,
                 pools: Pools) -> str:
    """Changes one field; returns a short description of the change."""
    name = descriptor.name
    if _is_map(descriptor):
        key = rng.choice(string_values(rng, "pipeline_id", pools))
        getattr(message, name)[key] = rng.choice(["", "x", "\x00", "2026-01-01", "a" * 3000])
        return f"{name}[{key[:12]!r}]"
    if descriptor.is_repeated:
        return mutate_repeated(rng, message, descriptor, pools)
    if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
        if rng.random() < 0.5:
            message.ClearField(name)
            return f"{name}=unset"
        getattr(message, name).SetInParent()
        return f"{name}={{}}"
    value = scalar_value(rng, descriptor, pools)
    setattr(message, name, value)
    return f"{name}={_short(value)}"


def mutate_repeated(rng: random.Random, message: Message, descriptor: FieldDescriptor,
                    pools: Pools) -> str:
    items = getattr(message, descriptor.name)
    choice = rng.randrange(4)
    if choice == 0:
        message.ClearField(descriptor.name)
        return f"{descriptor.name}=[]"
    if choice == 1 and len(items) and message.ByteSize() < MAX_COPIED_BYTES:
        copies = rng.choice([2, 1001, 1100])
        if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
            first = items[0]
            for _ in range(copies):
                items.add().CopyFrom(first)
        else:
            items.extend([items[0]] * copies)
        return f"{descriptor.name}*{copies}"
    if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
        items.add()
        return f"{descriptor.name}+={{}}"
    value = scalar_value(rng, descriptor, pools)
    items.append(value)
    return f"{descriptor.name}+={_short(value)}"


def mutate(rng: random.Random, message: Message, pools: Pools) -> str:
    changes = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        fields = list(leaf_fields(message))
        if not fields:
            return "no fields"
        target, descriptor = rng.choice(fields)
        try:
            changes.append(mutate_field(rng, target, descriptor, pools))
        except (ValueError, TypeError):  # a value the field's type cannot hold (closed enum)
            continue
    return ", ".join(changes)


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    raw = bytearray(data)
    choice = rng.randrange(6)
    if choice == 0 and raw:
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw), "flipped bits"
    if choice == 1 and raw:
        return bytes(raw[:rng.randrange(len(raw))]), "truncated"
    if choice == 2:
        at = rng.randrange(len(raw) + 1)
        return bytes(raw[:at]) + os.urandom(rng.randrange(1, 16)) + bytes(raw[at:]), "spliced"
    if choice == 3:
        return bytes(raw) + rng.choice([b"\x0a\x02\xc3\x28", b"\xff", b"\x08" + b"\xff" * 11,
                                        b"\x0a\x7f", b"\x7a\x00"]), "bad tail"
    if choice == 4:
        return os.urandom(rng.randrange(0, 64)), "random bytes"
    return bytes(raw) + b"\xf8\x07\x01", "unknown field"  # field 127, varint 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


GARBAGE: list[tuple[str, Callable[[random.Random], bytes]]] = [
    ("random bytes", lambda rng: rng.randbytes(rng.randrange(1, 4096))),
    ("invalid wire type", lambda rng: bytes([(rng.randrange(1, 16) << 3) | rng.choice([6, 7])])
     + rng.randbytes(rng.randrange(8))),
    ("field number 0", lambda rng: b"\x00" + rng.randbytes(rng.randrange(4))),
    ("field number 2^29", lambda rng: _varint((2**29 << 3) | 0) + b"\x01"),
    ("unterminated varint", lambda rng: b"\x08" + b"\xff" * rng.randrange(1, 12)),
    ("length past the end", lambda rng: b"\x0a" + _varint(rng.choice([5, 2**31, 2**63]))
     + b"abc"),
    ("unterminated groups", lambda rng: b"\x0b" * rng.randrange(50, 5000)),
    ("groups nested deep", lambda rng: b"\x7b" * (n := rng.randrange(100, 5000)) + b"\x7c" * n),
    ("end group alone", lambda rng: b"\x0c"),
    ("text", lambda rng: rng.choice([b'{"pipeline_id": "p"}', b"GET / HTTP/1.1\r\n\r\n",
                                     "ünï\u202e".encode(), b"\x00" * 100, b"\xff" * 100])),
    ("over the size limit", lambda rng: b"\x7a" + _varint(5 * 1024 * 1024)
     + bytes(5 * 1024 * 1024)),
]
GARBAGE_WEIGHTS = [30, 10, 5, 5, 10, 10, 10, 10, 3, 6, 1]


def garbage_bytes(rng: random.Random) -> tuple[bytes, str]:
    """Bytes that are not a protobuf message (or not one the daemon may take)."""
    name, make = rng.choices(GARBAGE, GARBAGE_WEIGHTS)[0]
    return make(rng), name


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"


# ---------------------------------------------------------------------------- sending


@dataclass
class Outcome:
    rpc: str
    mode: str
    code: grpc.StatusCode
    details: str
    seconds: float
    change: str = ""


def _identity(data: bytes) -> bytes:
    return data


class Caller:
    """Sends raw request bytes to any method and returns the reply's bytes (a unary reply)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        self._calls: dict[str, Any] = {}

    def _call(self, rpc: Rpc) -> Any:
        call = self._calls.get(rpc.path)
        if call is None:
            kind = {(False, False): self.channel.unary_unary,
                    (False, True): self.channel.unary_stream,
                    (True, False): self.channel.stream_unary,
                    (True, True): self.channel.stream_stream}[
                        (rpc.client_streaming, rpc.server_streaming)]
            call = self._calls[rpc.path] = kind(rpc.path, _identity, _identity)
        return call

    def send(self, rpc: Rpc, data: bytes, metadata: tuple[tuple[str, str], ...] = ()
             ) -> tuple[grpc.StatusCode, str, bytes | None]:
        call = self._call(rpc)
        request = iter([data]) if rpc.client_streaming else data
        try:
            if not rpc.server_streaming:
                return grpc.StatusCode.OK, "", call(request, timeout=HANG_S, metadata=metadata)
            for _ in call(request, timeout=HANG_S, metadata=metadata):
                pass
            return grpc.StatusCode.OK, "", None
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", None

    def close(self) -> None:
        self.channel.close()


def observe(rpc: Rpc, reply: bytes, pools: Pools) -> None:
    """Learns from a successful reply: pipelines, epochs, transactions and their states."""
    message = rpc.reply_type.FromString(reply)
    for txn in _transactions(message):
        pools.observe_txn(txn)
    for pipeline in _pipelines(message):
        pools.observe_pipeline(pipeline)
    if isinstance(message, pb.ListTransactionsResponse) and message.next_page_token:
        with pools.lock:
            pools.page_tokens.append(message.next_page_token)


def _transactions(message: Message) -> list[pb.Transaction]:
    if isinstance(message, pb.Transaction):
        return [message]
    if isinstance(message, pb.ListTransactionsResponse):
        return list(message.transactions)
    field_ = message.DESCRIPTOR.fields_by_name.get("transaction")
    if field_ is not None and field_.message_type is pb.Transaction.DESCRIPTOR:
        return [message.transaction]
    return []


def _pipelines(message: Message) -> list[pb.Pipeline]:
    if isinstance(message, pb.Pipeline):
        return [message]
    field_ = message.DESCRIPTOR.fields_by_name.get("pipeline")
    if (field_ is not None and field_.message_type is pb.Pipeline.DESCRIPTOR
            and message.HasField("pipeline")):
        return [message.pipeline]
    return []


def pick(rng: random.Random, ticket: int) -> tuple[str, str]:
    """The RPC and kind of request number ``ticket``: every pair once first, then at random."""
    if ticket < len(RPC_NAMES) * len(MODES):
        return RPC_NAMES[ticket % len(RPC_NAMES)], MODES[ticket // len(RPC_NAMES)]
    rpc = rng.choices(RPC_NAMES, [WEIGHTS.get(r, 1) for r in RPC_NAMES])[0]
    return rpc, rng.choices(MODES, MODE_WEIGHTS)[0]


def build(rng: random.Random, pools: Pools, rpc: Rpc, mode: str) -> tuple[bytes, str]:
    """The bytes of one request of kind ``mode`` and a short description of what was done."""
    if mode == "garbage":
        return garbage_bytes(rng)
    if mode == "random":
        message = rpc.request_type()
        return message.SerializeToString(), random_message(rng, message, pools)
    builder = BUILDERS.get(rpc.name)
    if builder is not None:
        message, change = builder(rng, pools), ""
    else:
        message = rpc.request_type()
        change = random_message(rng, message, pools)
    if mode == "mutated":
        change = mutate(rng, message, pools)
    data = message.SerializeToString()
    if mode == "raw":
        data, change = mutate_bytes(rng, data)
    return data, change


# odd credentials sent with a few requests (the daemon may ignore them, never fail on them)
AUTHORIZATION = ["", "Bearer", "Bearer ", "Bearer  x", "bearer x", "Basic dXNlcjpwYXNz",
                 "Bearer " + "x" * 8000, "Bearer a.b.c", "Bearer %00", "Token x"]


def one_request(rng: random.Random, pools: Pools, caller: Caller, ticket: int) -> Outcome:
    name, mode = pick(rng, ticket)
    rpc = RPCS[name]
    data, change = build(rng, pools, rpc, mode)
    metadata: tuple[tuple[str, str], ...] = ()
    if rng.random() < 0.03:
        value = rng.choice(AUTHORIZATION)
        metadata = (("authorization", value),)
        change = f"{change}; authorization={_short(value)}"
    started = time.monotonic()
    code, details, reply = caller.send(rpc, data, metadata)
    outcome = Outcome(name, mode, code, details, time.monotonic() - started, change)
    if reply is not None and rpc.learns:
        observe(rpc, reply, pools)
    return outcome


# ---------------------------------------------------------------------------- the run


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    modes: Counter[tuple[str, str]] = field(default_factory=Counter)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rpc, mode)
    slowest: dict[str, float] = field(default_factory=dict)  # rpc -> seconds
    failures: list[Outcome] = field(default_factory=list)
    hangs: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the fuzzer's own crashes
    sent: int = 0

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.counts[(outcome.rpc, outcome.code.name)] += 1
            self.modes[(outcome.mode, outcome.code.name)] += 1
            self.pairs[(outcome.rpc, outcome.mode)] += 1
            self.slowest[outcome.rpc] = max(self.slowest.get(outcome.rpc, 0.0), outcome.seconds)
            if outcome.code in FAILING:
                self.failures.append(outcome)
            elif outcome.seconds >= HANG_S - 0.05:  # its deadline ran out
                self.hangs.append(outcome)

    def claim(self, budget: int) -> int | None:
        """The number of the next request to send, None once ``budget`` were sent."""
        with self.lock:
            if self.sent >= budget:
                return None
            self.sent += 1
            return self.sent - 1


def worker(seed: int, pools: Pools, target: str, tally: Tally, budget: int,
           deadline: float, daemon: DaemonProcess) -> None:
    rng = random.Random(seed)
    caller = Caller(target)
    try:
        while time.monotonic() < deadline and daemon.is_running():
            ticket = tally.claim(budget)
            if ticket is None:
                break
            tally.add(one_request(rng, pools, caller, ticket))
    except Exception:  # noqa: BLE001 - reported, and the run fails
        with tally.lock:
            tally.errors.append(traceback.format_exc())
    finally:
        caller.close()


def run(args: argparse.Namespace, daemon: DaemonProcess, pools: Pools) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=worker, name=f"fuzz-{i}", args=(
        args.seed * 1000 + i, pools, daemon.target, tally, args.requests, deadline, daemon))
        for i in range(args.threads)]
    for thread in threads:
        thread.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.monotonic() - last >= 15:
            last = time.monotonic()
            print(f"  ... {tally.sent} requests sent", flush=True)
    return tally


def status_table(counts: Counter[tuple[str, str]], first: str = "rpc",
                 slowest: dict[str, float] | None = None) -> str:
    """Counts per row and status code; with ``slowest``, the slowest answer of each row."""
    rows = sorted({r for r, _ in counts})
    order = [c.name for c in grpc.StatusCode]
    codes = [c for c in order if any(counts[(r, c)] for r in rows)]
    extra = ["max s"] if slowest is not None else []
    header = [first, *codes, "total", *extra]
    lines = [header]
    for row in rows:
        cells = [counts[(row, c)] for c in codes]
        late = [f"{slowest.get(row, 0.0):.2f}"] if slowest is not None else []
        lines.append([row, *[str(n) if n else "." for n in cells], str(sum(cells)), *late])
    totals = [sum(counts[(r, c)] for r in rows) for c in codes]
    late = [f"{max(slowest.values(), default=0.0):.2f}"] if slowest is not None else []
    lines.append(["total", *map(str, totals), str(sum(totals)), *late])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
                     for line in lines)


# ---------------------------------------------------------------------------- integrity


def all_transactions(stub: pb_grpc.CoordinatorStub) -> list[pb.Transaction]:
    txns: list[pb.Transaction] = []
    token = ""
    while True:
        reply = stub.ListTransactions(pb.ListTransactionsRequest(page_size=1000,
                                                                 page_token=token), timeout=60)
        txns.extend(reply.transactions)
        token = reply.next_page_token
        if not token:
            return txns


def check_store(stub: pb_grpc.CoordinatorStub, pools: Pools) -> tuple[list[str], list[Any]]:
    """Every transaction and pipeline answers; batches commit once; acknowledgments stand."""
    problems: list[str] = []
    txns = all_transactions(stub)
    batches: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for txn in txns:
        try:
            stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id, include_writes=True),
                                timeout=30)
        except grpc.RpcError as exc:
            problems.append(f"GetTransaction {txn.txn_id}: {exc.code().name} {exc.details()}")
        if txn.state in COMMITTED:
            batches[(txn.pipeline_id, txn.generation, txn.batch_id)].append(txn.txn_id)
    problems += [f"batch {key} committed by {ids}" for key, ids in batches.items()
                 if len(ids) > 1]
    for pipeline in sorted({t.pipeline_id for t in txns}):
        try:
            stub.GetPipeline(pb.GetPipelineRequest(pipeline_id=pipeline), timeout=30)
        except grpc.RpcError as exc:
            problems.append(f"GetPipeline {pipeline!r}: {exc.code().name} {exc.details()}")
    states = {t.txn_id: t.state for t in txns}
    with pools.lock:
        committed, aborted = set(pools.committed), set(pools.aborted)
    problems += [f"acknowledged commit {t} is {_state(states.get(t))}" for t in sorted(committed)
                 if states.get(t) not in COMMITTED]
    problems += [f"acknowledged abort {t} is {_state(states.get(t))}" for t in sorted(aborted)
                 if states.get(t) != pb.ABORTED]
    return problems, txns


def _state(state: int | None) -> str:
    return "missing" if state is None else pb.TransactionState.Name(state)


def check_applies(stub: pb_grpc.CoordinatorStub, txns: list[pb.Transaction]) -> list[str]:
    """Every committed write applies: GetSnapshot rolls each table forward."""
    problems: list[str] = []
    tables = sorted({p.table for t in txns if t.state == pb.COMMITTED for p in t.participants})
    for table in tables:
        try:
            stub.GetSnapshot(pb.GetSnapshotRequest(tables=[table], wait_timeout_ms=60_000),
                             timeout=90)
        except grpc.RpcError as exc:
            problems.append(f"GetSnapshot {table}: {exc.code().name} {exc.details()}")
    for txn in txns:
        if txn.state != pb.COMMITTED:
            continue
        now = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn.txn_id), timeout=30)
        if now.state != pb.APPLIED:
            problems.append(f"committed {txn.txn_id} is still {_state(now.state)} after "
                            "GetSnapshot rolled its tables forward")
    return problems


def integrity(daemon: DaemonProcess, pools: Pools) -> list[str]:
    if not daemon.is_running():
        return [f"the daemon died:\n{daemon.log_tail()}"]
    try:
        daemon.wait_serving(10)
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        return [f"the daemon stopped answering health checks: {exc}"]
    try:
        with grpc.insecure_channel(daemon.target) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            problems, txns = check_store(stub, pools)
            problems += check_applies(stub, txns)
        print(f"checked {len(txns)} transactions, {len(pools.committed)} acknowledged "
              f"commits, {len(pools.aborted)} acknowledged aborts")
        status = daemon.stop()
        if status != 0:
            problems.append(f"graceful stop exited with {status}")
        daemon.start()
        with grpc.insecure_channel(daemon.target) as channel:
            again, txns_after = check_store(pb_grpc.CoordinatorStub(channel), pools)
    except grpc.RpcError as exc:
        return [f"a check's request failed: {exc.code().name} {exc.details()}"]
    problems += [f"after restart: {p}" for p in again]
    if len(txns_after) < len(txns):
        problems.append(f"after restart {len(txns_after)} transactions, before {len(txns)}")
    return problems


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests to send")
    parser.add_argument("--seconds", type=float, default=3600.0,
                        help="time bound of the run (requests not sent by then are skipped)")
    parser.add_argument("--threads", type=int, default=2, help="concurrent senders")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--tables", type=int, default=24, help="tables in the pool")
    parser.add_argument("--workdir", help="folder for the daemon (kept); default a temp dir "
                        "removed after a clean run")
    return parser.parse_args(argv)


def one_line(text: str, limit: int) -> str:
    return text[:limit].replace("\n", "\\n")


def signature(details: str) -> str:
    """A failure's message with ids, numbers and paths blanked: one line per kind of failure."""
    text = re.sub(r"[0-9a-f]{32}", "<txn>", one_line(details, 1000))
    text = re.sub(r"file://\S+|/tmp/\S+", "<path>", text)
    text = re.sub(r"x{20,}|\d+", "#", text)
    return text[:160]


def report(tally: Tally, seconds: float) -> None:
    print(f"\n{tally.sent} requests in {seconds:.1f} s ({tally.sent / max(seconds, 1e-9):.0f}/s)")
    print(status_table(tally.counts, "rpc", tally.slowest))
    print("\nby kind of request:")
    print(status_table(tally.modes, "kind"))
    kinds = Counter(signature(o.details) for o in tally.failures)
    for kind, count in kinds.most_common():
        print(f"FAIL x{count}: {kind}")
    for outcome in tally.failures[:10]:
        print(f"FAIL {outcome.rpc} [{outcome.mode}: {outcome.change}] {outcome.code.name}: "
              f"{one_line(outcome.details, 300)}")
    for error in tally.errors:
        print(f"FUZZER ERROR {error}")
    for outcome in tally.hangs[:10]:
        print(f"HANG {outcome.rpc} [{outcome.mode}: {outcome.change}] "
              f"{outcome.code.name} after {outcome.seconds:.1f} s")


def daemon_errors(log_path: Path) -> Counter[str]:
    """The daemon's error records (JSON log lines at level error or critical), by message."""
    found: Counter[str] = Counter()
    if not log_path.exists():
        return found
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
            last = str(entry.get("exc", "")).strip().splitlines()[-1:] or [""]
            found[f"{entry.get('msg')} {one_line(last[0], 200)}".strip()] += 1
    return found


@dataclass
class Result:
    tally: Tally
    problems: list[str]  # the store checks that failed, a dead daemon
    log_errors: Counter[str]
    seconds: float
    workdir: Path

    @property
    def failed(self) -> bool:
        return bool(self.tally.failures or self.tally.hangs or self.tally.errors
                    or self.problems)


def fuzz(args: argparse.Namespace) -> Result:
    """Starts a daemon, sends the requests, checks the store before and after a restart."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix="percolake-fuzz-"))
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    wh = os.path.realpath(warehouse)
    tables = ([f"{wh}/t{i}" for i in range(args.tables)] + [f"{wh}/p{i}" for i in range(3)]
              + [f"{wh}/{name}" for name in ODD_NAMES] + [f"file://{wh}/sales%2025"])
    pools = Pools(warehouse=wh, tables=tables)
    daemon = DaemonProcess(work / "data", [wh], extra_args=DAEMON_ARGS)
    daemon.start()
    print(f"daemon at {daemon.target}, folder {work}, seed {args.seed}, "
          f"{len(RPCS)} RPCs", flush=True)
    started = time.monotonic()
    try:
        tally = run(args, daemon, pools)
        seconds = time.monotonic() - started
        report(tally, seconds)
        problems = integrity(daemon, pools)
    finally:
        daemon.stop()
    return Result(tally, problems, daemon_errors(daemon.log_path), seconds, work)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = fuzz(args)
    for message, count in result.log_errors.most_common(20):
        print(f"daemon log error x{count}: {one_line(message, 300)}")
    for problem in result.problems[:30]:
        print(f"INTEGRITY {one_line(problem, 400)}")
    print("\nFAILED" if result.failed else "\nOK: no INTERNAL or UNKNOWN, no hang, store intact "
          "and served after a restart")
    if result.failed or args.workdir:
        print(f"daemon folder and log kept: {result.workdir}")
    else:
        shutil.rmtree(result.workdir, ignore_errors=True)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
