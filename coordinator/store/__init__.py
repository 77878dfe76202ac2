"""Durable storage behind one small interface; SQLite is the embedded default."""

from coordinator.store.base import IndexView, Store, TableCommit, TxnQuery
from coordinator.store.memory import MemoryStore
from coordinator.store.sqlite import SqliteStore

__all__ = ["IndexView", "MemoryStore", "SqliteStore", "Store", "TableCommit", "TxnQuery"]
