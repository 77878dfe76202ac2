"""In-memory store for unit tests: same semantics as SQLite, nothing survives the process."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence

from coordinator.auth_records import AclRecord, TokenRecord
from coordinator.store.base import (
    UNFINISHED_STATES,
    IndexView,
    Lease,
    LeaseRecord,
    ReadEdge,
    Store,
    TableCommit,
    TableWriter,
    TxnQuery,
)
from coordinator.store.schema import TXN_IDENTITY_COLUMNS
from percolake.errors import StoreConflict
from percolake.records import PipelineRecord, QuarantineRecord, TxnRecord
from percolake.states import COMMITTED_STATES


class MemoryStore(Store):
    """One process's store; its leader lease runs on ``time.monotonic`` and fences nothing
    (every user of it is in this process)."""

    supports_leases = True

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._lease = Lease(holder="", epoch=0, address="", remaining_s=0.0)
        self._lease_expires = time.monotonic() - 1.0  # expired: never held
        self._fencing_epoch: int | None = None
        self._high_water = 0
        self._pipelines: dict[str, dict] = {}
        self._txns: dict[str, dict] = {}
        self._table_commits: dict[tuple[str, int], TableCommit] = {}
        self._floor_ts = 0
        self._tokens: dict[str, TokenRecord] = {}
        self._acl: dict[tuple[str, str, str, str], AclRecord] = {}
        self._writers: dict[str, TableWriter] = {}
        self._read_edges: dict[tuple[str, str], ReadEdge] = {}
        self._leases: dict[str, LeaseRecord] = {}
        self._quarantines: dict[tuple[str, str], QuarantineRecord] = {}
        self._depth = 0

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            saved = copy.deepcopy((self._high_water, self._pipelines, self._txns,
                                   self._table_commits, self._floor_ts, self._tokens,
                                   self._acl, self._writers, self._read_edges, self._leases))
            self._depth = 1
            try:
                yield
            except BaseException:
                (self._high_water, self._pipelines, self._txns, self._table_commits,
                 self._floor_ts, self._tokens, self._acl, self._writers,
                 self._read_edges, self._leases) = saved
                raise
            finally:
                self._depth = 0

    def close(self) -> None:
        pass

    def read_lease(self) -> Lease:
        with self._lock:
            remaining = self._lease_expires - time.monotonic()
            return Lease(self._lease.holder, self._lease.epoch, self._lease.address, remaining)

    def try_acquire_lease(self, holder: str, address: str, lease_s: float) -> int | None:
        with self._lock:
            now = time.monotonic()
            if self._lease_expires > now and self._lease.holder != holder:
                return None
            self._lease = Lease(holder, self._lease.epoch + 1, address, lease_s)
            self._lease_expires = now + lease_s
            self._fencing_epoch = self._lease.epoch
            return self._lease.epoch

    def renew_lease(self, epoch: int, lease_s: float) -> bool:
        with self._lock:
            if self._lease.epoch != epoch:
                return False
            self._lease_expires = time.monotonic() + lease_s
            return True

    def release_lease(self, epoch: int) -> None:
        with self._lock:
            if self._lease.epoch == epoch:
                self._lease_expires = time.monotonic()
            if self._fencing_epoch == epoch:
                self._fencing_epoch = None

    @property
    def fencing_epoch(self) -> int | None:
        return self._fencing_epoch

    def read_timestamp_high_water(self) -> int:
        return self._high_water

    def write_timestamp_high_water(self, value: int) -> None:
        with self._lock:
            self._high_water = max(self._high_water, value)

    def load_pipelines(self) -> list[PipelineRecord]:
        with self._lock:
            return [PipelineRecord.from_row(r) for r in self._pipelines.values()]

    def insert_pipeline(self, record: PipelineRecord) -> None:
        with self._lock:
            if record.pipeline_id in self._pipelines:
                raise StoreConflict(f"pipeline {record.pipeline_id} exists")
            self._pipelines[record.pipeline_id] = record.to_row()

    def update_pipeline(self, record: PipelineRecord) -> None:
        with self._lock:
            row = self._pipelines.get(record.pipeline_id)
            if row is None or row["row_version"] != record.row_version:
                raise StoreConflict(f"pipeline {record.pipeline_id} changed underneath")
            record.row_version += 1
            self._pipelines[record.pipeline_id] = record.to_row()

    def insert_txn(self, record: TxnRecord) -> None:
        with self._lock:
            if record.txn_id in self._txns:
                raise StoreConflict(f"transaction {record.txn_id} exists")
            self._txns[record.txn_id] = record.to_row()

    def update_txn(self, record: TxnRecord) -> None:
        with self._lock:
            row = self._txns.get(record.txn_id)
            if row is None or row["row_version"] != record.row_version or any(
                    row[c] != getattr(record, c) for c in TXN_IDENTITY_COLUMNS):
                raise StoreConflict(f"transaction {record.txn_id} changed underneath (or its "
                                    f"identity differs: {', '.join(TXN_IDENTITY_COLUMNS)})")
            record.row_version += 1
            self._txns[record.txn_id] = record.to_row()

    def get_txn(self, txn_id: str) -> TxnRecord | None:
        with self._lock:
            row = self._txns.get(txn_id)
            return TxnRecord.from_row(row) if row else None

    def _all(self) -> list[TxnRecord]:
        return sorted((TxnRecord.from_row(r) for r in self._txns.values()),
                      key=lambda t: t.start_ts)

    def attempts_of(self, pipeline_id: str, generation: int, batch_id: int) -> list[TxnRecord]:
        with self._lock:
            return [t for t in self._all() if (t.pipeline_id, t.generation, t.batch_id)
                    == (pipeline_id, generation, batch_id)]

    def newest_committed_batch(self, pipeline_id: str, generation: int) -> int | None:
        with self._lock:
            return max((t.batch_id for t in self._all() if t.pipeline_id == pipeline_id
                        and t.generation == generation and t.state in COMMITTED_STATES),
                       default=None)

    def unfinished_txns(self) -> list[TxnRecord]:
        with self._lock:
            return [t for t in self._all() if t.state in UNFINISHED_STATES]

    def list_txns(self, query: TxnQuery) -> list[TxnRecord]:
        def keep(t: TxnRecord) -> bool:
            return (
                (not query.pipeline_id or t.pipeline_id == query.pipeline_id)
                and (query.generation is None or t.generation == query.generation)
                and (not query.states or t.state in query.states)
                and (query.batch_id is None or t.batch_id == query.batch_id)
                and t.created_ms >= query.created_after_ms
                and (not query.created_before_ms or t.created_ms < query.created_before_ms)
                and t.start_ts > query.after_start_ts
            )

        with self._lock:
            return [t for t in self._all() if keep(t)][: query.limit]

    def add_table_commit(self, commit: TableCommit) -> None:
        with self._lock:
            key = (commit.table, commit.commit_ts)
            if key in self._table_commits:
                raise StoreConflict(f"table commit {key} exists")
            self._table_commits[key] = commit

    def set_table_commit_version(self, table: str, commit_ts: int, delta_version: int) -> None:
        with self._lock:
            old = self._table_commits.get((table, commit_ts))
            if old is None:
                raise StoreConflict(f"no table commit {(table, commit_ts)}")
            self._table_commits[(table, commit_ts)] = dataclasses.replace(
                old, delta_version=delta_version)

    def _commits_of(self, table: str, max_commit_ts: int) -> list[TableCommit]:
        return sorted((c for (t, ts), c in self._table_commits.items()
                       if t == table and ts <= max_commit_ts), key=lambda c: c.commit_ts)

    def table_commit_at(self, table: str, max_commit_ts: int) -> TableCommit | None:
        with self._lock:
            commits = self._commits_of(table, max_commit_ts)
            return commits[-1] if commits else None

    def table_commits_at(self, tables: Sequence[str], max_commit_ts: int) -> IndexView:
        with self._lock:
            return IndexView(self._floor_ts,
                             {t: self.table_commit_at(t, max_commit_ts) for t in tables})

    def unapplied_table_commits(self, table: str, max_commit_ts: int) -> list[TableCommit]:
        with self._lock:
            return [c for c in self._commits_of(table, max_commit_ts) if c.delta_version is None]

    def _keyed(self, table: str, by_input_barrier: bool) -> list[tuple[int, TableCommit]]:
        """(key, commit) of the table's commits in commit_ts order."""
        return [(c.barrier(by_input_barrier), c) for c in self._commits_of(table, 2**63)]

    def _live(self, table: str, by_input_barrier: bool, as_of_ts: int | None,
              changes: bool) -> list[tuple[int, TableCommit]]:
        return [(key, c) for key, c in self._keyed(table, by_input_barrier)
                if c.live_at(as_of_ts) and not (changes and c.restore)]

    def table_commits_in_range(self, table: str, after: int, upto: int,
                               by_input_barrier: bool,
                               as_of_ts: int | None = None) -> list[TableCommit]:
        with self._lock:
            return [c for key, c in self._live(table, by_input_barrier, as_of_ts, True)
                    if after < key <= upto]

    def table_commit_at_barrier(self, table: str, barrier: int, by_input_barrier: bool,
                                as_of_ts: int | None = None) -> TableCommit | None:
        with self._lock:
            found = [c for key, c in self._live(table, by_input_barrier, as_of_ts, False)
                     if key <= barrier]
            return found[-1] if found else None

    def first_table_commit_after(self, table: str, after: int, by_input_barrier: bool,
                                 as_of_ts: int | None = None) -> TableCommit | None:
        with self._lock:
            return next((c for key, c in self._live(table, by_input_barrier, as_of_ts, True)
                         if key > after), None)

    def last_input_barrier(self, pipeline_id: str, generation: int) -> int:
        with self._lock:
            return max((t["input_barrier"] for t in self._txns.values()
                        if t["pipeline_id"] == pipeline_id and t["generation"] == generation
                        and t["state"] in ("COMMITTED", "APPLIED")), default=0)

    def newest_commit_at_or_before(self, pipeline_id: str, max_commit_ts: int) -> TxnRecord | None:
        with self._lock:
            return max((t for t in self._all() if t.pipeline_id == pipeline_id
                        and t.state in COMMITTED_STATES and 0 < t.commit_ts <= max_commit_ts),
                       key=lambda t: t.commit_ts, default=None)

    def first_unapplied_input_barrier(self, table: str,
                                      as_of_ts: int | None = None) -> int | None:
        with self._lock:
            return min((c.barrier(True) for c in self._table_commits.values()
                        if c.table == table and c.delta_version is None
                        and c.live_at(as_of_ts)), default=None)

    def newest_restore(self, table: str, as_of_ts: int | None = None) -> int:
        with self._lock:
            return max((c.commit_ts for c in self._table_commits.values()
                        if c.table == table and c.restore
                        and (as_of_ts is None or c.commit_ts <= as_of_ts)), default=0)

    def supersede_table_commits(self, table: str, revision_ts: int,
                                above_input_barrier: int) -> int:
        with self._lock:
            doomed = [key for key, c in self._table_commits.items()
                      if c.table == table and c.commit_ts < revision_ts and not c.superseded_ts
                      and c.input_barrier > above_input_barrier]
            for key in doomed:
                self._table_commits[key] = dataclasses.replace(
                    self._table_commits[key], superseded_ts=revision_ts)
            return len(doomed)

    def insert_lease(self, lease: LeaseRecord) -> None:
        with self._lock:
            if lease.lease_id in self._leases:
                raise StoreConflict(f"lease {lease.lease_id} exists")
            self._leases[lease.lease_id] = lease

    def delete_lease(self, lease_id: str) -> bool:
        with self._lock:
            return self._leases.pop(lease_id, None) is not None

    def load_leases(self) -> list[LeaseRecord]:
        with self._lock:
            return [self._leases[k] for k in sorted(self._leases)]

    def delete_expired_leases(self, now_ms: int) -> int:
        with self._lock:
            expired = [k for k, lease in self._leases.items() if lease.expires_ms <= now_ms]
            for key in expired:
                del self._leases[key]
            return len(expired)

    def retention_floor_ts(self) -> int:
        return self._floor_ts

    def prune(self, cutoff_ms: int, floor_ts: int, limit: int,
              keep: frozenset[str] = frozenset()) -> tuple[int, int]:
        with self.batch():
            newest: dict[tuple[str, int], int] = {}
            newest_with_input: dict[tuple[str, int], int] = {}  # ... with an input barrier
            for t in self._txns.values():
                if t["state"] in ("APPLIED", "COMMITTED"):
                    key = (t["pipeline_id"], t["generation"])
                    newest[key] = max(newest.get(key, -1), t["batch_id"])
                    if t["input_barrier"]:
                        newest_with_input[key] = max(newest_with_input.get(key, -1),
                                                     t["batch_id"])
            doomed = [
                t["txn_id"] for t in sorted(self._txns.values(), key=lambda r: r["start_ts"])
                if t["state"] in ("APPLIED", "ABORTED") and t["updated_ms"] < cutoff_ms
                and t["created_ms"] < cutoff_ms and t["txn_id"] not in keep
                and not (t["state"] == "APPLIED" and t["batch_id"] in (
                    newest[(t["pipeline_id"], t["generation"])],
                    newest_with_input.get((t["pipeline_id"], t["generation"]))))
            ][:limit]
            for txn_id in doomed:
                del self._txns[txn_id]
            base: dict[str, int] = {}
            for table, ts in self._table_commits:
                if ts <= floor_ts:
                    base[table] = max(base.get(table, -1), ts)
            old = [key for key, c in sorted(self._table_commits.items())
                   if key[1] < base.get(key[0], -1) and c.delta_version is not None][:limit]
            for key in old:
                del self._table_commits[key]
            self._floor_ts = max(self._floor_ts, floor_ts)
            return len(doomed), len(old)

    def load_tokens(self) -> list[TokenRecord]:
        with self._lock:
            return [self._tokens[k] for k in sorted(self._tokens)]

    def insert_token(self, record: TokenRecord) -> None:
        with self._lock:
            if record.token_id in self._tokens:
                raise StoreConflict(f"token {record.token_id} exists")
            self._tokens[record.token_id] = record

    def revoke_token(self, token_id: str, revoked_ms: int) -> TokenRecord | None:
        with self._lock:
            token = self._tokens.get(token_id)
            if token is not None and token.live:
                token = self._tokens[token_id] = dataclasses.replace(token,
                                                                     revoked_ms=revoked_ms)
            return token

    def load_acl(self) -> list[AclRecord]:
        with self._lock:
            return [self._acl[k] for k in sorted(self._acl)]

    def insert_acl(self, entry: AclRecord) -> bool:
        with self._lock:
            if entry.key in self._acl:
                return False
            self._acl[entry.key] = entry
            return True

    def delete_acl(self, entry: AclRecord) -> bool:
        with self._lock:
            return self._acl.pop(entry.key, None) is not None

    def load_table_writers(self) -> list[TableWriter]:
        with self._lock:
            return [self._writers[t] for t in sorted(self._writers)]

    def insert_table_writer(self, writer: TableWriter) -> None:
        with self._lock:
            if writer.table in self._writers:
                raise StoreConflict(f"table {writer.table} has an owner")
            self._writers[writer.table] = writer

    def load_read_edges(self) -> list[ReadEdge]:
        with self._lock:
            return [self._read_edges[k] for k in sorted(self._read_edges)]

    def insert_read_edge(self, edge: ReadEdge) -> bool:
        with self._lock:
            key = (edge.pipeline_id, edge.table)
            if key in self._read_edges:
                return False
            self._read_edges[key] = edge
            return True

    def load_quarantines(self) -> list[QuarantineRecord]:
        with self._lock:
            return [dataclasses.replace(q) for q in sorted(
                self._quarantines.values(), key=lambda q: (q.table, q.quarantined_ms, q.txn_id))]

    def put_quarantine(self, record: QuarantineRecord) -> None:
        with self._lock:
            self._quarantines[(record.table, record.txn_id)] = dataclasses.replace(record)
