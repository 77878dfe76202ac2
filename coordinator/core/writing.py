"""Write intents, the commit point, aborts and heartbeats of an attempt."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from coordinator import validation
from coordinator.core.optimizing import check_optimize_writes
from coordinator.core.quotas import exceeded
from coordinator.core.revision import REVISE_PIPELINE
from coordinator.core.state import CoreState, wall_ms
from coordinator.store.base import TableCommit
from percolake.errors import FailedPrecondition, InvalidArgument, TransactionAborted
from percolake.failpoints import fail_point
from percolake.lake.warehouse import is_object_store
from percolake.parallel import in_parallel, results_or_first_error
from percolake.records import TableEntry, TableWriteRecord, TxnRecord, WriteMode
from percolake.states import COMMITTED_STATES, LIVE_STATES, TxnState, check_transition

log = logging.getLogger("percolake.coordinator")
MAX_SOURCE_OFFSETS_LENGTH = 1024 * 1024


def is_empty_append(write: TableWriteRecord) -> bool:
    """An APPEND of no file: no change of its table."""
    return write.mode == WriteMode.APPEND and not write.add_files


class Writing(CoreState):
    """Prewrite, CommitTransaction, AbortTransaction, Heartbeat."""

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
            self._check_txn_totals(txn, checked)
        self._declare(txn_id, epoch, [w.table for w in checked])
        self._check_applicable(checked)
        with self._lock:
            txn = self._live_txn_for_update(txn_id, epoch)
            self._check_txn_totals(txn, checked)  # again: a concurrent prewrite may have added
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
        source_offsets: str = "",
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
            source_offsets: a root batch's Spark source offsets (JSON), recorded with the
                commit (docs/topology.md: a revision prints them).
        """
        validation.check_id("txn_id", txn_id)
        validation.check_epoch(epoch)
        validation.check_text("source_offsets", source_offsets, MAX_SOURCE_OFFSETS_LENGTH)
        names = list(tables)
        self.check_txn_tables(len(names))
        self.check_txn_tables(len(writes or ()), "table writes")
        named = self._resolve_tables(names, self.config.max_tables_per_txn)
        checked: list[TableWriteRecord] = []
        empty: set[str] = set()  # a downstream batch's empty appends: left out (_empty_appends)
        if writes:
            checked = self._check_writes(txn_id, writes)
            with self._lock:
                txn = self._live_txn_for_update(txn_id, epoch, allow_committed=True)
                if txn.input_barrier:  # fixed at Open
                    empty = {w.table for w in checked if is_empty_append(w)}
                    checked = [w for w in checked if w.table not in empty]
                undeclared = any(w.table not in txn.tables for w in checked)
            if undeclared:  # a full prewrite first: it takes the missing holds, maybe waiting
                self.prewrite(txn_id, epoch, checked)
                checked = []
            elif not self._holds_writes(txn, checked):  # not a retry of recorded intents
                self._check_applicable(checked)
        released: list[TableEntry] = []
        with self._lock:
            txn = self._live_txn_for_update(txn_id, epoch, allow_committed=True)
            if txn.state in COMMITTED_STATES:
                if not self._holds_writes(txn, checked):
                    raise FailedPrecondition(f"transaction {txn_id} is already committed")
                return self._fresh(txn)  # idempotent: a retried commit answers the same
            if checked:  # the intents join the commit's own durable write
                self._check_txn_totals(txn, checked)
                txn = self._with_writes(txn, checked)
                check_transition(txn.state, TxnState.PREWRITTEN)
                txn.state = TxnState.PREWRITTEN
            dropped = sorted({t for t in txn.tables if t in empty} | self._empty_appends(txn))
            named = [t for t in named if t not in empty and t not in dropped]
            missing = [t for t in named if t not in txn.tables or not txn.tables[t].prewritten]
            unwritten = [t for t, e in txn.tables.items()
                         if not e.prewritten and t not in dropped]
            if release_unwritten and not missing:
                released = [txn.tables[t] for t in unwritten]
                unwritten = []
            if not missing and not unwritten:
                released += [txn.tables[t] for t in dropped]
            if missing or unwritten:
                if checked:  # the intents stay recorded, as a separate Prewrite would leave them
                    self.store.update_txn(txn)
                    self._track(txn)
                raise FailedPrecondition(
                    f"transaction {txn_id} cannot commit: no prewrite for "
                    f"{', '.join(sorted(set(missing) | set(unwritten)))}; prewrite or abort it"
                )
            self._check_batch_order(txn)
            self._check_planned_if_downstream(txn)
            self._check_input_barrier(txn)
            fail_point("before-commit-durable")
            # Taken under the lock with its durable write, so a snapshot never sees a ts above
            # a commit that is not yet durable.
            commit_ts = self.oracle.next()
            updated = txn.copy()
            for entry in released:
                del updated.tables[entry.table]
            target = TxnState.COMMITTED if updated.tables else TxnState.APPLIED
            check_transition(txn.state, target)
            updated.state = target
            updated.commit_ts = commit_ts
            updated.updated_ms = wall_ms()
            updated.source_offsets = source_offsets
            pipeline = self._pipelines[txn.pipeline_id].copy()
            current_generation = pipeline.generation == txn.generation
            if current_generation:
                pipeline.last_commit_ms = updated.updated_ms
            with self.store.batch():
                self.store.update_txn(updated)
                self.store.add_table_commits([TableCommit(table, commit_ts, txn_id, None,
                                                          txn.input_barrier)
                                              for table in updated.tables])
                self.store.update_pipeline(pipeline)
            self._pipelines[pipeline.pipeline_id] = pipeline
            if current_generation:
                self._last_commit_at[pipeline.pipeline_id] = self._monotonic()
            key = (txn.pipeline_id, txn.generation)
            self._newest_batch[key] = max(self._newest_batch.get(key, -1), txn.batch_id)
            if txn.input_barrier:  # loaded by _check_input_barrier
                self._last_input[key] = max(self._last_input[key], txn.input_barrier)
            for entry in released:
                if self._holders.get(entry.table) == txn_id:
                    del self._holders[entry.table]
            self._track(updated)
            self._changed.notify_all()
        self.wait_durable()  # the servicer would wait too; C5 must come after the fsync
        if updated.input_barrier:
            fail_point("after-input-barrier-commit")
        self._remove_released(txn_id, released)
        fail_point("after-commit-durable-before-reply")
        log.info("committed", extra={"txn_id": txn_id, "commit_ts": commit_ts,
                                     "tables": len(updated.tables)})
        # the reply shows this record alone, durable since the flush above (read nothing since)
        self._reply_flushed()
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
            self._check_txn_caller(txn, epoch)  # fencing first, whatever the state
            if txn.state in LIVE_STATES:
                if self._deadlines[txn_id] <= self._monotonic():
                    expired.append(self._expire(txn))
                    txn = expired[-1]
                else:
                    timeout = self._timeouts[txn_id]
                    self._deadlines[txn_id] = self._monotonic() + timeout
                    return txn.state, int(timeout * 1000)
        self._clean_up(expired)
        return txn.state, 0

    @staticmethod
    def _empty_appends(txn: TxnRecord) -> set[str]:
        """The tables a downstream batch appends no file to. Left out of its commit, as if
        declared but not written: such a commit would change nothing, yet an unapplied
        table-commit row at its input barrier (often one the table already completed, an empty
        step's) would pull the table's completed barrier back below it (T2)."""
        if not txn.input_barrier:
            return set()  # a root pipeline's (or a batch without an input barrier): as ever
        return {t for t, e in txn.tables.items()
                if e.write is not None and is_empty_append(e.write)}

    def _check_batch_order(self, txn: TxnRecord) -> None:
        """Batch ids of a generation commit in increasing order: a table's Delta app
        transaction version is the batch id, so an apply skips any batch below one it holds."""
        key = (txn.pipeline_id, txn.generation)
        if key not in self._newest_batch:
            newest = self.store.newest_committed_batch(*key)
            self._newest_batch[key] = -1 if newest is None else newest
        if txn.batch_id < self._newest_batch[key]:
            raise FailedPrecondition(
                f"batch {txn.batch_id} of pipeline {txn.pipeline_id!r} generation "
                f"{txn.generation} cannot commit after batch {self._newest_batch[key]}: the "
                "batches of a generation commit in increasing order (a checkpoint restored "
                "from a backup? start a new generation with reset-pipeline)")

    def _check_planned_if_downstream(self, txn: TxnRecord) -> None:
        """Refuses, before the commit point, a commit without an input barrier by a pipeline
        that reads percolake tables, or to a table whose writer does: keyed by input barriers,
        its rows would be at no barrier its readers stream or topology reads show (T1, T2).
        The coordinator's revisions carry their own."""
        if txn.input_barrier or txn.pipeline_id == REVISE_PIPELINE:
            return
        reads = self._lineage.reads_of(txn.pipeline_id)
        derived = [t for t in sorted(txn.tables) if (w := self._lineage.writers.get(t))
                   is not None and self._lineage.reads.get(w)]
        if not reads and not derived:
            return
        written = ", ".join(sorted(txn.tables)) or "no table"
        why = (f"pipeline {txn.pipeline_id!r} reads percolake tables ({', '.join(reads)})"
               if reads else f"table {derived[0]} is written by pipeline "
               f"{self._lineage.writers[derived[0]]!r}, which reads percolake tables")
        raise FailedPrecondition(
            f"transaction {txn.txn_id} (pipeline {txn.pipeline_id!r}, batch {txn.batch_id}, "
            f"writing {written}) carries no input barrier, but {why}: its rows would be at no "
            "barrier, never streamed to the readers of its tables nor shown by topology "
            "reads (docs/topology.md). Abort it. Every batch of a downstream pipeline must be "
            "planned by its percolake sources (PlanBarrier before OpenTransaction): read "
            "percolake tables through the percolake source, and do not mix it with another "
            "source (rate, Kafka, files) in one query; split such a query into a root "
            "pipeline and a downstream one")

    def _check_input_barrier(self, txn: TxnRecord) -> None:
        """T1 (docs/topology.md): a batch's input barrier lies strictly above the last one its
        generation committed (or, before the first, the generation's start barrier). A lower
        one means its sources planned a range already read: a broken plan, refused loudly."""
        if not txn.input_barrier:
            return
        last = self._last_input_barrier(txn.pipeline_id, txn.generation)
        floor, what = last, "the last input barrier its generation committed"
        pipeline = self._pipelines.get(txn.pipeline_id)
        if not last and pipeline is not None and pipeline.generation == txn.generation:
            floor, what = pipeline.start_barrier, "the start barrier of its generation"
        if txn.input_barrier <= floor:
            raise FailedPrecondition(
                f"transaction {txn.txn_id} (pipeline {txn.pipeline_id!r} generation "
                f"{txn.generation}, batch {txn.batch_id}) has input barrier {txn.input_barrier}, "
                f"not above {what}, {floor}: its sources planned a range already read (T1); "
                "abort it and replan the batch")

    def _check_applicable(self, writes: list[TableWriteRecord]) -> None:
        """I10: refuses, before the commit point, a write whose apply could fail. Called with
        the tables held (no protocol writer can change them) and outside the lock (file I/O)."""
        if self._write_check is None:
            return
        if sum(is_object_store(w.table) for w in writes) <= 1:
            for write in writes:
                self._write_check(write)
            return
        # each check waits on its object store: the tables side by side, one round trip
        results_or_first_error(in_parallel(self._write_check, writes, len(writes),
                                           "percolake-write-check"))

    def _check_writes(self, txn_id: str, writes: list[TableWriteRecord]) -> list[TableWriteRecord]:
        self.check_txn_tables(len(writes), "table writes")  # limits first: no per-table work
        self.check_txn_files(sum(len(write.add_files) for write in writes))
        checked: list[TableWriteRecord] = []
        seen: set[str] = set()
        for write in writes:
            table = self._canonical(write.table)
            if table in seen:
                raise InvalidArgument(f"table {write.table} appears twice in one prewrite")
            seen.add(table)
            if write.table != table:  # first: the checks' cached encodings stay with it
                write = write.with_table(table)
            validation.check_table_write(write, txn_id, self.config.max_intent_bytes)
            checked.append(write)
        return checked

    def _check_txn_totals(self, txn: TxnRecord, writes: list[TableWriteRecord]) -> None:
        """Refuses intents that would take the transaction's record over --max-files-per-txn
        or --max-txn-intent-bytes (counting the tables it already wrote, except these)."""
        new = {w.table for w in writes}
        kept = [e.write for t, e in txn.tables.items() if e.write is not None and t not in new]
        files = sum(len(w.add_files) for w in kept) + sum(len(w.add_files) for w in writes)
        if files > self.config.max_files_per_txn:
            raise exceeded(f"transaction {txn.txn_id} would list {files} files",
                           "--max-files-per-txn", self.config.max_files_per_txn,
                           "write fewer, larger files per batch")
        size = sum(len(w.json_text) for w in kept) + sum(len(w.json_text) for w in writes)
        if size > self.config.max_txn_intent_bytes:
            raise exceeded(f"transaction {txn.txn_id} would record {size} bytes of write "
                           "intents", "--max-txn-intent-bytes", self.config.max_txn_intent_bytes,
                           "write fewer, larger files per batch or split it (never truncated)")

    def _refuse_different_prewrite(self, txn: TxnRecord, writes: list[TableWriteRecord]) -> None:
        for write in writes:
            entry = txn.tables.get(write.table)
            if entry is not None and entry.write is not None and entry.write != write:
                raise FailedPrecondition(
                    f"table {write.table} already has a different prewrite in transaction "
                    f"{txn.txn_id}; abort and retry the batch"
                )

    def _with_writes(self, txn: TxnRecord, writes: list[TableWriteRecord]) -> TxnRecord:
        check_optimize_writes(txn.pipeline_id, writes)
        self._refuse_different_prewrite(txn, writes)
        updated = txn.copy()
        for write in writes:
            updated.tables[write.table].write = write
        updated.updated_ms = wall_ms()
        return updated

    @staticmethod
    def _holds_writes(txn: TxnRecord, writes: list[TableWriteRecord]) -> bool:
        """Whether ``txn`` already records exactly these intents (a retried request)."""
        return all(txn.tables.get(w.table) and txn.tables[w.table].write == w for w in writes)

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

    def _prepare_abort(self, txn: TxnRecord, reason: str) -> TxnRecord:
        check_transition(txn.state, TxnState.ABORTED)
        aborted = txn.copy()
        aborted.state = TxnState.ABORTED
        aborted.abort_reason = reason
        aborted.updated_ms = wall_ms()
        return aborted

    def _expire(self, txn: TxnRecord) -> TxnRecord:
        timeout = self._timeouts.get(txn.txn_id, self.config.txn_timeout_s)
        aborted = self._prepare_abort(txn, f"expired: no heartbeat within {timeout:g} s")
        self.store.update_txn(aborted)
        self._track(aborted)
        self._changed.notify_all()
        log.warning("transaction expired", extra={"txn_id": txn.txn_id})
        return aborted
