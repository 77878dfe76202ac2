"""Durable storage behind one small interface; SQLite is the embedded default."""

from coordinator.store.base import Store, TableCommit, TxnQuery
from coordinator.store.memory import MemoryStore
from coordinator.store.sqlite import SqliteStore

__all__ = ["MemoryStore", "SqliteStore", "Store", "TableCommit", "TxnQuery"]
