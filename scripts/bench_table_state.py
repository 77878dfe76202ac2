"""The coordinator's Delta log work per batch as a table ages (issue 33, point 3, daemon side).

One local table is given 10, 100, 1,000 and 10,000 versions (``--quick``: up to 1,000): version 0
by delta-rs, the others written as delta-rs writes an append (commitInfo naming a transaction,
an app transaction, one add), with a checkpoint at the last multiple of 100 as delta-rs's
default interval leaves it. At each age the coordinator's share of a batch runs ``--batches``
times, each a real one-file append:

- the pre-commit write check (``WriteChecker.check``: layout, files, schema);
- the apply a roll-forward makes (``apply_table_write``);
- the check of the applied report (``is_commit_of`` of the version just written).

Twice, side by side: with the table state kept across batches (``percolake.lake.table_cache``:
log entries summarised once, the table advanced over the entries written since
(``percolake.lake.kept_table``); what the daemon runs) and with the log loaded again for every
apply and entry (as before). Prints ms per batch (median) and the log entries parsed in Python
per batch, at each age, and how the kept path's time at the oldest age compares with its time
at 10 versions.

    python scripts/bench_table_state.py --quick --json /tmp/table_state.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _benchlib as bl  # noqa: E402

SCHEMA = {"type": "struct", "fields": [{"name": "x", "type": "long", "nullable": True,
                                        "metadata": {}}]}
APP_ID = "percolake:bench:g0"


def build_table(root: Path, versions: int) -> None:
    """A table at version ``versions - 1``: delta-rs's version 0, raw appends after it, and a
    checkpoint at the newest multiple of 100 (delta-rs's default interval)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(root), pa.table({"x": pa.array([0], pa.int64())}))
    log = root / "_delta_log"
    now = int(time.time() * 1000)
    for version in range(1, versions):
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE",
                            "percolake.txn_id": uuid.uuid4().hex}},
            {"txn": {"appId": "percolake:older:g0", "version": version, "lastUpdated": now}},
            {"add": {"path": f"part-{version:06d}.parquet", "size": 500, "partitionValues": {},
                     "modificationTime": now, "dataChange": True,
                     "stats": json.dumps({"numRecords": 1})}}]
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))
    checkpoint = (versions - 1) // 100 * 100
    if checkpoint:
        DeltaTable(str(root), version=checkpoint).create_checkpoint()


def run_age(root: Path, versions: int, batches: int, kept: bool, first_batch: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from percolake.lake import delta_commit
    from percolake.lake.table_cache import TableCache
    from percolake.lake.write_check import LayoutCache, WriteChecker
    from percolake.records import AddFileRecord, TableWriteRecord, WriteMode

    cache = TableCache() if kept else None
    checker = WriteChecker(LayoutCache(cache.entries)) if cache else WriteChecker()
    table = f"file://{root}"
    phases: dict[str, list[float]] = {"check": [], "apply": [], "report": [], "total": []}
    reads0 = cache.entries.reads if cache else 0
    for batch in range(first_batch, first_batch + batches):
        txn_id = uuid.uuid4().hex
        folder = root / "_percolake" / txn_id
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": pa.array([batch], pa.int64())}), folder / "part-0.parquet")
        add = AddFileRecord(f"_percolake/{txn_id}/part-0.parquet",
                            (folder / "part-0.parquet").stat().st_size, {}, 0,
                            json.dumps({"numRecords": 1}))
        write = TableWriteRecord(table, WriteMode.APPEND, (add,), json.dumps(SCHEMA))
        t0 = time.perf_counter()
        checker.check(write)
        t1 = time.perf_counter()
        version = delta_commit.apply_table_write(
            write, app_id=APP_ID, app_version=batch, txn_id=txn_id, commit_ts=batch,
            tables=cache.tables if cache else None)
        t2 = time.perf_counter()
        verified = (cache.entries.is_commit_of(table, version, txn_id, APP_ID, batch) if cache
                    else delta_commit.is_commit_of(table, version, txn_id, APP_ID, batch))
        t3 = time.perf_counter()
        assert verified, (version, txn_id)
        for name, seconds in (("check", t1 - t0), ("apply", t2 - t1), ("report", t3 - t2),
                              ("total", t3 - t0)):
            phases[name].append(seconds * 1e3)
    return {"versions": versions, "kept": kept,
            **{f"{name}_ms": statistics.median(values) for name, values in phases.items()},
            "entries_parsed_per_batch": ((cache.entries.reads - reads0) / batches
                                         if cache else float("nan")),
            "delta_loads": cache.tables.loads if cache else batches,
            "delta_advances": cache.tables.advances if cache else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="ages 10, 100, 1,000 (~1 min)")
    parser.add_argument("--versions", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--batches", type=int, default=20, help="batches measured per age")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-append", action="store_true", help="do not touch benchmarks.md")
    args = parser.parse_args()
    ages = args.versions or ([10, 100, 1000] if args.quick else [10, 100, 1000, 10000])
    info = bl.machine_info()
    print(f"bench_table_state: {bl.machine_line(info)}", flush=True)
    pairs: list[tuple[dict, dict]] = []
    with tempfile.TemporaryDirectory(prefix="percolake-table-state-") as work:
        for versions in ages:
            root = Path(work) / f"t{versions}"
            started = time.perf_counter()
            build_table(root, versions)
            print(f"table at {versions:,} versions built in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            kept = run_age(root, versions, args.batches, True, versions)
            again = run_age(root, versions + args.batches, args.batches, False,
                            versions + args.batches)
            pairs.append((kept, again))
            print(f"{versions:>6,} versions: kept {kept['total_ms']:.2f} ms/batch, reloaded "
                  f"{again['total_ms']:.2f} ms/batch", flush=True)
    table_rows = []
    for versions, (kept, again) in zip(ages, pairs, strict=True):
        table_rows.append([versions, kept["check_ms"], kept["apply_ms"], kept["report_ms"],
                           kept["total_ms"], kept["entries_parsed_per_batch"],
                           again["apply_ms"], again["report_ms"], again["total_ms"],
                           again["total_ms"] / kept["total_ms"]])
    first, last = pairs[0][0], pairs[-1][0]
    path_first = first["check_ms"] + first["report_ms"]
    path_last = last["check_ms"] + last["report_ms"]
    growth = path_last / path_first
    body = "\n".join([
        f"One local table, {args.batches} one-file appends measured at each age; median ms per "
        "batch of the coordinator's log work (write check, a roll-forward's apply, the applied "
        "report's check), with the table state kept (what the daemon runs) and with the log "
        "loaded again for each apply (before):\n",
        bl.table(["versions", "kept: check", "kept: apply", "kept: report", "kept: total",
                  "kept: entries parsed / batch", "reloaded: apply", "reloaded: report",
                  "reloaded: total", "reloaded ÷ kept"], table_rows),
        f"\nThe daemon's own batch path (write check + report check, kept state): "
        f"{path_last:.3f} ms at {last['versions']:,} versions against {path_first:.3f} at "
        f"{first['versions']:,} (× {growth:.2f}; goal: flat). A roll-forward's apply (an append: "
        f"a log entry of percolake's own on the kept table) {last['apply_ms']:.1f} against "
        f"{first['apply_ms']:.1f} ms (× {last['apply_ms'] / first['apply_ms']:.2f}); each kept "
        f"table was loaded once and advanced {last['delta_advances']} times at the last age.\n"])
    result = {"machine": info, "batches": args.batches,
              "ages": [{"kept": kept, "reloaded": again} for kept, again in pairs],
              "batch_path_growth_factor": growth}
    bl.publish("bench_table_state", info, body, result, args.json, not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
