"""Snapshot reader process: loops GetSnapshot + deltalake reads at the snapshot's versions.

Every observation (or error) is one JSON line in ``--out``; the checker compares each with the
state the committed transactions define at its snapshot_ts (I1). Runs until ``--stop-file``
exists. Coordinator restarts are expected: UNAVAILABLE is recorded and the loop goes on.

    python -m tests.crash.reader --target HOST:PORT --table debits=/lake/debits ... --out obs.jsonl

A table may be an ``s3://`` URI, read with the AWS variables of the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc
from tests.crash.checker import (
    open_delta,
    read_parquet,
    relative_to_root,
    table_root,
    txn_of_path,
)


class FileCache:
    """Data files and a table's versions never change once written: read each once."""

    def __init__(self) -> None:
        self.summaries: dict[str, dict[str, Any]] = {}
        self.versions: dict[tuple[str, int], list[str]] = {}

    def file_uris(self, path: str, version: int) -> list[str]:
        """The data files of ``path`` at ``version`` (delta-rs loads the log once per version,
        not at every observation that names it)."""
        if (path, version) not in self.versions:
            self.versions[path, version] = open_delta(path, version=version).file_uris()
        return self.versions[path, version]

    def summary(self, path: str) -> dict[str, Any]:
        if path not in self.summaries:
            table = read_parquet(path).to_pydict()
            columns = set(table)
            rows = len(next(iter(table.values()))) if table else 0
            summary: dict[str, Any] = {"rows": rows}
            if "amount" in columns:
                summary["sum"] = int(sum(table["amount"]))
            if "balance" in columns and "batch" in columns:
                summary["balances"] = [list(r) for r in zip(
                    table["account"], table["balance"], table["batch"], strict=True)]
            value = "amount" if "amount" in columns else "balance"
            if "account" in columns and value in columns:  # sum(value) by account
                by_account: dict[str, int] = {}
                for account, amount in zip(table["account"], table[value], strict=True):
                    by_account[str(account)] = by_account.get(str(account), 0) + int(amount)
                summary["by_account"] = by_account
            self.summaries[path] = summary
        return self.summaries[path]


def observe(stub: pb_grpc.CoordinatorStub, tables: dict[str, str], cache: FileCache,
            reader: str) -> dict[str, Any]:
    reply = stub.GetSnapshot(pb.GetSnapshotRequest(tables=list(tables.values())), timeout=30)
    obs: dict[str, Any] = {"reader": reader, "snapshot_ts": reply.snapshot_ts, "tables": {},
                           "wall": time.time()}
    by_path = {t.table: t for t in reply.tables}
    for name, path in tables.items():
        version = by_path[path]
        seen: dict[str, Any] = {"version": None, "txns": {}, "rows": 0, "sum": 0}
        if version.exists:
            seen["version"] = version.delta_version
            root = table_root(path)
            balances: list[list[int]] = []
            by_account: dict[str, int] = {}
            for uri in cache.file_uris(path, version.delta_version):
                relative = relative_to_root(uri, root)
                summary = cache.summary(f"{root}/{relative}")
                txn = str(txn_of_path(relative))
                rows, total = seen["txns"].get(txn, (0, 0))
                seen["txns"][txn] = (rows + summary["rows"], total + summary.get("sum", 0))
                seen["rows"] += summary["rows"]
                seen["sum"] += summary.get("sum", 0)
                balances += summary.get("balances", [])
                for account, amount in summary.get("by_account", {}).items():
                    by_account[account] = by_account.get(account, 0) + amount
            if balances:
                seen["balances"] = balances
            seen["by_account"] = by_account
        obs["tables"][name] = seen
    return obs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--table", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--prefix", action="append", default=None,
                        help="bank table-name prefixes to check the bank invariant on")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--name", default=f"reader-{os.getpid()}")
    args = parser.parse_args(argv)
    tables = dict(item.split("=", 1) for item in args.table)
    cache = FileCache()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    channel = grpc.insecure_channel(args.target)
    stub = pb_grpc.CoordinatorStub(channel)
    while not Path(args.stop_file).exists():
        try:
            obs = observe(stub, tables, cache, args.name)
            obs["prefixes"] = args.prefix or [""]
        except grpc.RpcError as exc:
            obs = {"reader": args.name, "error": exc.details(), "code": exc.code().name}
            time.sleep(0.2)
        except Exception as exc:  # a version the snapshot named could not be read: recorded
            obs = {"reader": args.name, "error": repr(exc), "code": "READ_ERROR"}
        out.write(json.dumps(obs) + "\n")
        time.sleep(args.interval)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
