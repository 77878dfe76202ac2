"""One attempt's table writes as concurrent Spark jobs, finished or cancelled together.

Each ``txn.write`` hands its Spark write job to a thread of its own and returns; the driver runs
the jobs side by side (Spark schedules jobs from several threads at once). The threads inherit
the caller's Spark local properties (``inheritable_thread_target``: the streaming query's id and
job group, so ``query.stop()`` still cancels them) and tag their jobs with the attempt, so one
failure cancels the others. Results come back in the order the writes were submitted, whatever
order the jobs finish in: the commit's records, and so a replay's effects, stay deterministic.

The tables' Delta commits of a committed transaction run side by side too
(``percolake.parallel.in_parallel``; delta-rs releases the GIL); each table still gets one
commit, so every table keeps commit_ts order (I7).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyspark import inheritable_thread_target
from pyspark.sql import SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from percolake.parallel import in_parallel  # noqa: F401 - moved there; importable here too

log = logging.getLogger("percolake.participant")
Result = TypeVar("Result")


@dataclass
class _Write(Generic[Result]):
    name: str
    thread: threading.Thread | None = None
    result: Result | None = None
    error: BaseException | None = None
    cancelled_first: bool = False  # failed after the attempt's jobs were cancelled
    done: threading.Event = field(default_factory=threading.Event)


class ConcurrentWrites(Generic[Result]):
    """The running writes of one attempt, their jobs tagged ``tag``."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._writes: list[_Write[Result]] = []
        self._session: SparkSession | None = None
        self._lock = threading.Lock()
        self._cancelled = False
        self._failed = threading.Event()
        self._changed = threading.Condition()  # a write ended (done or failed)

    def submit(self, session: SparkSession, name: str, job: Callable[[], Result]) -> None:
        """Starts ``job`` (one table's write, named ``name`` in errors) in its own thread."""
        if self._cancelled:
            raise RuntimeError(f"the writes of {self.tag} were cancelled")
        write: _Write[Result] = _Write(name)
        self._session = session

        def run() -> None:
            context = session.sparkContext
            context.addJobTag(self.tag)
            try:
                if self._cancelled:
                    raise RuntimeError(f"the writes of {self.tag} were cancelled")
                write.result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                with self._lock:
                    write.error, write.cancelled_first = exc, self._cancelled
                self._failed.set()
            finally:
                context.removeJobTag(self.tag)
                write.done.set()
                with self._changed:
                    self._changed.notify_all()

        write.thread = threading.Thread(target=inheritable_thread_target(session)(run),
                                        name=f"{self.tag}-{len(self._writes)}", daemon=True)
        self._writes.append(write)
        write.thread.start()

    def results(self) -> list[Result]:
        """Waits for every write; their results in submission order.

        On the first failure the others' jobs are cancelled and every thread is waited for
        before the failure is raised: no job of the attempt writes anything afterwards.

        Raises:
            The first write failure in submission order (one not caused by the
            cancellation), noted with the table it belongs to.
        """
        if not self.wait():
            self.cancel()
        self._join()
        failed = [w for w in self._writes if w.error is not None]
        if failed:
            first = next((w for w in failed if not w.cancelled_first), failed[0])
            error = first.error
            assert error is not None
            error.add_note(f"(while writing table {first.name})")
            raise error
        return [w.result for w in self._writes]  # type: ignore[misc]

    def wait(self) -> bool:
        """Waits until every write is done (True) or one has failed (False); never raises."""
        with self._changed:
            while not self._failed.is_set() and not all(w.done.is_set() for w in self._writes):
                self._changed.wait()
        return not self._failed.is_set()

    def cancel(self) -> None:
        """Cancels the attempt's running jobs and waits for every thread; never raises."""
        with self._lock:
            self._cancelled = True
        # Again while any thread runs: a write may start another job after a cancellation.
        while running := [w for w in self._writes if not w.done.is_set()]:
            try:
                self._session.sparkContext.cancelJobsWithTag(self.tag)  # type: ignore[union-attr]
            except Exception as exc:  # the join below still holds the attempt back
                log.warning("could not cancel the jobs of %s: %s", self.tag, exc)
                break
            running[0].done.wait(0.2)
        self._join()

    def _join(self) -> None:
        for write in self._writes:
            if write.thread is not None:
                write.thread.join()


@contextmanager
def unpersist_waits_for(writes: ConcurrentWrites) -> Iterator[None]:
    """While the user's function runs on this thread, ``DataFrame.unpersist`` first waits for
    the batch's writes under way: Spark's own advice for writing one micro-batch to several
    places is persist, write each, unpersist, and an unpersist while the writes still run
    would make them compute the batch again (other rows, if it is not deterministic)."""
    _hook_unpersist()
    previous = getattr(_batch_writes, "current", None)
    _batch_writes.current = writes
    try:
        yield
    finally:
        _batch_writes.current = previous


_batch_writes = threading.local()
_hook_lock = threading.Lock()


def _hook_unpersist() -> None:
    """Wraps the classic DataFrame's unpersist once per process; outside a batch's function
    (no writes on the calling thread) it behaves exactly as before."""
    with _hook_lock:
        original = ClassicDataFrame.unpersist
        if getattr(original, "_percolake_waits", False):
            return

        @functools.wraps(original)
        def unpersist(self: ClassicDataFrame, blocking: bool = False) -> ClassicDataFrame:
            writes = getattr(_batch_writes, "current", None)
            if writes is not None:
                writes.wait()
            return original(self, blocking)

        unpersist._percolake_waits = True  # type: ignore[attr-defined]
        ClassicDataFrame.unpersist = unpersist  # type: ignore[method-assign]
