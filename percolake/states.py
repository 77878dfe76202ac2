"""Transaction states and the one table of valid transitions. No I/O here.

OPEN -> PREWRITTEN -> COMMITTED -> APPLIED; OPEN | PREWRITTEN -> ABORTED; OPEN -> COMMITTED for
an empty transaction, which may go to APPLIED at once (no secondary to wait for), in the same
durable write, as may a commit whose written tables were all released. COMMITTED and ABORTED are
decisions and never change into one another.
"""

from __future__ import annotations

import enum


class TxnState(enum.Enum):
    # members are singletons compared by identity: hashed by identity too, in C (Enum's own
    # __hash__ is a Python call, paid by every state set and dict lookup of every request)
    __hash__ = object.__hash__

    OPEN = "OPEN"
    PREWRITTEN = "PREWRITTEN"
    COMMITTED = "COMMITTED"
    APPLIED = "APPLIED"
    ABORTED = "ABORTED"


# target state -> the states it may be entered from
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.OPEN: frozenset(),
    TxnState.PREWRITTEN: frozenset({TxnState.OPEN, TxnState.PREWRITTEN}),
    TxnState.COMMITTED: frozenset({TxnState.OPEN, TxnState.PREWRITTEN}),
    # from OPEN / PREWRITTEN: a commit with no table left to apply is decided and done at once
    TxnState.APPLIED: frozenset({TxnState.COMMITTED, TxnState.OPEN, TxnState.PREWRITTEN}),
    TxnState.ABORTED: frozenset({TxnState.OPEN, TxnState.PREWRITTEN}),
}

LIVE_STATES = frozenset({TxnState.OPEN, TxnState.PREWRITTEN})
COMMITTED_STATES = frozenset({TxnState.COMMITTED, TxnState.APPLIED})
FINAL_STATES = frozenset({TxnState.APPLIED, TxnState.ABORTED})


class IllegalTransition(AssertionError):
    """A transition outside the table: a broken invariant, never an expected protocol error."""


def can_transition(current: TxnState, target: TxnState) -> bool:
    return current in VALID_PREVIOUS[target]


def check_transition(current: TxnState, target: TxnState) -> None:
    """Raises IllegalTransition unless ``current -> target`` is in the table."""
    if not can_transition(current, target):
        raise IllegalTransition(f"illegal transaction transition {current.value} -> {target.value}")
