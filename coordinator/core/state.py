"""The shared state of the coordinator core: configuration, in-memory view, the store."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from coordinator import metrics, validation
from coordinator.core.quotas import LiveCounts, WaitSlots, exceeded
from coordinator.oracle import TimestampOracle
from coordinator.store.base import Store, TxnQuery
from percolake.errors import NotFound
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.warehouse import Warehouse
from percolake.lineage import Lineage
from percolake.records import PipelineRecord, QuarantineRecord, TableWriteRecord, TxnRecord
from percolake.states import LIVE_STATES, TxnState

log = logging.getLogger("percolake.coordinator")

Applier = Callable[..., int]
# (table, delta_version, txn_id, app_id, app_version) -> whether that Delta commit is the txn's
AppliedCheck = Callable[[str, int, str, str, int], bool]
# Raises InvalidArgument / FailedPrecondition for a write intent whose apply could fail (I10)
WriteCheck = Callable[[TableWriteRecord], None]
RESOLVE_CACHE_S = 1.0
SWEEP_INTERVAL_S = 30.0


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class CoordinatorConfig:
    """Tunables of the coordinator; the CLI exposes each as a flag."""

    warehouse_roots: list[str]
    txn_timeout_s: float = 120.0
    conflict_wait_s: float = 10.0
    snapshot_wait_s: float = 30.0
    roll_forward_after_s: float = 10.0
    resolver_interval_s: float = 1.0
    max_intent_bytes: int = 16 * 1024 * 1024
    # APPLIED and ABORTED transactions older than this are pruned (0: keep everything); see
    # prune_history for what is always kept.
    retention_hours: float = 168.0
    retention_interval_s: float = 600.0
    # Limits (docs/limits.md); each refusal is RESOURCE_EXHAUSTED naming its serve flag.
    max_tables_per_txn: int = 1000
    max_files_per_txn: int = 100_000
    max_txn_intent_bytes: int = 32 * 1024 * 1024
    max_txn_timeout_s: float = 3600.0
    max_live_txns_per_pipeline: int = 64
    max_live_txns_per_principal: int = 1024  # authentication off: every caller is one principal
    max_table_waiters: int = 8
    max_live_leases_per_principal: int = 1000  # snapshot leases (coordinator/core/leases.py)
    # Topology (docs/topology.md): global barriers every this many seconds of oracle time;
    # with shared_table_writers a table's owner is recorded but other pipelines may write it.
    barrier_interval_s: float = 5.0
    shared_table_writers: bool = False


@dataclass
class Snapshot:
    snapshot_ts: int
    versions: dict[str, int | None]  # canonical table -> Delta version (None: never written)
    revised_ts: int = 0  # topology: the newest revision of a derived table among them (0: none)


class CoreState:
    """The state every request family works on, and the helpers all of them share.

    One lock guards the in-memory view (pipelines, unfinished transactions, deadlines, table
    holds, pending cleanups); it always matches the durable records just written (``_track``).
    """

    def __init__(
        self,
        store: Store,
        config: CoordinatorConfig,
        applier: Applier | None = None,
        remove_files: Callable[[str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        applied_check: AppliedCheck | None = None,
        write_check: WriteCheck | None = None,
    ) -> None:
        """``monotonic`` drives transaction expiry only; waits always use real time.
        ``applied_check`` verifies reported Delta versions against the tables' logs;
        ``write_check`` checks, under the table hold and before the commit point, everything
        that could make a write's apply fail."""
        self.store = store
        self.config = config
        self.warehouse = Warehouse(config.warehouse_roots)
        self.oracle = TimestampOracle(store)
        self._applier = applier
        self._applied_check = applied_check
        self._write_check = write_check
        # cleanup re-checks the warehouse roots on the real path as it deletes (no escape)
        self._remove_files = remove_files or functools.partial(
            remove_attempt_files, roots=self.warehouse.roots)
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._table_apply_locks: dict[str, threading.Lock] = {}
        self._pipelines = {p.pipeline_id: p for p in store.load_pipelines()}
        self._lineage = Lineage.of(((w.table, w.pipeline_id) for w in store.load_table_writers()),
                                   ((e.pipeline_id, e.table, e.since_ts)
                                    for e in store.load_read_edges()))
        self._unfinished: dict[str, TxnRecord] = {}
        self._deadlines: dict[str, float] = {}
        self._timeouts: dict[str, float] = {}
        self._live = LiveCounts()  # keyed like _deadlines: the live transactions
        self._table_waits = WaitSlots(config.max_table_waiters)
        self._holders: dict[str, str] = {}
        self._waiting_for: dict[str, str] = {}  # txn id -> the held table it waits to take
        self._pending_cleanup: set[str] = set()
        self._resolved: dict[str, tuple[str, float]] = {}
        # Monotonic times of commits (for the roll-forward delay and require_idle). Across a
        # restart only wall-clock times survive: count what was committed as committed now.
        self._committed_at: dict[str, float] = {}
        # (pipeline, generation) -> its highest committed batch id, loaded on first use
        self._newest_batch: dict[tuple[str, int], int] = {}
        # (pipeline, generation) -> its highest committed input barrier, loaded on first use
        self._last_input: dict[tuple[str, int], int] = {}
        # pipeline -> its latest PlanBarrier round's answer: (generation, after, round, barrier,
        # has_changes), in memory only (coordinator/core/topology.py)
        self._plan_rounds: dict[str, tuple[int, int, int, int, bool]] = {}
        self._last_commit_at = {p.pipeline_id: monotonic() for p in self._pipelines.values()
                                if p.last_commit_ms}
        # canonical table -> its active quarantine (coordinator/core/quarantine.py)
        self._quarantined: dict[str, QuarantineRecord] = {
            q.table: q for q in store.load_quarantines() if q.active}
        # the state each unfinished transaction was last tracked in (metrics' transitions);
        # recovered ones are not transitions
        self._tracked_state: dict[str, TxnState] = {}
        self._count_transitions = False
        for txn in store.unfinished_txns():
            self._track(txn)
        self._count_transitions = True
        # per request thread: whether the request's own last step was a flush after which it
        # read nothing (a commit), so that its reply needs no other (begin_reply)
        self._reply = threading.local()
        self._stop = threading.Event()
        self._resolver: threading.Thread | None = None
        # committed revisions whose pipeline resets are not made yet: a topology answer makes
        # them first (coordinator/core/revision.py)
        self._revisions_resetting: set[str] = set()
        self._after_load()

    def _after_load(self) -> None:
        """What the loaded state needs before any request: nothing, but for a revision
        committed before a crash (coordinator/core/revision.py)."""

    def start_background(self) -> None:
        """Starts the resolver: expires stale attempts, rolls forward orphaned commits (I4)."""
        self._resolver = threading.Thread(target=self._resolve_loop, name="resolver", daemon=True)
        self._resolver.start()

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            self._changed.notify_all()  # requests waiting for a table hold give up (NotLeader)
        if self._resolver is not None:
            self._resolver.join(timeout=30)
        self.oracle.close()  # its mark extension ends before the store closes

    def get_transaction(self, txn_id: str) -> TxnRecord:
        validation.check_id("txn_id", txn_id)
        with self._lock:
            return self._fresh(self._get(txn_id))

    def transaction_owner(self, txn_id: str) -> tuple[str, str, tuple[str, ...]]:
        """(pipeline, the principal that opened it, its tables) of a transaction: what
        permission checks need, none of which ever changes but the tables (no copy made)."""
        validation.check_id("txn_id", txn_id)
        with self._lock:
            txn = self._get(txn_id)
            return txn.pipeline_id, txn.principal, tuple(txn.tables)

    def transaction_pipeline(self, txn_id: str) -> str:
        """The pipeline of a transaction, which never changes: read without the coordinator's
        lock (an unfinished one from memory, else from the store under the store's own lock),
        so a request's reserved-pipeline check does not queue behind other requests."""
        validation.check_id("txn_id", txn_id)
        return self._get(txn_id).pipeline_id

    def list_transactions(self, query: TxnQuery) -> list[TxnRecord]:
        if query.pipeline_id:
            validation.check_id("pipeline_id", query.pipeline_id)
        for name in ("generation", "batch_id"):
            value = getattr(query, name)
            if value is not None:
                validation.check_non_negative(name, value)
        return self.store.list_txns(query)

    def waiting_for(self, txn_id: str) -> str:
        """The table another transaction holds that this one is waiting to take, or ""."""
        with self._lock:
            return self._waiting_for.get(txn_id, "")

    def resolve_table(self, table: str) -> str:
        return self._canonical(table)

    def wait_durable(self) -> None:
        """Returns once every state change made so far is on stable storage; called before
        every reply (I8), it lets the store commit concurrent requests' writes together."""
        with metrics.FLUSH_SECONDS.time():
            self.store.flush()

    def begin_reply(self) -> None:
        """Called by the servicer before each call: nothing is flushed for its reply yet."""
        self._reply.flushed = False

    def _reply_flushed(self) -> None:
        """Called right after a request's own ``wait_durable`` when its reply rests on
        nothing read or written after that flush (a commit's own record)."""
        self._reply.flushed = True

    def wait_durable_for_reply(self) -> None:
        """``wait_durable`` before a reply (I8), unless the request's last step was its own
        flush (``_reply_flushed``): flushing again would only wait for other requests'
        batches ended since, which this reply does not rest on, and split the group commit
        into more flushes."""
        if getattr(self._reply, "flushed", False):
            self._reply.flushed = False
            return
        self.wait_durable()

    def metrics_view(self) -> tuple[list[tuple[TxnState, int]], list[tuple[str, int]]]:
        """(state, created_ms) of each unfinished transaction and (pipeline, last_commit_ms)
        of each pipeline that committed: one pass under the lock, for a metrics scrape."""
        with self._lock:
            return ([(t.state, t.created_ms) for t in self._unfinished.values()],
                    [(p.pipeline_id, p.last_commit_ms) for p in self._pipelines.values()
                     if p.last_commit_ms])

    def _get(self, txn_id: str) -> TxnRecord:
        txn = self._unfinished.get(txn_id) or self.store.get_txn(txn_id)
        if txn is None:
            raise NotFound(f"no transaction {txn_id!r}")
        return txn

    def _last_input_barrier(self, pipeline_id: str, generation: int) -> int:
        """The highest input barrier the generation committed (0: none), under the lock. Read
        from the store once per generation, then kept by the commits (docs/topology.md)."""
        key = (pipeline_id, generation)
        last = self._last_input.get(key)
        if last is None:
            last = self._last_input[key] = self.store.last_input_barrier(pipeline_id, generation)
        return last

    def _input_start(self, pipeline: PipelineRecord) -> int:
        """Where the current generation's next batch reads from, under the lock: its last
        committed input barrier, or the generation's start barrier before its first one."""
        return (self._last_input_barrier(pipeline.pipeline_id, pipeline.generation)
                or pipeline.start_barrier)

    def _fresh(self, txn: TxnRecord) -> TxnRecord:
        return txn.copy()

    def _before_roll_forward(self, txn: TxnRecord) -> None:
        """What must be durable before any table of a committed transaction is applied by
        roll-forward: nothing, but for a revision (coordinator/core/revision.py)."""

    def _write_to_apply(self, txn_id: str, table: str,
                        write: TableWriteRecord) -> TableWriteRecord:
        """The write a roll-forward applies; raises TableQuarantined while the table is
        quarantined by this transaction and no operator chose (coordinator/core/quarantine.py)."""
        return write

    def _quarantine(self, txn_id: str, table: str, reason: str) -> Exception:
        """Records the table quarantined (its committed write cannot be applied as read) and
        returns the refusal to raise."""
        raise NotImplementedError

    def _held_back(self, txn_id: str, table: str) -> bool:
        """Under the lock: the table is quarantined by the transaction, with no choice made
        yet (nothing to roll forward until an operator chooses)."""
        return False

    def _released_by_apply(self, txn_id: str, table: str, version: int) -> None:
        """Under the lock, once the write is recorded applied: ends a quarantine of it."""

    def _track(self, txn: TxnRecord, timeout_ms: int = 0) -> None:
        """Makes the in-memory view match the durable record just written."""
        was_live = txn.txn_id in self._deadlines
        if txn.state in (TxnState.APPLIED, TxnState.ABORTED):  # a final state: counted once
            previous = self._tracked_state.pop(txn.txn_id, None)
            entered = previous is not None
        else:
            previous = self._tracked_state.get(txn.txn_id)
            self._tracked_state[txn.txn_id] = txn.state
            entered = previous != txn.state
        if entered and self._count_transitions:
            metrics.transition(previous, txn)
        try:
            self._track_view(txn, timeout_ms)
        finally:
            if not was_live and txn.txn_id in self._deadlines:
                self._live.started(txn.txn_id, txn.pipeline_id, txn.principal)
            elif was_live and txn.txn_id not in self._deadlines:
                self._live.ended(txn.txn_id)

    def _track_view(self, txn: TxnRecord, timeout_ms: int) -> None:
        for table, entry in txn.tables.items():
            if entry.applied or txn.state == TxnState.ABORTED:  # the hold ends here
                if self._holders.get(table) == txn.txn_id:
                    del self._holders[table]
            else:
                holder = self._holders.setdefault(table, txn.txn_id)
                assert holder == txn.txn_id, f"{table} held by both {holder} and {txn.txn_id}"
        if txn.state == TxnState.COMMITTED:
            self._committed_at.setdefault(txn.txn_id, self._monotonic())
        if txn.state in (TxnState.APPLIED, TxnState.ABORTED):
            self._committed_at.pop(txn.txn_id, None)
            self._unfinished.pop(txn.txn_id, None)
            self._deadlines.pop(txn.txn_id, None)
            self._timeouts.pop(txn.txn_id, None)
            if txn.state == TxnState.ABORTED and txn.tables:
                self._pending_cleanup.add(txn.txn_id)
            return
        self._unfinished[txn.txn_id] = txn
        if txn.state in LIVE_STATES and txn.txn_id not in self._deadlines:
            timeout = timeout_ms / 1000 if timeout_ms else self.config.txn_timeout_s
            self._timeouts[txn.txn_id] = timeout
            self._deadlines[txn.txn_id] = self._monotonic() + timeout
        elif txn.state not in LIVE_STATES:
            self._deadlines.pop(txn.txn_id, None)
            self._timeouts.pop(txn.txn_id, None)

    def _canonical(self, uri: str) -> str:
        """``Warehouse.resolve`` memoised for RESOLVE_CACHE_S per spelling.

        Following symlinks walks every path component (a system call each) and was the largest
        CPU cost of a request; a canonical form is re-derived at most once a second, so a
        symlink changed under a warehouse root takes effect within that second. Refusals are
        never cached.
        """
        now = time.monotonic()
        hit = self._resolved.get(uri)
        if hit is not None and hit[1] > now:
            return hit[0]
        canonical = self.warehouse.resolve(uri)
        if len(self._resolved) >= 4096:
            self._resolved.clear()
        self._resolved[uri] = (canonical, now + RESOLVE_CACHE_S)
        return canonical

    def _resolve_tables(self, tables: Iterable[str],
                        most: int = validation.MAX_TABLES) -> list[str]:
        """The canonical names, each once, in request order. The count is checked before any
        name is resolved, and duplicates are dropped in O(n)."""
        names = list(tables)
        validation.check_count("tables", len(names), most)
        return list(dict.fromkeys(self._canonical(table) for table in names))

    def check_txn_files(self, count: int) -> None:
        """Refuses a request listing more data files than a transaction may, before any
        per-file work."""
        limit = self.config.max_files_per_txn
        if count > limit:
            raise exceeded(f"{count} files in one request", "--max-files-per-txn", limit,
                           "write fewer, larger files per batch")

    def check_txn_tables(self, count: int, what: str = "tables") -> None:
        """Refuses a request naming more tables than a transaction may hold, before any
        per-table work."""
        limit = self.config.max_tables_per_txn
        if count > limit:
            raise exceeded(f"{count} {what} in one request", "--max-tables-per-txn", limit,
                           "a transaction writes at most that many tables")
