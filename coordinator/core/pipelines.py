"""Pipelines: registration (a new epoch), lookups and checkpoint resets (generations)."""

from __future__ import annotations

import logging

from coordinator import validation
from coordinator.core.state import CoreState, wall_ms
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound
from percolake.records import PipelineRecord, ResetRecord, TxnRecord
from percolake.states import LIVE_STATES

log = logging.getLogger("percolake.coordinator")


class Pipelines(CoreState):
    """RegisterPipeline, GetPipeline, ListPipelines, ResetPipeline."""

    def register_pipeline(self, pipeline_id: str, query_id: str | None) -> PipelineRecord:
        """Issues a new epoch (fencing every older driver) and binds the query id on first use."""
        validation.check_id("pipeline_id", pipeline_id)
        validation.check_query_id(query_id)
        to_clean: list[TxnRecord] = []
        with self._lock:
            current = self._pipelines.get(pipeline_id)
            pipeline = current.copy() if current else self._new_pipeline(pipeline_id)
            if query_id is None and pipeline.query_id:
                raise FailedPrecondition(
                    f"pipeline {pipeline_id!r} is bound to Spark query id {pipeline.query_id}; "
                    "register with that query id"
                )
            self._check_query_id(pipeline, query_id)
            pipeline.epoch += 1
            if query_id and not pipeline.query_id:
                pipeline.query_id = query_id
            stale = [t for t in self._unfinished.values()
                     if t.pipeline_id == pipeline_id and t.state in LIVE_STATES]
            aborted = [self._prepare_abort(t, f"fenced by epoch {pipeline.epoch}") for t in stale]
            with self.store.batch():
                self._persist_pipeline(pipeline, current)
                for txn in aborted:
                    self.store.update_txn(txn)
            self._pipelines[pipeline_id] = pipeline
            for txn in aborted:
                self._track(txn)
            to_clean.extend(aborted)
            self._changed.notify_all()
        self._clean_up(to_clean)
        log.info("pipeline registered", extra={"pipeline_id": pipeline_id,
                                               "epoch": pipeline.epoch, "query_id": query_id})
        return pipeline.copy()

    def get_pipeline(self, pipeline_id: str) -> PipelineRecord:
        validation.check_id("pipeline_id", pipeline_id)
        with self._lock:
            pipeline = self._pipelines.get(pipeline_id)
            if pipeline is None:
                raise NotFound(f"no pipeline {pipeline_id!r}")
            return pipeline.copy()

    def list_pipelines(self, after_id: str, limit: int) -> list[PipelineRecord]:
        """Up to ``limit`` pipelines whose id sorts after ``after_id``, ordered by id."""
        with self._lock:
            ids = sorted(i for i in self._pipelines if i > after_id)[:limit]
            return [self._pipelines[i].copy() for i in ids]

    def last_committed_batch(self, pipeline_id: str, generation: int) -> int | None:
        """The newest committed batch of that generation, or None if it never committed."""
        with self._lock:
            return self.store.newest_committed_batch(pipeline_id, generation)

    def reset_pipeline(
        self, pipeline_id: str, reason: str, expected_generation: int | None,
        require_idle: bool = False, query_id: str | None = None,
        start_barrier: int | None = None, keep_plan: bool = True, revision: bool = False,
    ) -> tuple[PipelineRecord, bool, list[str]]:
        """Starts a new generation: live attempts aborted, epoch bumped, query id unbound (or
        bound to ``query_id`` at once; never the query id of this or an earlier generation, I9).

        The new generation's percolake input starts at ``start_barrier`` (a revision's), by
        default where the pipeline's input stands: the last input barrier it committed, in any
        generation (docs/topology.md). A plan of the next batch starting there stays with
        ``keep_plan`` (a revision drops it: the inputs it was computed from changed).

        With ``require_idle`` it refuses while the current generation is active: a live
        transaction, or a commit within the transaction timeout.

        A start barrier below where the input of a pipeline that reads and writes percolake
        tables stands is refused: its tables hold the results of that range, which their
        readers already passed (docs/topology.md, lineage transitions); only a ``revision``,
        which supersedes those results first, moves it back.

        Returns:
            The pipeline after the call, whether this call changed it, and the aborted txn ids.
        """
        validation.check_id("pipeline_id", pipeline_id)
        if not reason or not reason.strip():
            raise InvalidArgument("reason must say why the pipeline is reset (it is recorded)")
        validation.check_text("reason", reason, 1000)
        validation.check_query_id(query_id)
        if expected_generation is not None and expected_generation < 0:
            raise InvalidArgument(f"generation must be >= 0, got {expected_generation}")
        if start_barrier is not None:
            validation.check_non_negative("start_barrier", start_barrier)
        with self._lock:
            current = self._pipelines.get(pipeline_id)
            if current is None:
                raise NotFound(f"no pipeline {pipeline_id!r}: nothing to reset")
            if expected_generation is not None and expected_generation != current.generation:
                last = current.resets[-1] if current.resets else None
                if (last is not None and last.expected_generation == expected_generation
                        and last.to_generation == current.generation and last.reason == reason
                        and last.bound_query_id == (query_id or "")):
                    return current.copy(), False, []
                raise FailedPrecondition(
                    f"pipeline {pipeline_id!r} is at generation {current.generation}, not "
                    f"{expected_generation}: it was reset meanwhile; check with GetPipeline"
                )
            if require_idle:
                self._check_idle(current)
            if query_id:
                self._refuse_replaced_query_id(current, query_id)
                self._refuse_earlier_query_id(current, query_id)
            if start_barrier is not None and not revision:
                self._check_start_not_back(current, start_barrier)
            pipeline = current.copy()
            pipeline.resets.append(ResetRecord(
                from_generation=current.generation, to_generation=current.generation + 1,
                reason=reason, reset_ms=wall_ms(), previous_query_id=current.query_id,
                expected_generation=expected_generation, bound_query_id=query_id or "",
            ))
            pipeline.start_barrier = (self._input_start(current) if start_barrier is None
                                      else start_barrier)
            if (keep_plan and current.plan_generation == current.generation
                    and current.plan_after == pipeline.start_barrier):
                # the planned next batch starts where the new generation does: its plan stays
                # (a reset by a new checkpoint must not lose the input barrier of the batch
                # its sources already planned; docs/topology.md)
                pipeline.plan_generation = current.generation + 1
            pipeline.generation += 1
            pipeline.epoch += 1
            pipeline.query_id = query_id or ""
            pipeline.last_commit_ms = 0
            stale = [t for t in self._unfinished.values()
                     if t.pipeline_id == pipeline_id and t.state in LIVE_STATES]
            aborted = [self._prepare_abort(t, f"pipeline reset: {reason}") for t in stale]
            with self.store.batch():
                self.store.update_pipeline(pipeline)
                for txn in aborted:
                    self.store.update_txn(txn)
            self._pipelines[pipeline_id] = pipeline
            self._last_commit_at.pop(pipeline_id, None)
            for txn in aborted:
                self._track(txn)
            self._changed.notify_all()
        self._clean_up(aborted)
        log.warning("pipeline reset", extra={"pipeline_id": pipeline_id,
                                             "generation": pipeline.generation, "reason": reason})
        return pipeline.copy(), True, [t.txn_id for t in aborted]

    def _check_start_not_back(self, current: PipelineRecord, start_barrier: int) -> None:
        """Under the lock: refuses a start barrier below the input start of a pipeline that
        reads percolake tables and writes tables (``reset_pipeline``)."""
        pipeline_id = current.pipeline_id
        stands = self._input_start(current)
        written = self._lineage.writes_of(pipeline_id)
        if start_barrier >= stands or not written or not self._lineage.reads.get(pipeline_id):
            return
        raise FailedPrecondition(
            f"start barrier {start_barrier} is below where pipeline {pipeline_id!r}'s input "
            f"stands ({stands}): {written[0]} already holds its results up to there and its "
            "readers passed them, so reading the range again would write them twice at "
            "barriers nobody reads again (docs/topology.md, lineage transitions). To "
            "reprocess from an earlier barrier, revise its table: `percolake-coordinator "
            f"revise --table {written[0]} --to-barrier {start_barrier}`; or reset at or above "
            f"{stands}")

    def _new_pipeline(self, pipeline_id: str) -> PipelineRecord:
        return PipelineRecord(pipeline_id=pipeline_id, created_ms=wall_ms())

    def _persist_pipeline(self, pipeline: PipelineRecord, current: PipelineRecord | None) -> None:
        if current is None:
            self.store.insert_pipeline(pipeline)
        else:
            self.store.update_pipeline(pipeline)
