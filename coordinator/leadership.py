"""Which core serves the calls: one fixed core (SQLite), or the leader lease's (PostgreSQL).

Active–standby on a store with leases: a standby polls ``try_acquire_lease``; on success it
loads a fresh core from the store (exactly as a restarted daemon does) and serves. A leader
renews the lease and answers only while ``monotonic() < (when the last successful renewal was
sent) + VALID_FRACTION * lease_s``. It steps down (health NOT_SERVING, no core, the old core
closed) when a renewal is refused, that deadline passes, or a store call fails with NotLeader or
StoreUnavailable; then it is a standby again.

Each term of leadership has a store object of its own: the one the lease was acquired with,
whose writes carry that term's epoch. A request still running in an old core after a step-down
can therefore only write with the old epoch, which the store refuses once anyone (this process
included) acquired the lease again. That term store is closed once the old core's resolver
stopped and its last call left.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.core import TransactionCoordinator
from coordinator.store.base import Store
from percolake.errors import NotLeader, StoreUnavailable
from percolake.leader import standby_message

log = logging.getLogger("percolake.leadership")

VALID_FRACTION = 0.8  # of the lease: the leader's own margin against clock-rate drift
LEADER_HINT_CACHE_S = 0.2
MAX_BACKOFF_S = 1.0


class NotServing(NotLeader):
    """This process has no core to answer with; ``leader_address`` is where to retry."""

    def __init__(self, message: str, leader_address: str | None = None) -> None:
        super().__init__(message)
        self.leader_address = leader_address


class OutcomeUnknown(NotServing):
    """The leadership ended while a call ran: whatever it did is re-read by the next leader."""


class Fatal(Exception):
    """The store cannot be used at all (a newer schema, a bad setting): the daemon exits."""


@dataclass(eq=False)
class Term:
    """One term of leadership (or the one everlasting term of a fixed core)."""

    epoch: int | None
    store: Store
    valid_until: float
    monotonic: Callable[[], float] = time.monotonic
    core: TransactionCoordinator | None = None
    ended: bool = False
    calls: int = 0
    retired: threading.Event = field(default_factory=threading.Event)

    def valid(self) -> bool:
        return not self.ended and self.monotonic() < self.valid_until

    def confirm(self) -> None:
        """Raises OutcomeUnknown unless this term still leads: checked before every reply."""
        if not self.valid():
            raise OutcomeUnknown(
                f"the leadership of this coordinator (lease epoch {self.epoch}) ended while the "
                "call ran: its outcome is unknown and will be re-read by the next leader; retry")


class CoreProvider(Protocol):
    """What the servicer asks for each call."""

    def serving(self) -> contextlib.AbstractContextManager[Term]:
        """The term to answer with, for the duration of one call; raises NotServing."""
        ...

    def lost(self, term: Term, exc: BaseException) -> OutcomeUnknown:
        """A store call of ``term`` failed with NotLeader or StoreUnavailable: the error to
        answer with (the leadership steps down first)."""
        ...


class FixedCore:
    """The SQLite default: one process, always the leader, no lease."""

    def __init__(self, core: TransactionCoordinator) -> None:
        self.term = Term(epoch=None, store=core.store, valid_until=float("inf"), core=core)

    @contextlib.contextmanager
    def serving(self) -> Iterator[Term]:
        yield self.term

    def lost(self, term: Term, exc: BaseException) -> OutcomeUnknown:
        return OutcomeUnknown(f"{type(exc).__name__}: {exc}; the outcome of the call is "
                              "unknown; read the transaction again before retrying")


class Leadership:
    """The lease loop and the core's lifecycle; a :class:`CoreProvider` for the servicer.

    Args:
        open_store: a new store object each call (raises StoreUnavailable while unreachable,
            anything else when the store can never be used).
        build_core: a core loaded from a store (what a restarted daemon builds).
        node_id: this process incarnation's lease holder id.
        advertise: the HOST:PORT clients reach this process at (shown to them by standbys).
        on_serving: called with True once a core serves and False when it stops (health).
        store: an already opened store to begin with.
    """

    def __init__(self, open_store: Callable[[], Store],
                 build_core: Callable[[Store], TransactionCoordinator], *, node_id: str,
                 advertise: str, lease_s: float = 2.0,
                 on_serving: Callable[[bool], None] = lambda serving: None,
                 store: Store | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.advertise = advertise
        self.lease_s = lease_s
        self.fatal: BaseException | None = None
        self._open_store = open_store
        self._build_core = build_core
        self._on_serving = on_serving
        self._monotonic = monotonic
        self._standby_store = store
        self._term: Term | None = None
        self._recent_term: Term | None = None  # the current or the last term
        self._lock = threading.Lock()
        self._opening = threading.Lock()  # one standby store, whoever opens it first
        self._left = threading.Condition(self._lock)  # a call left a term
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._hint: tuple[float, str | None, int | None] = (-float("inf"), None, None)
        self._acquire_after = -float("inf")
        self._backoff = self.poll_s

    @property
    def poll_s(self) -> float:
        return self.lease_s / 8

    @property
    def renew_s(self) -> float:
        return self.lease_s / 4

    # ------------------------------------------------------------------ for the servicer

    @contextlib.contextmanager
    def serving(self) -> Iterator[Term]:
        term = self._enter()
        try:
            yield term
        finally:
            with self._lock:
                term.calls -= 1
                self._left.notify_all()

    def lost(self, term: Term, exc: BaseException) -> OutcomeUnknown:
        self.step_down(term, f"a store call failed: {type(exc).__name__}: {exc}")
        leader, _ = self._leader_hint()
        return OutcomeUnknown(
            f"{type(exc).__name__}: {exc}; this coordinator stepped down (lease epoch "
            f"{term.epoch}): the outcome of the call is unknown and will be re-read by the next "
            "leader; retry", leader)

    def _enter(self) -> Term:
        with self._lock:
            term = self._term
            if term is not None and term.core is not None and term.valid():
                term.calls += 1
                return term
        if term is not None and term.core is not None and not term.ended:
            # Found here first, e.g. right after a SIGSTOP: stop serving before anything else.
            self.step_down(term, "the lease ran out before a renewal succeeded")
        leader, epoch = self._leader_hint()
        raise NotServing(standby_message(self.advertise, leader, epoch), leader)

    def _leader_hint(self) -> tuple[str | None, int | None]:
        """The leader's address and epoch from the lease row (None, None: no other leader),
        read at most every LEADER_HINT_CACHE_S."""
        now = time.monotonic()
        read_at, address, epoch = self._hint
        if now - read_at < LEADER_HINT_CACHE_S:
            return address, epoch
        address, epoch = None, None
        # The standby's store; right after a step-down the old term's, open until its last
        # call (maybe the caller) left, by when the standby's is open (``_retire``).
        recent = self._recent_term
        store = self._standby_store or (
            recent.store if recent is not None and not recent.retired.is_set() else None)
        if store is not None:
            try:
                lease = store.read_lease()
                if lease.holder and lease.holder != self.node_id and lease.remaining_s > 0:
                    address, epoch = lease.address, lease.epoch
            except Exception as exc:  # unreachable, or closed under us: no leader known
                log.debug("cannot read the lease", extra={"error": repr(exc)})
        self._hint = (now, address, epoch)
        return address, epoch

    # ------------------------------------------------------------------ state

    @property
    def is_leader(self) -> bool:
        term = self._term
        return term is not None and term.core is not None and term.valid()

    @property
    def epoch(self) -> int | None:
        """The epoch of the term serving now (None while a standby)."""
        term = self._term
        return term.epoch if term is not None and term.core is not None else None

    @property
    def core(self) -> TransactionCoordinator | None:
        term = self._term
        return term.core if term is not None else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Leadership:
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()
        self._spawn(self._watch, name="lease-watch")
        return self

    def stop(self) -> None:
        """Steps down, releasing the lease so a standby takes over at once; ends the loop."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_s + 30)
        term = self._term
        if term is not None:
            self.step_down(term, "shutting down", release=True)

    def close(self, timeout_s: float = 30.0) -> None:
        """After ``stop``: waits for old cores to close, then closes the standby's store."""
        deadline = time.monotonic() + timeout_s
        for worker in list(self._workers):
            worker.join(max(0.0, deadline - time.monotonic()))
        with self._opening:
            if self._standby_store is not None:
                self._standby_store.close()
                self._standby_store = None

    def step_down(self, term: Term, reason: str, release: bool = False) -> None:
        """Ends ``term`` (idempotent): no call is answered with it from now on; its core is
        closed and its store too once its last call left. ``release`` expires the lease at
        once, so that another coordinator need not wait for it to run out."""
        with self._lock:
            if term.ended:
                return
            term.ended = True
            if self._term is term:
                self._term = None
            self._on_serving(False)  # under the lock: never after a newer term's True
        log.warning("stepped down", extra={"epoch": term.epoch, "reason": reason})
        if release:
            try:
                term.store.release_lease(term.epoch)
                log.info("released the lease", extra={"epoch": term.epoch})
            except Exception as exc:  # it runs out by itself
                log.warning("could not release the lease", extra={"error": str(exc)})
        self._spawn(self._retire, term, name=f"retire-{term.epoch}")

    def _retire(self, term: Term) -> None:
        with self._lock:
            core = term.core
        if core is not None:
            core.close()
        with self._lock:
            self._left.wait_for(lambda: term.calls == 0)
        if self._term is None and not self._stopping.is_set():
            # the standby's store before the term's closes: a refusal in between (before the
            # lease loop's next turn) still reads the lease and names the new leader
            with contextlib.suppress(Exception):  # unreachable: the loop retries it
                self._standby()
        with contextlib.suppress(Exception):
            term.store.close()
        term.retired.set()

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        worker = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _run(self) -> None:
        while not self._stopping.is_set() and self.fatal is None:
            self._stopping.wait(self.step())

    def _watch(self) -> None:
        """Steps a leader down the moment its validity runs out, apart from the lease loop: a
        renewal hanging on an unreachable store must not leave health SERVING meanwhile."""
        while not self._stopping.is_set():
            term, wait = self._term, self.poll_s
            if term is not None and not term.ended:
                remaining = term.valid_until - self._monotonic()
                if remaining <= 0:
                    self.step_down(term, "the lease ran out before a renewal succeeded")
                    continue
                wait = min(wait, remaining)
            self._stopping.wait(wait)

    def step(self) -> float:
        """One turn of the loop: acquire as a standby, renew as a leader; returns the seconds
        until the next turn. Never raises: a store that cannot be used at all is recorded
        in ``fatal`` (the daemon exits), anything else is retried after a backoff."""
        try:
            wait = self._acquire() if self._term is None else self._renew(self._term)
            self._backoff = self.poll_s
            return wait
        except Fatal as exc:
            self.fatal = exc.__cause__ or exc
            log.error("cannot use the store", extra={"error": str(self.fatal)})
            return 0.0
        except (StoreUnavailable, NotLeader) as exc:
            if self._term is not None:
                self.step_down(self._term, f"{type(exc).__name__}: {exc}")
            log.warning("store unavailable; retrying", extra={"error": str(exc),
                                                             "retry_in_s": self._backoff})
        except Exception:  # a bug: loud, and no serving on a state we do not understand
            log.exception("leadership loop failed")
            if self._term is not None:
                self.step_down(self._term, "the leadership loop failed")
        wait, self._backoff = self._backoff, min(2 * self._backoff, MAX_BACKOFF_S)
        return wait

    def _standby(self) -> Store:
        with self._opening:
            if self._standby_store is None:
                try:
                    self._standby_store = self._open_store()
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    raise Fatal(str(exc)) from exc
            return self._standby_store

    def _acquire(self) -> float:
        store = self._standby()
        if self._monotonic() < self._acquire_after:
            return self.poll_s
        sent = self._monotonic()
        epoch = store.try_acquire_lease(self.node_id, self.advertise, self.lease_s)
        if epoch is None:
            return self.poll_s
        term = Term(epoch, store, sent + VALID_FRACTION * self.lease_s, self._monotonic)
        with self._lock:
            self._term = self._recent_term = term
            self._standby_store = None
        log.info("acquired the lease; loading state", extra={"epoch": epoch,
                                                              "advertise": self.advertise})
        self._spawn(self._load, term, name=f"load-{epoch}")
        return self.renew_s

    def _load(self, term: Term) -> None:
        """Builds the term's core from the store (the lease loop renews meanwhile)."""
        started = self._monotonic()
        try:
            core = self._build_core(term.store)
        except Exception as exc:
            if not isinstance(exc, StoreUnavailable):
                log.exception("could not load the coordinator state", extra={"epoch": term.epoch})
                # Let another coordinator try before this one does again.
                self._acquire_after = self._monotonic() + self.lease_s
            self.step_down(term, f"loading the state failed: {type(exc).__name__}: {exc}",
                           release=not isinstance(exc, StoreUnavailable))
            return
        with self._lock:
            serving = not term.ended
            if serving:
                core.start_background()
                self._on_serving(True)
                term.core = core  # last: ``is_leader`` reads it without the lock
        if not serving:
            core.close()
            return
        log.info("leader: serving", extra={"epoch": term.epoch, "advertise": self.advertise,
                                           "load_s": round(self._monotonic() - started, 3)})

    def _renew(self, term: Term) -> float:
        sent = self._monotonic()
        if sent >= term.valid_until:
            self.step_down(term, "the lease ran out before a renewal succeeded")
            return 0.0
        if not term.store.renew_lease(term.epoch, self.lease_s):
            self.step_down(term, "renewal refused: another coordinator holds the lease")
            return self.poll_s
        with self._lock:
            term.valid_until = max(term.valid_until, sent + VALID_FRACTION * self.lease_s)
        return max(0.0, sent + self.renew_s - self._monotonic())
