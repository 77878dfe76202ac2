"""Reading many tables at one consistent point in time.

GetSnapshot answers a snapshot_ts and a Delta version per table (the coordinator first rolls
forward committed writes that are not applied yet). Each table is then read at exactly that
version with delta-spark (``versionAsOf``); the session needs it (``sparkside.configure_spark``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from percolake.credentials import ClientSecurity
from percolake.lake.warehouse import is_object_store, spark_uri
from percolake.v1 import coordinator_pb2 as pb
from sparkside.client import CoordinatorClient
from sparkside.errors import ObjectStoreNotConfigured, TableNotWritten
from sparkside.session import use_object_store_settings

AsOf = int | tuple[str, int] | tuple[str, int, int] | None


class Snapshot:
    """The tables at one snapshot: ``table(name)``, ``snapshot_ts`` and ``versions``."""

    def __init__(self, spark: SparkSession, reply: pb.GetSnapshotResponse) -> None:
        self._spark = spark
        self.snapshot_ts: int = reply.snapshot_ts
        self.versions: dict[str, int | None] = {
            t.table: (t.delta_version if t.exists else None) for t in reply.tables}
        self._canonical = {t.table: t.canonical_table for t in reply.tables}

    def table(self, name: str) -> DataFrame:
        """The table as a Spark DataFrame at this snapshot.

        Raises:
            KeyError: ``name`` was not part of the snapshot.
            TableNotWritten: the table had no committed write at ``snapshot_ts``.
        """
        if name not in self.versions:
            raise KeyError(f"{name} is not in this snapshot; it has {sorted(self.versions)}")
        version = self.versions[name]
        if version is None:
            raise TableNotWritten(
                f"table {name} has no committed write at or before snapshot {self.snapshot_ts}")
        return read_table_version(self._spark, self._canonical[name], version)


class ConsistentReader:
    """Snapshots of several tables from the coordinator at ``target``.

    ``target`` is ``host:port``, or several coordinators separated by commas
    (``"h1:50051,h2:50051"``): snapshots are asked of the leader, followed within ``retry_s``.
    ``tls_ca``, ``tls_cert``, ``tls_key`` (PEM files) and ``token``: the connection's TLS and
    bearer token as for :class:`sparkside.participant.Participant`; None: the environment.
    """

    def __init__(self, spark: SparkSession, target: str, retry_s: float = 30.0, *,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, token: str | None = None) -> None:
        self._spark = spark
        security = ClientSecurity.resolve(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                          token=token)
        self._client = CoordinatorClient(target, retry_s, security)

    def snapshot(self, tables: Sequence[str], as_of: AsOf = None,
                 wait_s: float | None = None) -> Snapshot:
        """A consistent snapshot of ``tables``.

        Args:
            tables: absolute paths or ``file://`` URIs; ``Snapshot.table`` takes the same strings.
            as_of: None for the latest; a commit_ts to travel to; ``(pipeline, batch)`` for the
                state right after that batch of the current generation, or
                ``(pipeline, generation, batch)``.
            wait_s: how long the coordinator may spend rolling commits forward.
        """
        request = pb.GetSnapshotRequest(tables=list(tables))
        if isinstance(as_of, int) and not isinstance(as_of, bool):
            request.as_of_ts = as_of
        elif isinstance(as_of, tuple) and len(as_of) == 2:
            request.as_of_batch.CopyFrom(pb.BatchRef(pipeline_id=as_of[0], batch_id=as_of[1]))
        elif isinstance(as_of, tuple) and len(as_of) == 3:
            request.as_of_batch.CopyFrom(pb.BatchRef(pipeline_id=as_of[0], generation=as_of[1],
                                                     batch_id=as_of[2]))
        elif as_of is not None:
            raise ValueError("as_of is a commit_ts, (pipeline, batch) or "
                             f"(pipeline, generation, batch); got {as_of!r}")
        if wait_s is not None:
            request.wait_timeout_ms = int(wait_s * 1000)
        return Snapshot(self._spark, self._client.call("GetSnapshot", request))

    def close(self) -> None:
        self._client.close()


def read_table_version(spark: SparkSession, table_uri: str, version: int) -> DataFrame:
    """One Delta table at one version as a Spark DataFrame (delta-spark's ``versionAsOf``).

    A table on an object store is read through Hadoop's S3 connector; the session gets
    ``fs.s3a.*`` from the AWS environment unless the user set them.

    Raises:
        ObjectStoreNotConfigured: the session lacks Hadoop's S3 connector.
    """
    if is_object_store(table_uri):
        use_object_store_settings(spark)
    try:
        return spark.read.format("delta").option("versionAsOf", version) \
            .load(spark_uri(table_uri))
    except Exception as exc:
        if "S3AFileSystem" in str(exc) and "not found" in str(exc).lower():
            raise ObjectStoreNotConfigured(
                f"cannot read {table_uri}: this SparkSession lacks Hadoop's S3 connector; "
                "build it with sparkside.configure_spark(builder, warehouse='s3://...') "
                "(it adds the connector's jars, which Spark loads only at the session's "
                "start)") from None
        raise
