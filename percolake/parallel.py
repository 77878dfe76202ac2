"""Running independent calls side by side: per-table work of one batch, and the object-store
requests of one check, so a batch waits for one round trip where it used to wait for one per
request.

``in_parallel`` runs a function over items on threads of its own, each result or error in item
order. ``leaf_pool`` is a process-wide pool for single object-store requests (a call that makes
no further request through it, so it can never wait on itself), created again after a fork.
Threads only: delta-rs's runtime must never be used in a forked child (docs/design-notes.md).
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

_lock = threading.Lock()
_leaf: tuple[int, ThreadPoolExecutor] | None = None


def in_parallel(fn: Callable[[Item], Result], items: Sequence[Item], workers: int,
                name: str = "percolake-parallel") -> list[Result | Exception]:
    """``fn`` over ``items`` on up to ``workers`` threads; each result or error, in item order."""
    def guarded(item: Item) -> Result | Exception:
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - returned to the caller, per item
            return exc

    if len(items) <= 1 or workers <= 1:
        return [guarded(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)),
                            thread_name_prefix=name) as pool:
        return list(pool.map(guarded, items))


def results_or_first_error(outcomes: Sequence[Result | Exception]) -> list[Result]:
    """The results of ``in_parallel``, or the first error in item order raised."""
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    return list(outcomes)  # type: ignore[arg-type]


def leaf_submit(fn: Callable[..., Result], *args: object) -> Future[Result]:
    """``fn(*args)`` on the process-wide pool of single requests (see the module doc)."""
    global _leaf
    pid = os.getpid()
    with _lock:
        if _leaf is None or _leaf[0] != pid:  # a forked child has no threads of the parent's
            _leaf = (pid, ThreadPoolExecutor(max_workers=LEAF_WORKERS,
                                             thread_name_prefix="percolake-io"))
        pool = _leaf[1]
    return pool.submit(fn, *args)
