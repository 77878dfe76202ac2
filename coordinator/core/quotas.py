"""Bookkeeping of the core's limits (docs/limits.md): live transactions per pipeline and per
principal, and how many requests may wait for a table at once.

Every refusal is RESOURCE_EXHAUSTED naming the ``serve`` flag that sets the limit and its value,
so an operator reading a client's error knows what to raise. Callers hold the core lock.
"""

from __future__ import annotations

from collections import Counter

from percolake.errors import Overloaded, ResourceExhausted


def exceeded(what: str, flag: str, limit: object, advice: str) -> ResourceExhausted:
    """The refusal of a request over a limit: ``what`` happened, the limit, what to do."""
    return ResourceExhausted(f"{what}: over the limit {flag} {limit}; {advice}")


class LiveCounts:
    """Live (OPEN or PREWRITTEN) transactions per pipeline and per principal (the one that
    opened each, recorded with it); a transaction counts while it is in the live states."""

    def __init__(self) -> None:
        self.per_pipeline: Counter[str] = Counter()
        self.per_principal: Counter[str] = Counter()
        self._keys: dict[str, tuple[str, str]] = {}

    def started(self, txn_id: str, pipeline_id: str, principal: str) -> None:
        self._keys[txn_id] = (pipeline_id, principal)
        self.per_pipeline[pipeline_id] += 1
        self.per_principal[principal] += 1

    def ended(self, txn_id: str) -> None:
        pipeline_id, principal = self._keys.pop(txn_id)
        _decrement(self.per_pipeline, pipeline_id)
        _decrement(self.per_principal, principal)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class WaitSlots:
    """How many requests may wait for a table (its hold or its roll-forward) at once.

    A waiting request keeps its RPC worker thread; bounding the waiters well below the worker
    count leaves workers for every other call (a Heartbeat must not queue behind them).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def take(self, table: str) -> None:
        if self.in_use >= self.limit:
            raise Overloaded(
                f"too many requests waiting for tables (limit {self.limit}, "
                f"--max-table-waiters) when this one had to wait for {table}; retry later")
        self.in_use += 1

    def give_back(self) -> None:
        assert self.in_use > 0, "a wait slot given back twice"
        self.in_use -= 1
