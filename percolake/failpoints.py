"""Named failpoints that tests switch on to crash a process at an exact protocol step.

A failpoint is off unless named in the environment variable ``PERCOLAKE_FAILPOINTS`` (read at
import) or enabled with :func:`enable`. The variable holds ``name=action`` pairs separated by
``;``, for example ``after-prewrite=exit;before-commit-durable=sleep(2)``. Actions:

- ``exit``: ``os._exit(137)`` at once: no cleanup, no flush, like a SIGKILL.
- ``kill``: SIGKILL to the own process.
- ``raise``: raise :class:`FailpointError`.
- ``sleep(S)``: sleep S seconds, then go on.
- ``N*action``: only the N-th time the point is reached (1-based); earlier hits pass.
- ``action@B``: only hits in micro-batch B count (points that know their batch pass it), so
  ``mid-prewrite=2*exit@3`` dies after the second table's files of batch 3, replays included.

When no failpoint is active, :func:`fail_point` costs one truth test of an empty dict.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

ENV_VAR = "PERCOLAKE_FAILPOINTS"
_ACTION = re.compile(r"^(?:(\d+)\*)?(exit|kill|raise|sleep\((\d+(?:\.\d+)?)\))(?:@(\d+))?$")


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


class _Failpoint:
    def __init__(self, spec: str) -> None:
        match = _ACTION.match(spec.strip())
        if not match:
            raise ValueError(f"bad failpoint action {spec!r}: use [N*]exit|kill|raise|sleep(S)"
                             "[@batch]")
        self.nth = int(match.group(1)) if match.group(1) else 0
        self.action = match.group(2).split("(")[0]
        self.seconds = float(match.group(3) or 0)
        self.batch = int(match.group(4)) if match.group(4) else None
        self.hits = 0


_active: dict[str, _Failpoint] = {}
_lock = threading.Lock()


def enable(name: str, action: str) -> None:
    """Switches failpoint ``name`` on with ``action`` (see the module doc)."""
    with _lock:
        _active[name] = _Failpoint(action)


def disable(name: str | None = None) -> None:
    """Switches one failpoint off, or all of them when ``name`` is None."""
    with _lock:
        if name is None:
            _active.clear()
        else:
            _active.pop(name, None)


def fail_point(name: str, batch: int | None = None) -> None:
    """Marks a protocol step (of micro-batch ``batch`` if known); does what the failpoint
    ``name`` says when it is on."""
    if not _active:
        return
    point = _active.get(name)
    if point is None or point.batch is not None and point.batch != batch:
        return
    with _lock:
        point.hits += 1
        if point.nth and point.hits != point.nth:
            return
    # Said before acting, so a test can see that a process reached (or sleeps in) the point.
    sys.stderr.write(f"failpoint {name}: {point.action}\n")
    sys.stderr.flush()
    if point.action == "sleep":
        time.sleep(point.seconds)
        return
    if point.action == "raise":
        raise FailpointError(f"failpoint {name} raised")
    if point.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


def _load_from_environment() -> None:
    for item in filter(None, (part.strip() for part in os.environ.get(ENV_VAR, "").split(";"))):
        name, _, action = item.partition("=")
        enable(name.strip(), action or "exit")


_load_from_environment()
