"""The percolake streaming source: ``spark.readStream.format("percolake")`` (docs/topology.md).

A downstream pipeline reads the rows that committed upstream batches appended to a percolake
table, one barrier range per micro-batch::

    sparkside.register(spark)
    debits = (spark.readStream.format("percolake")
              .option("coordinator", "127.0.0.1:50051")
              .option("pipeline", "ledger")          # the reading pipeline's id
              .load("/lake/debits"))

Offsets are ``{"generation": g, "barrier": b, "after": a}``: the batch ending at that offset
reads the range (a, b], fixed by the offset alone (a replay reads the same rows). Where a
micro-batch ends is the coordinator's answer to PlanBarrier, the same for every percolake source
of the query (and for every retry): each source counts its planning calls, and the coordinator
gives every call of one count (one planning round) the same answer, so all sources end on the
same global barrier. A batch's rows are the add actions of the
table's Delta versions whose commits lie in the barrier range (GetTableChanges), read from the
Delta log and the data files with pyarrow on the executors. Nothing here imports delta-rs: it
runs in Spark's forked Python workers.

Optional options: ``retry_s`` (coordinator retry budget, default 60), ``tls_ca``, ``tls_cert``,
``tls_key``, ``token`` (else the ``PERCOLAKE_*`` environment variables of Spark's Python
workers, as for the participant), ``new_columns``: the rows carry the upstream table's columns
as they were when the query started; a file with columns added upstream since fails the batch
naming them (``"fail"``, the default: restart the query to read them) or they are left out
(``"ignore"``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from percolake.credentials import ClientSecurity
from percolake.lake import storage
from percolake.lake.warehouse import canonical_table_uri, is_object_store
from percolake.v1 import coordinator_pb2 as pb
from sparkside.catalog import is_table_name
from sparkside.client import CoordinatorClient
from sparkside.delta_log import TableLog
from sparkside.errors import BatchRefused, InvalidRequest
from sparkside.session import run_executors_on_driver_python
from sparkside.source_files import FilePartition, read_file
from sparkside.source_names import FORMAT
from sparkside.source_names import install as install_name_resolution

REGISTER_ATTEMPTS = 3
NEW_COLUMNS = ("fail", "ignore")  # the source's new_columns option: upstream columns added later


def register(spark: SparkSession) -> None:
    """Registers the ``percolake`` streaming source on ``spark`` (once per session); its
    planner and readers run the driver's Python unless the user chose another. A catalog
    name given to its ``load`` is resolved to the table's location on the driver
    (``sparkside.source_names``)."""
    run_executors_on_driver_python(spark.sparkContext)
    install_name_resolution()
    spark.dataSource.register(PercolakeDataSource)


@dataclass(frozen=True)
class Offset:
    """A percolake source offset: the reading pipeline's generation, the barrier its input has
    reached, and where the batch ending here began (``after``; None in offsets written before
    it was recorded)."""

    generation: int
    barrier: int
    after: int | None = None

    @classmethod
    def parse(cls, value: Mapping[str, Any] | str) -> Offset:
        data = json.loads(value) if isinstance(value, str) else value
        try:
            after = data.get("after")
            offset = cls(int(data["generation"]), int(data["barrier"]),
                         None if after is None else int(after))
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ValueError(f"not a percolake source offset: {value!r}") from None
        if offset.after is not None and offset.after > offset.barrier:
            raise ValueError(f"not a percolake source offset (after above barrier): {value!r}")
        return offset

    def to_dict(self) -> dict[str, int]:
        data = {"generation": self.generation, "barrier": self.barrier}
        if self.after is not None:
            data["after"] = self.after
        return data


@dataclass(frozen=True)
class SourceOptions:
    """The options of one percolake source, checked."""

    table: str
    coordinator: str
    pipeline: str
    retry_s: float = 60.0
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = None
    ignore_new_columns: bool = False  # option new_columns: "fail" (default) or "ignore"

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SourceOptions:
        table = options.get("path") or options.get("table")
        missing = [name for name, value in (("table (load(table))", table),
                                            ("coordinator", options.get("coordinator")),
                                            ("pipeline", options.get("pipeline")))
                   if not value]
        if missing:
            raise ValueError(f"the percolake source needs {', '.join(missing)}: "
                             'readStream.format("percolake").option("coordinator", "host:port")'
                             '.option("pipeline", "<reading pipeline>").load("<table>")')
        if is_table_name(str(table)):
            raise ValueError(
                f"the percolake source got the catalog name {table!r} unresolved: its planner "
                "runs in a Python worker, without the session's catalog, and names are "
                "resolved on the driver by the readers of a session on which "
                "sparkside.register(spark) was called. Call it before readStream, or load the "
                f"table by location: .load(sparkside.resolve_table(spark, {table!r}))")
        new_columns = str(options.get("new_columns", "fail")).lower()
        if new_columns not in NEW_COLUMNS:
            raise ValueError(f"option new_columns must be one of {NEW_COLUMNS}, got "
                             f"{new_columns!r}")
        return cls(canonical_table_uri(str(table)), options["coordinator"], options["pipeline"],
                   float(options.get("retry_s", 60.0)), options.get("tls_ca"),
                   options.get("tls_cert"), options.get("tls_key"), options.get("token"),
                   new_columns == "ignore")

    def client(self) -> CoordinatorClient:
        security = ClientSecurity.resolve(tls_ca=self.tls_ca, tls_cert=self.tls_cert,
                                          tls_key=self.tls_key, token=self.token)
        return CoordinatorClient(self.coordinator, self.retry_s, security)


class PercolakeDataSource(DataSource):
    """The ``percolake`` format: streaming reads of percolake tables (no batch reads)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        """The upstream table's newest schema, from its Delta log.

        Raises:
            TableNotWritten: the table has no commit yet.
        """
        table = SourceOptions.of(self.options).table
        return StructType.fromJson(json.loads(TableLog(table).schema_json()))

    def streamReader(self, schema: StructType) -> PercolakeStreamReader:  # noqa: N802
        return PercolakeStreamReader(SourceOptions.of(self.options), schema)


