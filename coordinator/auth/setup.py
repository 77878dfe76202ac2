"""Everything security adds to a running server, made from its options in one place."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc

from coordinator.auth.access import Guard
from coordinator.auth.admin_service import SecuredServicer
from coordinator.auth.audit import AuditLog
from coordinator.auth.credentials import (
    Credentials,
    SecurityFileError,
    bootstrap_token_hash,
    store_loader,
)
from coordinator.auth.interceptor import AuthInterceptor
from coordinator.store.base import Store

log = logging.getLogger("percolake.auth")


class _ReadingStore:
    """The store the credentials are read from: the daemon's own when it has one store for
    life (SQLite); else one of their own, opened when first needed (PostgreSQL: it reads
    without the lease, so a standby's view is fresh when it takes over)."""

    def __init__(self, shared: Store | None, open_store: Callable[[], Store]) -> None:
        self._shared = shared
        self._open = open_store
        self._own: Store | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Store:
        if self._shared is not None:
            return self._shared
        with self._lock:
            if self._own is None:
                self._own = self._open()
            return self._own

    def close(self) -> None:
        with self._lock:
            if self._own is not None:
                with contextlib.suppress(Exception):
                    self._own.close()
                self._own = None


class Security:
    """The authentication interceptor, the guard of each call, the audit log, and the
    credentials in memory (None without ``--authenticate``)."""

    def __init__(self, credentials: Credentials | None, audit_log: AuditLog | None,
                 open_health: bool, reading: _ReadingStore | None,
                 redact: Callable[[str], str]) -> None:
        self.credentials = credentials
        self.audit_log = audit_log
        self.open_health = open_health
        self._reading = reading
        self.guard = Guard(credentials, audit_log, redact)

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        if self.credentials is None and self.audit_log is None:
            return []  # authentication off and no audit log: calls run exactly as before
        return [AuthInterceptor(self.credentials, self.audit_log, self.open_health)]

    def servicer(self, cores: Any, redact: Callable[[str], str]) -> SecuredServicer:
        return SecuredServicer(cores, redact, self.guard, self.credentials)

    def serving(self) -> None:
        """This daemon starts serving (e.g. a standby took over): reload at once."""
        if self.credentials is not None:
            self.credentials.refresh_soon()

    def close(self) -> None:
        if self.credentials is not None:
            self.credentials.stop()
        if self._reading is not None:
            self._reading.close()
        if self.audit_log is not None:
            self.audit_log.close()


def build_security(*, authenticate: bool, open_health: bool, audit_log: str,
                   admin_token_file: str, store: Store | None,
                   open_store: Callable[[], Store],
                   redact: Callable[[str], str] = str) -> Security:
    """Raises SecurityFileError: the admin token file or the audit log cannot be used."""
    try:
        log_file = AuditLog(audit_log) if audit_log else None
    except OSError as exc:
        raise SecurityFileError(f"--audit-log {audit_log}: {exc.strerror or exc}") from exc
    if not authenticate:
        if admin_token_file:
            log.warning("--admin-token-file is ignored without --authenticate")
        return Security(None, log_file, open_health, None, redact)
    bootstrap = bootstrap_token_hash(admin_token_file) if admin_token_file else None
    shared = store if store is not None and not store.supports_leases else None
    reading = _ReadingStore(shared, open_store)
    credentials = Credentials(store_loader(reading), bootstrap)
    try:
        credentials.refresh()  # served from the first call when the store answers now
    except Exception as exc:  # noqa: BLE001 - the loop keeps trying
        log.warning("cannot load tokens and ACL entries yet; retrying",
                    extra={"error": redact(f"{type(exc).__name__}: {exc}")})
    credentials.start()
    log.info("authentication on", extra={"open_health": open_health,
                                         "bootstrap_admin": bootstrap is not None})
    return Security(credentials, log_file, open_health, reading, redact)
