"""Running independent calls side by side: per-table work of one batch, and the object-store
requests of one check, so a batch waits for one round trip where it used to wait for one per
request.

``in_parallel`` runs a function over items side by side, each result or error in item order:
the calling thread takes items itself, helped by threads of a process-wide pool that stay
between calls (starting a thread per call cost ~0.5 ms each on an idle machine, several on a
loaded one, on every Open and Commit of the daemon). ``leaf_pool`` is a process-wide pool for
single object-store requests (a call that makes no further request through it, so it can never
wait on itself). Both pools are created again after a fork. Threads only: delta-rs's runtime
must never be used in a forked child (docs/design-notes.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
LEAF_WORKERS = 32
HELPER_WORKERS = 32  # in_parallel's helpers, shared by every call of the process

_lock = threading.Lock()
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}  # kind -> (pid, pool)


def in_parallel(fn: Callable[[Item], Result], items: Sequence[Item], workers: int,
                name: str = "percolake-parallel") -> list[Result | Exception]:
    """``fn`` over ``items`` on up to ``workers`` threads; each result or error, in item order.

    The calling thread is one of them; the others are borrowed from the process-wide helper
    pool. An item is taken by whichever thread is free first, and the caller waits only for
    items another thread has taken, so nested calls (``fn`` calling ``in_parallel``) and a
    busy pool never deadlock: at worst the caller runs every item itself. ``name`` is kept
    for callers' readability (the pool's threads are named ``percolake-helper``).
    """
    del name

    def guarded(item: Item) -> Result | Exception:
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - returned to the caller, per item
            return exc

    if len(items) <= 1 or workers <= 1:
        return [guarded(item) for item in items]
    results: list[Result | Exception | None] = [None] * len(items)
    taken = iter(range(len(items)))
    take_lock = threading.Lock()
    others_done = threading.Semaphore(0)
    by_others = [0]  # items taken by pool threads (the caller waits for exactly these)
    escaped: list[BaseException] = []  # a panic or exit in a pool thread, for the caller

    def run(helper: bool) -> None:
        while True:
            with take_lock:
                index = next(taken, None)
                if index is None:
                    return
                by_others[0] += helper
            try:
                results[index] = guarded(items[index])
            except BaseException as exc:  # noqa: BLE001 - a Rust panic: raised in the caller
                if not helper:
                    raise
                escaped.append(exc)
            finally:
                if helper:
                    others_done.release()

    pool = _pool("helper", HELPER_WORKERS, "percolake-helper")
    for _ in range(min(workers, len(items)) - 1):
        pool.submit(run, True)
    try:
        run(False)
    finally:
        with take_lock:
            for _ in taken:  # after a raise here: no thread takes what is left
                pass
            waited = by_others[0]
        for _ in range(waited):
            others_done.acquire()
    if escaped:
        raise escaped[0]
    return results  # type: ignore[return-value]


def results_or_first_error(outcomes: Sequence[Result | Exception]) -> list[Result]:
    """The results of ``in_parallel``, or the first error in item order raised."""
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    return list(outcomes)  # type: ignore[arg-type]


def leaf_submit(fn: Callable[..., Result], *args: object) -> Future[Result]:
    """``fn(*args)`` on the process-wide pool of single requests (see the module doc)."""
    return _pool("leaf", LEAF_WORKERS, "percolake-io").submit(fn, *args)


def _pool(kind: str, workers: int, prefix: str) -> ThreadPoolExecutor:
    """The process-wide pool ``kind``, created on first use and again in a forked child (which
    has none of its parent's threads)."""
    pid = os.getpid()
    with _lock:
        known = _pools.get(kind)
        if known is None or known[0] != pid:
            known = _pools[kind] = (pid, ThreadPoolExecutor(max_workers=workers,
                                                            thread_name_prefix=prefix))
        return known[1]
