"""The percolake streaming source: ``spark.readStream.format("percolake")`` (docs/topology.md).

A downstream pipeline reads the rows that committed upstream batches appended to a percolake
table, one barrier range per micro-batch::

    sparkside.register(spark)
    debits = (spark.readStream.format("percolake")
              .option("coordinator", "127.0.0.1:50051")
              .option("pipeline", "ledger")          # the reading pipeline's id
              .load("/lake/debits"))

Offsets are ``{"generation": g, "barrier": b}``. Where a micro-batch ends is the coordinator's
answer to PlanBarrier, the same for every percolake source of the query (and for every retry),
so all of them end on the same global barrier. A batch's rows are the add actions of the
table's Delta versions whose commits lie in the barrier range (GetTableChanges), read from the
Delta log and the data files with pyarrow on the executors. Nothing here imports delta-rs: it
runs in Spark's forked Python workers.

Optional options: ``retry_s`` (coordinator retry budget, default 60), ``tls_ca``, ``tls_cert``,
``tls_key``, ``token`` (else the ``PERCOLAKE_*`` environment variables of Spark's Python
workers, as for the participant).
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
from sparkside.client import CoordinatorClient
from sparkside.delta_log import TableLog
from sparkside.errors import BatchRefused, InvalidRequest
from sparkside.source_files import FilePartition, read_file

FORMAT = "percolake"
REGISTER_ATTEMPTS = 3


def register(spark: SparkSession) -> None:
    """Registers the ``percolake`` streaming source on ``spark`` (once per session)."""
    spark.dataSource.register(PercolakeDataSource)


@dataclass(frozen=True)
class Offset:
    """A percolake source offset: the reading pipeline's generation and the barrier its
    input has reached."""

    generation: int
    barrier: int

    @classmethod
    def parse(cls, value: Mapping[str, Any] | str) -> Offset:
        data = json.loads(value) if isinstance(value, str) else value
        try:
            return cls(int(data["generation"]), int(data["barrier"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not a percolake source offset: {value!r}") from None

    def to_dict(self) -> dict[str, int]:
        return {"generation": self.generation, "barrier": self.barrier}


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
        return cls(canonical_table_uri(str(table)), options["coordinator"], options["pipeline"],
                   float(options.get("retry_s", 60.0)), options.get("tls_ca"),
                   options.get("tls_cert"), options.get("tls_key"), options.get("token"))

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
        self._register_read()

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

    def _plan(self, start: Offset | None = None) -> pb.PlanBarrierResponse:
        request = pb.PlanBarrierRequest(pipeline_id=self.options.pipeline)
        if start is not None:
            request.generation = start.generation
            request.after_barrier = start.barrier
        return self._coordinator().call("PlanBarrier", request)

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        """Where a new query's input starts: its generation's start barrier."""
        reply = self._plan()
        return Offset(reply.generation, reply.start_barrier).to_dict()

    def latestOffset(self, start: dict, limit: Any = None) -> dict[str, int]:  # noqa: N802
        """The end of the next batch (the coordinator's plan), or ``start`` if none is due."""
        begin = Offset.parse(start)
        reply = self._plan(begin)
        if reply.barrier <= reply.after_barrier:
            return begin.to_dict()
        return Offset(reply.generation, reply.barrier).to_dict()

    def after_barrier(self, start: Offset, end: Offset) -> int:
        """Where the range ending at ``end`` begins: ``start``'s barrier within a generation;
        the start barrier of ``end``'s generation when the pipeline changed generation."""
        if start.generation == end.generation:
            return start.barrier
        reply = self._plan()
        if reply.generation != end.generation:
            raise BatchRefused(
                f"percolake source of pipeline {self.options.pipeline!r} on {self.table}: the "
                f"batch ending at {end} belongs to generation {end.generation}, but the "
                f"pipeline is at generation {reply.generation} now; restart the query")
        return reply.start_barrier

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One partition per data file the table's commits in the batch's range added."""
        begin, finish = Offset.parse(start), Offset.parse(end)
        if begin == finish:
            return []
        after = self.after_barrier(begin, finish)
        reply = self._coordinator().call("GetTableChanges", pb.GetTableChangesRequest(
            table=self.table, after_barrier=after, upto_barrier=finish.barrier))
        log = TableLog(self.table)
        s3 = (storage.s3_settings(), storage.limits()) if is_object_store(self.table) else None
        return [FilePartition(self.table, change.delta_version, file, s3)
                for change in sorted(reply.changes, key=lambda c: c.delta_version)
                for file in log.data_files(change.delta_version)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            raise TypeError(f"not a percolake source partition: {partition!r}")
        return read_file(partition, self.arrow_schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: the reading pipeline's commit records its input barrier."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
