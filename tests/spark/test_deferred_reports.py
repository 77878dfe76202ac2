"""The batch's critical path is two calls (issue 18, point 2): Open and Commit.

The applied report of a batch's secondaries is sent by a background thread, or carried by the
next Open when it was not confirmed by then; either way the transaction ends APPLIED.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from percolake.v1 import coordinator_pb2 as pb
from sparkside import Participant
from tests.spark.helpers import transactions

pytestmark = pytest.mark.spark


class CallLog:
    """Wraps a client's ``call``: (thread id, method, carried reports) of every call."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[int, str, int]] = []
        self._lock = threading.Lock()
        self._call = client.call
        client.call = self

    def __call__(self, method: str, request: Any, *args: Any, **kwargs: Any) -> Any:
        carried = len(request.applied_reports) if method == "OpenTransaction" else 0
        with self._lock:
            self.calls.append((threading.get_ident(), method, carried))
        return self._call(method, request, *args, **kwargs)

    def mark(self) -> int:
        with self._lock:
            return len(self.calls)

    def since(self, mark: int) -> list[tuple[int, str, int]]:
        with self._lock:
            return self.calls[mark:]


def test_steady_state_batch_calls_only_open_and_commit_and_every_txn_ends_applied(
        spark, lake_daemon, lake):
    participant = Participant(lake_daemon.target, pipeline_id=f"two-calls-{lake.name}")
    log = CallLog(participant.client)
    tables = [str(lake / name) for name in ("a", "b", "c")]
    batches = 4

    def write(df, batch_id, txn):  # noqa: ANN001, ANN202
        for n, table in enumerate(tables):
            txn.write(spark.createDataFrame([(batch_id, n)], "batch long, n long"), table)

    participant.run_batch(spark.range(1), 0, write)  # registers and declares the tables
    on_path: list[list[str]] = []
    for batch in range(1, batches):
        mark = log.mark()
        participant.run_batch(spark.range(1), batch, write)
        on_path.append([method for thread, method, _ in log.since(mark)
                        if thread == threading.get_ident()])
    assert on_path == [["OpenTransaction", "CommitTransaction"]] * (batches - 1), log.calls
    participant.close()

    # Every batch's report went by the background sender or rode on the next Open.
    background = [m for t, m, _ in log.calls if m == "ReportApplied"]
    assert all(t != threading.get_ident() for t, m, _ in log.calls if m == "ReportApplied")
    carried = sum(n for _, m, n in log.calls if m == "OpenTransaction")
    assert len(background) == batches and carried <= batches, log.calls
    states = Counter(t.state for t in transactions(lake_daemon.stub, participant.pipeline_id))
    assert states == {pb.APPLIED: batches}, states
