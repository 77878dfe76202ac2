"""``scripts/_coordinator_load.py``, the load generator of ``bench_coordinator.py``: what it
makes ahead and what it renders without a JSON encoder is still what the daemon must see (the
files its Commit stats, the log entries the applied report is checked against)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from deltalake import DeltaTable

from percolake.lake.table_cache import LogEntries
from percolake.records import delta_app_id
from percolake.v1 import coordinator_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def _load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coordinator_load",
                                                  ROOT / "scripts" / "_coordinator_load.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


load = _load_module()


def test_a_transactions_files_and_log_entries_are_what_the_daemon_and_delta_rs_read(
        tmp_path: Path) -> None:
    warehouse = str(tmp_path)
    pipeline = load.LoadPipeline(None, pb, "2rpc", "bench-p", 1, "q", warehouse,
                                 load.DataFiles(warehouse, 3))
    pipeline.prepare(2, until=time.monotonic() + 60, prepared_from=0.0)
    entries = LogEntries()
    app_id = delta_app_id("bench-p", 0)
    for batch_id, txn_id in enumerate(("a" * 32, "b" * 32)):
        paths = pipeline._place_files(txn_id)
        assert not pipeline.unprepared  # made ahead, moved in by the rename
        mtime_ms = 1_700_000_000_000 + batch_id
        stats = load.file_stats(batch_id)
        version = pipeline._write_log_entries(txn_id, batch_id, paths, mtime_ms, stats)
        assert version == batch_id
        for table, table_paths in zip(pipeline.tables, paths, strict=True):
            assert [p.rsplit("/", 1)[0] for p in table_paths] == [f"_percolake/{txn_id}"] * 3
            for path in table_paths:
                assert os.stat(f"{table}/{path}").st_size == load.DATA_FILE_SIZE
            assert entries.is_commit_of(table, version, txn_id, app_id, batch_id)
            assert not entries.is_commit_of(table, version, "c" * 32, app_id, batch_id)
            lines = Path(f"{table}/_delta_log/{version:020d}.json").read_text().splitlines()
            now_ms = json.loads(lines[0])["commitInfo"]["timestamp"]
            actions = [{"commitInfo": {"timestamp": now_ms, "operation": "WRITE",
                                       "percolake.txn_id": txn_id}},
                       {"txn": {"appId": app_id, "version": batch_id, "lastUpdated": now_ms}}]
            if version == 0:
                assert [next(iter(json.loads(line))) for line in lines[2:4]] == [
                    "protocol", "metaData"]
                lines = lines[:2] + lines[4:]
            actions += [{"add": {"path": path, "size": load.DATA_FILE_SIZE,
                                 "partitionValues": {}, "modificationTime": mtime_ms,
                                 "dataChange": True, "stats": stats}} for path in table_paths]
            assert lines == [json.dumps(action) for action in actions]  # byte for byte
            assert json.loads(stats) == {"numRecords": 1000, "minValues": {"id": batch_id * 1000},
                                         "maxValues": {"id": batch_id * 1000 + 999},
                                         "nullCount": {"id": 0}}
    for table in pipeline.tables:  # delta-rs reads the table the entries make
        delta = DeltaTable(table)
        assert delta.version() == 1
        assert len(delta.file_uris()) == 6
