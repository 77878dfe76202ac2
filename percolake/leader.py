"""What clients and a standby coordinator agree on: several addresses, the leader hint.

A client is given one or several coordinator addresses (``"h1:50051,h2:50051"``). A coordinator
that is not the leader answers UNAVAILABLE with the leader's address in the message and in the
trailing metadata key :data:`LEADER_METADATA_KEY`; the client then retries there.
:class:`LeaderFollower` is that client's loop, shared by the Spark side, the CLI and the tests.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from percolake.credentials import ClientSecurity, open_channel

log = logging.getLogger("percolake.leader")

LEADER_METADATA_KEY = "percolake-leader"


def parse_targets(text: str) -> list[str]:
    """``"h1:50051, h2:50051"`` -> ``["h1:50051", "h2:50051"]`` (order kept, duplicates dropped).

    Raises:
        ValueError: no address, or an address without a port.
    """
    targets: list[str] = []
    for part in text.split(","):
        address = part.strip()
        if not address:
            continue
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"coordinator address {address!r} is not HOST:PORT "
                             f"(several are separated by commas: h1:50051,h2:50051)")
        if address not in targets:
            targets.append(address)
    if not targets:
        raise ValueError(f"no coordinator address in {text!r}; give HOST:PORT, or several "
                         "separated by commas")
    return targets


def standby_message(self_address: str, leader_address: str | None, epoch: int | None) -> str:
    """The UNAVAILABLE message of a coordinator that is not the leader."""
    if leader_address:
        return (f"not the leader: the coordinator at {self_address} is a standby; the leader "
                f"is {leader_address} (lease epoch {epoch}); retry there")
    return (f"not the leader: the coordinator at {self_address} is a standby and no leader "
            "holds the lease right now (a takeover is under way); retry shortly")


RECONNECT_OPTIONS: list[tuple[str, int]] = [
    # gRPC's default reconnect backoff grows to 120 s; a coordinator that was down for a while
    # and became the leader again must be reachable within a takeover's few seconds.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
MIN_ATTEMPT_TIMEOUT_S = 1.0
# trailing metadata on a RESOURCE_EXHAUSTED that sheds load: nothing was done, retry later
RETRY_METADATA_KEY = "percolake-retry"
RETRY_METADATA = ((RETRY_METADATA_KEY, "after-backoff"),)


def overloaded(exc: grpc.RpcError) -> bool:
    """Whether the coordinator shed this call (it did nothing; the same call may be retried)."""
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        key == RETRY_METADATA_KEY for key, _ in _trailing_metadata(exc))


def dropped_by_stopping_server(exc: grpc.RpcError) -> bool:
    """Whether a coordinator shutting down dropped the call before any handler took it.

    gRPC core ends such a call CANCELLED with exactly this message (grpc/grpc#41785) where an
    UNAVAILABLE is meant: the server went away and nothing ran. A client closing its own
    channel gets CANCELLED with another message."""
    return exc.code() == grpc.StatusCode.CANCELLED and exc.details() == "CANCELLED"


def is_transient(exc: grpc.RpcError) -> bool:
    """A status the same call is retried after: no leader reached (a coordinator stopping
    included), or load shed."""
    return exc.code() in TRANSIENT or overloaded(exc) or dropped_by_stopping_server(exc)


def default_channel(address: str, security: ClientSecurity | None = None) -> grpc.Channel:
    """A channel to one coordinator that reconnects within a second; TLS and the bearer token
    as ``security`` says (None: from the ``PERCOLAKE_*`` environment variables)."""
    return open_channel(address, security, options=[*RECONNECT_OPTIONS,
                                                    ("grpc.enable_retries", 0)])


def leader_hint(exc: grpc.RpcError) -> str | None:
    """The leader's HOST:PORT a standby named in its UNAVAILABLE, if any."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in _trailing_metadata(exc):
        if key == LEADER_METADATA_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            try:
                (address,) = parse_targets(text)
            except ValueError:
                return None  # not one HOST:PORT: no usable hint
            return address
    return None


def _trailing_metadata(exc: grpc.RpcError) -> tuple[tuple[str, str | bytes], ...]:
    metadata = getattr(exc, "trailing_metadata", None)
    return tuple(metadata() or ()) if callable(metadata) else ()


class LeaderNotReached(grpc.RpcError):
    """No coordinator answered within the retry time; names every address and its last error.

    A ``grpc.RpcError`` whose ``code()`` is the last transient status, so callers that handle
    UNAVAILABLE keep working. Nothing about the call's outcome is known or guessed.
    """

    def __init__(self, method: str, retry_s: float, errors: dict[str, grpc.RpcError],
                 last: grpc.RpcError) -> None:
        self.method = method
        self.errors = dict(errors)
        self.last = last
        tried = "; ".join(f"{address} ({error.code().name}: {error.details()})"
                          for address, error in errors.items())
        self._details = (f"no coordinator answered {method} within {retry_s:.1f} s; "
                         f"tried {tried}")
        super().__init__(self._details)

    def code(self) -> grpc.StatusCode:
        return self.last.code()

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return _trailing_metadata(self.last)


class LeaderFollower:
    """Calls the coordinators' leader, wherever it is, given one or several addresses.

    One channel per address (made by ``channel_factory``). A call goes to the address that
    answered last. An UNAVAILABLE naming the leader in its trailing metadata switches there at
    once (an unknown address is added); any other UNAVAILABLE or DEADLINE_EXCEEDED moves on to
    the next address, backing off (jittered) once every address failed in a round. The same
    request is sent again: the protocol's calls are idempotent. Every other status is raised
    unchanged; running out of ``retry_s`` raises :class:`LeaderNotReached`. Thread-safe.

    Args:
        target: ``"h1:50051,h2:50051"`` or a list of addresses.
        channel_factory: makes the channel of one address (message limits, TLS...).
        stub_factory: makes the stub of a channel; methods are called by name.
        wait_for_ready: None: True with a single address (a restarting coordinator is waited
            for), False with several (a dead address fails fast and the next one is tried).
    """

    def __init__(self, target: str | Sequence[str],
                 channel_factory: Callable[[str], grpc.Channel] = default_channel, *,
                 stub_factory: Callable[[grpc.Channel], Any] | None = None,
                 wait_for_ready: bool | None = None, backoff_s: float = 0.05,
                 max_backoff_s: float = 1.0) -> None:
        self._addresses = parse_targets(target if isinstance(target, str) else ",".join(target))
        self.target = ",".join(self._addresses)
        self._channel_factory = channel_factory
        self._stub_factory = stub_factory or _coordinator_stub
        self._wait_for_ready = wait_for_ready
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._current = self._addresses[0]
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """Every address known: the given ones, then leaders learnt from standbys."""
        with self._lock:
            return list(self._addresses)

    @property
    def current(self) -> str:
        """The address the next call goes to first (the last one that answered)."""
        with self._lock:
            return self._current

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def call(self, method: str, request: Any, timeout_s: float, retry_s: float) -> Any:
        """``method`` (a stub method's name) at the leader; see the class for the retries.

        Each attempt's deadline is ``timeout_s``, cut to the retry time left (at least 1 s).

        Raises:
            grpc.RpcError: a non-transient status, as the coordinator answered it.
            LeaderNotReached: no leader answered within ``retry_s``.
        """
        deadline = time.monotonic() + retry_s
        delay = self._backoff_s
        errors: dict[str, grpc.RpcError] = {}
        failed_this_round: set[str] = set()
        address = self.current
        while True:
            stub, wait_for_ready = self._stub(address)
            attempt_timeout = min(timeout_s,
                                  max(deadline - time.monotonic(), MIN_ATTEMPT_TIMEOUT_S))
            try:
                reply = getattr(stub, method)(request, timeout=attempt_timeout,
                                              wait_for_ready=wait_for_ready)
            except grpc.RpcError as exc:
                if not is_transient(exc):
                    self._answered(address)
                    raise
                errors[address] = exc
                if time.monotonic() >= deadline:
                    raise LeaderNotReached(method, retry_s, errors, exc) from exc
                if overloaded(exc):  # the leader answered: the same address, after a pause
                    self._answered(address)
                    pause = min(delay * random.uniform(0.5, 1.5), deadline - time.monotonic())
                    if pause > 0:
                        time.sleep(pause)
                    delay = min(delay * 2, self._max_backoff_s)
                    continue
                failed_this_round.add(address)
                hint = leader_hint(exc)
                if hint and hint != address and hint not in failed_this_round:
                    log.info("coordinator %s is not the leader; following it to %s",
                             address, hint)
                    address = self._learn(hint)
                    continue
                address = self._next(address)
                if address in failed_this_round:  # every address had its chance: back off
                    pause = min(delay * random.uniform(0.5, 1.5), deadline - time.monotonic())
                    if pause > 0:
                        time.sleep(pause)
                    delay = min(delay * 2, self._max_backoff_s)
                    failed_this_round.clear()
                log.debug("%s failed (%s: %s); trying %s", method, exc.code().name,
                          exc.details(), address)
                continue
            self._answered(address)
            return reply

    def _stub(self, address: str) -> tuple[Any, bool]:
        with self._lock:
            if self._closed:
                raise ValueError("the coordinator client is closed")
            stub = self._stubs.get(address)
            if stub is None:
                self._channels[address] = channel = self._channel_factory(address)
                self._stubs[address] = stub = self._stub_factory(channel)
            wait = len(self._addresses) == 1 if self._wait_for_ready is None \
                else self._wait_for_ready
            return stub, wait

    def _learn(self, address: str) -> str:
        with self._lock:
            if address not in self._addresses:
                self._addresses.append(address)
        return address

    def _next(self, address: str) -> str:
        with self._lock:
            index = self._addresses.index(address)
            return self._addresses[(index + 1) % len(self._addresses)]

    def _answered(self, address: str) -> None:
        with self._lock:
            if address == self._current:
                return
            previous, self._current = self._current, address
        log.info("coordinator leader is now %s (was %s)", address, previous)


def _coordinator_stub(channel: grpc.Channel) -> Any:
    from percolake.v1 import coordinator_pb2_grpc as pb_grpc

    return pb_grpc.CoordinatorStub(channel)
