"""Leases on snapshots (docs/topology.md, safe expiry): a reader keeps the files of the
versions it reads from vacuum, and the snapshot index from retention pruning, until the lease
expires or is released. Leases live in the store only (durable before the answer that hands
one out); expired ones count as gone at once and are deleted by maintenance.

Each lease records the principal that took it: only that principal, or an ADMIN on every
pipeline, may release it (coordinator/auth/access.py), and each principal holds at most
``--max-live-leases-per-principal`` live leases (docs/limits.md).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable

from coordinator import validation
from coordinator.core.quotas import exceeded
from coordinator.core.state import CoreState, Snapshot, wall_ms
from coordinator.principal import current_principal
from coordinator.store.base import LeaseRecord
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.failpoints import fail_point

log = logging.getLogger("percolake.coordinator")

MAX_LEASE_MS = 30 * 24 * 3600 * 1000  # 30 days
MAX_HOLDER_LENGTH = 256
_TAKING = threading.Lock()  # a principal's count and its new lease's insert, together


def describe_lease(lease: LeaseRecord) -> str:
    """``lease L held by 'H' until <UTC>``: how refusals and the CLI name a lease."""
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lease.expires_ms / 1000))
    return f"lease {lease.lease_id} held by {lease.holder or '(no holder named)'!r} until {until}"


def check_lease_request(lease_ms: int, holder: str) -> None:
    """GetSnapshot's lease fields: 0 (no lease) up to MAX_LEASE_MS, a holder of printable
    text. Checked before the snapshot is taken."""
    validation.check_range("lease_ms", lease_ms, MAX_LEASE_MS, " ms (30 days)")
    validation.check_text("lease_holder", holder, MAX_HOLDER_LENGTH)
    if holder and not holder.isprintable():
        raise InvalidArgument("lease_holder must be printable text")
    if holder and not lease_ms:
        raise InvalidArgument("lease_holder needs lease_ms > 0 (no lease is taken without it)")


class Leases(CoreState):
    """Taking (with GetSnapshot), releasing, listing and expiring leases."""

    def take_lease(self, snapshot: Snapshot, lease_ms: int, holder: str) -> LeaseRecord:
        """A lease on the snapshot's (table, version)s for ``lease_ms``, durable on return.

        Raises:
            FailedPrecondition: retention pruning moved past the snapshot before the lease
                was recorded (its files may be vacuumed already): take a newer snapshot.
            ResourceExhausted: the caller holds --max-live-leases-per-principal live leases.
        """
        check_lease_request(lease_ms, holder)
        if lease_ms <= 0:
            raise InvalidArgument("lease_ms must be > 0 to take a lease")
        principal = current_principal()
        with _TAKING:
            now = wall_ms()
            self._check_lease_limit(principal, now)
            lease = LeaseRecord(
                lease_id=f"lease-{uuid.uuid4().hex}", holder=holder,
                tables=tuple(sorted((t, v) for t, v in snapshot.versions.items()
                                    if v is not None)),
                barrier_ts=snapshot.snapshot_ts, created_ms=now, expires_ms=now + lease_ms,
                principal=principal)
            with self.store.batch():
                self.store.insert_lease(lease)
        self.wait_durable()
        fail_point("after-lease-durable")
        # Vacuum protects every version from the retention floor on, and reads the floor
        # before the leases: a snapshot still at or above the floor now was protected all
        # along, one below it may have lost files before this lease existed.
        floor = self.store.retention_floor_ts()
        if snapshot.snapshot_ts < floor:
            with self.store.batch():
                self.store.delete_lease(lease.lease_id)
            raise FailedPrecondition(
                f"retention pruning moved the time-travel floor (timestamp {floor}) past the "
                f"snapshot (timestamp {snapshot.snapshot_ts}) while its lease was taken; "
                "take a newer snapshot")
        log.info("lease taken", extra={"lease_id": lease.lease_id, "holder": holder,
                                       "tables": len(lease.tables)})
        return lease

    def _check_lease_limit(self, principal: str, now_ms: int) -> None:
        limit = self.config.max_live_leases_per_principal
        held = sum(1 for lease in self.store.load_leases()
                   if lease.principal == principal and lease.expires_ms > now_ms)
        if held >= limit:
            who = f"principal {principal!r}" if principal else "the anonymous principal"
            raise exceeded(f"{who} holds {held} live leases",
                           "--max-live-leases-per-principal", limit,
                           "release some first (ReleaseLease; they also expire)")

    def release_lease(self, lease_id: str) -> bool:
        """Ends a lease now; False if there is none (expired or released before)."""
        validation.check_id("lease_id", lease_id)
        with self.store.batch():
            released = self.store.delete_lease(lease_id)
        if released:
            log.info("lease released", extra={"lease_id": lease_id})
        return released

    def list_leases(self, tables: Iterable[str] = ()) -> list[LeaseRecord]:
        """The live leases, oldest first; with ``tables`` those on any of them."""
        wanted = set(self._resolve_tables(tables))
        return [lease for lease in self.live_leases()
                if not wanted or any(t in wanted for t, _ in lease.tables)]

    def live_lease(self, lease_id: str) -> LeaseRecord | None:
        """A live lease (for ReleaseLease's permission check); None if there is none."""
        validation.check_id("lease_id", lease_id)
        return next((lease for lease in self.live_leases() if lease.lease_id == lease_id),
                    None)

    def lease_principals(self) -> dict[str, str]:
        """lease id -> the principal that took it, of every lease (ListLeases hides the ids
        of other principals' leases)."""
        return {lease.lease_id: lease.principal for lease in self.store.load_leases()}

    def live_leases(self, now_ms: int | None = None) -> list[LeaseRecord]:
        """Leases not expired at ``now_ms`` (default now), oldest first."""
        now_ms = wall_ms() if now_ms is None else now_ms
        return sorted((lease for lease in self.store.load_leases() if lease.expires_ms > now_ms),
                      key=lambda lease: (lease.created_ms, lease.lease_id))

    def drop_expired_leases(self, now_ms: int | None = None) -> int:
        """Deletes the leases expired at ``now_ms`` (default now); returns how many."""
        now_ms = wall_ms() if now_ms is None else now_ms
        if all(lease.expires_ms > now_ms for lease in self.store.load_leases()):
            return 0  # a read, not a write, on nearly every pass
        with self.store.batch():
            dropped = self.store.delete_expired_leases(now_ms)
        if dropped:
            log.info("expired leases dropped", extra={"leases": dropped})
        return dropped

    def retention_guard_ts(self, now_ms: int | None = None) -> int | None:
        """The lowest timestamp retention pruning may raise the floor to: the oldest live
        lease's barrier and the oldest downstream reader's last input barrier (its range
        still to read starts there). None: nothing holds the floor back.

        A reader already below the current floor holds nothing: its range is pruned already
        (GetTableChanges refuses it until a reset starts it at or above the floor), and
        letting it pin the floor would stop pruning for every table (a new downstream
        pipeline starts at 0, a dead one stays where it stopped)."""
        guards = [lease.barrier_ts for lease in self.live_leases(now_ms)]
        completion = self.completion()  # Topology's (the core has both)
        readers = [completion.last_input(p) for p in completion.lineage.pipelines()
                   if not completion.lineage.is_root(p)]
        if readers:
            floor = self.store.retention_floor_ts()
            guards += [last for last in readers if last >= floor]
        return min(guards, default=None)
