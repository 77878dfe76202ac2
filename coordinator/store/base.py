"""The storage interface every store implements (memory, SQLite, PostgreSQL).

Rules for implementations:
- Updates are compare-and-set on ``row_version``, checked by row count; a mismatch raises
  :class:`~percolake.errors.StoreConflict` ("commit failed, re-read and retry").
- Every write made inside ``with store.batch():`` becomes durable together (a write outside a
  batch is its own batch): before ``batch`` returns, or, in a store with group commit, before
  the next ``flush()`` returns. Whoever replies to a client calls ``flush()`` first (I8).
- Nothing above this interface may rely on one implementation's specifics.

Stores shared by several coordinator processes (``supports_leases``) also keep the leader
lease: one holder at a time, each acquisition with a new epoch (the fencing token). Such a store
refuses writes (:class:`~percolake.errors.NotLeader`) unless it holds the lease and the epoch it
acquired is still the newest; a store it cannot reach raises
:class:`~percolake.errors.StoreUnavailable` (the outcome of a write in flight is unknown).
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.auth_records import AclRecord, TokenRecord
from percolake.records import PipelineRecord, QuarantineRecord, TxnRecord
from percolake.states import TxnState

UNFINISHED_STATES = (TxnState.OPEN, TxnState.PREWRITTEN, TxnState.COMMITTED)


class StoreSchemaError(RuntimeError):
    """The store's schema is newer than this coordinator knows: upgrade the coordinator."""


@dataclass(frozen=True)
class Lease:
    """The leader lease as the store sees it now."""

    holder: str  # node id of the holder ("" if never held)
    epoch: int  # fencing token: +1 on every acquisition
    address: str  # advertised HOST:PORT of the holder
    remaining_s: float  # seconds until expiry by the store's clock (<= 0: expired)


@dataclass(frozen=True)
class TableCommit:
    """A committed transaction's write to one table, in the snapshot index."""

    table: str
    commit_ts: int
    txn_id: str
    delta_version: int | None
    input_barrier: int = 0  # the committing transaction's (docs/topology.md); 0: a root's
    # The commit_ts of the revision of a derived table that rolled this commit back (0: none):
    # from then on it is no change and no version at any barrier.
    superseded_ts: int = 0
    # A derived revision's restore commit: a version of the table, no change (a root
    # revision's restore is a change: the pipelines reading it restart after it).
    restore: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "restore", bool(self.restore))  # SQLite answers 0/1

    def live_at(self, as_of_ts: int | None) -> bool:
        """Whether the commit is in the index as it stood at ``as_of_ts`` (None: now):
        committed by then and not superseded by then."""
        if as_of_ts is None:
            return not self.superseded_ts
        return self.commit_ts <= as_of_ts and (not self.superseded_ts
                                                or self.superseded_ts > as_of_ts)

    def barrier(self, by_input_barrier: bool) -> int:
        """The barrier this commit changes its table at: its input barrier for a downstream
        table, its commit_ts for a root table and for a downstream table's commit without an
        input barrier (made before its writer read any percolake table: docs/topology.md,
        "Lineage transitions")."""
        if by_input_barrier and self.input_barrier > 0:
            return self.input_barrier
        return self.commit_ts


@dataclass(frozen=True)
class IndexView:
    """The retention floor and, per table, its newest commit at or below a timestamp, all
    read at one moment: a prune pass never falls between the floor and the rows."""

    floor_ts: int
    commits: dict[str, TableCommit | None]


@dataclass(frozen=True)
class TableWriter:
    """Lineage: the one pipeline that writes (owns) a table, recorded when it first declared
    it (docs/topology.md)."""

    table: str
    pipeline_id: str
    registered_ms: int


@dataclass(frozen=True)
class ReadEdge:
    """Lineage: a pipeline reads a percolake table (its streaming source or ``txn.read``)."""

    pipeline_id: str
    table: str
    registered_ms: int
    # The oracle timestamp the edge counts from: the table's changes at or below it neither
    # end the pipeline's batches nor hold its tables' completion (0: from the start; set when
    # a pipeline that already writes tables gains the read, docs/topology.md).
    since_ts: int = 0


