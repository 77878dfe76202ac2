"""Maintenance: the resolver (expiry, roll-forward), cleanup of aborted attempts, retention."""

from __future__ import annotations

import logging
import time

from coordinator.core.state import SWEEP_INTERVAL_S, CoreState, wall_ms
from coordinator.oracle import LOGICAL_BITS
from coordinator.store.base import TxnQuery
from percolake.errors import NotLeader, StoreUnavailable
from percolake.failpoints import fail_point
from percolake.lake.cleanup import check_own_location
from percolake.lake.warehouse import UnsafeLocation
from percolake.records import TableEntry, TxnRecord
from percolake.states import LIVE_STATES, TxnState

log = logging.getLogger("percolake.coordinator")
LEASE_SWEEP_INTERVAL_S = 10.0  # expired snapshot leases count as gone before their deletion


def _log_failure(what: str, exc: BaseException, **extra: object) -> None:
    """A background step failed: a store out of reach or a lease lost (the leadership steps
    down on its own) is a warning; anything else is a bug and logged with its trace."""
    if isinstance(exc, (NotLeader, StoreUnavailable)):
        log.warning(what, extra={**extra, "error": f"{type(exc).__name__}: {exc}"})
    else:
        log.error(what, exc_info=exc, extra=extra)


class Maintenance(CoreState):
    """The background work and file cleanup (I10)."""

    def resolve_once(self) -> None:
        """One resolver pass: expire stale attempts, roll forward old commits, retry cleanups.

        Each step and each transaction fails alone (logged, retried next pass): one bad
        transaction never stops the resolver's work on the others.
        """
        now = self._monotonic()
        expired: list[TxnRecord] = []
        with self._lock:
            for txn_id, deadline in list(self._deadlines.items()):
                txn = self._unfinished.get(txn_id)
                if txn is not None and txn.state in LIVE_STATES and deadline <= now:
                    try:
                        expired.append(self._expire(txn))
                    except Exception as exc:
                        _log_failure("could not expire a transaction", exc, txn_id=txn_id)
            due = now - self.config.roll_forward_after_s
            orphaned = [
                (t.txn_id, [table for table, entry in t.tables.items()
                            if not entry.applied and not self._held_back(t.txn_id, table)])
                for t in self._unfinished.values()
                if t.state == TxnState.COMMITTED and self._committed_at.get(t.txn_id, now) <= due
            ]
            retry = [txn for t in self._pending_cleanup
                     if (txn := self._unfinished.get(t) or self.store.get_txn(t)) is not None]
        self._clean_up(expired + retry)
        for txn_id, tables in orphaned:  # a transaction's tables in parallel, each in order
            failures = self._roll_forward_tables(
                txn_id, tables, time.monotonic() + self.config.snapshot_wait_s)
            for table, exc in failures.items():  # logged; the next pass retries
                _log_failure("roll-forward failed", exc, txn_id=txn_id, table=table)

    def sweep_recent_aborts(self, horizon_s: float = 24 * 3600) -> int:
        """Deletes leftover files of attempts aborted within the horizon (a crash may have cut
        their cleanup short, or an executor may have written after the abort).

        Returns:
            How many aborted attempts were swept.
        """
        query = TxnQuery(states=(TxnState.ABORTED,), limit=1000,
                         created_after_ms=max(0, wall_ms() - int(horizon_s * 1000)))
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
        The floor never passes a live snapshot lease's barrier nor a downstream pipeline's last
        input barrier (``retention_guard_ts``).
        Time travel (as_of_ts, as_of_batch) to before the floor is refused afterwards. Runs
        in chunks, each its own durable batch holding the store only briefly, so requests
        interleave (a chunk of 5,000 records took seconds in bench_growth: keep them small).

        Returns:
            How many transactions and snapshot-index rows were deleted.
        """
        if self.config.retention_hours <= 0:
            return 0, 0
        now_ms = wall_ms() if now_ms is None else now_ms
        cutoff_ms = now_ms - int(self.config.retention_hours * 3600 * 1000)
        floor_ts = max(0, cutoff_ms) << LOGICAL_BITS
        # never below a live lease's snapshot nor a downstream reader's range still to read
        guard = self.retention_guard_ts(now_ms)  # Leases'
        if guard is not None:
            floor_ts = min(floor_ts, guard)
        txns = rows = 0
        # revisions are few and read for any barrier (refusals, a root's offsets): never pruned
        revisions = frozenset(r.txn_id for r in self._revisions_between(-1))  # Revising's
        while not self._stop.is_set():
            with self._lock:
                keep = frozenset(self._pending_cleanup) | frozenset(self._unfinished) | revisions
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

    def _resolve_loop(self) -> None:
        try:
            self.sweep_recent_aborts()
        except Exception as exc:
            _log_failure("sweep of aborted attempts failed", exc)
        last_sweep = time.monotonic()
        last_prune = last_lease_sweep = -float("inf")
        # the first log cleanup waits one interval: a daemon just started gets its first
        # batches' commits through without delta-rs loading every table it writes beside them
        last_log_cleanup = time.monotonic()
        while not self._stop.wait(self.config.resolver_interval_s):
            try:
                self.resolve_once()
                if time.monotonic() - last_prune >= self.config.retention_interval_s:
                    last_prune = time.monotonic()
                    self.prune_history()
                if time.monotonic() - last_log_cleanup >= self.config.retention_interval_s:
                    last_log_cleanup = time.monotonic()
                    self.clean_logs()  # LogRetention's: after the floor moved
                if time.monotonic() - last_lease_sweep >= LEASE_SWEEP_INTERVAL_S:
                    last_lease_sweep = time.monotonic()
                    self.drop_expired_leases()  # Leases'
                if time.monotonic() - last_sweep >= SWEEP_INTERVAL_S:
                    # files written late into an aborted attempt's folder (a frozen driver
                    # resumed): sweep attempts aborted within a few timeouts again
                    self.sweep_recent_aborts(horizon_s=3 * self.config.txn_timeout_s
                                             + SWEEP_INTERVAL_S)
                    last_sweep = time.monotonic()
            except Exception as exc:
                _log_failure("resolver pass failed", exc)

    def _clean_up(self, txns: list[TxnRecord]) -> None:
        """Deletes the files of aborted attempts: only the write locations the store recorded.

        Never raises: a failure is logged and the attempt stays pending for the next pass.
        """
        aborted = [t for t in txns if t.state == TxnState.ABORTED and t.tables]
        if not aborted:
            return
        self.store.flush()  # I10: the abort that orphans the files is durable before deletion
        fail_point("after-abort-durable-before-cleanup")
        for txn in aborted:
            done = self._remove_locations(txn.txn_id, list(txn.tables.values()))
            with self._lock:
                if done:
                    self._pending_cleanup.discard(txn.txn_id)
                else:
                    self._pending_cleanup.add(txn.txn_id)

    def _remove_locations(self, txn_id: str, entries: list[TableEntry]) -> bool:
        """Deletes the attempt folders of ``entries``; logs what fails. True if all went."""
        done = True
        for entry in entries:
            try:
                check_own_location(entry.write_location, entry.table, txn_id)
                self._remove_files(entry.write_location)
            except UnsafeLocation:  # a retry cannot help: nothing was deleted, nothing will be
                log.error("refused to delete an attempt folder outside the rules",
                          exc_info=True, extra={"txn_id": txn_id, "table": entry.table})
            except OSError as exc:  # e.g. a late executor still writing into it: retried
                log.warning("could not delete an attempt folder; will retry",
                            extra={"txn_id": txn_id, "table": entry.table,
                                   "error": f"{type(exc).__name__}: {exc}"})
                done = False
            except Exception:  # logged and retried later: never raised into a committed path
                log.exception("could not delete an attempt folder; will retry",
                              extra={"txn_id": txn_id, "table": entry.table})
                done = False
        return done

    def _remove_released(self, txn_id: str, released: list[TableEntry]) -> None:
        """Deletes what a committed attempt left in folders of tables it did not write; no
        Delta version references them. A crash before this leaves an unreferenced folder."""
        self._remove_locations(txn_id, released)
