"""Who is calling: set for each call by the authentication interceptor, read by the checks
that depend on the caller (permissions, per-principal limits, the audit log)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

ANONYMOUS = ""  # authentication off: every caller is the same, unnamed principal

_current: ContextVar[str] = ContextVar("percolake_principal", default=ANONYMOUS)


def current_principal() -> str:
    """The principal of the call this thread is serving (ANONYMOUS without authentication)."""
    return _current.get()


@contextlib.contextmanager
def acting_as(principal: str) -> Iterator[None]:
    """Runs the enclosed handler code as ``principal``."""
    token = _current.set(principal)
    try:
        yield
    finally:
        _current.reset(token)
