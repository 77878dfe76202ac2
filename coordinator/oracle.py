"""Timestamp oracle: strictly increasing int64 timestamps for the life of the data dir (I6).

A timestamp is ``wall_ms << LOGICAL_BITS`` plus a logical counter, so it reads as a time and
still orders events within one millisecond. Before handing out any timestamp, the oracle
durably records a high-water mark ahead of it (as TiDB's PD does); after a restart it starts
above that mark, so neither a crash nor a wall clock stepping backwards can repeat one.

The mark is extended ahead of need by a background thread once half the window is used, so the
durable write (an fsync) is off the caller's path, which in the core holds the coordinator's
lock. ``next`` writes the mark itself only when it reaches the durable mark (the extension has
not finished, or the wall clock jumped ahead). A mark is in memory only once its write
returned, and a store keeps the highest mark written (``Store.write_timestamp_high_water``), so
two writes finishing out of order never lower it: no timestamp is ever handed out at or above
the durable mark. An extension that fails (e.g. a store that lost the leader lease refuses it)
changes nothing; the next ``next`` tries again or writes the mark itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from coordinator.store.base import Store
from percolake.barriers import LOGICAL_BITS, wall_ms_of_barrier

DEFAULT_WINDOW_MS = 3000
log = logging.getLogger("percolake.oracle")
wall_ms_of = wall_ms_of_barrier  # the wall-clock milliseconds any timestamp was taken at


class TimestampOracle:
    """Hands out strictly increasing timestamps, persisting a high-water mark ahead of use."""

    def __init__(
        self,
        store: Store,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        window_ms: int = DEFAULT_WINDOW_MS,
        extend_ahead: bool = True,
    ) -> None:
        self._store = store
        self._wall_ms = wall_ms
        self._window = window_ms << LOGICAL_BITS
        self._extend_ahead = extend_ahead
        self._lock = threading.Lock()
        # Every timestamp handed out before a restart is below the persisted mark.
        self._high_water = store.read_timestamp_high_water()
        self._last = self._high_water
        self._extending = False  # a background extension is under way
        self._extension: threading.Thread | None = None
        self._closed = False

    @property
    def last(self) -> int:
        """The newest timestamp handed out (or the restart floor)."""
        return self._last

    @property
    def high_water(self) -> int:
        """The durable mark: no timestamp at or above it has been handed out."""
        return self._high_water

    def next(self) -> int:
        """A timestamp larger than every one handed out before, also across restarts."""
        with self._lock:
            ts = max(self._last + 1, self._wall_ms() << LOGICAL_BITS)
            if ts >= self._high_water:  # nothing durable covers it: write the mark now
                mark = ts + self._window
                self._store.write_timestamp_high_water(mark)
                self._high_water = mark
            elif (self._extend_ahead and not self._extending and not self._closed
                  and ts >= self._high_water - self._window // 2):
                self._extending = True
                self._extension = threading.Thread(target=self._extend,
                                                   args=(ts + self._window,),
                                                   name="oracle-extend", daemon=True)
                self._extension.start()
            self._last = ts
            return ts

    def _extend(self, mark: int) -> None:
        """Writes ``mark`` durably off the callers' path, then lets ``next`` use it."""
        try:
            self._store.write_timestamp_high_water(mark)
        except Exception as exc:  # noqa: BLE001 - next() writes the mark itself if needed
            log.warning("extending the timestamp high-water mark failed: %s", exc)
            with self._lock:
                self._extending = False
            return
        with self._lock:
            self._high_water = max(self._high_water, mark)
            self._extending = False

    def close(self) -> None:
        """Starts no more extensions and waits for one under way (before the store closes)."""
        with self._lock:
            self._closed = True
            extension = self._extension
        if extension is not None:
            extension.join()
