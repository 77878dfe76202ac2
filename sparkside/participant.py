"""The participant: one ``foreachBatch`` call becomes one percolake transaction.

Per batch: register (once per Spark query id) → Open, declaring the tables the previous batch
wrote → the user's function writes each table through :class:`BatchTransaction` (a table not
declared yet is declared first; executors write its files; the schema is checked before) →
Commit carrying every write intent (prewrite and commit point in one durable write) → each
table's Delta commit with delta-rs → one ReportApplied. Three round trips in the steady state.
A batch the coordinator already committed is not written again: only its missing secondaries
are finished. After Commit nothing calls the JVM, so a stopping query cannot strand a secondary.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from percolake import codec
from percolake.credentials import ClientSecurity
from percolake.errors import ProtocolError
from percolake.failpoints import fail_point
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.delta_commit import apply_table_write
from percolake.lake.warehouse import canonical_table_uri, is_object_store
from percolake.records import TableWriteRecord, WriteMode, delta_app_id
from percolake.v1 import coordinator_pb2 as pb
from sparkside.client import CoordinatorClient
from sparkside.errors import (
    BatchRefused,
    CommitOutcomeUnknown,
    CoordinatorUnavailable,
    WriteConflict,
)
from sparkside.heartbeat import Heartbeat
from sparkside.schema_check import SchemaChecker
from sparkside.session import use_object_store_settings
from sparkside.writer import delta_schema_json, write_files

log = logging.getLogger("percolake.participant")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

UserFunction = Callable[[DataFrame, int, "BatchTransaction"], Any]
MODES = {m.value: m for m in WriteMode}
CHECKPOINT_RESET_POLICIES = ("refuse", "new_generation")


class BatchTransaction:
    """What the user's function writes through: ``txn.write(df, table, mode, partition_by)``."""

    def __init__(self, client: CoordinatorClient, opened: pb.OpenTransactionResponse,
                 epoch: int | None, schemas: SchemaChecker) -> None:
        self._client = client
        self.txn_id = opened.transaction.txn_id
        self.batch_id = opened.transaction.batch_id
        self._epoch = epoch
        self._schemas = schemas
        self.writes: dict[str, TableWriteRecord] = {}
        # Every table this attempt may write (declared at Open or by write), with its folder.
        self.locations: dict[str, str] = {loc.table: loc.write_location
                                          for loc in opened.locations}

    def write(self, df: DataFrame, table: str, mode: str = "append",
              partition_by: list[str] | None = None) -> None:
        """Writes ``df`` to the Delta table at ``table`` as part of this batch's transaction.

        The files are written now; their write intent reaches the coordinator with the commit.

        Args:
            df: the rows; Spark's executors write them once, in parallel.
            table: absolute path or ``file://`` URI under a warehouse root.
            mode: ``append``, ``overwrite`` (whole table) or ``overwrite_partitions`` (only the
                partitions present in ``df``).
            partition_by: partition columns; on the first write they create a partitioned
                table, later they must match the table.

        Raises:
            SchemaMismatch: the schema does not fit the table (nothing was written).
            WriteConflict: another live transaction holds the table.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        canonical = canonical_table_uri(table)
        if canonical in self.writes:
            raise ValueError(f"table {table} is written twice in batch {self.batch_id}; "
                             "union the DataFrames into one write")
        location = self.locations.get(canonical) or self._declare(table, canonical)
        if is_object_store(canonical):  # the user's own reads of the store, as the reader's
            use_object_store_settings(df.sparkSession)
        schema_json = delta_schema_json(df)
        partitions = self._schemas.check(canonical, schema_json, list(partition_by or []),
                                         mode, self.batch_id)
        adds = write_files(df, canonical, location, partitions)
        fail_point("mid-prewrite", self.batch_id)
        replace = ()
        if MODES[mode] == WriteMode.OVERWRITE_PARTITIONS:
            distinct = {tuple(sorted(a.partition_values.items(), key=lambda kv: kv[0]))
                        for a in adds}
            replace = tuple(dict(values) for values in sorted(distinct, key=str))
        self.writes[canonical] = TableWriteRecord(canonical, MODES[mode], tuple(adds),
                                                  schema_json, tuple(partitions), replace)

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

    Raises:
        ValueError: a bad argument; ``SecuritySettingsError`` names an unusable security file
            or setting.
    """

    def __init__(self, target: str, pipeline_id: str, *, retry_s: float = 60.0,
                 heartbeat_s: float = 10.0, txn_timeout_s: float | None = None,
                 on_checkpoint_reset: str = "refuse", tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 token: str | None = None) -> None:
        if on_checkpoint_reset not in CHECKPOINT_RESET_POLICIES:
            raise ValueError(f"on_checkpoint_reset must be one of {CHECKPOINT_RESET_POLICIES}")
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
        self._query_id: str | None = None
        self.epoch: int | None = None
        self.generation: int | None = None
        self._schemas = SchemaChecker()
        # The tables the last committed batch wrote: declared at the next Open, in the same
        # durable write, since a streaming job nearly always writes the same tables.
        self._expected_tables: list[str] = []

    def wrap(self, fn: UserFunction) -> Callable[[DataFrame, int], None]:
        """The function to hand to ``writeStream.foreachBatch``."""

        def batch_function(batch_df: DataFrame, batch_id: int) -> None:
            self.run_batch(batch_df, batch_id, fn)

        return batch_function

    def run_batch(self, batch_df: DataFrame, batch_id: int, fn: UserFunction) -> None:
        """Runs one micro-batch as one transaction (see the module doc)."""
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
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
        handle = BatchTransaction(self.client, opened, self.epoch, self._schemas)
        try:
            with Heartbeat(self.client, txn.txn_id, self.epoch, self.heartbeat_s):
                fn(batch_df, batch_id, handle)
                fail_point("after-prewrite", batch_id)
                committed = self._commit(handle)
        except BaseException as exc:
            self._abort(handle, exc)
            raise
        fail_point("after-commit-reply", batch_id)
        self._expected_tables = list(handle.writes)
        self._apply(committed, handle.writes)

    def finish_secondaries(self, txn_id: str) -> None:
        """Applies whatever tables of a committed transaction are not yet applied."""
        txn = self.client.get_transaction(txn_id, include_writes=True)
        writes = {p.table: codec.table_write_from_pb(p.write)
                  for p in txn.participants if not p.applied}
        self._apply(txn, writes)

    def close(self) -> None:
        self.client.close()

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
        opens again declaring none (this batch may not write it: its write() will wait)."""
        if not self._expected_tables:
            return self.client.call("OpenTransaction", request)
        declaring = pb.OpenTransactionRequest()
        declaring.CopyFrom(request)
        declaring.tables.extend(self._expected_tables)
        try:
            return self.client.call("OpenTransaction", declaring)
        except WriteConflict as conflict:
            log.info("batch %s: an expected table is held (%s); opening without declaring",
                     request.batch_id, conflict)
            return self.client.call("OpenTransaction", request)  # supersedes the first attempt

    def _commit(self, handle: BatchTransaction) -> pb.Transaction:
        """Prewrite and commit in one call: the write intents ride on the commit request, and
        tables declared at Open that this batch did not write are released."""
        request = pb.CommitTransactionRequest(
            txn_id=handle.txn_id, epoch=self.epoch, tables=list(handle.writes),
            writes=[codec.table_write_to_pb(w) for w in handle.writes.values()],
            release_unwritten=True)
        try:
            return self.client.call("CommitTransaction", request).transaction
        except CoordinatorUnavailable as exc:
            raise CommitOutcomeUnknown(
                f"the commit of batch {handle.batch_id} ({handle.txn_id}) may or may not have "
                f"happened: {exc}. The batch fails; its replay asks the coordinator, which "
                "knows.") from exc

    def _abort(self, handle: BatchTransaction, cause: BaseException) -> None:
        """Aborts the attempt; its files go only once the coordinator confirms ABORTED."""
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
        try:
            for table, write in writes.items():
                version = apply_table_write(write, app_id=app_id, app_version=txn.batch_id,
                                            txn_id=txn.txn_id, commit_ts=txn.commit_ts)
                applied.append(pb.AppliedTable(table=table, delta_version=version))
                fail_point("after-secondary", txn.batch_id)
        except Exception as exc:  # committed: the coordinator rolls the rest forward (I4)
            log.warning("secondaries of %s not finished (%s); the coordinator will roll them "
                        "forward", txn.txn_id, exc)
        if applied:
            try:
                self.client.call("ReportApplied", pb.ReportAppliedRequest(
                    txn_id=txn.txn_id, epoch=self.epoch, tables=applied))
            except Exception as exc:  # the roll-forward finds them applied and reports them
                log.warning("could not report the secondaries of %s (%s)", txn.txn_id, exc)
                return
        if len(applied) == len(writes):
            fail_point("after-all-secondaries", txn.batch_id)
