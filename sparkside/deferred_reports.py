"""Applied reports off the batch's critical path.

After a batch's secondaries, its ReportApplied is sent from a background thread; the batch does
not wait for it. A report the coordinator has not confirmed by the next batch rides on that
batch's OpenTransaction (``applied_reports``), which the coordinator records, with the same
checks as ReportApplied, before the Open. A report confirmed by either path is dropped.

Nothing depends on a report arriving: until it does, the transaction's tables stay held by it
(nothing overtakes it, I7), and a driver that dies first leaves a COMMITTED transaction that the
coordinator rolls forward (its resolver, the next Open that needs a table, a snapshot); the
Delta apply is idempotent through the app transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from percolake.v1 import coordinator_pb2 as pb
from sparkside.client import CoordinatorClient
from sparkside.errors import CoordinatorUnavailable, PercolakeError

log = logging.getLogger("percolake.participant")

# An Open carries at most this many reports (the coordinator's bound, validation.py).
MAX_CARRIED = 64
# Reports kept unconfirmed at most; beyond, the oldest are left to the coordinator's
# roll-forward, which finds their tables applied.
MAX_PENDING = 4 * MAX_CARRIED
SEND_RETRY_S = 30.0


class DeferredReports:
    """Sends applied reports in the background and hands out the unconfirmed ones.

    Thread-safe: the batch thread submits and takes reports for its Open while background
    threads send.
    """

    def __init__(self, client: CoordinatorClient, retry_s: float = SEND_RETRY_S) -> None:
        self._client = client
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending: dict[str, dict[str, int]] = {}  # txn id -> table -> Delta version
        self._sending = 0

    def submit(self, txn_id: str, epoch: int | None, tables: Iterable[pb.AppliedTable]) -> None:
        """Keeps the report until confirmed and sends it from a background thread."""
        versions = {t.table: t.delta_version for t in tables}
        if not versions:
            return
        with self._lock:
            self._pending.setdefault(txn_id, {}).update(versions)
            while len(self._pending) > MAX_PENDING:
                oldest = next(iter(self._pending))
                log.warning("dropping the unconfirmed applied report of %s; the coordinator "
                            "rolls it forward", oldest)
                del self._pending[oldest]
        request = pb.ReportAppliedRequest(
            txn_id=txn_id, tables=[pb.AppliedTable(table=t, delta_version=v)
                                   for t, v in versions.items()])
        if epoch is not None:
            request.epoch = epoch
        sender = threading.Thread(target=self._send, args=(request,), daemon=True,
                                  name=f"report-{txn_id[:8]}")
        with self._lock:
            self._sending += 1
        try:
            sender.start()
        except RuntimeError:  # no thread: the report waits for the next Open
            with self._lock:
                self._sending -= 1

    def unconfirmed(self) -> list[pb.AppliedReport]:
        """The reports not confirmed yet, oldest first, at most MAX_CARRIED: for an Open."""
        with self._lock:
            items = list(self._pending.items())[:MAX_CARRIED]
        return [pb.AppliedReport(txn_id=txn_id, tables=[
                    pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()])
                for txn_id, versions in items]

    def confirm(self, reports: Iterable[pb.AppliedReport]) -> None:
        """Drops what the coordinator recorded (or refused for good: then its roll-forward
        finishes the transaction)."""
        with self._lock:
            for report in reports:
                self._drop(report.txn_id, {t.table: t.delta_version for t in report.tables})

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Waits at most ``timeout_s`` for the sends under way. True if none is left."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._sending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def _send(self, request: pb.ReportAppliedRequest) -> None:
        sent = {t.table: t.delta_version for t in request.tables}
        try:
            self._client.call("ReportApplied", request, retry_s=self._retry_s)
        except CoordinatorUnavailable as exc:  # the next Open carries it
            log.info("applied report of %s not confirmed yet (%s)", request.txn_id, exc)
            sent = {}
        except PercolakeError as exc:  # refused: the coordinator rolls it forward
            log.warning("applied report of %s refused (%s); the coordinator rolls it forward",
                        request.txn_id, exc)
        except Exception:  # never into the batch; the next Open carries it
            log.exception("applied report of %s failed", request.txn_id)
            sent = {}
        finally:
            with self._lock:
                if sent:
                    self._drop(request.txn_id, sent)
                self._sending -= 1
                self._idle.notify_all()

    def _drop(self, txn_id: str, versions: dict[str, int]) -> None:
        """Forgets the tables of ``versions`` reported for ``txn_id`` (lock held)."""
        pending = self._pending.get(txn_id)
        if pending is None:
            return
        for table, version in versions.items():
            if pending.get(table) == version:
                del pending[table]
        if not pending:
            del self._pending[txn_id]