class PercolakeStreamReader(DataSourceStreamReader):
    """Barrier-aligned micro-batches of one percolake table for one reading pipeline.

    Creating it registers the read edge (pipeline reads table) with the coordinator.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.table = options.table
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._client: CoordinatorClient | None = None
        self._rounds = 0  # latestOffset's PlanBarrier calls so far: the planning round
        try:
            self._register_read()
        finally:
            # Spark also creates readers only to plan a query (schema, pickling for the
            # executors) and never stops them: no channel outlives the registration; a
            # streaming reader opens one again on its first plan
            self.stop()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a channel never travels to an executor
        return state

    def _register_read(self) -> None:
        """RegisterReads (idempotent). Once a driver of the pipeline registered, the
        coordinator fences calls by epoch; the source is part of that driver's query (the
        participant registers it at the first batch), so it registers with the pipeline's
        current epoch, asking again if a newer driver took over meanwhile."""
        request = pb.RegisterReadsRequest(pipeline_id=self.options.pipeline, tables=[self.table])
        for _ in range(REGISTER_ATTEMPTS):
            try:
                self._coordinator().call("RegisterReads", request)
                return
            except (BatchRefused, InvalidRequest) as refused:
                if "epoch" not in str(refused):
                    raise
                pipeline = self._coordinator().call(
                    "GetPipeline", pb.GetPipelineRequest(pipeline_id=self.options.pipeline))
                request.epoch = pipeline.epoch
        self._coordinator().call("RegisterReads", request)

    def _coordinator(self) -> CoordinatorClient:
        if self._client is None:
            self._client = self.options.client()
        return self._client

    def _plan(self, start: Offset | None, planning_round: int) -> pb.PlanBarrierResponse:
        request = pb.PlanBarrierRequest(pipeline_id=self.options.pipeline,
                                        round=planning_round)
        if start is not None:
            request.generation = start.generation
            request.after_barrier = start.barrier
        return self._coordinator().call("PlanBarrier", request)

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        """Where a new query's input starts: where its generation's input stands.

        Spark asks it right before the first latestOffset, in the same planning round: it
        asks with that round's count, so a plan it causes is the one every source of the
        round gets."""
        reply = self._plan(None, self._rounds + 1)
        return Offset(reply.generation, reply.after_barrier, reply.after_barrier).to_dict()

    def latestOffset(self, start: dict, limit: Any = None) -> dict:  # noqa: N802
        """The end of the next batch (the coordinator's plan for this planning round), or
        ``start`` if the source stands where the pipeline's input stands and nothing is due."""
        begin = Offset.parse(start)
        self._rounds += 1
        return next_offset(begin, self._plan(begin, self._rounds), start)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One partition per data file the table's commits in the batch's range added: the
        range (after, barrier] the end offset records."""
        after, upto = batch_range(Offset.parse(start), Offset.parse(end), self.options.pipeline,
                                  self.table)
        if after == upto:
            return []
        reply = self._coordinator().call("GetTableChanges", pb.GetTableChangesRequest(
            table=self.table, after_barrier=after, upto_barrier=upto))
        log = TableLog(self.table)
        s3 = (storage.s3_settings(), storage.limits()) if is_object_store(self.table) else None
        return [FilePartition(self.table, change.delta_version, file, s3)
                for change in sorted(reply.changes, key=lambda c: c.delta_version)
                for file in log.data_files(change.delta_version)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            raise TypeError(f"not a percolake source partition: {partition!r}")
        return read_file(partition, self.arrow_schema, self.options.ignore_new_columns)

    def commit(self, end: dict) -> None:
        """Nothing to do: the reading pipeline's commit records its input barrier."""

    def stop(self) -> None:
        """Closes the reader's channel, if open (again and again: idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()


def next_offset(start: Offset, reply: pb.PlanBarrierResponse, given: Any) -> Any:
    """latestOffset's answer from the coordinator's plan: ``given`` (the start, unchanged:
    Spark runs no batch for this source) only if nothing is due and the source already stands
    where the plan starts; else the plan's end with the range start it was planned from (a
    source left behind or of another generation moves there, reading nothing)."""
    if reply.barrier == reply.after_barrier and (start.generation, start.barrier) == (
            reply.generation, reply.after_barrier):
        return given
    return Offset(reply.generation, reply.barrier, reply.after_barrier).to_dict()


def batch_range(start: Offset, end: Offset, pipeline: str, table: str) -> tuple[int, int]:
    """The barrier range (after, upto] of the batch from ``start`` to ``end``: recorded in the
    end offset. An offset written before ranges were recorded (no ``after``) continues from
    ``start`` within its generation, as it was planned; across generations its range is not
    known."""
    if end.after is not None:
        return end.after, end.barrier
    if start == end:
        return end.barrier, end.barrier
    if start.generation != end.generation:
        raise BatchRefused(
            f"percolake source of pipeline {pipeline!r} on {table}: the batch ending at "
            f"{end.to_dict()} has no recorded range start (an offset of an earlier percolake "
            "version) and its start is of another generation; restart the query on a new "
            "checkpoint location")
    return start.barrier, end.barrier
