"""``percolake.parallel.in_parallel``: results in order, errors per item, helper threads kept
between calls, and nested calls that never deadlock."""

from __future__ import annotations

import threading
import time

import pytest

from percolake.parallel import in_parallel


def test_results_and_errors_come_back_in_item_order():
    assert in_parallel(lambda x: 10 // x, [1, 0, 5], 3)[::2] == [10, 2]
    assert isinstance(in_parallel(lambda x: 10 // x, [1, 0, 5], 3)[1], ZeroDivisionError)


def test_items_run_side_by_side_up_to_the_workers_asked():
    running, most = [0], [0]
    lock = threading.Lock()

    def work(_: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    started = time.monotonic()
    in_parallel(work, list(range(6)), 3)
    assert most[0] == 3 and time.monotonic() - started < 0.25


def test_no_thread_is_started_per_call(monkeypatch):
    """The daemon calls in_parallel on every Open carrying reports and every Commit: its
    helpers are kept between calls (a thread started per call cost milliseconds on a loaded
    machine)."""
    in_parallel(time.sleep, [0.001] * 4, 4)  # the pool's threads, once
    started = [0]
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started[0] += 1
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(100):
        in_parallel(time.sleep, [0.001] * 3, 3)
    assert started[0] <= 32  # at most the pool's size once (HELPER_WORKERS); per call: 200


def test_nested_calls_finish_with_every_helper_busy():
    outer = 64  # twice the helpers (HELPER_WORKERS)
    results = in_parallel(lambda n: sum(in_parallel(lambda m: m, list(range(n)), 4)),
                          list(range(outer)), outer)
    assert results == [n * (n - 1) // 2 for n in range(outer)]


def test_a_panic_in_a_helper_reaches_the_caller():
    class Panic(BaseException):  # a Rust panic is a BaseException, not an Exception
        pass

    def work(item: int) -> int:
        if item == 2:
            time.sleep(0.02)  # taken by a helper while the caller runs item 0
            raise Panic()
        time.sleep(0.05)
        return item

    with pytest.raises(Panic):
        in_parallel(work, [0, 1, 2], 3)
