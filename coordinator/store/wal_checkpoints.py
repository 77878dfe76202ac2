"""The SQLite store's WAL checkpoints, made off the request path (group commit only).

SQLite checkpoints by itself inside the COMMIT that takes the WAL past 1,000 pages: under group
commit that COMMIT runs under the store's lock, so every ~70th flush of a transaction's writes
(~14 pages each) also copied ~1,000 pages into the database file and fsynced it, 1.3-2 ms on an
idle disk and far more on a busy one, while every other request waited for the lock; at
concurrency 1 that was the p99 of a batch's calls. Here the serving connection never
checkpoints by itself: a thread with a connection of its own runs a PASSIVE checkpoint every
``every`` group commits, beside the writer (a passive checkpoint takes no write lock).

The writer reuses the WAL from its start only when a checkpoint copied all of it before the
writer's next transaction began; under a steady load a background pass may always be a commit
behind, so once a pass finds the WAL over ``restart_pages`` the next flush checkpoints on the
serving connection right after its COMMIT, as SQLite would have (little is left to copy by
then), and the following transaction reuses the WAL. The same happens when the background thread
falls ``LATE_PASSES`` passes behind (a machine too busy to give it the CPU): the WAL stays
bounded however the threads are scheduled. While a restart is due no background pass starts (a
pass in progress, slow to sync on a busy disk, would make the serving one's checkpoint return
busy again and again while the WAL grew); a restart that found one in progress is tried again at
the next flush. I8 is unchanged: a reply waits for the WAL's sync, and a checkpoint syncs the
WAL before copying it and the database file after (synchronous=FULL on its connection), so no
acknowledged write is ever only in pages a restart overwrites.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("percolake.store")

CHECKPOINT_EVERY = 32  # group commits between background checkpoints (~450 pages alone)
RESTART_PAGES = 8000  # WAL pages (~32 MiB) after which the serving connection checkpoints once
LATE_PASSES = 8  # passes the background thread may fall behind before the serving one steps in


class WalCheckpointer:
    """Checkpoints one database's WAL from its own thread and connection."""

    def __init__(self, path: Path, every: int | None = None,
                 restart_pages: int | None = None) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA synchronous=FULL")  # sync the WAL before, the file after
        self._every = max(1, CHECKPOINT_EVERY if every is None else every)
        self._restart_pages = RESTART_PAGES if restart_pages is None else restart_pages
        self._commits = 0
        self._passed_at = 0  # commits made when the last pass (either connection's) began
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.restart_due = False  # read by the serving connection's flush, under its lock
        self.checkpoints = 0  # background passes made (for tests and benchmarks)
        self.restarts = 0  # the serving connection's checkpoints made (for tests) ...
        self.busy_restarts = 0  # ... and found busy, a background pass under way
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Called after each group COMMIT (under the store's lock)."""
        self._commits += 1
        if self._commits % self._every == 0:
            self._wake.set()
        if self._commits - self._passed_at >= self._every * LATE_PASSES:
            self.restart_due = True

    def restarted(self, busy: bool) -> None:
        """Called when the serving connection has checkpointed (under the store's lock);
        ``busy``: a background pass held the checkpoint, so the next flush tries again (no
        new pass starts while a restart is due)."""
        self.restart_due = busy
        if busy:
            self.busy_restarts += 1
        else:
            self.restarts += 1
            self._passed_at = self._commits

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.restart_due:  # the serving connection's next flush checkpoints: leave it
                continue
            began_at = self._commits
            try:
                _, pages, _ = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as exc:  # the next pass tries again; the WAL grows meanwhile
                log.warning("background WAL checkpoint failed: %s", exc)
                continue
            self.checkpoints += 1
            self._passed_at = max(self._passed_at, began_at)
            if pages > self._restart_pages:
                self.restart_due = True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._conn.close()
