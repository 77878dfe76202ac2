"""Durable storage behind one small interface; SQLite is the embedded default, PostgreSQL the
store several coordinator processes share (one leads, holding the lease)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.store.base import (
    IndexView,
    Lease,
    LeaseRecord,
    Store,
    StoreSchemaError,
    TableCommit,
    TxnQuery,
)
from coordinator.store.memory import MemoryStore
from coordinator.store.sqlite import SqliteStore

__all__ = ["IndexView", "Lease", "LeaseRecord", "MemoryStore", "PostgresStore", "SqliteStore",
           "Store", "StoreSchemaError", "TableCommit", "TxnQuery", "is_postgres_url",
           "open_store"]


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_store(url: str, data_dir: str | Path | None, **postgres_options: Any) -> Store:
    """The store a ``--store`` value names: "" or "sqlite" -> SQLite in ``data_dir`` (with
    group commit, as the daemon runs it); "postgresql://..." or "postgres://..." -> PostgreSQL
    (``postgres_options``: PostgresStore's keyword arguments, e.g. idle_in_txn_timeout_s).

    Raises:
        ValueError: an unknown kind of store, or SQLite without a data dir.
        StoreUnavailable: PostgreSQL cannot be reached now.
        StoreSchemaError: the store's schema is newer than this coordinator knows.
    """
    if url in ("", "sqlite"):
        if data_dir is None:
            raise ValueError("the SQLite store needs a data dir")
        return SqliteStore(data_dir, group_commit=True)
    if is_postgres_url(url):
        from coordinator.store.postgres import PostgresStore

        return PostgresStore(url, **postgres_options)
    raise ValueError(f"unknown store {url.split('://')[0]!r}: use sqlite or postgresql://...")


def __getattr__(name: str) -> object:
    """``PostgresStore`` loads psycopg only when asked for."""
    if name == "PostgresStore":
        from coordinator.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
