"""The participant's deferred applied reports (``sparkside.deferred_reports``) with a fake client:
what is handed to the next Open, and what is dropped once confirmed by either path."""

from __future__ import annotations

import threading
from typing import Any

from percolake.v1 import coordinator_pb2 as pb
from sparkside.deferred_reports import MAX_CARRIED, DeferredReports
from sparkside.errors import BatchRefused, CoordinatorUnavailable


class FakeClient:
    """Answers ReportApplied with ``outcome`` (None: success, else raises it), each call held
    until ``release`` is set."""

    def __init__(self, outcome: Exception | None = None) -> None:
        self.outcome = outcome
        self.release = threading.Event()
        self.requests: list[Any] = []

    def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        assert method == "ReportApplied"
        self.requests.append(request)
        assert self.release.wait(30)
        if self.outcome is not None:
            raise self.outcome
        return pb.ReportAppliedResponse()


def tables(*pairs: tuple[str, int]) -> list[pb.AppliedTable]:
    return [pb.AppliedTable(table=t, delta_version=v) for t, v in pairs]


def test_a_report_confirmed_by_the_background_send_is_not_carried():
    client = FakeClient()
    reports = DeferredReports(client)  # type: ignore[arg-type]
    reports.submit("t1", 4, tables(("a", 1), ("b", 2)))
    carried = reports.unconfirmed()  # still in flight: the next Open would carry it
    assert [(r.txn_id, {t.table: t.delta_version for t in r.tables}) for r in carried] == [
        ("t1", {"a": 1, "b": 2})]
    client.release.set()
    assert reports.close(30)
    assert reports.unconfirmed() == [] and reports.pending_count() == 0
    assert client.requests[0].epoch == 4 and client.requests[0].txn_id == "t1"


def test_an_unconfirmed_report_is_carried_until_an_open_confirms_it():
    client = FakeClient(CoordinatorUnavailable("down"))
    reports = DeferredReports(client)  # type: ignore[arg-type]
    client.release.set()
    reports.submit("t1", None, tables(("a", 1)))
    reports.submit("t2", None, tables(("a", 2), ("b", 1)))
    assert reports.close(30)
    carried = reports.unconfirmed()
    assert [r.txn_id for r in carried] == ["t1", "t2"]
    reports.confirm(carried[:1])  # the Open that carried t1 succeeded
    assert [r.txn_id for r in reports.unconfirmed()] == ["t2"]
    reports.confirm(carried)
    assert reports.unconfirmed() == []


def test_a_refused_report_is_dropped_for_the_coordinators_roll_forward():
    client = FakeClient(BatchRefused("not this transaction's commit"))
    reports = DeferredReports(client)  # type: ignore[arg-type]
    client.release.set()
    reports.submit("t1", 1, tables(("a", 1)))
    assert reports.close(30)
    assert reports.unconfirmed() == []


def test_a_later_report_of_more_tables_stays_until_it_is_confirmed_too():
    client = FakeClient()
    reports = DeferredReports(client)  # type: ignore[arg-type]
    reports.submit("t1", 1, tables(("a", 1)))
    reports.submit("t1", 1, tables(("b", 3)))
    client.release.set()
    assert reports.close(30)
    assert reports.unconfirmed() == []
    assert sorted(t.table for r in client.requests for t in r.tables) == ["a", "b"]


def test_an_open_carries_at_most_the_coordinators_bound_oldest_first():
    client = FakeClient(CoordinatorUnavailable("down"))
    reports = DeferredReports(client)  # type: ignore[arg-type]
    client.release.set()
    for n in range(MAX_CARRIED + 5):
        reports.submit(f"t{n}", None, tables(("a", n)))
    assert reports.close(30)
    carried = reports.unconfirmed()
    assert [r.txn_id for r in carried] == [f"t{n}" for n in range(MAX_CARRIED)]


def test_close_gives_up_after_its_bound_when_a_send_hangs():
    client = FakeClient()
    reports = DeferredReports(client)  # type: ignore[arg-type]
    reports.submit("t1", None, tables(("a", 1)))
    assert not reports.close(0.05)
    client.release.set()
    assert reports.close(30)
