"""The participant: one ``foreachBatch`` call becomes one percolake transaction.

Per batch: register (once per Spark query id) → Open, declaring the tables the previous batch
wrote → the user's function writes each table through :class:`BatchTransaction` (a table not
declared yet is declared first; the schema is checked at the call; executors write its files
in a background Spark job, the batch's tables concurrently) → all writes done →
Commit carrying every write intent (prewrite and commit point in one durable write) → each
table's Delta commit with delta-rs → one ReportApplied, sent in the background (the next Open
carries it if unconfirmed): two round trips on the batch's path, Open and Commit.
A batch the coordinator already committed is not written again: only its missing secondaries
are finished. After Commit nothing calls the JVM, so a stopping query cannot strand a secondary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from percolake import codec
from percolake.credentials import ClientSecurity
from percolake.errors import ProtocolError
from percolake.failpoints import fail_point
from percolake.lake.checkpoints import Checkpointer
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.table_cache import TableCache
from percolake.lake.warehouse import canonical_table_uri, is_object_store
from percolake.parallel import in_parallel
from percolake.records import TableWriteRecord, WriteMode, delta_app_id
from percolake.v1 import coordinator_pb2 as pb
from sparkside.catalog import is_table_name, resolve_table
from sparkside.checkpoint_offsets import batch_source_offsets, check_checkpoint_location
from sparkside.client import CoordinatorClient
from sparkside.column_mapping import ColumnMapping
from sparkside.concurrent_writes import ConcurrentWrites, unpersist_waits_for
from sparkside.deferred_reports import DeferredReports
from sparkside.delta_table import TransactionDeltaTable
from sparkside.errors import (
    BatchRefused,
    CommitOutcomeUnknown,
    CoordinatorUnavailable,
    InvalidRequest,
    RowLevelConflict,
    TableNotWritten,
    WriteConflict,
)
from sparkside.heartbeat import Heartbeat
from sparkside.reader import read_table_version, snapshot_once_completed, topology_request
from sparkside.row_level import RowLevelTable, RowLevelWrites, marked_spark_writes
from sparkside.schema_check import SchemaChecker, check_layout, refuse_features
from sparkside.session import run_executors_on_driver_python, use_object_store_settings
from sparkside.table_rules import conform_batch, violation_of
from sparkside.writer import delta_schema_json, write_files

log = logging.getLogger("percolake.participant")

UserFunction = Callable[[DataFrame, int, "BatchTransaction"], Any]
# txn.write's modes; ROW_LEVEL writes come from txn.delta_table only
MODES = {m.value: m for m in WriteMode if m != WriteMode.ROW_LEVEL}
CHECKPOINT_RESET_POLICIES = ("refuse", "new_generation")
SECONDARY_WORKERS = 4  # tables whose Delta commits run at once


class BatchTransaction:
    """What the user's function writes through: ``txn.write(df, table, mode, partition_by)``."""

    def __init__(self, client: CoordinatorClient, opened: pb.OpenTransactionResponse,
                 epoch: int | None, schemas: SchemaChecker,
                 spark: SparkSession | None = None) -> None:
        self._client = client
        self._spark = spark
        self.txn_id = opened.transaction.txn_id
        self.batch_id = opened.transaction.batch_id
        self.pipeline_id = opened.transaction.pipeline_id
        # The batch's input range (after, barrier] planned by its percolake sources; 0: none.
        self.input_barrier: int = opened.input_barrier
        self.input_after_barrier: int = opened.input_after_barrier
        self._epoch = epoch
        self._schemas = schemas
        # Filled by finish_writes, in the order of the write() calls.
        self.writes: dict[str, TableWriteRecord] = {}
        self._tables: list[str] = []  # the tables write() was called for, in order
        self.running: ConcurrentWrites[TableWriteRecord] = ConcurrentWrites(
            f"percolake-{self.txn_id}")
        # Every table this attempt may write (declared at Open or by write), with its folder.
        self.locations: dict[str, str] = {loc.table: loc.write_location
                                          for loc in opened.locations}
        # the declared tables' layouts, read side by side while the user's function starts
        self._layouts = schemas.for_batch(list(self.locations))
        self.row_level = RowLevelWrites(spark, self._location, self.batch_id, self.txn_id)

    def delta_table(self, table: str) -> TransactionDeltaTable:
        """``table`` as delta-spark's ``DeltaTable``, written within this batch: ``merge``,
        ``update``, ``delete``, ``toDF``, ``alias`` (docs/row-level-writes.md).

        Each operation is computed when called (the first one reads the table's latest
        version, pinned for the attempt, once the attempt holds the table); later ones see
        the earlier ones; all of them commit with the batch, as one Delta commit. ``table`` is
        a path, a URI or a name in the session's catalog.
        """
        table = resolve_table(self._spark, table)
        canonical = canonical_table_uri(table)
        return TransactionDeltaTable(lambda: self._row_level_state(table, canonical))

    def _row_level_state(self, table: str, canonical: str) -> RowLevelTable:
        """The table's row-level state, with the batch's earlier ``txn.write`` of it (read
        your own writes: that write, append or overwrite, is waited for)."""
        state = self.row_level.state(table, canonical)
        if canonical in self._tables and not self.row_level.includes_write(canonical):
            records = dict(zip(self._tables, self.running.results(), strict=True))
            self.row_level.include_write(records[canonical])
        return state

    def _location(self, table: str, canonical: str) -> str:
        return self.locations.get(canonical) or self._declare(table, canonical)

    def write(self, df: DataFrame, table: str, mode: str = "append",
              partition_by: list[str] | None = None, merge_schema: bool = False) -> None:
        """Writes ``df`` to the Delta table at ``table`` as part of this batch's transaction.

        The checks run now; the files are written by a Spark job that runs in the background,
        beside the batch's other writes. The batch commits once every write is done, and their
        write intents reach the coordinator with the commit in the order of the calls; a failed
        write fails the batch at its commit (the other writes are cancelled). ``unpersist()``
        called in the function waits for the writes under way, so the usual persist, write
        several tables, unpersist pattern computes the batch once.

        Args:
            df: the rows; Spark's executors write them once, in parallel.
            table: absolute path, ``file://`` or ``s3://`` URI under a warehouse root, or a
                name in the session's catalog (``db.table``, ``catalog.db.table``).
            mode: ``append``, ``overwrite`` (whole table) or ``overwrite_partitions`` (only the
                partitions present in ``df``).
            partition_by: partition columns; on the first write they create a partitioned
                table, later they must match the table.
            merge_schema: columns (and nested struct fields) the table lacks are added to it
                in the batch's own Delta commit (delta-spark's ``mergeSchema``).

        The batch is shaped and checked as delta-spark's writer does (docs/schema-evolution.md):
        table columns it lacks are null, generated columns it lacks are computed, a column
        named in another case is the table's; NOT NULL, CHECK constraints and generated
        columns it gives are enforced inside the write job.

        Raises:
            UnsupportedTableFeature: the table requires a Delta feature percolake cannot write
                (docs/delta-features.md); nothing was declared or written.
            SchemaMismatch: the schema does not fit the table (nothing was written).
            WriteConflict: another live transaction holds the table.
            ConstraintViolation: (at the commit) a row breaks a rule of the table; the batch
                is aborted and nothing is committed.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        catalog_name = table if is_table_name(table) else ""
        table = resolve_table(df.sparkSession, table)
        canonical = canonical_table_uri(table)
        if canonical in self._tables:
            raise ValueError(f"table {table} is written twice in batch {self.batch_id}; "
                             "union the DataFrames into one write")
        # before the declare: a table percolake cannot write is refused with nothing declared
        layout = refuse_features(canonical, self._layouts.get(canonical))
        mapping = ColumnMapping.of(layout)
        location = self.locations.get(canonical)
        if location is None:  # held from the declare on: its layout is read again after it
            location = self._declare(table, canonical)
            layout = self._layouts.fresh(canonical)
        state = self.row_level.tables.get(canonical)
        if state is not None:  # beside the operations' op<N> folders, on the table they left
            location = f"{location}/write"
            layout = state.layout_after(layout)
            mapping = ColumnMapping.of(layout)
        if is_object_store(canonical):  # the user's own reads of the store, as the reader's
            use_object_store_settings(df.sparkSession)
        df = conform_batch(df, layout, canonical, self.batch_id)
        schema_json = delta_schema_json(df)
        if merge_schema and mapping is not None:  # new columns: ids and physical names now
            evolved = ColumnMapping.evolved(layout, schema_json)
            if evolved is not None:
                mapping, schema_json = evolved, evolved.schema_json
        partitions = check_layout(layout, canonical, schema_json, list(partition_by or []),
                                  mode, self.batch_id, merge_schema)
        self._tables.append(canonical)
        self.row_level.note_write(canonical, layout.version if layout is not None else -1,
                                  location)

        def write_table() -> TableWriteRecord:
            try:
                if mapping is None:
                    adds = write_files(df, canonical, location, partitions)
                else:
                    adds = mapping.write(df, canonical, location, partitions)
            except Exception as exc:
                violation = violation_of(exc, canonical, self.batch_id)
                if violation is None:
                    raise
                raise violation from None
            fail_point("mid-prewrite", self.batch_id)
            replace = ()
            if MODES[mode] == WriteMode.OVERWRITE_PARTITIONS:
                distinct = {tuple(sorted(a.partition_values.items(), key=lambda kv: kv[0]))
                            for a in adds}
                replace = tuple(dict(values) for values in sorted(distinct, key=str))
            return TableWriteRecord(canonical, MODES[mode], tuple(adds), schema_json,
                                    tuple(partitions), replace, merge_schema, catalog_name)

        self.running.submit(df.sparkSession, table, write_table)

    def read(self, table: str) -> DataFrame:
        """``table`` whole, as it was at this batch's input barrier (docs/topology.md).

        Registers the read edge (this pipeline reads ``table``), then reads the table's version
        at the input barrier (a topology snapshot), so a slowly changing table joins the
        batch's streamed rows consistently and a replayed batch reads the same. A batch without
        an input barrier (no percolake source) reads the table at its latest completed barrier.

        Raises:
            BatchRefused: the table has not completed the barrier (or a cycle, ownership).
            TableNotWritten: the table did not exist yet at that barrier.
        """
        if self._spark is None:
            raise ValueError("this BatchTransaction has no SparkSession to read with")
        table = resolve_table(self._spark, table)
        register = pb.RegisterReadsRequest(pipeline_id=self.pipeline_id, tables=[table])
        if self._epoch is not None:
            register.epoch = self._epoch
        self._client.call("RegisterReads", register)
        reply = snapshot_once_completed(
            self._client, topology_request([table], self.input_barrier or None))
        version = reply.tables[0]
        if not version.exists:
            raise TableNotWritten(f"table {table} has no committed version at barrier "
                                  f"{reply.barrier_ts} (batch {self.batch_id})")
        return read_table_version(self._spark, version.canonical_table, version.delta_version)

    def finish_writes(self) -> None:
        """Waits for every write so far; raises the first failure in call order (the others
        stopped). The commit calls it; the user's function may too, to have the writes so far
        done (and their failure raised) before it goes on."""
        records = self.running.results()
        self.writes = dict(zip(self._tables, records, strict=True))
        self.row_level.refuse_spark_writes()
        for table, record in self.writes.items():  # appends of tables also written row-level
            if table in self.row_level.tables and not self.row_level.includes_write(table):
                self.row_level.include_write(record)
        self.writes.update({w.table: w for w in self.row_level.records()})

    def stop_writes(self) -> None:
        """Cancels the writes still running and waits for all of them; never raises."""
        self.running.cancel()

    def _declare(self, table: str, canonical: str) -> str:
        """Durably tells the coordinator this attempt may write ``table``, before any file."""
        request = pb.DeclareTablesRequest(txn_id=self.txn_id, tables=[table])
        if self._epoch is not None:
            request.epoch = self._epoch
        reply = self._client.call("DeclareTables", request)
        self.locations.update({loc.table: loc.write_location for loc in reply.locations})
        return self.locations[canonical]


class Participant:
    """Turns ``foreachBatch`` into one atomic, exactly-once transaction per micro-batch.

    Args:
        target: the coordinator's ``host:port``, or several coordinators (one leader, the
            others standbys) separated by commas: ``"h1:50051,h2:50051"``; calls follow
            the leader within ``retry_s``.
        pipeline_id: stable name of the streaming query (like Kafka's transactional.id).
        retry_s: how long transient coordinator failures are retried before the batch fails.
        heartbeat_s: heartbeat interval from Open until Commit; never more than a third of
            ``txn_timeout_s`` nor of the timeout the coordinator reports.
        txn_timeout_s: how long an attempt may go without a heartbeat before the coordinator
            aborts it; None uses the coordinator's default (at least 120 s).
        on_checkpoint_reset: ``"refuse"`` (default): a new checkpoint (new Spark query id) fails
            the batch until an explicit reset; ``"new_generation"``: reset automatically, with
            a warning, unless a driver of the old generation is still active.
        tls_ca, tls_cert, tls_key: PEM files: the CA bundle that signed the coordinator's
            certificate (given: TLS), and a client certificate and key for mutual TLS.
        token: bearer token sent on every call. Each of these four None: its environment
            variable (``PERCOLAKE_TLS_CA``, ``_TLS_CERT``, ``_TLS_KEY``, ``PERCOLAKE_TOKEN``
            or ``PERCOLAKE_TOKEN_FILE``); see :mod:`percolake.credentials`.
        checkpoint_location: the query's ``checkpointLocation``; given, each batch's source
            offsets (Spark's offset log entry of the batch) are recorded with its commit, so
            a revision can name where a root pipeline restarts.
        row_level_retries: how many times a batch runs again from a fresh read when a commit
            made outside percolake conflicts with its MERGE, UPDATE or DELETE.

    Raises:
        ValueError: a bad argument; ``SecuritySettingsError`` names an unusable security file
            or setting.
    """

    def __init__(self, target: str, pipeline_id: str, *, retry_s: float = 60.0,
                 heartbeat_s: float = 10.0, txn_timeout_s: float | None = None,
                 on_checkpoint_reset: str = "refuse", tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 token: str | None = None, checkpoint_location: str | None = None,
                 row_level_retries: int = 3) -> None:
        if on_checkpoint_reset not in CHECKPOINT_RESET_POLICIES:
            raise ValueError(f"on_checkpoint_reset must be one of {CHECKPOINT_RESET_POLICIES}")
        if checkpoint_location is not None:
            check_checkpoint_location(checkpoint_location)
        self.pipeline_id = pipeline_id
        security = ClientSecurity.resolve(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                          token=token)
        self.client = CoordinatorClient(target, retry_s, security)
        if txn_timeout_s is not None and txn_timeout_s <= 0:
            raise ValueError(f"txn_timeout_s must be positive, got {txn_timeout_s}")
        self.txn_timeout_s = txn_timeout_s
        self.heartbeat_s = heartbeat_s if txn_timeout_s is None \
            else min(heartbeat_s, txn_timeout_s / 3)
        self.on_checkpoint_reset = on_checkpoint_reset
        self.checkpoint_location = checkpoint_location
        if row_level_retries < 0:
            raise ValueError(f"row_level_retries must be >= 0, got {row_level_retries}")
        self.row_level_retries = row_level_retries
        self._query_id: str | None = None
        self.epoch: int | None = None
        self.generation: int | None = None
        self._schemas = SchemaChecker()
        # The tables the last committed batch wrote: declared at the next Open, in the same
        # durable write, since a streaming job nearly always writes the same tables.
        self._expected_tables: list[str] = []
        # ReportApplied off the batch's path: sent in the background, else carried by an Open.
        self._reports = DeferredReports(self.client)
        # Delta checkpoints of the versions its applies reach, at each table's
        # delta.checkpointInterval, written in the background (docs/checkpoints.md)
        self._checkpoints = Checkpointer()
        # each table's delta-rs state kept between batches and advanced, not loaded per apply
        self._tables = TableCache().tables

    def wrap(self, fn: UserFunction) -> Callable[[DataFrame, int], None]:
        """The function to hand to ``writeStream.foreachBatch``."""

        def batch_function(batch_df: DataFrame, batch_id: int) -> None:
            self.run_batch(batch_df, batch_id, fn)

        return batch_function

    def run_batch(self, batch_df: DataFrame, batch_id: int, fn: UserFunction) -> None:
        """Runs one micro-batch as one transaction (see the module doc); a batch whose
        row-level write an outside commit conflicted with runs again from a fresh read, up to
        ``row_level_retries`` times (its aborted attempt wrote nothing visible)."""
        for retry in range(self.row_level_retries + 1):
            try:
                self._run_attempt(batch_df, batch_id, fn)
                return
            except RowLevelConflict as conflict:
                if retry == self.row_level_retries:
                    raise
                log.warning("batch %s of %s: %s; running it again (retry %d of %d)", batch_id,
                            self.pipeline_id, conflict, retry + 1, self.row_level_retries)

    def _run_attempt(self, batch_df: DataFrame, batch_id: int, fn: UserFunction) -> None:
        context = batch_df.sparkSession.sparkContext
        run_executors_on_driver_python(context)  # before any write job of the batch
        query_id = context.getLocalProperty("sql.streaming.queryId")
        self._register(query_id)
        request = pb.OpenTransactionRequest(pipeline_id=self.pipeline_id, batch_id=batch_id,
                                            epoch=self.epoch)
        if self.txn_timeout_s is not None:
            request.timeout_ms = int(self.txn_timeout_s * 1000)
        if query_id:
            request.query_id = query_id
        opened = self._open(request)
        txn = opened.transaction
        if opened.already_committed:
            log.info("batch %s of %s already committed (%s); finishing secondaries only",
                     batch_id, self.pipeline_id, txn.txn_id)
            self.finish_secondaries(txn.txn_id)
            return
        fail_point("after-open", batch_id)
        handle = BatchTransaction(self.client, opened, self.epoch, self._schemas,
                                  batch_df.sparkSession)
        try:
            with Heartbeat(self.client, txn.txn_id, self.epoch, self.heartbeat_s):
                with unpersist_waits_for(handle.running), \
                        marked_spark_writes(batch_df.sparkSession, handle.row_level.marker):
                    fn(batch_df, batch_id, handle)
                handle.finish_writes()
                fail_point("after-prewrite", batch_id)
                committed = self._commit(handle)
        except BaseException as exc:
            self._abort(handle, exc)
            raise
        fail_point("after-commit-reply", batch_id)
        self._expected_tables = list(handle.writes)
        in_commit = {p.table for p in committed.participants}  # not the writes left out
        self._apply(committed, {t: w for t, w in handle.writes.items() if t in in_commit})

    def finish_secondaries(self, txn_id: str) -> None:
        """Applies whatever tables of a committed transaction are not yet applied."""
        txn = self.client.get_transaction(txn_id, include_writes=True)
        writes = {p.table: codec.table_write_from_pb(p.write)
                  for p in txn.participants if not p.applied}
        self._apply(txn, writes)

    def wait_for_reports(self, timeout_s: float = 10.0) -> bool:
        """Waits up to ``timeout_s`` for the applied reports sent after the last batches (off
        the batch's path). True when none is under way; one that failed rides on the next
        Open, and the coordinator rolls forward whatever is never reported."""
        return self._reports.close(timeout_s)

    def close(self, report_wait_s: float = 10.0) -> None:
        """Waits up to ``report_wait_s`` for applied reports still being sent (one not sent is
        rolled forward by the coordinator), then closes the channel."""
        self._reports.close(report_wait_s)
        self._checkpoints.close(report_wait_s)
        self.client.close()

    def wait_for_checkpoints(self, timeout_s: float = 30.0) -> bool:
        """Waits up to ``timeout_s`` for the checkpoints due after the last batches (written
        off the batch's path). True when none is under way."""
        return self._checkpoints.flush(timeout_s)

    # ---------------------------------------------------------------- internals

    def _register(self, query_id: str | None) -> None:
        if self.epoch is not None and query_id == self._query_id:
            return
        try:
            reply = self.client.register(self.pipeline_id, query_id)
        except BatchRefused as refused:
            if (self.on_checkpoint_reset != "new_generation" or not query_id
                    or "but this request carries query id" not in str(refused)):
                raise  # only a new checkpoint (another query id than the bound one) resets
            log.warning("pipeline %s: Spark query id changed to %s (new checkpoint); "
                        "on_checkpoint_reset='new_generation' starts a new generation",
                        self.pipeline_id, query_id)
            self._reset_for(query_id)
            reply = self.client.register(self.pipeline_id, query_id)
        self.epoch, self.generation, self._query_id = reply.epoch, reply.generation, query_id
        log.info("pipeline %s registered: epoch %s, generation %s", self.pipeline_id,
                 self.epoch, self.generation)

    def _reset_for(self, query_id: str | None) -> None:
        """The automatic reset: compare-and-set on the generation seen, so a retried call
        resets once; the new generation is bound to the new query id in the same write."""
        generation = self.client.call(
            "GetPipeline", pb.GetPipelineRequest(pipeline_id=self.pipeline_id)).generation
        request = pb.ResetPipelineRequest(
            pipeline_id=self.pipeline_id, require_idle=True, expected_generation=generation,
            reason=f"automatic: new Spark query id {query_id} "
                   "(on_checkpoint_reset='new_generation')")
        if query_id:
            request.query_id = query_id
        self.client.call("ResetPipeline", request)

    def _open(self, request: pb.OpenTransactionRequest) -> pb.OpenTransactionResponse:
        """Opens the attempt declaring the expected tables; if one of them is held elsewhere,
        opens again declaring none (this batch may not write it: its write() will wait).

        The Open carries the applied reports not confirmed yet (recorded before the Open)."""
        request.applied_reports.extend(self._reports.unconfirmed())
        if not self._expected_tables:
            return self._call_open(request)
        declaring = pb.OpenTransactionRequest()
        declaring.CopyFrom(request)
        declaring.tables.extend(self._expected_tables)
        try:
            return self._call_open(declaring)
        except WriteConflict as conflict:
            log.info("batch %s: an expected table is held (%s); opening without declaring",
                     request.batch_id, conflict)
            return self._call_open(request)  # supersedes the first attempt

    def _call_open(self, request: pb.OpenTransactionRequest) -> pb.OpenTransactionResponse:
        """One Open; if its carried reports are refused, they are dropped (the coordinator
        rolls those transactions forward) and the Open is sent again without them."""
        carried = list(request.applied_reports)
        try:
            reply = self.client.call("OpenTransaction", request)
        except (BatchRefused, InvalidRequest) as refused:
            if not carried:
                raise
            log.warning("batch %s: Open refused (%s); opening again without its %d applied "
                        "reports", request.batch_id, refused, len(carried))
            self._reports.confirm(carried)
            del request.applied_reports[:]
            return self.client.call("OpenTransaction", request)
        self._reports.confirm(carried)
        return reply

    def _commit(self, handle: BatchTransaction) -> pb.Transaction:
        """Prewrite and commit in one call: the write intents ride on the commit request, and
        tables declared at Open that this batch did not write are released, so are the empty
        appends of a batch with an input barrier (no change: left out, as the coordinator
        does, so an empty step never pulls its table's completed barrier back)."""
        writes = [w for w in handle.writes.values()
                  if not (handle.input_barrier and w.mode == WriteMode.APPEND
                          and not w.add_files)]
        request = pb.CommitTransactionRequest(
            txn_id=handle.txn_id, epoch=self.epoch, tables=[w.table for w in writes],
            writes=[codec.table_write_to_pb(w) for w in writes], release_unwritten=True)
        if self.checkpoint_location:
            request.source_offsets = batch_source_offsets(self.checkpoint_location,
                                                          handle.batch_id)
        try:
            return self.client.call("CommitTransaction", request).transaction
        except CoordinatorUnavailable as exc:
            raise CommitOutcomeUnknown(
                f"the commit of batch {handle.batch_id} ({handle.txn_id}) may or may not have "
                f"happened: {exc}. The batch fails; its replay asks the coordinator, which "
                "knows.") from exc

    def _abort(self, handle: BatchTransaction, cause: BaseException) -> None:
        """Aborts the attempt once none of its writes runs; its files go only once the
        coordinator confirms ABORTED."""
        handle.stop_writes()
        if isinstance(cause, CommitOutcomeUnknown):
            return  # maybe committed: never abort, never delete
        request = pb.AbortTransactionRequest(txn_id=handle.txn_id, epoch=self.epoch,
                                             reason=f"{type(cause).__name__}: {cause}"[:900])
        try:
            reply = self.client.call("AbortTransaction", request, retry_s=10)
        except Exception as exc:  # the coordinator expires it and deletes its files then
            log.warning("abort of %s not confirmed: %s", handle.txn_id, exc)
            return
        if reply.transaction.state != pb.ABORTED:
            return
        # The coordinator deleted them already; this catches files an executor wrote late.
        for location in handle.locations.values():
            try:
                remove_attempt_files(location)
            except (OSError, ProtocolError) as exc:  # never hides the user's own error
                log.warning("could not delete %s: %s", location, exc)

    def _apply(self, txn: pb.Transaction, writes: dict[str, TableWriteRecord]) -> None:
        """Secondaries: each table's Delta commit (delta-rs only), then one ReportApplied."""
        app_id = delta_app_id(txn.pipeline_id, txn.generation)
        applied: list[pb.AppliedTable] = []

        def commit_table(item: tuple[str, TableWriteRecord]) -> pb.AppliedTable:
            version = apply_table_write(item[1], app_id=app_id, app_version=txn.batch_id,
                                        txn_id=txn.txn_id, commit_ts=txn.commit_ts,
                                        tables=self._tables)
            self._checkpoints.applied(item[1].table, version)
            fail_point("after-secondary", txn.batch_id)
            return pb.AppliedTable(table=item[0], delta_version=version)

        # One commit per table, the tables side by side (each table keeps commit_ts order, I7).
        for table, outcome in zip(writes, in_parallel(commit_table, list(writes.items()),
                                                      SECONDARY_WORKERS), strict=True):
            if isinstance(outcome, Exception):  # committed: the coordinator rolls it forward
                log.warning("secondary %s of %s not finished (%s); the coordinator will roll "
                            "it forward", table, txn.txn_id, outcome)
            else:
                applied.append(outcome)
        if applied:  # off the batch's path: sent in the background, or carried by the next Open
            fail_point("before-deferred-report", txn.batch_id)
            self._reports.submit(txn.txn_id, self.epoch, applied)
        if len(applied) == len(writes):
            fail_point("after-all-secondaries", txn.batch_id)