@dataclass(frozen=True)
class LeaseRecord:
    """A reader's lease on a snapshot (docs/topology.md, safe expiry): vacuum keeps the files
    of these (table, Delta version)s until ``expires_ms``."""

    lease_id: str
    holder: str
    tables: tuple[tuple[str, int], ...]  # (canonical table, Delta version)
    barrier_ts: int  # the snapshot's barrier (or commit_ts)
    created_ms: int
    expires_ms: int
    principal: str = ""  # who took it: only they (or an ADMIN on '*') may release it

    def tables_json(self) -> str:
        return json.dumps([{"table": t, "version": v} for t, v in self.tables],
                          separators=(",", ":"))

    @staticmethod
    def tables_from_json(text: str) -> tuple[tuple[str, int], ...]:
        return tuple((t["table"], int(t["version"])) for t in json.loads(text or "[]"))


@dataclass
class TxnQuery:
    """Filters of ListTransactions; results are ordered by start_ts."""

    pipeline_id: str = ""
    generation: int | None = None
    states: tuple[TxnState, ...] = ()
    batch_id: int | None = None
    created_after_ms: int = 0
    created_before_ms: int = 0
    after_start_ts: int = 0
    limit: int = 100


class Store(abc.ABC):
    """Durable records of pipelines, transactions, the snapshot index and the oracle."""

    supports_leases: bool = False

    @abc.abstractmethod
    def batch(self) -> contextlib.AbstractContextManager[None]:
        """All writes inside become durable together when the block ends without error."""

    def flush(self) -> None:
        """Returns once every batch ended before the call is durable.

        A no-op where ``batch`` itself is durable on return; a group-committing store makes
        the batches of all concurrent callers durable with one commit here.
        """
        return

    @abc.abstractmethod
    def close(self) -> None: ...

    def ping(self) -> None:
        """Raises StoreUnavailable if the store cannot be reached (an embedded one always can)."""
        return

    # leader lease (stores with ``supports_leases``)
    def read_lease(self) -> Lease:
        raise NotImplementedError(f"{type(self).__name__} keeps no leader lease")

    def try_acquire_lease(self, holder: str, address: str, lease_s: float) -> int | None:
        """Takes the lease for ``lease_s`` seconds if it expired or ``holder`` holds it; bumps
        the epoch. Returns the new epoch, which this store's writes carry from now on, or None
        if another holder's lease runs (or the lease row stayed locked too long)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leader lease")

    def renew_lease(self, epoch: int, lease_s: float) -> bool:
        """Extends the lease to ``lease_s`` seconds from now if ``epoch`` is still the newest
        (even if it ran out: nobody took over); False if another acquisition happened."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leader lease")

    def release_lease(self, epoch: int) -> None:
        """Expires the lease now if ``epoch`` still holds it (a graceful shutdown); this store
        writes no more."""
        raise NotImplementedError(f"{type(self).__name__} keeps no leader lease")

    @property
    def fencing_epoch(self) -> int | None:
        """The lease epoch this store's writes carry (None: it holds no lease)."""
        return None

    # timestamp oracle
    @abc.abstractmethod
    def read_timestamp_high_water(self) -> int: ...

    @abc.abstractmethod
    def write_timestamp_high_water(self, value: int) -> None:
        """Durably records that no timestamp at or above ``value`` was handed out; a mark only
        rises (a lower ``value`` than the stored one changes nothing), so concurrent writers
        finishing in any order leave the highest."""

    # pipelines
    @abc.abstractmethod
    def load_pipelines(self) -> list[PipelineRecord]: ...

    @abc.abstractmethod
    def insert_pipeline(self, record: PipelineRecord) -> None:
        """Raises StoreConflict if the pipeline exists."""

    @abc.abstractmethod
    def update_pipeline(self, record: PipelineRecord) -> None:
        """Compare-and-set on ``record.row_version``; bumps it on success."""

    # transactions
    @abc.abstractmethod
    def insert_txn(self, record: TxnRecord) -> None:
        """Raises StoreConflict if the txn_id exists."""

    @abc.abstractmethod
    def update_txn(self, record: TxnRecord) -> None:
        """Compare-and-set on ``record.row_version``; bumps it on success. A transaction's
        identity (``schema.TXN_IDENTITY_COLUMNS``: its ids, batch, attempt, epoch, start_ts,
        creation) is fixed at insert: a record that differs there is refused (StoreConflict),
        never written."""

    @abc.abstractmethod
    def get_txn(self, txn_id: str) -> TxnRecord | None: ...

    @abc.abstractmethod
    def attempts_of(self, pipeline_id: str, generation: int, batch_id: int) -> list[TxnRecord]:
        """Every attempt of one logical transaction, oldest first."""

    @abc.abstractmethod
    def newest_committed_batch(self, pipeline_id: str, generation: int) -> int | None:
        """The highest batch id of the generation that committed (pruning always keeps it)."""

    @abc.abstractmethod
    def unfinished_txns(self) -> list[TxnRecord]:
        """Transactions in OPEN, PREWRITTEN or COMMITTED: what a restart must load."""

    @abc.abstractmethod
    def list_txns(self, query: TxnQuery) -> list[TxnRecord]: ...

    # snapshot index
    @abc.abstractmethod
    def add_table_commit(self, commit: TableCommit) -> None: ...

    @abc.abstractmethod
    def set_table_commit_version(self, table: str, commit_ts: int, delta_version: int) -> None: ...

    def add_table_commits(self, commits: Sequence[TableCommit]) -> None:
        """``add_table_commit`` of each, in one step where the store can (inside a batch)."""
        for commit in commits:
            self.add_table_commit(commit)

    def set_table_commit_versions(self, versions: Sequence[tuple[str, int, int]]) -> None:
        """``set_table_commit_version`` of each (table, commit_ts, delta_version)."""
        for table, commit_ts, delta_version in versions:
            self.set_table_commit_version(table, commit_ts, delta_version)

    @abc.abstractmethod
    def table_commit_at(self, table: str, max_commit_ts: int) -> TableCommit | None:
        """The newest commit to ``table`` with commit_ts <= max_commit_ts."""

    @abc.abstractmethod
    def table_commits_at(self, tables: Sequence[str], max_commit_ts: int) -> IndexView:
        """The retention floor and ``table_commit_at(t, max_commit_ts)`` for each table, read
        in one consistent view (one read transaction). A prune raises the floor together with
        its deletions, so the rows answer exactly as before any prune whenever
        ``max_commit_ts >= floor_ts``; below it they may be thinned and must not be used."""

    @abc.abstractmethod
    def unapplied_table_commits(self, table: str, max_commit_ts: int) -> list[TableCommit]:
        """Commits to ``table`` at or below ``max_commit_ts`` not yet applied, in order."""

    # input barriers (docs/topology.md). ``by_input_barrier`` keys a commit by its input
    # barrier (a downstream table's changes) instead of its commit_ts (a root table's); keyed
    # so, a commit with input barrier 0 (made before its writer read any percolake table) is
    # keyed by its commit_ts (``TableCommit.barrier``). Only live commits are found
    # (``TableCommit.live_at(as_of_ts)``): ``as_of_ts`` reads the index as it stood then, so an
    # answer made of several reads sees one state even if a revision commits meanwhile.
    # A "change" is a live commit that is not a revision's restore.
    @abc.abstractmethod
    def table_commits_in_range(self, table: str, after: int, upto: int,
                               by_input_barrier: bool,
                               as_of_ts: int | None = None) -> list[TableCommit]:
        """The changes to ``table`` whose key lies in (after, upto], in commit_ts order."""

    @abc.abstractmethod
    def table_commit_at_barrier(self, table: str, barrier: int, by_input_barrier: bool,
                                as_of_ts: int | None = None) -> TableCommit | None:
        """The newest live commit (by commit_ts) to ``table`` whose key is <= ``barrier``
        (and, keyed by input barrier, > 0): the table's version at that barrier."""

    @abc.abstractmethod
    def first_table_commit_after(self, table: str, after: int, by_input_barrier: bool,
                                 as_of_ts: int | None = None) -> TableCommit | None:
        """The oldest change (by commit_ts) to ``table`` whose key is > ``after``."""

    @abc.abstractmethod
    def last_input_barrier(self, pipeline_id: str, generation: int) -> int:
        """The highest input barrier of the generation's COMMITTED or APPLIED transactions, 0
        if none has one. Pruning keeps it: input barriers rise with batch ids (T1), and the
        newest committed batch with one is never pruned."""

    @abc.abstractmethod
    def newest_commit_at_or_before(self, pipeline_id: str, max_commit_ts: int) -> TxnRecord | None:
        """The pipeline's COMMITTED or APPLIED transaction (any generation, any batch) with the
        highest commit_ts <= ``max_commit_ts``; None if none (or it was pruned)."""

    @abc.abstractmethod
    def first_unapplied_input_barrier(self, table: str,
                                      as_of_ts: int | None = None) -> int | None:
        """The lowest key (``TableCommit.barrier(True)``) of the table's live unapplied
        commits, None if none."""

    @abc.abstractmethod
    def newest_restore(self, table: str, as_of_ts: int | None = None) -> int:
        """The commit_ts of the table's newest restore row (at or below ``as_of_ts``); 0 if
        it has none."""

    @abc.abstractmethod
    def supersede_table_commits(self, table: str, revision_ts: int,
                                above_input_barrier: int) -> int:
        """Marks the table's live commits with commit_ts < ``revision_ts`` and an input
        barrier > ``above_input_barrier`` superseded by the revision committed at
        ``revision_ts``; returns how many it marked."""

    # snapshot leases (docs/topology.md)
    @abc.abstractmethod
    def insert_lease(self, lease: LeaseRecord) -> None:
        """Raises StoreConflict if the lease_id exists."""

    @abc.abstractmethod
    def delete_lease(self, lease_id: str) -> bool:
        """Removes the lease; False if there was none."""

    @abc.abstractmethod
    def load_leases(self) -> list[LeaseRecord]:
        """Every lease (expired ones not yet deleted included), ordered by lease_id."""

    @abc.abstractmethod
    def delete_expired_leases(self, now_ms: int) -> int:
        """Removes every lease with expires_ms <= ``now_ms``; returns how many."""

    # retention
    @abc.abstractmethod
    def retention_floor_ts(self) -> int:
        """Time travel below this timestamp was pruned (0: nothing ever was)."""

    @abc.abstractmethod
    def prune(self, cutoff_ms: int, floor_ts: int, limit: int,
              keep: frozenset[str] = frozenset()) -> tuple[int, int]:
        """Deletes history past the retention horizon, at most about ``limit`` rows a call.

        Deleted: APPLIED and ABORTED transactions created and last updated before
        ``cutoff_ms``, except those in ``keep`` and, per (pipeline, generation), the committed
        attempt of the newest committed batch (so a replay of it is still answered "already
        committed") and that of the newest committed batch with an input barrier (what
        ``last_input_barrier`` answers); and applied snapshot-index rows with commit_ts below
        ``floor_ts``, except each table's newest row at or below ``floor_ts`` (what a snapshot
        at or after the floor reads). Unfinished transactions and unapplied index rows are
        never deleted. Raises the recorded floor to ``floor_ts``, durably with the deletions.

        Returns:
            How many transactions and how many snapshot-index rows were deleted.
        """

    # lineage (docs/topology.md)
    @abc.abstractmethod
    def load_table_writers(self) -> list[TableWriter]:
        """Every table's owner, ordered by table."""

    @abc.abstractmethod
    def insert_table_writer(self, writer: TableWriter) -> None:
        """Records the table's owner; raises StoreConflict if the table already has one."""

    @abc.abstractmethod
    def load_read_edges(self) -> list[ReadEdge]:
        """Every read edge, ordered by (pipeline, table)."""

    @abc.abstractmethod
    def insert_read_edge(self, edge: ReadEdge) -> bool:
        """Adds the edge; False (and nothing changed) if the pipeline already reads the table."""

    # security: bearer tokens (only their hashes) and ACL entries
    @abc.abstractmethod
    def load_tokens(self) -> list[TokenRecord]:
        """Every token, revoked ones included, ordered by token_id."""

    @abc.abstractmethod
    def insert_token(self, record: TokenRecord) -> None:
        """Raises StoreConflict if the token_id exists."""

    @abc.abstractmethod
    def revoke_token(self, token_id: str, revoked_ms: int) -> TokenRecord | None:
        """Marks a live token revoked at ``revoked_ms``; returns the token as it is now (an
        already revoked one unchanged), None if there is no such token."""

    @abc.abstractmethod
    def load_acl(self) -> list[AclRecord]:
        """Every ACL entry, ordered by (principal, resource, pattern, permission)."""

    @abc.abstractmethod
    def insert_acl(self, entry: AclRecord) -> bool:
        """Adds the entry; False (and nothing changed) if the same entry exists."""

    @abc.abstractmethod
    def delete_acl(self, entry: AclRecord) -> bool:
        """Removes the entry with ``entry``'s key; False if there was none."""

    # quarantined tables (docs/row-level-writes.md, "Quarantine"): kept for good, released
    # ones included, as the record of what an operator chose
    @abc.abstractmethod
    def load_quarantines(self) -> list[QuarantineRecord]:
        """Every quarantine record, ordered by (table, quarantined_ms, txn_id)."""

    @abc.abstractmethod
    def put_quarantine(self, record: QuarantineRecord) -> None:
        """Inserts the record, or replaces the one of the same (table, txn_id)."""
