"""Timestamp oracle: strictly increasing int64 timestamps for the life of the data dir (I6).

A timestamp is ``wall_ms << LOGICAL_BITS`` plus a logical counter, so it reads as a time and
still orders events within one millisecond. Before handing out any timestamp, the oracle
durably records a high-water mark ahead of it (as TiDB's PD does); after a restart it starts
above that mark, so neither a crash nor a wall clock stepping backwards can repeat one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from coordinator.store.base import Store

LOGICAL_BITS = 18
DEFAULT_WINDOW_MS = 3000


def wall_ms_of(ts: int) -> int:
    """The wall-clock milliseconds a timestamp was taken at."""
    return ts >> LOGICAL_BITS


class TimestampOracle:
    """Hands out strictly increasing timestamps, persisting a high-water mark ahead of use."""

    def __init__(
        self,
        store: Store,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        window_ms: int = DEFAULT_WINDOW_MS,
    ) -> None:
        self._store = store
        self._wall_ms = wall_ms
        self._window = window_ms << LOGICAL_BITS
        self._lock = threading.Lock()
        # Every timestamp handed out before a restart is below the persisted mark.
        self._high_water = store.read_timestamp_high_water()
        self._last = self._high_water

    @property
    def last(self) -> int:
        """The newest timestamp handed out (or the restart floor)."""
        return self._last

    def next(self) -> int:
        """A timestamp larger than every one handed out before, also across restarts."""
        with self._lock:
            ts = max(self._last + 1, self._wall_ms() << LOGICAL_BITS)
            if ts >= self._high_water:
                mark = ts + self._window
                self._store.write_timestamp_high_water(mark)
                self._high_water = mark
            self._last = ts
            return ts
