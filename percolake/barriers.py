"""Global barriers (docs/topology.md): the points ``G_k = k x interval`` of the oracle's wall
time, the same for every pipeline. Pure arithmetic on oracle timestamps, no I/O.

An oracle timestamp is ``wall_ms << LOGICAL_BITS`` plus a logical counter; barrier ``G_k`` is
the timestamp ``(k x interval_ms) << LOGICAL_BITS``, the first of its millisecond, so "a commit
at or below G_k" means a commit_ts <= that value.
"""

from __future__ import annotations

LOGICAL_BITS = 18  # the oracle's (coordinator/oracle.py), shared by both sides of the wire


def barrier_ts(k: int, interval_ms: int) -> int:
    """The oracle timestamp of global barrier ``G_k``."""
    return (k * interval_ms) << LOGICAL_BITS


def barrier_at_or_below(ts: int, interval_ms: int) -> int:
    """The newest global barrier <= ``ts`` (0, ``G_0``, if ``ts`` is below ``G_1``)."""
    if interval_ms <= 0:
        raise ValueError(f"a barrier interval is positive, got {interval_ms} ms")
    if ts < 0:
        raise ValueError(f"a timestamp is >= 0, got {ts}")
    return barrier_ts((ts >> LOGICAL_BITS) // interval_ms, interval_ms)


def wall_ms_of_barrier(barrier: int) -> int:
    """The wall-clock milliseconds of a barrier (of any oracle timestamp)."""
    return barrier >> LOGICAL_BITS


def root_completed_barrier(now_ts: int, first_unapplied_ts: int | None,
                           interval_ms: int) -> int:
    """The last global barrier a root table completed.

    A root table has completed G once every commit to it at or below G is applied and no
    transaction of its pipeline can still commit at or below G. A commit_ts comes from the
    oracle at commit, durably with the commit: once the oracle handed out ``now_ts`` no later
    commit is at or below it, so the barriers below ``now_ts`` are closed to new commits; the
    oldest unapplied commit (if any) bounds the answer below it.

    Args:
        now_ts: an oracle timestamp taken after every commit that could be below the answer
            was recorded (under the coordinator's lock).
        first_unapplied_ts: the commit_ts of the table's oldest unapplied commit, or None.
    """
    limit = now_ts - 1
    if first_unapplied_ts is not None:
        limit = min(limit, first_unapplied_ts - 1)
    return barrier_at_or_below(max(limit, 0), interval_ms)
