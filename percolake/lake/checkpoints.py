"""Delta checkpoints of the tables percolake writes, on the table's own schedule, off the
batch's path (docs/checkpoints.md).

delta-spark writes a checkpoint at every ``delta.checkpointInterval``-th version (default 10)
and its readers replay the log only from the newest one; delta-rs's own post-commit hook
would checkpoint every 100th version, inline, and then delete log entries by the table's
retention alone, blind to leases. So every percolake apply turns the hook off, and whoever
applies (the participant, the coordinator's roll-forward) hands the version it reached to a
``Checkpointer``: a queue and one background thread that writes the checkpoint of the newest
multiple of the interval that has none. Handing a version over does no I/O.

A checkpoint is one object (``<version>.checkpoint.parquet``, written whole: a local file is
staged and renamed, an object-store put is atomic) followed by ``_last_checkpoint``, a hint.
A crash between or during them leaves the table readable: readers ignore a staged file, and
a stale hint only makes them list a little more of the log.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from percolake.lake import storage
from percolake.lake.warehouse import is_object_store, local_path
from percolake.records import TableWriteRecord

log = logging.getLogger("percolake.delta")

DEFAULT_CHECKPOINT_INTERVAL = 10  # delta-spark's default delta.checkpointInterval
INTERVAL_KEY = "delta.checkpointInterval"
LAST_CHECKPOINT = "_last_checkpoint"
PROTECTED_BEFORE_KEY = "delta.requireCheckpointProtectionBeforeVersion"


def checkpoint_interval(configuration: Mapping[str, str | None]) -> int:
    """The table's ``delta.checkpointInterval`` (a positive integer), else Delta's 10."""
    try:
        interval = int(configuration.get(INTERVAL_KEY) or DEFAULT_CHECKPOINT_INTERVAL)
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL
    return interval if interval > 0 else DEFAULT_CHECKPOINT_INTERVAL


def due_version(version: int, interval: int) -> int:
    """The newest version at or below ``version`` that the schedule checkpoints (0: none)."""
    return version - version % interval


def log_uri(table_uri: str, name: str) -> str:
    """The URI of one file of the table's ``_delta_log``."""
    return f"{table_uri.rstrip('/')}/_delta_log/{name}"


