"""The gRPC servicer: decode the request, call the core, encode the reply. Nothing else.

Decoding includes the bounds of what only the wire carries (list lengths, timeouts, page
tokens), checked with ``coordinator.validation``; request bytes that are not protobuf at all are
refused before this module by ``server.MalformedRequestInterceptor``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from coordinator import metrics, validation
from coordinator.auth.access import Guard
from coordinator.core.leases import check_lease_request
from coordinator.core.snapshots import Consistency
from coordinator.leadership import CoreProvider, NotServing
from coordinator.status_codes import status_for
from coordinator.store.base import TxnQuery
from percolake import codec
from percolake.codec import optional
from percolake.errors import (
    InvalidArgument,
    NotLeader,
    Overloaded,
    ProtocolError,
    StoreUnavailable,
)
from percolake.leader import LEADER_METADATA_KEY, RETRY_METADATA
from percolake.records import QuarantineChoice, QuarantineRecord
from percolake.v1 import coordinator_pb2 as pb
from percolake.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("percolake.rpc")
F = TypeVar("F", bound=Callable[..., Any])
MAX_PAGE_SIZE = 1000
_PAGE_TOKEN = re.compile(rb"ts:(0|[1-9][0-9]{0,18})")  # ASCII digits; at most int64's 19


def rpc(method: F) -> F:
    """Runs a call on the serving core and turns errors into gRPC statuses.

    The core comes from the provider for each call; an answer leaves only once what it rests
    on is durable (I8) and only while this process still leads (checked before and after the
    call). A store that refused a write (NotLeader) or could not be reached (StoreUnavailable)
    makes the leadership step down; the call is answered UNAVAILABLE with an unknown outcome,
    which the next leader re-reads. An unexpected error is a bug, logged with its trace.
    """

    @functools.wraps(method)
    def handler(self: CoordinatorServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            with self.cores.serving() as term:
                try:
                    reply, error = _run(self, method, term.core, request, context)
                except (NotLeader, StoreUnavailable) as exc:
                    raise self.cores.lost(term, exc) from exc
                term.confirm()
        except NotServing as exc:
            log.info("unavailable: not the leader", extra={"rpc": method.__name__,
                                                          "detail": self.redact(str(exc))})
            if exc.leader_address:
                context.set_trailing_metadata(((LEADER_METADATA_KEY, exc.leader_address),))
            context.abort(status_for(exc), self.redact(str(exc)))
        if error is None:
            return reply
        message = str(error) if isinstance(error, ProtocolError) else (
            f"{type(error).__name__}: {error}")
        if isinstance(error, Overloaded):
            context.set_trailing_metadata(RETRY_METADATA)
        context.abort(status_for(error), self.redact(message))

    return handler  # type: ignore[return-value]


def _run(servicer: CoordinatorServicer, method: Callable[..., Any], core: Any, request: Any,
         context: grpc.ServicerContext) -> tuple[Any, Exception | None]:
    """The reply, or the error to answer with; NotLeader and StoreUnavailable pass through."""
    reply, error = None, None
    core.begin_reply()
    try:  # the guard checks permissions first and audits refusals (docs/security.md)
        reply = servicer.guard.run(method.__name__, core, request,
                                   functools.partial(method, servicer, core, request, context))
    except (NotLeader, StoreUnavailable):
        raise
    except ProtocolError as exc:
        log.info("refused", extra={"rpc": method.__name__, "error": type(exc).__name__,
                                   "detail": servicer.redact(str(exc))})
        metrics.refused(exc)
        error = exc
    except Exception as exc:  # a broken invariant or a bug: loud, never silent
        log.exception("rpc failed", extra={"rpc": method.__name__})
        error = exc
    # Group commit: whatever this answer rests on (its own writes, or others' it read) is on
    # stable storage before it leaves (I8). Refusals too. A commit that flushed as its last
    # step (and read nothing after) needs no second flush.
    core.wait_durable_for_reply()
    return reply, error


def _page_token(start_ts: int) -> str:
    return base64.urlsafe_b64encode(f"ts:{start_ts}".encode()).decode()


def _after_start_ts(token: str) -> int:
    """The start_ts a page token continues after; an int64, or InvalidArgument."""
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
    except (UnicodeEncodeError, binascii.Error):
        raw = b""
    match = _PAGE_TOKEN.fullmatch(raw)
    if match is None or int(match[1]) > validation.INT64_MAX:
        raise InvalidArgument("page_token is not one this service returned; send the "
                              "next_page_token of the previous reply, or none to start")
    return int(match[1])


def _pipeline_page_token(pipeline_id: str) -> str:
    return base64.urlsafe_b64encode(f"pipeline:{pipeline_id}".encode()).decode()


def _after_pipeline(token: str) -> str:
    """The pipeline id a ListPipelines page token continues after, or InvalidArgument."""
    if not token:
        return ""
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (UnicodeError, binascii.Error):
        raw = ""
    if not raw.startswith("pipeline:") or len(raw) == len("pipeline:"):
        raise InvalidArgument("page_token is not one this service returned; send the "
                              "next_page_token of the previous reply, or none to start")
    return raw[len("pipeline:"):]


def _with_wait(core: Any, txn: pb.Transaction) -> pb.Transaction:
    if txn.state in (pb.OPEN, pb.PREWRITTEN):
        txn.waiting_for_table = core.waiting_for(txn.txn_id)
    return txn


def _pipeline_status(core: Any, pipeline: Any) -> pb.Pipeline:
    """A pipeline as GetPipeline and ListPipelines show it: with its newest committed batch."""
    reply = codec.pipeline_to_pb(pipeline)
    batch = core.last_committed_batch(pipeline.pipeline_id, pipeline.generation)
    if batch is not None:
        reply.last_committed_batch_id = batch
    return reply


def _topology_to_pb(view: Any) -> pb.GetTopologyResponse:
    """GetTopology's reply from the core's ``TopologyView``."""
    from coordinator.oracle import wall_ms_of

    reply = pb.GetTopologyResponse(barrier_interval_ms=view.barrier_interval_ms,
                                   now_ts=view.now_ts, now_unix_ms=wall_ms_of(view.now_ts))
    for node in view.pipelines:
        entry = reply.pipelines.add(pipeline_id=node.pipeline_id, generation=node.generation,
                                    root=node.root, reads=node.reads, writes=node.writes)
        for name in ("own_delay_ms", "end_to_end_delay_ms"):
            if getattr(node, name) is not None:
                setattr(entry, name, getattr(node, name))
        if node.last_input_barrier is not None:
            entry.last_input_barrier_ts = node.last_input_barrier
        reply.edges.extend(pb.TopologyEdge(pipeline_id=node.pipeline_id, table=t,
                                           kind=pb.EDGE_READS) for t in node.reads)
        reply.edges.extend(pb.TopologyEdge(pipeline_id=node.pipeline_id, table=t,
                                           kind=pb.EDGE_WRITES) for t in node.writes)
    for table in view.tables:
        entry = reply.tables.add(table=table.table, writer=table.writer, readers=table.readers)
        if table.completed_barrier is not None:
            entry.completed_barrier_ts = table.completed_barrier
            entry.completed_barrier_unix_ms = wall_ms_of(table.completed_barrier)
            entry.delay_ms = view.delay_ms(table)
        if table.bottleneck_delay_ms is not None:
            entry.bottleneck_pipeline = table.bottleneck_pipeline
            entry.bottleneck_delay_ms = table.bottleneck_delay_ms
    return reply


_CONSISTENCY = {pb.CONSISTENCY_UNSPECIFIED: Consistency.SNAPSHOT,
                pb.CONSISTENCY_SNAPSHOT: Consistency.SNAPSHOT,
                pb.CONSISTENCY_TOPOLOGY: Consistency.TOPOLOGY,
                pb.CONSISTENCY_READ_COMMITTED: Consistency.READ_COMMITTED}


def _consistency(value: int) -> Consistency:
    if value not in _CONSISTENCY:
        raise InvalidArgument(f"consistency {value} is none of SNAPSHOT, TOPOLOGY, "
                              "READ_COMMITTED")
    return _CONSISTENCY[value]


def _lease_to_pb(lease: Any) -> pb.Lease:
    return pb.Lease(lease_id=lease.lease_id, holder=lease.holder, barrier_ts=lease.barrier_ts,
                    created_unix_ms=lease.created_ms, expires_unix_ms=lease.expires_ms,
                    tables=[pb.TableVersion(table=t, canonical_table=t, exists=True,
                                            delta_version=v) for t, v in lease.tables])


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """Each method gets the serving core from ``rpc``; ``redact`` scrubs secrets (the store
    DSN's password) from what a client is told."""

    def __init__(self, cores: CoreProvider, redact: Callable[[str], str] = str,
                 guard: Guard | None = None) -> None:
        self.cores = cores
        self.redact = redact
        self.guard = guard or Guard(redact=redact)

    @rpc
    def RegisterPipeline(self, core, request, context):  # noqa: N802
        pipeline = core.register_pipeline(request.pipeline_id, optional(request, "query_id"))
        return pb.RegisterPipelineResponse(pipeline=codec.pipeline_to_pb(pipeline),
                                           epoch=pipeline.epoch, generation=pipeline.generation)

    @rpc
    def OpenTransaction(self, core, request, context):  # noqa: N802
        core.check_txn_tables(len(request.tables))  # timeout_ms: the core checks its limit
        validation.check_count("applied_reports", len(request.applied_reports),
                               validation.MAX_APPLIED_REPORTS)  # before decoding them
        for report in request.applied_reports:
            core.check_txn_tables(len(report.tables))
        reports = [(r.txn_id, [(t.table, t.delta_version) for t in r.tables])
                   for r in request.applied_reports]
        txn, committed = core.open_transaction(
            request.pipeline_id, request.batch_id, optional(request, "epoch"),
            optional(request, "query_id"), list(request.tables), request.timeout_ms, reports)
        return pb.OpenTransactionResponse(transaction=codec.txn_to_pb(txn),
                                          already_committed=committed,
                                          locations=codec.locations_to_pb(txn),
                                          input_barrier=txn.input_barrier,
                                          input_after_barrier=core.input_after_barrier(txn))

    @rpc
    def DeclareTables(self, core, request, context):  # noqa: N802
        if not request.tables:
            raise InvalidArgument("declare at least one table")
        core.check_txn_tables(len(request.tables))
        txn = core.declare_tables(request.txn_id, optional(request, "epoch"),
                                       list(request.tables))
        return pb.DeclareTablesResponse(transaction=codec.txn_to_pb(txn),
                                        locations=codec.locations_to_pb(txn))

    @rpc
    def Prewrite(self, core, request, context):  # noqa: N802
        core.check_txn_tables(len(request.writes), "table writes")  # before decoding them
        core.check_txn_files(sum(len(w.add_files) for w in request.writes))
        writes = [codec.table_write_from_pb(w) for w in request.writes]
        txn = core.prewrite(request.txn_id, optional(request, "epoch"), writes)
        return pb.PrewriteResponse(transaction=codec.txn_to_pb(txn))

    @rpc
    def CommitTransaction(self, core, request, context):  # noqa: N802
        core.check_txn_tables(len(request.tables))
        core.check_txn_tables(len(request.writes), "table writes")  # before decoding them
        core.check_txn_files(sum(len(w.add_files) for w in request.writes))
        writes = [codec.table_write_from_pb(w) for w in request.writes]
        txn = core.commit(request.txn_id, optional(request, "epoch"), list(request.tables),
                               writes, release_unwritten=request.release_unwritten,
                               source_offsets=request.source_offsets)
        return pb.CommitTransactionResponse(transaction=codec.txn_to_pb(txn))

    @rpc
    def AbortTransaction(self, core, request, context):  # noqa: N802
        txn = core.abort(request.txn_id, optional(request, "epoch"),
                              validation.clean_reason(request.reason))
        return pb.AbortTransactionResponse(transaction=codec.txn_to_pb(txn))

    @rpc
    def ReportApplied(self, core, request, context):  # noqa: N802
        validation.check_count("tables", len(request.tables))
        versions: dict[str, int] = {}
        for applied in request.tables:
            if applied.table in versions:
                raise InvalidArgument(f"table {applied.table} reported twice")
            versions[applied.table] = applied.delta_version
        txn = core.report_applied(request.txn_id, optional(request, "epoch"), versions)
        return pb.ReportAppliedResponse(transaction=codec.txn_to_pb(txn))

    @rpc
    def Heartbeat(self, core, request, context):  # noqa: N802
        state, expires_ms = core.heartbeat(request.txn_id, optional(request, "epoch"))
        return pb.HeartbeatResponse(state=codec.state_to_pb(state),
                                    expires_in_ms=min(expires_ms, validation.INT64_MAX))

    @rpc
    def GetTransaction(self, core, request, context):  # noqa: N802
        return _with_wait(core, codec.txn_to_pb(core.get_transaction(request.txn_id),
                                                request.include_writes))

    @rpc
    def ListTransactions(self, core, request, context):  # noqa: N802
        if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be 0..{MAX_PAGE_SIZE}, got {request.page_size}")
        if request.created_after_unix_ms < 0 or request.created_before_unix_ms < 0:
            raise InvalidArgument("created_after/before_unix_ms must be >= 0")
        limit = request.page_size or 100
        query = TxnQuery(
            pipeline_id=request.pipeline_id, generation=optional(request, "generation"),
            states=tuple(dict.fromkeys(codec.state_from_pb(s) for s in request.states)),
            batch_id=optional(request, "batch_id"),
            created_after_ms=request.created_after_unix_ms,
            created_before_ms=request.created_before_unix_ms,
            after_start_ts=_after_start_ts(request.page_token), limit=limit + 1,
        )
        txns = core.list_transactions(query)
        token = _page_token(txns[limit - 1].start_ts) if len(txns) > limit else ""
        return pb.ListTransactionsResponse(
            transactions=[_with_wait(core, codec.txn_to_pb(t)) for t in txns[:limit]],
            next_page_token=token)

    @rpc
    def GetSnapshot(self, core, request, context):  # noqa: N802
        validation.check_count("tables", len(request.tables))
        validation.check_timeout_ms("wait_timeout_ms", request.wait_timeout_ms,
                                    validation.MAX_WAIT_MS)
        as_of = request.WhichOneof("as_of")
        batch = None
        if as_of == "as_of_batch":
            ref = request.as_of_batch
            batch = (ref.pipeline_id, optional(ref, "generation"), ref.batch_id)
            if batch[1] is not None:
                validation.check_non_negative("generation", batch[1])
        consistency = _consistency(request.consistency)
        check_lease_request(request.lease_ms, request.lease_holder)
        snapshot = core.get_snapshot(
            list(request.tables), request.as_of_ts if as_of == "as_of_ts" else None, batch,
            request.wait_timeout_ms / 1000 if request.wait_timeout_ms else None, consistency,
            request.as_of_barrier if as_of == "as_of_barrier" else None)
        reply = pb.GetSnapshotResponse(snapshot_ts=snapshot.snapshot_ts,
                                       consistency=request.consistency or pb.CONSISTENCY_SNAPSHOT)
        if consistency == Consistency.TOPOLOGY:
            reply.barrier_ts = snapshot.snapshot_ts
            reply.revised_ts = snapshot.revised_ts
        for table in request.tables:
            canonical = core.resolve_table(table)
            version = snapshot.versions[canonical]
            reply.tables.add(table=table, canonical_table=canonical, exists=version is not None,
                             delta_version=version or 0)
        if request.lease_ms:  # durable before the reply (T3)
            reply.lease.CopyFrom(_lease_to_pb(core.take_lease(
                snapshot, request.lease_ms, request.lease_holder)))
        return reply

    @rpc
    def GetPipeline(self, core, request, context):  # noqa: N802
        return _pipeline_status(core, core.get_pipeline(request.pipeline_id))

    @rpc
    def ListPipelines(self, core, request, context):  # noqa: N802
        if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be 0..{MAX_PAGE_SIZE}, got {request.page_size}")
        limit = request.page_size or 100
        pipelines = core.list_pipelines(_after_pipeline(request.page_token), limit + 1)
        token = _pipeline_page_token(pipelines[limit - 1].pipeline_id) \
            if len(pipelines) > limit else ""
        return pb.ListPipelinesResponse(
            pipelines=[_pipeline_status(core, p) for p in pipelines[:limit]],
            next_page_token=token)

    @rpc
    def ResetPipeline(self, core, request, context):  # noqa: N802
        pipeline, changed, aborted = core.reset_pipeline(
            request.pipeline_id, validation.clean_reason(request.reason),
            optional(request, "expected_generation"),
            request.require_idle, optional(request, "query_id"),
            optional(request, "start_barrier"))
        return pb.ResetPipelineResponse(pipeline=codec.pipeline_to_pb(pipeline), changed=changed,
                                        aborted_txn_ids=aborted)

    @rpc
    def RegisterReads(self, core, request, context):  # noqa: N802
        validation.check_count("tables", len(request.tables))
        tables, added = core.register_reads(request.pipeline_id, list(request.tables),
                                            optional(request, "epoch"))
        return pb.RegisterReadsResponse(tables=tables, added=added)

    @rpc
    def GetTopology(self, core, request, context):  # noqa: N802
        validation.check_count("tables", len(request.tables))
        return _topology_to_pb(core.get_topology(list(request.tables)))

    @rpc
    def PlanBarrier(self, core, request, context):  # noqa: N802
        plan = core.plan_barrier(request.pipeline_id, optional(request, "generation"),
                                 optional(request, "after_barrier"), request.round)
        return pb.PlanBarrierResponse(generation=plan.generation,
                                      start_barrier=plan.start_barrier,
                                      after_barrier=plan.after_barrier, barrier=plan.barrier,
                                      has_changes=plan.has_changes)

    @rpc
    def GetTableChanges(self, core, request, context):  # noqa: N802
        changes = core.get_table_changes(request.table, request.after_barrier,
                                         request.upto_barrier)
        reply = pb.GetTableChangesResponse(canonical_table=changes.canonical_table, changes=[
            pb.TableChange(delta_version=c.delta_version, commit_ts=c.commit_ts,
                           barrier=c.barrier, txn_id=c.txn_id) for c in changes.changes])
        if changes.version_at_after is not None:
            reply.version_at_after = changes.version_at_after
        return reply

    @rpc
    def Revise(self, core, request, context):  # noqa: N802
        revision = core.revise(request.table, request.to_barrier,
                               validation.clean_reason(request.reason))
        return pb.ReviseResponse(
            txn_id=revision.txn_id, revision_ts=revision.revision_ts,
            tables=[pb.RevisedTable(table=t.table, restored_version=t.restored_version or 0,
                                    existed=t.restored_version is not None,
                                    delta_version=t.delta_version or 0)
                    for t in revision.tables],
            pipelines=[pb.RevisedPipeline(pipeline_id=p.pipeline_id, generation=p.generation,
                                          start_barrier=p.start_barrier)
                       for p in revision.pipelines],
            root_pipeline_id=revision.root_pipeline_id,
            root_batch_id=-1 if revision.root_batch_id is None else revision.root_batch_id,
            root_source_offsets=revision.root_source_offsets, derived=revision.derived,
            writing_pipeline_id=revision.writing_pipeline_id)

    @rpc
    def ReleaseLease(self, core, request, context):  # noqa: N802
        return pb.ReleaseLeaseResponse(released=core.release_lease(request.lease_id))

    @rpc
    def ListLeases(self, core, request, context):  # noqa: N802
        validation.check_count("tables", len(request.tables))
        return pb.ListLeasesResponse(leases=[_lease_to_pb(lease)
                                             for lease in core.list_leases(list(request.tables))])

    @rpc
    def Vacuum(self, core, request, context):  # noqa: N802
        result = core.vacuum(request.table, optional(request, "retention_hours"),
                             request.dry_run)
        return pb.VacuumResponse(
            canonical_table=result.table, removed_files=result.removed_files,
            oldest_needed_version=-1 if result.oldest_needed_version is None
            else result.oldest_needed_version, kept_for=result.kept_for)

    @rpc
    def ListQuarantines(self, core, request, context):  # noqa: N802
        return pb.ListQuarantinesResponse(quarantines=[
            quarantine_to_pb(q) for q in core.list_quarantines(request.include_released,
                                                                request.pipeline_id)])

    @rpc
    def ReleaseQuarantine(self, core, request, context):  # noqa: N802
        if request.choice not in _CHOICES:
            raise InvalidArgument("choice must be QUARANTINE_REAPPLY or QUARANTINE_ABANDON")
        return quarantine_to_pb(core.release_quarantine(
            request.table, request.txn_id, _CHOICES[request.choice],
            validation.clean_reason(request.reason)))


_CHOICES = {pb.QUARANTINE_REAPPLY: QuarantineChoice.REAPPLY,
            pb.QUARANTINE_ABANDON: QuarantineChoice.ABANDON}


def quarantine_to_pb(record: QuarantineRecord) -> pb.TableQuarantine:
    choice = {v: k for k, v in _CHOICES.items()}.get(record.choice,
                                                     pb.QUARANTINE_CHOICE_UNSPECIFIED)
    return pb.TableQuarantine(
        table=record.table, txn_id=record.txn_id, reason=record.reason,
        quarantined_unix_ms=record.quarantined_ms, choice=choice, chosen_by=record.chosen_by,
        chosen_unix_ms=record.chosen_ms, choice_reason=record.choice_reason,
        as_of_version=record.as_of_version, released_unix_ms=record.released_ms,
        delta_version=record.delta_version)
