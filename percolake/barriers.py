"""Global barriers (docs/topology.md): the points ``G_k = k x interval`` of the oracle's wall
time, the same for every pipeline. Pure arithmetic on oracle timestamps, no I/O.

An oracle timestamp is ``wall_ms << LOGICAL_BITS`` plus a logical counter; barrier ``G_k`` is
the timestamp ``(k x interval_ms) << LOGICAL_BITS``, the first of its millisecond, so "a commit
at or below G_k" means a commit_ts <= that value.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def first_barrier_at_or_above(ts: int, interval_ms: int) -> int:
    """The oldest global barrier >= ``ts`` (``G_f`` of a change at ``ts``)."""
    below = barrier_at_or_below(ts, interval_ms)
    return below if below == ts else barrier_ts(
        (below >> LOGICAL_BITS) // interval_ms + 1, interval_ms)


def is_global_barrier(ts: int, interval_ms: int) -> bool:
    return ts >= 0 and barrier_at_or_below(ts, interval_ms) == ts


def downstream_completed_barrier(last: int, sources_completed: Sequence[int | None],
                                 first_change: int | None, first_unapplied: int | None,
                                 interval_ms: int) -> int | None:
    """The last global barrier a downstream table completed (docs/topology.md).

    Its version at a barrier G is its newest commit whose input barrier is <= G. That is
    final for G <= ``last`` (the writer's newest committed input barrier, or where its
    generation's input starts), and beyond it for every G its sources completed before their
    next change: the writer's next batch must end at or after that change.

    Args:
        last: the writing pipeline's newest committed input barrier of its current
            generation, or the generation's start barrier if it committed none.
        sources_completed: the completed barrier of every table the writer reads (None:
            not known).
        first_change: the oldest change barrier above ``last`` in any source, or None.
        first_unapplied: the oldest input barrier among the table's committed but unapplied
            commits, or None: the table has not completed a barrier at or above it.
    """
    known = [c for c in sources_completed if c is not None]
    if len(known) < len(sources_completed) or not known:
        if last <= 0:
            return None  # a source not known yet and nothing committed: nothing to tell
        reached = last
    else:
        bound = min(known)
        if first_change is not None:
            bound = min(bound, first_change - 1)
        reached = max(last, bound)
    if first_unapplied is not None:
        reached = min(reached, first_unapplied - 1)
    if reached < 0:
        return None
    return barrier_at_or_below(reached, interval_ms)


def next_barrier(after: int, sources_completed: Sequence[int | None], first_change: int | None,
                 interval_ms: int) -> tuple[int, bool]:
    """Where a downstream pipeline's next micro-batch after ``after`` ends (docs/topology.md),
    and whether its sources changed in that range.

    The batch ends on the first global barrier at or above the oldest source change after
    ``after`` once every source completed it, so each non-empty barrier interval is its own
    batch however far behind the pipeline is; with no change completed yet, it is an empty
    step to the newest barrier every source completed. ``after`` itself: nothing to do yet.

    Args:
        sources_completed: the completed barrier of every table the pipeline reads.
        first_change: the oldest change barrier above ``after`` in any source, or None.
    """
    if not sources_completed or any(c is None for c in sources_completed):
        return after, False
    completed = min(c for c in sources_completed if c is not None)
    if first_change is not None:
        end = first_barrier_at_or_above(first_change, interval_ms)
        if end <= completed:
            return end, True
    step = barrier_at_or_below(completed, interval_ms)
    if step > after:
        return step, False
    return after, False