def last_checkpoint_version(table_uri: str) -> int | None:
    """The version ``_last_checkpoint`` names, None without one (or an unreadable one)."""
    if is_object_store(table_uri):
        data = storage.read_object(log_uri(table_uri, LAST_CHECKPOINT))
    else:
        try:
            data = (Path(local_path(table_uri)) / "_delta_log" / LAST_CHECKPOINT).read_bytes()
        except OSError:
            data = None
    if not data:
        return None
    try:
        return int(json.loads(data)["version"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign hint: readers list the log instead


def write_checkpoint(table_uri: str, version: int) -> int:
    """Writes the checkpoint of ``version`` unless ``_last_checkpoint`` names it or a later one,
    or the table protects checkpoints below a later version (``_protected_below``).

    Returns:
        The table's ``delta.checkpointInterval`` at ``version``.
    """
    from percolake.lake.delta_commit import open_table  # delta_commit imports this module

    table = open_table(table_uri, version)
    if table is None:
        raise FileNotFoundError(f"no Delta table at {table_uri}")
    interval = checkpoint_interval(table.metadata().configuration)
    last = last_checkpoint_version(table_uri)
    if last is not None and last >= version:
        return interval
    if _protected_below(table_uri) > version:
        log.info("checkpoint not written: below %s", PROTECTED_BEFORE_KEY,
                 extra={"table": table_uri, "delta_version": version})
        return interval
    table.create_checkpoint()
    log.info("checkpoint written", extra={"table": table_uri, "delta_version": version})
    if (last_checkpoint_version(table_uri) or -1) < version:
        # delta-rs finds the checkpoint of a writer that died before _last_checkpoint
        # and writes nothing: the hint is written here, from that checkpoint
        _write_hint(table_uri, version, len(table.file_uris()))
    return interval


def _protected_below(table_uri: str) -> int:
    """The newest ``delta.requireCheckpointProtectionBeforeVersion`` of a table with the
    ``checkpointProtection`` feature (0 without): no checkpoint may be created below it (a
    version whose protocol percolake may not implement; delta-spark's DROP FEATURE sets it)."""
    from percolake.lake.delta_commit import open_table

    newest = open_table(table_uri)  # a DROP FEATURE after ``version`` sets it there
    if newest is None or "checkpointProtection" not in (newest.protocol().writer_features or ()):
        return 0
    try:
        return int(newest.metadata().configuration.get(PROTECTED_BEFORE_KEY) or 0)
    except ValueError:
        return 2**62  # unreadable: protect every version


def _write_hint(table_uri: str, version: int, add_files: int) -> None:
    """``_last_checkpoint`` naming the single-file checkpoint of ``version``, with the fields
    delta-rs writes; written whole (an object-store put, a local rename)."""
    import pyarrow.parquet as pq

    name = f"{version:020d}.checkpoint.parquet"
    if is_object_store(table_uri):
        fs = storage.s3_filesystem()
        path = storage.arrow_path(log_uri(table_uri, name))
        size_bytes = fs.get_file_info(path).size
        with fs.open_input_file(path) as source:
            rows = pq.ParquetFile(source).metadata.num_rows
    else:
        path = str(Path(local_path(table_uri)) / "_delta_log" / name)
        size_bytes = os.path.getsize(path)
        rows = pq.ParquetFile(path).metadata.num_rows
    hint = json.dumps({"version": version, "size": rows, "sizeInBytes": size_bytes,
                       "numOfAddFiles": add_files}, separators=(",", ":")).encode()
    if is_object_store(table_uri):
        with storage.s3_filesystem().open_output_stream(
                storage.arrow_path(log_uri(table_uri, LAST_CHECKPOINT))) as out:
            out.write(hint)
        return
    target = Path(local_path(table_uri)) / "_delta_log" / LAST_CHECKPOINT
    staged = target.with_name(f".{LAST_CHECKPOINT}.{os.getpid()}.tmp")
    staged.write_bytes(hint)
    os.replace(staged, target)


class Checkpointer:
    """Writes the scheduled checkpoints of the versions appliers hand it, in one background
    thread. ``after_checkpoint(table, version)`` runs in that thread after each checkpoint is
    known to exist (the coordinator cleans the log then)."""

    def __init__(self, after_checkpoint: Callable[[str, int], None] | None = None) -> None:
        self._after = after_checkpoint
        self._intervals: dict[str, int] = {}  # learned when a checkpoint is written
        self._done: dict[str, int] = {}  # newest checkpoint known to exist, per table
        self._pending: dict[str, int] = {}  # newest version handed over, per table
        self._busy = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def applied(self, table_uri: str, version: int) -> None:
        """``table_uri`` reached ``version`` (an apply just made or found it). No I/O."""
        with self._changed:
            if self._closed:
                return
            interval = self._intervals.get(table_uri)
            if interval is not None and due_version(version, interval) <= \
                    self._done.get(table_uri, 0):
                return  # nothing due: the common case, a dictionary look-up
            if version <= self._pending.get(table_uri, -1):
                return
            self._pending[table_uri] = version
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="percolake-checkpoints",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until everything handed over is done; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._busy,
                                          timeout_s)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Finishes what is queued (within ``timeout_s``) and stops; later versions are
        ignored. A checkpoint cut short by the process's exit is harmless (module doc)."""
        done = self.flush(timeout_s)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        return done

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                table_uri, version = self._pending.popitem()
                self._busy = True
            try:
                self._checkpoint(table_uri, version)
            except Exception as exc:  # the next due version tries again
                log.warning("checkpoint of %s not written: %s", table_uri, exc,
                            extra={"table": table_uri, "delta_version": version})
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _checkpoint(self, table_uri: str, version: int) -> None:
        interval = self._intervals.get(table_uri)
        if interval is None:  # first sight of the table: its interval, its newest checkpoint
            from percolake.lake.delta_commit import open_table

            table = open_table(table_uri, version)
            if table is None:
                return
            interval = checkpoint_interval(table.metadata().configuration)
            self._remember(table_uri, interval, last_checkpoint_version(table_uri) or 0)
        due = due_version(version, interval)
        if due <= self._done.get(table_uri, 0):
            return
        interval = write_checkpoint(table_uri, due)
        self._remember(table_uri, interval, due)
        if self._after is not None:
            self._after(table_uri, due)

    def _remember(self, table_uri: str, interval: int, done: int) -> None:
        with self._changed:
            self._intervals[table_uri] = interval
            self._done[table_uri] = max(done, self._done.get(table_uri, 0))


def checkpointing(apply: Callable[..., int], checkpointer: Checkpointer) -> Callable[..., int]:
    """``apply`` (``apply_table_write``'s signature) that hands each version it reaches to
    ``checkpointer``: the coordinator's roll-forward applier."""
    def apply_then_checkpoint(write: TableWriteRecord, **kwargs: object) -> int:
        version = apply(write, **kwargs)
        checkpointer.applied(write.table, version)
        return version

    return apply_then_checkpoint
