"""Reading many tables at one consistent point in time.

GetSnapshot answers a snapshot_ts and a Delta version per table (the coordinator first rolls
forward committed writes that are not applied yet). Each table is then read at exactly that
version with delta-spark (``versionAsOf``); the session needs it (``sparkside.configure_spark``).

Three consistencies (docs/topology.md): ``snapshot`` (every table at one commit_ts),
``topology`` (every table at its version at the latest global barrier all of them completed:
a derived table shows exactly the result of its inputs as shown) and ``read_committed`` (each
table's latest applied version). A topology answer never goes backwards (T2): the coordinator
keeps that rule, and the reader keeps it too, per set of tables, across coordinators.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from percolake.credentials import ClientSecurity
from percolake.lake.warehouse import is_object_store, spark_uri
from percolake.v1 import coordinator_pb2 as pb
from sparkside.catalog import resolve_table
from sparkside.client import CoordinatorClient
from sparkside.errors import BatchRefused, ObjectStoreNotConfigured, TableNotWritten
from sparkside.session import use_object_store_settings

AsOf = int | tuple[str, int] | tuple[str, int, int] | None
CONSISTENCIES = {"snapshot": pb.CONSISTENCY_SNAPSHOT, "topology": pb.CONSISTENCY_TOPOLOGY,
                 "read_committed": pb.CONSISTENCY_READ_COMMITTED}
_CONSISTENCY_NAMES = {value: name for name, value in CONSISTENCIES.items()}
COMPLETION_POLL_S = 0.5


class Snapshot:
    """The tables at one snapshot: ``table(name)``, ``snapshot_ts`` and ``versions``.

    ``consistency`` is the answer's ("snapshot", "topology" or "read_committed");
    ``barrier_ts`` the global barrier a topology snapshot is at (None otherwise); ``lease_id``
    (also ``lease``) the lease taken with ``lease_s`` (None without), given back by
    ``release()``.
    """

    def __init__(self, spark: SparkSession, reply: pb.GetSnapshotResponse,
                 client: CoordinatorClient | None = None,
                 names: dict[str, str] | None = None) -> None:
        self._spark = spark
        self._client = client
        self.snapshot_ts: int = reply.snapshot_ts
        self.consistency: str = _CONSISTENCY_NAMES.get(reply.consistency, "snapshot")
        self.barrier_ts: int | None = (reply.barrier_ts if reply.consistency
                                       == pb.CONSISTENCY_TOPOLOGY else None)
        # topology: the newest revision of a derived table among the tables (0: none)
        self.revised_ts: int = reply.revised_ts
        self.lease_id: str | None = reply.lease.lease_id if reply.HasField("lease") and \
            reply.lease.lease_id else None
        self.lease_expires_unix_ms: int | None = (reply.lease.expires_unix_ms
                                                  if self.lease_id else None)
        names = names or {}  # location asked -> the catalog name the caller gave
        self.versions: dict[str, int | None] = {
            names.get(t.table, t.table): (t.delta_version if t.exists else None)
            for t in reply.tables}
        self._canonical = {names.get(t.table, t.table): t.canonical_table for t in reply.tables}

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

    @property
    def lease(self) -> str | None:
        """The id of the lease held on this snapshot's versions (``lease_id``)."""
        return self.lease_id

    def release(self) -> bool:
        """Gives the lease back (its files may be vacuumed again). True if it was held; False
        without a lease or when it had expired or was released before."""
        if self.lease_id is None or self._client is None:
            return False
        reply = self._client.call("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=self.lease_id))
        self.lease_id = None
        return reply.released


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
        # T2 on this side: the newest topology barrier answered per set of tables, and the
        # newest revision of a derived table among them then (past a newer one the answers
        # start again from its barrier: docs/topology.md, revision).
        self._topology_floor: dict[frozenset[str], tuple[int, int]] = {}

    def snapshot(self, tables: Sequence[str], as_of: AsOf = None,
                 wait_s: float | None = None, *, consistency: str = "snapshot",
                 barrier: int | None = None, lease_s: float | None = None,
                 lease_holder: str | None = None) -> Snapshot:
        """A consistent snapshot of ``tables``.

        Args:
            tables: absolute paths, ``file://`` or ``s3://`` URIs, or names in the session's
                catalog (``db.table``); ``Snapshot.table`` takes the same strings.
            as_of: None for the latest; a commit_ts to travel to; ``(pipeline, batch)`` for the
                state right after that batch of the current generation, or
                ``(pipeline, generation, batch)``. Not with ``consistency="topology"``.
            wait_s: how long the coordinator may spend rolling commits forward.
            consistency: ``"snapshot"`` (one commit_ts), ``"topology"`` (every table at its
                version at the latest global barrier all of them completed) or
                ``"read_committed"`` (each table's latest applied version).
            barrier: with ``"topology"``, a completed global barrier to read at instead of the
                latest (time travel); without it the answer never goes below an earlier one
                of this reader for the same tables.
            lease_s: keep the answer's versions from vacuum for this long (``Snapshot.release``
                ends it sooner); ``lease_holder`` names the holder (shown in refusals).

        Raises:
            BatchRefused: the barrier is not completed yet or below the retention floor.
            ValueError: a bad combination of arguments.
        """
        if consistency not in CONSISTENCIES:
            raise ValueError(f"consistency must be one of {sorted(CONSISTENCIES)}, "
                             f"got {consistency!r}")
        if barrier is not None and consistency != "topology":
            raise ValueError("barrier= reads a topology snapshot: pass consistency='topology'")
        names = {resolve_table(self._spark, t): t for t in tables}
        tables = list(names)
        if consistency == "topology":
            if as_of is not None:
                raise ValueError("a topology snapshot travels with barrier=, not as_of=")
            return self._topology_snapshot(tables, barrier, wait_s, lease_s, lease_holder,
                                           names)
        request = self._request(tables, wait_s, lease_s, lease_holder)
        if consistency != "snapshot":  # unspecified is the snapshot, for older coordinators
            request.consistency = CONSISTENCIES[consistency]
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
        return Snapshot(self._spark, self._client.call("GetSnapshot", request), self._client,
                        names)

    def _request(self, tables: Sequence[str], wait_s: float | None, lease_s: float | None,
                 lease_holder: str | None) -> pb.GetSnapshotRequest:
        request = pb.GetSnapshotRequest(tables=list(tables))
        if wait_s is not None:
            request.wait_timeout_ms = int(wait_s * 1000)
        if lease_s is not None:
            if lease_s <= 0:
                raise ValueError(f"lease_s must be positive, got {lease_s}")
            request.lease_ms = max(1, int(lease_s * 1000))
            if lease_holder:
                request.lease_holder = lease_holder
        return request

    def _topology_snapshot(self, tables: Sequence[str], barrier: int | None,
                           wait_s: float | None, lease_s: float | None,
                           lease_holder: str | None, names: dict[str, str]) -> Snapshot:
        request = topology_request(tables, barrier,
                                   self._request(tables, wait_s, lease_s, lease_holder))
        snapshot = Snapshot(self._spark, self._client.call("GetSnapshot", request), self._client,
                            names)
        if barrier is not None:
            return snapshot  # time travel: the floor is for the latest answers only
        key = frozenset(snapshot._canonical.values())
        floor, revised = self._topology_floor.get(key, (0, 0))
        if snapshot.revised_ts > revised:
            floor = 0  # a derived table was revised since: its answers restart at its barrier
        elif (snapshot.barrier_ts or 0) < floor:
            # An answer below one already given (a coordinator that does not know the earlier
            # answer): ask at the earlier barrier, which every table completed before.
            snapshot.release()
            request.as_of_barrier = floor
            snapshot = Snapshot(self._spark, snapshot_once_completed(self._client, request),
                                self._client, names)
        self._topology_floor[key] = (max(floor, snapshot.barrier_ts or 0),
                                     max(revised, snapshot.revised_ts))
        return snapshot

    def close(self) -> None:
        self._client.close()


def snapshot_once_completed(client: CoordinatorClient,
                            request: pb.GetSnapshotRequest) -> pb.GetSnapshotResponse:
    """GetSnapshot at a barrier, asked again while the coordinator says a table has not
    completed it yet (a table read for the first time, a coordinator catching up), within the
    client's retry time."""
    deadline = time.monotonic() + client.retry_s
    while True:
        try:
            return client.call("GetSnapshot", request)
        except BatchRefused as refused:
            if "not completed" not in str(refused) or time.monotonic() > deadline:
                raise
        time.sleep(COMPLETION_POLL_S)


def topology_request(tables: Sequence[str], barrier: int | None,
                     base: pb.GetSnapshotRequest | None = None) -> pb.GetSnapshotRequest:
    """A GetSnapshot request of a topology snapshot of ``tables``: at ``barrier`` (a completed
    global barrier) if given, else at the latest barrier all of them completed."""
    request = pb.GetSnapshotRequest()
    if base is not None:
        request.CopyFrom(base)
    del request.tables[:]
    request.tables.extend(tables)
    request.consistency = pb.CONSISTENCY_TOPOLOGY
    if barrier is not None:
        request.as_of_barrier = barrier
    return request


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
