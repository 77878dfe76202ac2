"""Tokens and ACL entries held in memory, so that checking a call never touches the store.

The view is reloaded from the store after every change made through this daemon, every
``refresh_s`` seconds (changes made through another daemon of a shared store, or by a standby
that became the leader) and when this daemon starts serving. Until the first load succeeded
only the bootstrap admin token is known.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from coordinator.auth import tokens
from coordinator.auth.acl import BOOTSTRAP_PRINCIPAL, EVERYTHING, Policy
from coordinator.auth_records import AclRecord, Permission, Resource, TokenRecord
from coordinator.store.base import Store

log = logging.getLogger("percolake.auth")

REFRESH_S = 2.0
Loader = Callable[[], tuple[list[TokenRecord], list[AclRecord]]]


class SecurityFileError(ValueError):
    """A file named by a security flag cannot be used; the message names the flag."""


class BootstrapTokenError(SecurityFileError):
    """The --admin-token-file cannot be used; the message says why and what to do."""


def bootstrap_token_hash(path: str | Path) -> str:
    """The hash of the admin token in ``path``; a missing file is created (mode 0600) with a
    new token in it, which this daemon never logs.

    Raises:
        BootstrapTokenError: the file is readable by others, or holds no usable token.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise BootstrapTokenError(f"--admin-token-file {path}: {exc.strerror}") from exc
    else:
        with os.fdopen(fd, "w") as out:
            out.write(tokens.new_token().bearer + "\n")
        log.warning("wrote a new bootstrap admin token", extra={"path": str(path)})
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BootstrapTokenError(f"--admin-token-file {path}: cannot be read ({exc})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BootstrapTokenError(
            f"--admin-token-file {path} is accessible by other users (mode "
            f"{stat.S_IMODE(mode):04o}); run: chmod 600 {path}")
    token = text.strip()
    if len(token) < tokens.MIN_BOOTSTRAP_CHARS or any(c.isspace() for c in token):
        raise BootstrapTokenError(
            f"--admin-token-file {path} must hold one token of at least "
            f"{tokens.MIN_BOOTSTRAP_CHARS} characters without blanks; delete the file to have "
            "a new one made")
    return tokens.secret_hash(token)


def store_loader(store: Callable[[], Store]) -> Loader:
    """Loads tokens and ACL entries from the store ``store()`` returns."""

    def load() -> tuple[list[TokenRecord], list[AclRecord]]:
        source = store()
        return source.load_tokens(), source.load_acl()

    return load


class Credentials:
    """Who a bearer token names and what each principal may do, from memory."""

    def __init__(self, load: Loader, bootstrap_hash: str | None = None,
                 refresh_s: float = REFRESH_S) -> None:
        self._load = load
        self._bootstrap_hash = bootstrap_hash
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._loads_started = 0  # each refresh's ticket, taken before it reads the store
        self._installed = 0  # the ticket of the view in memory
        self._tokens: dict[str, TokenRecord] = {}
        self._policy = self._with_bootstrap([])
        self.loaded = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _with_bootstrap(self, entries: list[AclRecord]) -> Policy:
        if self._bootstrap_hash is None:
            return Policy(entries)
        return Policy([*entries, AclRecord(BOOTSTRAP_PRINCIPAL, Resource.PIPELINE, EVERYTHING,
                                           Permission.ADMIN)])

    def is_bootstrap(self, bearer: str) -> bool:
        """Whether ``bearer`` is the bootstrap admin token (principal ``admin``)."""
        return self._bootstrap_hash is not None and tokens.matches(bearer, self._bootstrap_hash)

    def stored_principal_of(self, bearer: str) -> str | None:
        """The principal a stored token names; None for an unknown, revoked or malformed one."""
        parts = tokens.split(bearer)
        if parts is None:
            return None
        record = self._tokens.get(parts[0])
        if record is not None and tokens.matches(parts[1], record.secret_hash):
            return record.principal
        return None

    @property
    def policy(self) -> Policy:
        return self._policy

    def refresh(self) -> None:
        """Reloads from the store now; raises what the store raises (the old view stays).

        A load that started before another one's never replaces that one's view: the loop's
        read from before a revocation, slow to finish, would bring the revoked token back
        after the revoking call's own reload (until the next loop)."""
        with self._lock:
            self._loads_started += 1
            ticket = self._loads_started
        token_records, entries = self._load()
        with self._lock:
            if ticket < self._installed:
                return
            self._installed = ticket
            self._tokens = {t.token_id: t for t in token_records if t.live}
            self._policy = self._with_bootstrap(entries)
            self.loaded = True

    def refresh_soon(self) -> None:
        self._wake.set()

    def start(self) -> Credentials:
        self._thread = threading.Thread(target=self._run, name="credentials", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.refresh()
                if failing:
                    log.info("tokens and ACL entries reloaded")
                failing = False
            except Exception as exc:  # the store is away: keep the last view, try again
                if not failing:
                    log.warning("cannot reload tokens and ACL entries; keeping the last ones",
                                extra={"error": f"{type(exc).__name__}: {exc}"})
                failing = True
            self._wake.wait(self.refresh_s if self.loaded else min(self.refresh_s, 0.2))
            self._wake.clear()
