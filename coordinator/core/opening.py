"""Opening attempts and declaring the tables they may write (table holds)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence

from coordinator import metrics, validation
from coordinator.core.quotas import exceeded
from coordinator.core.state import CoreState, wall_ms
from coordinator.principal import current_principal
from percolake.errors import Conflict, InvalidArgument, NotLeader
from percolake.failpoints import fail_point
from percolake.lake.warehouse import write_location
from percolake.records import PipelineRecord, TableEntry, TxnRecord
from percolake.states import COMMITTED_STATES, LIVE_STATES, TxnState

log = logging.getLogger("percolake.coordinator")


class Opening(CoreState):
    """OpenTransaction and DeclareTables: a table is held by one live attempt."""

    def open_transaction(
        self,
        pipeline_id: str,
        batch_id: int,
        epoch: int | None = None,
        query_id: str | None = None,
        tables: Iterable[str] = (),
        timeout_ms: int = 0,
        applied_reports: Sequence[tuple[str, Sequence[tuple[str, int]]]] = (),
    ) -> tuple[TxnRecord, bool]:
        """Opens a new attempt of (pipeline, generation, batch), or answers the committed one.

        ``applied_reports`` (txn id, [(table, Delta version)]) of this pipeline's earlier
        transactions are recorded first, as ReportApplied would (``report_carried``), so the
        tables they release are free for this attempt.

        Returns:
            The transaction and whether the batch was already committed (then nothing is opened).
        """
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_non_negative("batch_id", batch_id)
        validation.check_epoch(epoch)
        validation.check_query_id(query_id)
        self._check_timeout(timeout_ms)
        names = list(tables)
        self.check_txn_tables(len(names))
        canonical = self._resolve_tables(names, self.config.max_tables_per_txn)
        self.report_carried(pipeline_id, epoch, query_id, applied_reports)
        principal = current_principal()
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
            self._check_writer(pipeline_id, canonical)
            if query_id and not pipeline.query_id:
                pipeline.query_id = query_id
            superseded = [self._prepare_abort(self._unfinished[a.txn_id],
                                              f"superseded by attempt {len(attempts) + 1}")
                          for a in attempts if a.txn_id in self._unfinished
                          and self._unfinished[a.txn_id].state in LIVE_STATES]
            self._check_live_limits(pipeline_id, principal, superseded)
            now = wall_ms()
            txn = TxnRecord(
                txn_id=uuid.uuid4().hex, pipeline_id=pipeline_id,
                generation=pipeline.generation, batch_id=batch_id, attempt=len(attempts) + 1,
                epoch=pipeline.epoch if epoch is not None else 0, query_id=query_id or "",
                state=TxnState.OPEN, start_ts=start_ts, created_ms=now, updated_ms=now,
                principal=principal, input_barrier=self._planned_input_barrier(pipeline),
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
                owners = self._persist_writers(pipeline_id, txn.tables)
            self._own(owners)
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

    def input_after_barrier(self, txn: TxnRecord) -> int:
        """Where the input range of an attempt ``open_transaction`` answered starts: it read
        (input_after_barrier, input_barrier]. 0 for an attempt without an input barrier and
        for a batch that had already committed (its range start is not kept)."""
        if not txn.input_barrier or txn.state in COMMITTED_STATES:
            return 0
        with self._lock:
            pipeline = self._pipelines.get(txn.pipeline_id)
            if pipeline is None or pipeline.generation != txn.generation:
                return 0
            return self._input_start(pipeline)

    def _planned_input_barrier(self, pipeline: PipelineRecord) -> int:
        """The input barrier a new attempt of a pipeline with read edges records (under the
        lock): the remembered PlanBarrier answer if it plans the batch after the current
        generation's last committed input barrier (or start), else 0. A root pipeline's is 0
        at no cost (no store read)."""
        if not self._lineage.reads.get(pipeline.pipeline_id):
            return 0
        if (pipeline.plan_generation == pipeline.generation
                and pipeline.plan_after == self._input_start(pipeline)
                and pipeline.plan_barrier > pipeline.plan_after):
            return pipeline.plan_barrier
        return 0

    def declare_tables(self, txn_id: str, epoch: int | None, tables: Iterable[str]) -> TxnRecord:
        """Durably records that the attempt may write these tables, taking each table's hold.

        Raises:
            Conflict: a table stayed held by another live transaction for conflict_wait_s.
        """
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        names = list(tables)
        self.check_txn_tables(len(names))
        self._declare(txn_id, epoch, self._resolve_tables(names, self.config.max_tables_per_txn))
        return self.get_transaction(txn_id)

    def _check_timeout(self, timeout_ms: int) -> None:
        """A client's timeout: 0 (the default) up to --max-txn-timeout; a longer one would let a
        dead driver's transaction hold its tables that long."""
        if timeout_ms < 0:
            raise InvalidArgument(f"timeout_ms must be >= 0, got {timeout_ms}")
        most_s = self.config.max_txn_timeout_s
        if timeout_ms > most_s * 1000:
            raise exceeded(f"timeout_ms {timeout_ms} ({timeout_ms / 1000:g} s)",
                           "--max-txn-timeout", f"{most_s:g} s",
                           "ask for less and heartbeat at least every third of it")

    def _check_live_limits(self, pipeline_id: str, principal: str,
                           superseded: list[TxnRecord]) -> None:
        """Refuses an Open that would leave too many live transactions on the pipeline or of
        the caller (the attempts this Open aborts do not count)."""
        limit = self.config.max_live_txns_per_pipeline
        live = self._live.per_pipeline[pipeline_id] - len(superseded)
        if live >= limit:
            raise exceeded(f"pipeline {pipeline_id!r} has {live} live transactions",
                           "--max-live-txns-per-pipeline", limit,
                           "commit or abort some first (they also expire without heartbeats)")
        limit = self.config.max_live_txns_per_principal
        live = self._live.per_principal[principal] - sum(
            1 for old in superseded if old.principal == principal)
        if live >= limit:
            who = f"principal {principal!r}" if principal else "the anonymous principal"
            raise exceeded(f"{who} has {live} live transactions",
                           "--max-live-txns-per-principal", limit,
                           "commit or abort some first (they also expire without heartbeats)")

    def _declare(self, txn_id: str, epoch: int | None, canonical: list[str]) -> None:
        """Takes the holds of already canonical tables: every free one in one durable write,
        then each held one as ``_acquire_table`` resolves it."""
        deadline = time.monotonic() + self.config.conflict_wait_s
        self._check_table_total(txn_id, epoch, canonical)
        with self._lock:
            self._check_writer(self._get(txn_id).pipeline_id, canonical)
        self._acquire_free_tables(txn_id, epoch, canonical)
        self._roll_forward_committed_holders(canonical)
        for table in canonical:
            self._acquire_table(txn_id, epoch, table, deadline)

    def _check_table_total(self, txn_id: str, epoch: int | None, canonical: list[str]) -> None:
        """Refuses declaring tables beyond --max-tables-per-txn for the whole transaction."""
        with self._lock:
            txn = self._get(txn_id)
            self._check_txn_caller(txn, epoch)  # fencing first: a zombie learns nothing else
            total = len(txn.tables) + sum(1 for t in canonical if t not in txn.tables)
            limit = self.config.max_tables_per_txn
            if total > limit:
                raise exceeded(f"transaction {txn_id} would hold {total} tables",
                               "--max-tables-per-txn", limit,
                               "a transaction writes at most that many tables")

    def _free_tables(self, tables: Iterable[str], leaving: Iterable[str] = ()) -> list[str]:
        """The tables no live transaction holds, counting holders in ``leaving`` as gone."""
        gone = set(leaving)
        return [t for t in tables if (holder := self._holders.get(t, "")) in gone
                or self._unfinished.get(holder) is None]

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
            self._check_writer(txn.pipeline_id, free)
            updated = txn.copy()
            for table in free:
                updated.tables[table] = TableEntry(table, write_location(table, txn_id))
            updated.updated_ms = wall_ms()
            with self.store.batch():
                self.store.update_txn(updated)
                owners = self._persist_writers(txn.pipeline_id, free)
            self._own(owners)
            self._track(updated)

    def _acquire_table(self, txn_id: str, epoch: int | None, table: str, deadline: float) -> None:
        """Takes the table's hold for txn_id, resolving a committed or expired holder first.

        A request that has to wait takes one of the --max-table-waiters slots until it is done.
        """
        waiting = [False]
        started = time.monotonic()
        try:
            self._acquire_table_waiting(txn_id, epoch, table, deadline, waiting)
        finally:
            if waiting[0]:
                metrics.TABLE_WAITS.observe(time.monotonic() - started)
                with self._lock:
                    self._table_waits.give_back()
                    self._waiting_for.pop(txn_id, None)

    def _acquire_table_waiting(self, txn_id: str, epoch: int | None, table: str,
                               deadline: float, waiting: list[bool]) -> None:
        while True:
            roll_forward: str | None = None
            expired: list[TxnRecord] = []
            with self._lock:
                if self._stop.is_set():
                    raise NotLeader("this coordinator stopped serving (it stepped down or is "
                                    "shutting down) while the request waited for table "
                                    f"{table}; retry")
                txn = self._get(txn_id)
                if table in txn.tables and txn.state != TxnState.ABORTED:
                    self._check_txn_caller(txn, epoch)
                    return
                txn = self._live_txn_for_update(txn_id, epoch)
                holder_id = self._holders.get(table)
                holder = self._unfinished.get(holder_id) if holder_id else None
                if holder is None:
                    self._check_writer(txn.pipeline_id, [table])
                    updated = txn.copy()
                    updated.tables[table] = TableEntry(table, write_location(table, txn_id))
                    updated.updated_ms = wall_ms()
                    with self.store.batch():
                        self.store.update_txn(updated)
                        owners = self._persist_writers(txn.pipeline_id, [table])
                    self._own(owners)
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
                    if not waiting[0]:
                        self._table_waits.take(table)
                        waiting[0] = True
                    self._waiting_for[txn_id] = table
                    self._changed.wait(min(remaining, 0.5))
            self._clean_up(expired)
            if roll_forward is not None:
                self._roll_forward(roll_forward, table, deadline, take_slot=not waiting[0])
