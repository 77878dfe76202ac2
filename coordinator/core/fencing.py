"""Fencing (I5) and query-id binding (I9): who may act on a pipeline or a transaction."""

from __future__ import annotations

import logging
import time

from coordinator.core.state import CoreState
from percolake.errors import FailedPrecondition, Fenced, QueryIdMismatch
from percolake.records import PipelineRecord, TxnRecord
from percolake.states import LIVE_STATES

log = logging.getLogger("percolake.coordinator")


class Fencing(CoreState):
    """Checks of the caller's epoch and query id; they change nothing."""

    def _check_caller(self, pipeline: PipelineRecord, epoch: int | None,
                      query_id: str | None) -> None:
        """Fencing (I5) and query-id binding (I9) of a pipeline-level request."""
        if query_id is not None and epoch is None:
            raise FailedPrecondition(
                f"a request of pipeline {pipeline.pipeline_id!r} carrying a Spark query id must "
                "carry the epoch RegisterPipeline issued; register first")
        self._check_epoch(pipeline, epoch)  # fencing first: a zombie learns nothing else
        if query_id is None and pipeline.query_id:
            raise FailedPrecondition(
                f"pipeline {pipeline.pipeline_id!r} is bound to Spark query id "
                f"{pipeline.query_id}; requests without a query id are refused on it"
            )
        self._check_query_id(pipeline, query_id)

    def _check_epoch(self, pipeline: PipelineRecord, epoch: int | None) -> None:
        if epoch is None:
            if pipeline.fenced_or_bound:
                driver = (f"a registered driver (epoch {pipeline.epoch})" if pipeline.epoch
                          else f"Spark query id {pipeline.query_id}")
                raise FailedPrecondition(
                    f"pipeline {pipeline.pipeline_id!r} is driven by {driver}; requests "
                    "without an epoch are refused on it"
                )
            return
        if epoch < pipeline.epoch:
            raise Fenced(
                f"fenced: epoch {epoch} of pipeline {pipeline.pipeline_id!r} is older than the "
                f"current epoch {pipeline.epoch}; a newer driver took over"
            )
        if epoch > pipeline.epoch:
            raise FailedPrecondition(
                f"epoch {epoch} of pipeline {pipeline.pipeline_id!r} was never issued (current "
                f"{pipeline.epoch}); call RegisterPipeline"
            )

    def _check_txn_caller(self, txn: TxnRecord, epoch: int | None) -> None:
        self._check_epoch(self._pipelines[txn.pipeline_id], epoch)

    def _check_query_id(self, pipeline: PipelineRecord, query_id: str | None) -> None:
        if query_id and not pipeline.query_id:
            self._refuse_earlier_query_id(pipeline, query_id)
        if query_id and pipeline.query_id and query_id != pipeline.query_id:
            last = (time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                  time.gmtime(pipeline.last_commit_ms / 1000))
                    if pipeline.last_commit_ms else "never")
            raise QueryIdMismatch(
                f"pipeline {pipeline.pipeline_id!r} (generation {pipeline.generation}) is bound "
                f"to Spark query id {pipeline.query_id} (last commit: {last}), but this request "
                f"carries query id {query_id}: the streaming checkpoint was deleted or replaced, "
                "so its batch ids restarted and cannot be told from replays. Nothing was "
                "written. If this is intended, start a new generation: percolake-coordinator "
                f"reset-pipeline --target HOST:PORT --pipeline {pipeline.pipeline_id} "
                f"--generation {pipeline.generation} --reason \"...\""
            )

    @staticmethod
    def _refuse_earlier_query_id(pipeline: PipelineRecord, query_id: str) -> None:
        """I9: a query id bound to an earlier generation never binds a later one; its batch
        ids belong to that generation, and taking it would write them again."""
        for reset in reversed(pipeline.resets):
            if reset.previous_query_id == query_id:
                raise FailedPrecondition(
                    f"Spark query id {query_id} drove generation {reset.from_generation} of "
                    f"pipeline {pipeline.pipeline_id!r}, which was reset to generation "
                    f"{reset.to_generation} ({reset.reason!r}); it cannot bind a later "
                    "generation, or its replays would be written again. Start the query on "
                    "a new checkpoint (it gets a new Spark query id)"
                )

    @staticmethod
    def _refuse_replaced_query_id(pipeline: PipelineRecord, query_id: str) -> None:
        """I9: a reset never binds the new generation to the query id of the one it replaces
        (its replays of committed batches would be written again as new)."""
        if query_id == pipeline.query_id:
            raise FailedPrecondition(
                f"Spark query id {query_id} drives generation {pipeline.generation} of "
                f"pipeline {pipeline.pipeline_id!r}; a reset cannot bind it to generation "
                f"{pipeline.generation + 1}, or its replays of batches already committed "
                "would be written again. A reset is for a new checkpoint: start the query on "
                "one and reset with its query id, or without one"
            )

    def _check_idle(self, pipeline: PipelineRecord) -> None:
        live = [t.txn_id for t in self._unfinished.values()
                if t.pipeline_id == pipeline.pipeline_id and t.state in LIVE_STATES]
        committed_at = self._last_commit_at.get(pipeline.pipeline_id)
        since_commit_s = self._monotonic() - committed_at if committed_at is not None else None
        if live or (since_commit_s is not None and since_commit_s < self.config.txn_timeout_s):
            activity = (f"live transaction {live[0]}" if live
                        else f"a commit {since_commit_s:.0f} s ago")
            raise FailedPrecondition(
                f"pipeline {pipeline.pipeline_id!r} generation {pipeline.generation} is still "
                f"driven by query {pipeline.query_id or '(unbound)'} ({activity}); "
                "on_checkpoint_reset='new_generation' refuses to reset an active pipeline. "
                "Stop the other query, or reset explicitly with reset-pipeline")
