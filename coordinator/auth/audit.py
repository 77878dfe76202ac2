"""The audit log: one JSON object per line for every administrative action and every refused
request. Never a secret: no token, no password (messages pass the daemon's redaction).

Fields: ``time`` (UTC, ISO 8601 with milliseconds), ``principal`` ("" without
authentication, or before a caller is authenticated), ``peer`` (gRPC's peer string, e.g.
``ipv4:127.0.0.1:53412``), ``method`` (the RPC's name), ``pipeline``, ``table`` and ``txn_id``
(what the request concerns; "" when none), ``action`` (``refused``, or the administrative
action done), ``outcome``: ``{"status": "PERMISSION_DENIED", "message": "..."}``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CallRecord:
    """What one call is about, filled in as the call learns it."""

    method: str
    peer: str
    pipeline: str = ""
    table: str = ""
    txn_id: str = ""
    audited: bool = False


_call: ContextVar[CallRecord | None] = ContextVar("percolake_audit_call", default=None)


@contextlib.contextmanager
def recording(method: str, peer: str) -> Iterator[CallRecord]:
    """The enclosed handler code is one call of ``method`` from ``peer``."""
    record = CallRecord(method, peer)
    token = _call.set(record)
    try:
        yield record
    finally:
        _call.reset(token)


def current_call() -> CallRecord | None:
    return _call.get()


def note(*, pipeline: str = "", table: str = "", txn_id: str = "") -> None:
    """Records what the current call concerns (kept for its audit line)."""
    record = _call.get()
    if record is None:
        return
    record.pipeline = pipeline or record.pipeline
    record.table = table or record.table
    record.txn_id = txn_id or record.txn_id


def _now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class AuditLog:
    """Appends lines to ``path`` (created 0600 if missing), one writer at a time, flushed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def write(self, *, principal: str, action: str, status: str, message: str,
              method: str = "", peer: str = "") -> None:
        """One line for the current call (its method, peer and what it concerns)."""
        call = _call.get()
        if call is not None:
            call.audited = True
        line = {
            "time": _now(), "principal": principal,
            "peer": call.peer if call else peer, "method": call.method if call else method,
            "pipeline": call.pipeline if call else "", "table": call.table if call else "",
            "txn_id": call.txn_id if call else "", "action": action,
            "outcome": {"status": status, "message": message},
        }
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(text)
                self._file.flush()
