"""The transaction coordinator: Percolator's primary, fencing, table holds, snapshots.

No gRPC here. Every state change follows one pattern (as Kafka's transaction coordinator does):
prepare a copy of the record, persist it (compare-and-set in the store, durable before return),
and only then apply it in memory and answer. Expected refusals raise the named errors of
``percolake.errors``; a broken invariant raises AssertionError.

Concurrency: one lock guards the in-memory state; Delta I/O (roll-forward) and file deletion run
outside it. A table is *held* by the transaction that declared it until that transaction aborts
or reports the table applied, so per table at most one committed write is ever unapplied and
Delta versions follow commit_ts order (I7).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from coordinator import validation
from coordinator.oracle import LOGICAL_BITS, TimestampOracle, wall_ms_of
from coordinator.store.base import Store, TableCommit, TxnQuery
from percolake.errors import (
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Fenced,
    InvalidArgument,
    NotFound,
    QueryIdMismatch,
    ResourceExhausted,
    TransactionAborted,
)
from percolake.failpoints import fail_point
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.warehouse import Warehouse, write_location
from percolake.records import (
    PipelineRecord,
    ResetRecord,
    TableEntry,
    TableWriteRecord,
    TxnRecord,
    delta_app_id,
)
from percolake.states import COMMITTED_STATES, LIVE_STATES, TxnState, check_transition

log = logging.getLogger("percolake.coordinator")

Applier = Callable[..., int]
RESOLVE_CACHE_S = 1.0
SWEEP_INTERVAL_S = 30.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class CoordinatorConfig:
    """Tunables of the coordinator; the CLI exposes each as a flag."""

    warehouse_roots: list[str]
    txn_timeout_s: float = 120.0
    conflict_wait_s: float = 10.0
    snapshot_wait_s: float = 30.0
    roll_forward_after_s: float = 10.0
    resolver_interval_s: float = 1.0
    max_intent_bytes: int = 16 * 1024 * 1024
    # APPLIED and ABORTED transactions older than this are pruned (0: keep everything); see
    # prune_history for what is always kept.
    retention_hours: float = 168.0
    retention_interval_s: float = 600.0


@dataclass
class Snapshot:
    snapshot_ts: int
    versions: dict[str, int | None]  # canonical table -> Delta version (None: never written)


class TransactionCoordinator:
    """The coordinator's core: every RPC of the service is one method here."""

    def __init__(
        self,
        store: Store,
        config: CoordinatorConfig,
        applier: Applier | None = None,
        remove_files: Callable[[str], None] = remove_attempt_files,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic`` drives transaction expiry only; waits always use real time."""
        self.store = store
        self.config = config
        self.warehouse = Warehouse(config.warehouse_roots)
        self.oracle = TimestampOracle(store)
        self._applier = applier
        self._remove_files = remove_files
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._table_apply_locks: dict[str, threading.Lock] = {}
        self._pipelines = {p.pipeline_id: p for p in store.load_pipelines()}
        self._unfinished: dict[str, TxnRecord] = {}
        self._deadlines: dict[str, float] = {}
        self._timeouts: dict[str, float] = {}
        self._holders: dict[str, str] = {}
        self._pending_cleanup: set[str] = set()
        self._resolved: dict[str, tuple[str, float]] = {}
        for txn in store.unfinished_txns():
            self._track(txn)
        self._stop = threading.Event()
        self._resolver: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start_background(self) -> None:
        """Starts the resolver: expires stale attempts, rolls forward orphaned commits (I4)."""
        self._resolver = threading.Thread(target=self._resolve_loop, name="resolver", daemon=True)
        self._resolver.start()

    def close(self) -> None:
        self._stop.set()
        if self._resolver is not None:
            self._resolver.join(timeout=30)

    # ------------------------------------------------------------------ pipelines

    def register_pipeline(self, pipeline_id: str, query_id: str | None) -> PipelineRecord:
        """Issues a new epoch (fencing every older driver) and binds the query id on first use."""
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_query_id(query_id)
        to_clean: list[TxnRecord] = []
        with self._lock:
            current = self._pipelines.get(pipeline_id)
            pipeline = current.copy() if current else self._new_pipeline(pipeline_id)
            if query_id is None and pipeline.query_id:
                raise FailedPrecondition(
                    f"pipeline {pipeline_id!r} is bound to Spark query id {pipeline.query_id}; "
                    "register with that query id"
                )
            self._check_query_id(pipeline, query_id)
            pipeline.epoch += 1
            if query_id and not pipeline.query_id:
                pipeline.query_id = query_id
            stale = [t for t in self._unfinished.values()
                     if t.pipeline_id == pipeline_id and t.state in LIVE_STATES]
            aborted = [self._prepare_abort(t, f"fenced by epoch {pipeline.epoch}") for t in stale]
            with self.store.batch():
                self._persist_pipeline(pipeline, current)
                for txn in aborted:
                    self.store.update_txn(txn)
            self._pipelines[pipeline_id] = pipeline
            for txn in aborted:
                self._track(txn)
            to_clean.extend(aborted)
            self._changed.notify_all()
        self._clean_up(to_clean)
        log.info("pipeline registered", extra={"pipeline_id": pipeline_id,
                                               "epoch": pipeline.epoch, "query_id": query_id})
        return pipeline.copy()

    def get_pipeline(self, pipeline_id: str) -> PipelineRecord:
        validation.check_id("pipeline_id", pipeline_id)
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id)
            if pipeline is None:
                raise NotFound(f"no pipeline {pipeline_id!r}")
            return pipeline.copy()

    def reset_pipeline(
        self, pipeline_id: str, reason: str, expected_generation: int | None,
        require_idle: bool = False,
    ) -> tuple[PipelineRecord, bool, list[str]]:
        """Starts a new generation: live attempts aborted, epoch bumped, query id unbound.

        With ``require_idle`` it refuses while the current generation is active: a live
        transaction, or a commit within the transaction timeout.

        Returns:
            The pipeline after the call, whether this call changed it, and the aborted txn ids.
        """
        validation.check_id("pipeline_id", pipeline_id)
        if not reason or not reason.strip():
            raise InvalidArgument("reason must say why the pipeline is reset (it is recorded)")
        validation.check_text("reason", reason, 1000)
        if expected_generation is not None and expected_generation < 0:
            raise InvalidArgument(f"generation must be >= 0, got {expected_generation}")
        with self._lock:
            current = self._pipelines.get(pipeline_id)
            if current is None:
                raise NotFound(f"no pipeline {pipeline_id!r}: nothing to reset")
            if expected_generation is not None and expected_generation != current.generation:
                last = current.resets[-1] if current.resets else None
                if (last is not None and last.expected_generation == expected_generation
                        and last.to_generation == current.generation and last.reason == reason):
                    return current.copy(), False, []
                raise FailedPrecondition(
                    f"pipeline {pipeline_id!r} is at generation {current.generation}, not "
                    f"{expected_generation}: it was reset meanwhile; check with GetPipeline"
                )
            if require_idle:
                self._check_idle(current)
            pipeline = current.copy()
            pipeline.resets.append(ResetRecord(
                from_generation=current.generation, to_generation=current.generation + 1,
                reason=reason, reset_ms=_now_ms(), previous_query_id=current.query_id,
                expected_generation=expected_generation,
            ))
            pipeline.generation += 1
            pipeline.epoch += 1
            pipeline.query_id = ""
            pipeline.last_commit_ms = 0
            stale = [t for t in self._unfinished.values()
                     if t.pipeline_id == pipeline_id and t.state in LIVE_STATES]
            aborted = [self._prepare_abort(t, f"pipeline reset: {reason}") for t in stale]
            with self.store.batch():
                self.store.update_pipeline(pipeline)
                for txn in aborted:
                    self.store.update_txn(txn)
            self._pipelines[pipeline_id] = pipeline
            for txn in aborted:
                self._track(txn)
            self._changed.notify_all()
        self._clean_up(aborted)
        log.warning("pipeline reset", extra={"pipeline_id": pipeline_id,
                                             "generation": pipeline.generation, "reason": reason})
        return pipeline.copy(), True, [t.txn_id for t in aborted]

    # ------------------------------------------------------------------ transactions

    def open_transaction(
        self,
        pipeline_id: str,
        batch_id: int,
        epoch: int | None = None,
        query_id: str | None = None,
        tables: Iterable[str] = (),
        timeout_ms: int = 0,
    ) -> tuple[TxnRecord, bool]:
        """Opens a new attempt of (pipeline, generation, batch), or answers the committed one.

        Returns:
            The transaction and whether the batch was already committed (then nothing is opened).
        """
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_non_negative("batch_id", batch_id)
        validation.check_epoch(epoch)
        validation.check_query_id(query_id)
        if timeout_ms < 0:
            raise InvalidArgument(f"timeout_ms must be >= 0, got {timeout_ms}")
        canonical = self._resolve_tables(tables)
        start_ts = self.oracle.next()
        with self._lock:
            current = self._pipelines.get(pipeline_id)
            pipeline = current.copy() if current else self._new_pipeline(pipeline_id)
            self._check_caller(pipeline, epoch, query_id)
            attempts = self.store.attempts_of(pipeline_id, pipeline.generation, batch_id)
            committed = [a for a in attempts if a.state in COMMITTED_STATES]
            if committed:
                assert len(committed) == 1, f"batch committed twice: {committed}"
                return self._fresh(committed[0]), True
            if query_id and not pipeline.query_id:
                pipeline.query_id = query_id
            superseded = [self._prepare_abort(self._unfinished[a.txn_id],
                                              f"superseded by attempt {len(attempts) + 1}")
                          for a in attempts if a.txn_id in self._unfinished
                          and self._unfinished[a.txn_id].state in LIVE_STATES]
            now = _now_ms()
            txn = TxnRecord(
                txn_id=uuid.uuid4().hex, pipeline_id=pipeline_id,
                generation=pipeline.generation, batch_id=batch_id, attempt=len(attempts) + 1,
                epoch=pipeline.epoch if epoch is not None else 0, query_id=query_id or "",
                state=TxnState.OPEN, start_ts=start_ts, created_ms=now, updated_ms=now,
            )
            # Free tables are declared in the attempt's first durable write; held ones go
            # through _declare below (roll-forward, expiry or a bounded wait).
            for table in self._free_tables(canonical, {old.txn_id for old in superseded}):
                txn.tables[table] = TableEntry(table, write_location(table, txn.txn_id))
            with self.store.batch():
                if current is None or pipeline.query_id != current.query_id:
                    self._persist_pipeline(pipeline, current)
                for old in superseded:
                    self.store.update_txn(old)
                self.store.insert_txn(txn)
            self._pipelines[pipeline_id] = pipeline
            for old in superseded:
                self._track(old)
            self._track(txn, timeout_ms)
            self._changed.notify_all()
        self._clean_up(superseded)
        fail_point("after-open")
        if len(txn.tables) < len(canonical):
            self._declare(txn.txn_id, epoch, canonical)
            txn = self.get_transaction(txn.txn_id)
        return self._fresh(txn), False

    def declare_tables(self, txn_id: str, epoch: int | None, tables: Iterable[str]) -> TxnRecord:
        """Durably records that the attempt may write these tables, taking each table's hold.

        Raises:
            Conflict: a table stayed held by another live transaction for conflict_wait_s.
        """
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        self._declare(txn_id, epoch, self._resolve_tables(tables))
        return self.get_transaction(txn_id)

    def _declare(self, txn_id: str, epoch: int | None, canonical: list[str]) -> None:
        """Takes the holds of already canonical tables: every free one in one durable write,
        then each held one as ``_acquire_table`` resolves it."""
        deadline = time.monotonic() + self.config.conflict_wait_s
        self._acquire_free_tables(txn_id, epoch, canonical)
        for table in canonical:
            self._acquire_table(txn_id, epoch, table, deadline)

    def prewrite(self, txn_id: str, epoch: int | None,
                 writes: list[TableWriteRecord]) -> TxnRecord:
        """Records durable write intents; each table is declared first if it was not."""
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        if not writes:
            raise InvalidArgument("prewrite needs at least one table write")
        checked = self._check_writes(txn_id, writes)
        with self._lock:
            txn = self._live_txn_for_update(txn_id, epoch, allow_committed=True)
            if self._holds_writes(txn, checked):
                return self._fresh(txn)  # a retry: already recorded, change nothing
            if txn.state in COMMITTED_STATES:
                raise FailedPrecondition(f"transaction {txn_id} is already committed")
            self._refuse_different_prewrite(txn, checked)  # before declaring anything
        self._declare(txn_id, epoch, [w.table for w in checked])
        with self._lock:
            txn = self._live_txn_for_update(txn_id, epoch)
            updated = self._with_writes(txn, checked)
            check_transition(txn.state, TxnState.PREWRITTEN)
            updated.state = TxnState.PREWRITTEN
            self.store.update_txn(updated)
            self._track(updated)
            return self._fresh(updated)

    def commit(
        self,
        txn_id: str,
        epoch: int | None,
        tables: Iterable[str] = (),
        writes: list[TableWriteRecord] | None = None,
        release_unwritten: bool = False,
    ) -> TxnRecord:
        """The commit point: one durable write makes every table of the transaction visible.

        Args:
            txn_id: the attempt.
            epoch: the caller's epoch (fencing), None for an unregistered pipeline.
            tables: every table the caller wrote; each must have its prewrite.
            writes: write intents recorded first, as a Prewrite would (prewrite + commit in
                one call).
            release_unwritten: declared tables without a write leave the transaction in the
                commit's durable write, and their attempt folders are deleted afterwards;
                without it such a table refuses the commit.
        """
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        named = self._resolve_tables(tables)
        checked: list[TableWriteRecord] = []
        if writes:
            checked = self._check_writes(txn_id, writes)
            with self._lock:
                txn = self._live_txn_for_update(txn_id, epoch, allow_committed=True)
                undeclared = any(w.table not in txn.tables for w in checked)
            if undeclared:  # a full prewrite first: it takes the missing holds, maybe waiting
                self.prewrite(txn_id, epoch, writes)
                checked = []
        released: list[TableEntry] = []
        with self._lock:
            txn = self._live_txn_for_update(txn_id, epoch, allow_committed=True)
            if txn.state in COMMITTED_STATES:
                if not self._holds_writes(txn, checked):
                    raise FailedPrecondition(f"transaction {txn_id} is already committed")
                return self._fresh(txn)  # idempotent: a retried commit answers the same
            if checked:  # the intents join the commit's own durable write
                txn = self._with_writes(txn, checked)
                check_transition(txn.state, TxnState.PREWRITTEN)
                txn.state = TxnState.PREWRITTEN
            missing = [t for t in named if t not in txn.tables or not txn.tables[t].prewritten]
            unwritten = [t for t, e in txn.tables.items() if not e.prewritten]
            if release_unwritten and not missing:
                released = [txn.tables[t] for t in unwritten]
                unwritten = []
            if missing or unwritten:
                if checked:  # the intents stay recorded, as a separate Prewrite would leave them
                    self.store.update_txn(txn)
                    self._track(txn)
                raise FailedPrecondition(
                    f"transaction {txn_id} cannot commit: no prewrite for "
                    f"{', '.join(sorted(set(missing) | set(unwritten)))}; prewrite or abort it"
                )
            fail_point("before-commit-durable")
            # Taken under the lock with its durable write, so a snapshot never sees a ts above
            # a commit that is not yet durable.
            commit_ts = self.oracle.next()
            updated = txn.copy()
            for entry in released:
                del updated.tables[entry.table]
            target = TxnState.COMMITTED if updated.tables else TxnState.APPLIED
            check_transition(txn.state, TxnState.COMMITTED)
            updated.state = target
            updated.commit_ts = commit_ts
            updated.updated_ms = _now_ms()
            pipeline = self._pipelines[txn.pipeline_id].copy()
            if pipeline.generation == txn.generation:
                pipeline.last_commit_ms = updated.updated_ms
            with self.store.batch():
                self.store.update_txn(updated)
                for table in updated.tables:
                    self.store.add_table_commit(TableCommit(table, commit_ts, txn_id, None))
                self.store.update_pipeline(pipeline)
            self._pipelines[pipeline.pipeline_id] = pipeline
            for entry in released:
                if self._holders.get(entry.table) == txn_id:
                    del self._holders[entry.table]
            self._track(updated)
            self._changed.notify_all()
        self.wait_durable()  # the servicer would wait too; C5 must come after the fsync
        self._remove_released(txn_id, released)
        fail_point("after-commit-durable-before-reply")
        log.info("committed", extra={"txn_id": txn_id, "commit_ts": commit_ts,
                                     "tables": len(updated.tables)})
        return self._fresh(updated)

    def abort(self, txn_id: str, epoch: int | None, reason: str = "") -> TxnRecord:
        """Aborts an OPEN or PREWRITTEN attempt and deletes its files; idempotent."""
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        validation.check_text("reason", reason, 1000)
        with self._lock:
            txn = self._get(txn_id)
            self._check_txn_caller(txn, epoch)
            if txn.state == TxnState.ABORTED:
                return self._fresh(txn)
            if txn.state in COMMITTED_STATES:
                raise FailedPrecondition(
                    f"transaction {txn_id} is committed (commit_ts {txn.commit_ts}): "
                    "a committed transaction is never aborted"
                )
            aborted = self._prepare_abort(txn, reason or "aborted by request")
            self.store.update_txn(aborted)
            self._track(aborted)
            self._changed.notify_all()
        self._clean_up([aborted])
        return self._fresh(aborted)

    def report_applied(self, txn_id: str, epoch: int | None,
                       versions: dict[str, int]) -> TxnRecord:
        """Records finished secondaries; the transaction is APPLIED once every table is."""
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        if not versions:
            raise InvalidArgument("report at least one table and its Delta version")
        canonical: dict[str, int] = {}
        for table, version in versions.items():
            validation.check_non_negative("delta_version", version)
            canonical[self._canonical(table)] = version
        with self._lock:
            txn = self._get(txn_id)
            self._check_txn_caller(txn, epoch)
            return self._fresh(self._record_applied(txn, canonical))

    def heartbeat(self, txn_id: str, epoch: int | None) -> tuple[TxnState, int]:
        """Extends an OPEN or PREWRITTEN transaction's deadline.

        Returns:
            The state and the milliseconds left before it expires (0 when not live).
        """
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        expired: list[TxnRecord] = []
        with self._lock:
            txn = self._get(txn_id)
            if txn.state in LIVE_STATES:
                self._check_txn_caller(txn, epoch)
                if self._deadlines[txn_id] <= self._monotonic():
                    expired.append(self._expire(txn))
                    txn = expired[-1]
                else:
                    timeout = self._timeouts[txn_id]
                    self._deadlines[txn_id] = self._monotonic() + timeout
                    return txn.state, int(timeout * 1000)
        self._clean_up(expired)
        return txn.state, 0

    def get_transaction(self, txn_id: str) -> TxnRecord:
        validation.check_id("txn_id", txn_id)
        with self._lock:
            return self._fresh(self._get(txn_id))

    def list_transactions(self, query: TxnQuery) -> list[TxnRecord]:
        if query.pipeline_id:
            validation.check_id("pipeline_id", query.pipeline_id)
        for name in ("generation", "batch_id"):
            value = getattr(query, name)
            if value is not None:
                validation.check_non_negative(name, value)
        return self.store.list_txns(query)

    # ------------------------------------------------------------------ snapshots

    def get_snapshot(
        self,
        tables: Iterable[str],
        as_of_ts: int | None = None,
        as_of_batch: tuple[str, int | None, int] | None = None,
        wait_s: float | None = None,
    ) -> Snapshot:
        """A snapshot_ts and, per table, the Delta version holding exactly the commits <= it.

        Committed-but-unapplied writes at or below snapshot_ts are rolled forward first (I1, I4).

        Raises:
            DeadlineExceeded: a roll-forward did not finish within the wait.
        """
        canonical = self._resolve_tables(tables)
        if not canonical:
            raise InvalidArgument("name at least one table")
        if as_of_ts is not None:
            validation.check_non_negative("as_of_ts", as_of_ts)
            with self._lock:
                newest = self.oracle.last
            if as_of_ts > newest:
                raise InvalidArgument(
                    f"as_of_ts {as_of_ts} is in the future (newest timestamp {newest})")
            snapshot_ts = as_of_ts
            self._check_not_pruned(snapshot_ts, f"as_of_ts {as_of_ts}")
        elif as_of_batch is not None:
            snapshot_ts = self._commit_ts_of_batch(*as_of_batch)
            self._check_not_pruned(snapshot_ts, f"batch {as_of_batch[2]} (commit_ts {snapshot_ts})")
        else:
            # Under the lock no commit is half-done, so every commit below a fresh ts is durable.
            with self._lock:
                snapshot_ts = self.oracle.next()
        deadline = time.monotonic() + (self.config.snapshot_wait_s if wait_s is None else wait_s)
        for table in canonical:
            for pending in self.store.unapplied_table_commits(table, snapshot_ts):
                self._roll_forward(pending.txn_id, table, deadline)
        versions: dict[str, int | None] = {}
        for table in canonical:
            commit = self.store.table_commit_at(table, snapshot_ts)
            assert commit is None or commit.delta_version is not None, f"unapplied {commit}"
            versions[table] = commit.delta_version if commit else None
        return Snapshot(snapshot_ts, versions)

    def resolve_table(self, table: str) -> str:
        return self._canonical(table)

    def wait_durable(self) -> None:
        """Returns once every state change made so far is on stable storage; called before
        every reply (I8), it lets the store commit concurrent requests' writes together."""
        self.store.flush()

    # ------------------------------------------------------------------ background resolver

    def resolve_once(self) -> None:
        """One resolver pass: expire stale attempts, roll forward old commits, retry cleanups."""
        now = self._monotonic()
        expired: list[TxnRecord] = []
        with self._lock:
            for txn_id, deadline in list(self._deadlines.items()):
                txn = self._unfinished.get(txn_id)
                if txn is not None and txn.state in LIVE_STATES and deadline <= now:
                    expired.append(self._expire(txn))
            orphaned = [
                (t.txn_id, table) for t in self._unfinished.values()
                if t.state == TxnState.COMMITTED
                and _now_ms() - wall_ms_of(t.commit_ts) >= self.config.roll_forward_after_s * 1000
                for table, entry in t.tables.items() if not entry.applied
            ]
            retry = [self._get(t) for t in self._pending_cleanup]
        self._clean_up(expired + retry)
        for txn_id, table in orphaned:
            try:
                self._roll_forward(txn_id, table, time.monotonic() + self.config.snapshot_wait_s)
            except Exception:  # logged; the next pass retries
                log.exception("roll-forward failed", extra={"txn_id": txn_id, "table": table})

    def sweep_recent_aborts(self, horizon_s: float = 24 * 3600) -> int:
        """Deletes leftover files of attempts aborted within the horizon (a crash may have cut
        their cleanup short, or an executor may have written after the abort).

        Returns:
            How many aborted attempts were swept.
        """
        query = TxnQuery(states=(TxnState.ABORTED,), limit=1000,
                         created_after_ms=max(0, _now_ms() - int(horizon_s * 1000)))
        swept = 0
        while batch := self.store.list_txns(query):
            self._clean_up(batch)
            swept += len(batch)
            query.after_start_ts = batch[-1].start_ts
        return swept

    def prune_history(self, now_ms: int | None = None, chunk: int = 250) -> tuple[int, int]:
        """Retention: deletes APPLIED/ABORTED history older than ``retention_hours``.

        Kept: every unfinished transaction; per pipeline generation the committed attempt of
        its newest committed batch (a replay of it must still be answered "already
        committed", I2); attempts whose file cleanup is still pending; every snapshot-index
        row at or after the floor (now - horizon) and each table's newest row below it, so
        latest snapshots and time travel at or after the floor answer exactly as before.
        Time travel (as_of_ts, as_of_batch) to before the floor is refused afterwards. Runs
        in chunks, each its own durable batch holding the store only briefly, so requests
        interleave (a chunk of 5,000 records took seconds in bench_growth: keep them small).

        Returns:
            How many transactions and snapshot-index rows were deleted.
        """
        if self.config.retention_hours <= 0:
            return 0, 0
        now_ms = _now_ms() if now_ms is None else now_ms
        cutoff_ms = now_ms - int(self.config.retention_hours * 3600 * 1000)
        floor_ts = max(0, cutoff_ms) << LOGICAL_BITS
        txns = rows = 0
        while not self._stop.is_set():
            with self._lock:
                keep = frozenset(self._pending_cleanup) | frozenset(self._unfinished)
            deleted_txns, deleted_rows = self.store.prune(cutoff_ms, floor_ts, chunk, keep)
            self.store.flush()
            txns += deleted_txns
            rows += deleted_rows
            if deleted_txns < chunk and deleted_rows < chunk:
                break
        if txns or rows:
            log.info("pruned history", extra={"transactions": txns, "index_rows": rows,
                                               "before_ms": cutoff_ms})
        return txns, rows

    def _check_not_pruned(self, ts: int, what: str) -> None:
        floor = self.store.retention_floor_ts()
        if ts < floor:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ms_of(floor) / 1000))
            raise FailedPrecondition(
                f"{what} is older than the retention floor ({when}, timestamp {floor}): that "
                "history was pruned (serve --retention-hours); read a later point in time")

    def _resolve_loop(self) -> None:
        try:
            self.sweep_recent_aborts()
        except Exception:
            log.exception("sweep of aborted attempts failed")
        last_sweep = time.monotonic()
        last_prune = -float("inf")
        while not self._stop.wait(self.config.resolver_interval_s):
            try:
                self.resolve_once()
                if time.monotonic() - last_prune >= self.config.retention_interval_s:
                    last_prune = time.monotonic()
                    self.prune_history()
                if time.monotonic() - last_sweep >= SWEEP_INTERVAL_S:
                    # files written late into an aborted attempt's folder (a frozen driver
                    # resumed): sweep attempts aborted within a few timeouts again
                    self.sweep_recent_aborts(horizon_s=3 * self.config.txn_timeout_s
                                             + SWEEP_INTERVAL_S)
                    last_sweep = time.monotonic()
            except Exception:
                log.exception("resolver pass failed")

    # ------------------------------------------------------------------ internals

    def _new_pipeline(self, pipeline_id: str) -> PipelineRecord:
        return PipelineRecord(pipeline_id=pipeline_id, created_ms=_now_ms())

    def _persist_pipeline(self, pipeline: PipelineRecord, current: PipelineRecord | None) -> None:
        if current is None:
            self.store.insert_pipeline(pipeline)
        else:
            self.store.update_pipeline(pipeline)

    def _check_idle(self, pipeline: PipelineRecord) -> None:
        live = [t.txn_id for t in self._unfinished.values()
                if t.pipeline_id == pipeline.pipeline_id and t.state in LIVE_STATES]
        since_commit_s = (_now_ms() - pipeline.last_commit_ms) / 1000
        if live or (pipeline.last_commit_ms and since_commit_s < self.config.txn_timeout_s):
            activity = (f"live transaction {live[0]}" if live
                        else f"a commit {since_commit_s:.0f} s ago")
            raise FailedPrecondition(
                f"pipeline {pipeline.pipeline_id!r} generation {pipeline.generation} is still "
                f"driven by query {pipeline.query_id or '(unbound)'} ({activity}); "
                "on_checkpoint_reset='new_generation' refuses to reset an active pipeline. "
                "Stop the other query, or reset explicitly with reset-pipeline")

    def _check_query_id(self, pipeline: PipelineRecord, query_id: str | None) -> None:
        if query_id and pipeline.query_id and query_id != pipeline.query_id:
            last = (time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                  time.gmtime(pipeline.last_commit_ms / 1000))
                    if pipeline.last_commit_ms else "never")
            raise QueryIdMismatch(
                f"pipeline {pipeline.pipeline_id!r} (generation {pipeline.generation}) is bound "
                f"to Spark query id {pipeline.query_id} (last commit: {last}), but this request "
                f"carries query id {query_id}: the streaming checkpoint was deleted or replaced, "
                "so its batch ids restarted and cannot be told from replays. Nothing was "
                "written. If this is intended, start a new generation: percolake-coordinator "
                f"reset-pipeline --target HOST:PORT --pipeline {pipeline.pipeline_id} "
                f"--generation {pipeline.generation} --reason \"...\""
            )

    def _check_caller(self, pipeline: PipelineRecord, epoch: int | None,
                      query_id: str | None) -> None:
        """Fencing (I5) and query-id binding (I9) of a pipeline-level request."""
        if query_id is None and pipeline.query_id:
            raise FailedPrecondition(
                f"pipeline {pipeline.pipeline_id!r} is bound to Spark query id "
                f"{pipeline.query_id}; requests without a query id are refused on it"
            )
        self._check_query_id(pipeline, query_id)
        self._check_epoch(pipeline, epoch)

    def _check_epoch(self, pipeline: PipelineRecord, epoch: int | None) -> None:
        if epoch is None:
            if pipeline.epoch > 0:
                raise FailedPrecondition(
                    f"pipeline {pipeline.pipeline_id!r} is driven by a registered driver (epoch "
                    f"{pipeline.epoch}); requests without an epoch are refused on it"
                )
            return
        if epoch < pipeline.epoch:
            raise Fenced(
                f"fenced: epoch {epoch} of pipeline {pipeline.pipeline_id!r} is older than the "
                f"current epoch {pipeline.epoch}; a newer driver took over"
            )
        if epoch > pipeline.epoch:
            raise FailedPrecondition(
                f"epoch {epoch} of pipeline {pipeline.pipeline_id!r} was never issued (current "
                f"{pipeline.epoch}); call RegisterPipeline"
            )

    def _check_txn_caller(self, txn: TxnRecord, epoch: int | None) -> None:
        self._check_epoch(self._pipelines[txn.pipeline_id], epoch)

    def _resolve_tables(self, tables: Iterable[str]) -> list[str]:
        canonical: list[str] = []
        for table in tables:
            resolved = self._canonical(table)
            if resolved not in canonical:
                canonical.append(resolved)
        if len(canonical) > validation.MAX_TABLES:
            raise ResourceExhausted(
                f"{len(canonical)} tables in one request; at most {validation.MAX_TABLES}")
        return canonical

    def _check_writes(self, txn_id: str, writes: list[TableWriteRecord]) -> list[TableWriteRecord]:
        checked: list[TableWriteRecord] = []
        seen: set[str] = set()
        for write in writes:
            table = self._canonical(write.table)
            if table in seen:
                raise InvalidArgument(f"table {write.table} appears twice in one prewrite")
            seen.add(table)
            validation.check_table_write(write, txn_id, self.config.max_intent_bytes)
            checked.append(TableWriteRecord(
                table=table, mode=write.mode, add_files=write.add_files,
                schema_json=write.schema_json, partition_by=write.partition_by,
                replace_partitions=write.replace_partitions,
            ))
        return checked

    def _refuse_different_prewrite(self, txn: TxnRecord, writes: list[TableWriteRecord]) -> None:
        for write in writes:
            entry = txn.tables.get(write.table)
            if entry is not None and entry.write is not None and entry.write != write:
                raise FailedPrecondition(
                    f"table {write.table} already has a different prewrite in transaction "
                    f"{txn.txn_id}; abort and retry the batch"
                )

    def _with_writes(self, txn: TxnRecord, writes: list[TableWriteRecord]) -> TxnRecord:
        self._refuse_different_prewrite(txn, writes)
        updated = txn.copy()
        for write in writes:
            updated.tables[write.table].write = write
        updated.updated_ms = _now_ms()
        return updated

    def _get(self, txn_id: str) -> TxnRecord:
        txn = self._unfinished.get(txn_id) or self.store.get_txn(txn_id)
        if txn is None:
            raise NotFound(f"no transaction {txn_id!r}")
        return txn

    def _fresh(self, txn: TxnRecord) -> TxnRecord:
        return txn.copy()

    def _live_txn_for_update(self, txn_id: str, epoch: int | None,
                             allow_committed: bool = False) -> TxnRecord:
        txn = self._get(txn_id)
        if txn.state == TxnState.ABORTED and txn.tables:
            # A late writer (a zombie's executors, a resumed driver) may have added files
            # after the cleanup: delete the folders again.
            self._pending_cleanup.add(txn_id)
        self._check_txn_caller(txn, epoch)  # fencing first: a zombie learns nothing else
        if txn.state == TxnState.ABORTED:
            raise TransactionAborted(
                f"transaction {txn_id} was aborted ({txn.abort_reason}); retry the batch")
        if txn.state in COMMITTED_STATES and allow_committed:
            return txn
        if txn.state not in LIVE_STATES:
            raise FailedPrecondition(f"transaction {txn_id} is {txn.state.value}")
        if self._deadlines[txn_id] <= self._monotonic():
            timeout = self._timeouts.get(txn_id, self.config.txn_timeout_s)
            expired = self._expire(txn)
            self._pending_cleanup.add(expired.txn_id)
            raise TransactionAborted(
                f"transaction {txn_id} expired (no heartbeat for {timeout:g} s) and was "
                "aborted; retry the batch")
        return txn

    def _canonical(self, uri: str) -> str:
        """``Warehouse.resolve`` memoised for RESOLVE_CACHE_S per spelling.

        Following symlinks walks every path component (a system call each) and was the largest
        CPU cost of a request; a canonical form is re-derived at most once a second, so a
        symlink changed under a warehouse root takes effect within that second. Refusals are
        never cached.
        """
        now = time.monotonic()
        hit = self._resolved.get(uri)
        if hit is not None and hit[1] > now:
            return hit[0]
        canonical = self.warehouse.resolve(uri)
        if len(self._resolved) >= 4096:
            self._resolved.clear()
        self._resolved[uri] = (canonical, now + RESOLVE_CACHE_S)
        return canonical

    def _free_tables(self, tables: Iterable[str], leaving: Iterable[str] = ()) -> list[str]:
        """The tables no live transaction holds, counting holders in ``leaving`` as gone."""
        gone = set(leaving)
        return [t for t in tables if (holder := self._holders.get(t, "")) in gone
                or self._unfinished.get(holder) is None]

    @staticmethod
    def _holds_writes(txn: TxnRecord, writes: list[TableWriteRecord]) -> bool:
        """Whether ``txn`` already records exactly these intents (a retried request)."""
        return all(txn.tables.get(w.table) and txn.tables[w.table].write == w for w in writes)

    def _acquire_free_tables(self, txn_id: str, epoch: int | None, tables: list[str]) -> None:
        """Takes, in one durable write, the hold of every table nobody holds; leaves the rest
        (and every refusal) to ``_acquire_table``."""
        with self._lock:
            txn = self._get(txn_id)
            new = [t for t in tables if t not in txn.tables]
            if len(new) < 2 or txn.state not in LIVE_STATES:
                return
            txn = self._live_txn_for_update(txn_id, epoch)
            free = self._free_tables(new)
            if not free:
                return
            updated = txn.copy()
            for table in free:
                updated.tables[table] = TableEntry(table, write_location(table, txn_id))
            updated.updated_ms = _now_ms()
            self.store.update_txn(updated)
            self._track(updated)

    def _acquire_table(self, txn_id: str, epoch: int | None, table: str, deadline: float) -> None:
        """Takes the table's hold for txn_id, resolving a committed or expired holder first."""
        while True:
            roll_forward: str | None = None
            expired: list[TxnRecord] = []
            with self._lock:
                txn = self._get(txn_id)
                if table in txn.tables and txn.state != TxnState.ABORTED:
                    self._check_txn_caller(txn, epoch)
                    return
                txn = self._live_txn_for_update(txn_id, epoch)
                holder_id = self._holders.get(table)
                holder = self._unfinished.get(holder_id) if holder_id else None
                if holder is None:
                    updated = txn.copy()
                    updated.tables[table] = TableEntry(table, write_location(table, txn_id))
                    updated.updated_ms = _now_ms()
                    self.store.update_txn(updated)
                    self._track(updated)
                    return
                if holder.state == TxnState.COMMITTED:
                    roll_forward = holder.txn_id
                elif self._deadlines.get(holder.txn_id, 0) <= self._monotonic():
                    expired.append(self._expire(holder))
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Conflict(
                            f"table {table} is held by transaction {holder.txn_id} (pipeline "
                            f"{holder.pipeline_id!r}, batch {holder.batch_id}, "
                            f"{holder.state.value}); gave up after "
                            f"{self.config.conflict_wait_s:.0f} s"
                        )
                    self._changed.wait(min(remaining, 0.5))
            self._clean_up(expired)
            if roll_forward is not None:
                self._roll_forward(roll_forward, table, deadline)

    def _roll_forward(self, txn_id: str, table: str, deadline: float) -> None:
        """Applies a committed transaction's write to one table (Percolator lock resolution)."""
        lock = self._table_apply_locks.setdefault(table, threading.Lock())
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise DeadlineExceeded(
                f"timed out waiting to roll forward transaction {txn_id} on {table}")
        try:
            with self._lock:
                txn = self._get(txn_id)
                entry = txn.tables.get(table)
                assert txn.state in COMMITTED_STATES and entry is not None and entry.write, (
                    f"roll-forward of {txn_id} on {table} in state {txn.state}")
                if entry.applied:
                    return
                write = entry.write
            self.store.flush()  # never apply a commit that is not yet durable
            if self._applier is None:
                raise DeadlineExceeded(f"this coordinator cannot apply Delta commits ({table})")
            version = self._applier(
                write, app_id=delta_app_id(txn.pipeline_id, txn.generation),
                app_version=txn.batch_id, txn_id=txn_id, commit_ts=txn.commit_ts,
            )
            with self._lock:
                self._record_applied(self._get(txn_id), {table: version})
            log.info("rolled forward", extra={"txn_id": txn_id, "table": table,
                                              "delta_version": version})
        finally:
            lock.release()

    def _record_applied(self, txn: TxnRecord, versions: dict[str, int]) -> TxnRecord:
        if txn.state not in COMMITTED_STATES:
            raise FailedPrecondition(
                f"transaction {txn.txn_id} is {txn.state.value}; only a committed transaction "
                "has secondaries to report")
        updated = txn.copy()
        changed: list[str] = []
        for table, version in versions.items():
            entry = updated.tables.get(table)
            if entry is None:
                raise InvalidArgument(f"transaction {txn.txn_id} did not write {table}")
            if entry.applied:
                if entry.delta_version != version:
                    raise FailedPrecondition(
                        f"{table} was reported applied at Delta version {entry.delta_version}, "
                        f"not {version}")
                continue
            entry.delta_version = version
            changed.append(table)
        if not changed:
            return txn
        if all(e.applied for e in updated.tables.values()):
            check_transition(updated.state, TxnState.APPLIED)
            updated.state = TxnState.APPLIED
        updated.updated_ms = _now_ms()
        with self.store.batch():
            self.store.update_txn(updated)
            for table in changed:
                self.store.set_table_commit_version(table, updated.commit_ts,
                                                    versions[table])
        self._track(updated)
        self._changed.notify_all()
        return updated

    def _prepare_abort(self, txn: TxnRecord, reason: str) -> TxnRecord:
        check_transition(txn.state, TxnState.ABORTED)
        aborted = txn.copy()
        aborted.state = TxnState.ABORTED
        aborted.abort_reason = reason
        aborted.updated_ms = _now_ms()
        return aborted

    def _expire(self, txn: TxnRecord) -> TxnRecord:
        timeout = self._timeouts.get(txn.txn_id, self.config.txn_timeout_s)
        aborted = self._prepare_abort(txn, f"expired: no heartbeat within {timeout:g} s")
        self.store.update_txn(aborted)
        self._track(aborted)
        self._changed.notify_all()
        log.warning("transaction expired", extra={"txn_id": txn.txn_id})
        return aborted

    def _track(self, txn: TxnRecord, timeout_ms: int = 0) -> None:
        """Makes the in-memory view match the durable record just written."""
        for table, entry in txn.tables.items():
            if entry.applied or txn.state == TxnState.ABORTED:  # the hold ends here
                if self._holders.get(table) == txn.txn_id:
                    del self._holders[table]
            else:
                holder = self._holders.setdefault(table, txn.txn_id)
                assert holder == txn.txn_id, f"{table} held by both {holder} and {txn.txn_id}"
        if txn.state in (TxnState.APPLIED, TxnState.ABORTED):
            self._unfinished.pop(txn.txn_id, None)
            self._deadlines.pop(txn.txn_id, None)
            self._timeouts.pop(txn.txn_id, None)
            if txn.state == TxnState.ABORTED and txn.tables:
                self._pending_cleanup.add(txn.txn_id)
            return
        self._unfinished[txn.txn_id] = txn
        if txn.state in LIVE_STATES and txn.txn_id not in self._deadlines:
            timeout = timeout_ms / 1000 if timeout_ms else self.config.txn_timeout_s
            self._timeouts[txn.txn_id] = timeout
            self._deadlines[txn.txn_id] = self._monotonic() + timeout
        elif txn.state not in LIVE_STATES:
            self._deadlines.pop(txn.txn_id, None)
            self._timeouts.pop(txn.txn_id, None)

    def _clean_up(self, txns: list[TxnRecord]) -> None:
        """Deletes the files of aborted attempts: only the write locations the store recorded."""
        for txn in txns:
            if txn.state != TxnState.ABORTED:
                continue
            try:
                for entry in txn.tables.values():
                    self._remove_files(entry.write_location)
            except OSError:
                log.exception("cleanup failed; will retry", extra={"txn_id": txn.txn_id})
                with self._lock:
                    self._pending_cleanup.add(txn.txn_id)
                continue
            with self._lock:
                self._pending_cleanup.discard(txn.txn_id)

    def _remove_released(self, txn_id: str, released: list[TableEntry]) -> None:
        """Deletes what a committed attempt left in folders of tables it did not write; no
        Delta version references them. A crash before this leaves an unreferenced folder."""
        for entry in released:
            try:
                self._remove_files(entry.write_location)
            except OSError:
                log.exception("could not delete the folder of a released table",
                              extra={"txn_id": txn_id, "table": entry.table})

    def _commit_ts_of_batch(self, pipeline_id: str, generation: int | None, batch_id: int) -> int:
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_non_negative("batch_id", batch_id)
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id)
            if pipeline is None:
                raise NotFound(f"no pipeline {pipeline_id!r}")
            gen = pipeline.generation if generation is None else generation
        for attempt in self.store.attempts_of(pipeline_id, gen, batch_id):
            if attempt.state in COMMITTED_STATES:
                return attempt.commit_ts
        pruned = (" (or it committed before the retention floor and its record was pruned)"
                  if self.store.retention_floor_ts() else "")
        raise NotFound(f"batch {batch_id} of pipeline {pipeline_id!r} generation {gen} "
                       f"has not committed{pruned}")
