"""Bad input and faults of the participant writing S3 tables (moto's S3 API server on
127.0.0.1): each fails the batch with a clear error, the attempt is aborted as a whole, nothing
reaches a Delta log, no attempt object is left, and the replay of the same batch id commits
exactly once once the fault is gone.

- access denied on one table of a three-table batch, for real: a separate moto server that
  enforces IAM (``MotoServer(iam=True)``), a user whose policy denies one table's prefix;
- the driver's credentials missing (the message names the variable);
- the bucket missing (the message names it);
- the endpoint unreachable, from the start or going down while the executors write (bounded
  in time; the store "did not answer"; nothing guessed).

The participant reads the AWS variables of this process when it writes (monkeypatched per
test, as ``s3_env`` does); the coordinator daemon gets its own through ``env=``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from percolake.lake.arrow_read import read_delta_table
from percolake.lake.storage import StorageRefused, StorageSettingsError, StorageUnavailable
from percolake.v1 import coordinator_pb2 as pb
from sparkside import Participant
from tests.daemon_support import unique, wait_for
from tests.s3_support import CLOSED_PORT, FlakyEndpoint, MotoServer
from tests.spark.helpers import committed_batches, transactions

pytestmark = pytest.mark.spark

TABLES = ("a", "b", "denied")  # written in this order: the denied one last
ROOT = "warehouse"
FAULT_BOUND_S = 60  # an unreachable store fails the batch within this
CLEANUP_WAIT_S = 30  # the coordinator deletes an aborted attempt's objects within this


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def iam_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto server of this module's own that checks every request against IAM (the shared
    session server stays open to everyone)."""
    server = MotoServer(log_path=tmp_path_factory.mktemp("moto-iam") / "moto.log",
                        iam=True).start()
    yield server
    server.stop()


@pytest.fixture
def make_participant() -> Iterator[Callable[..., Participant]]:
    """``make_participant(target, pipeline_id)``; closed after the test."""
    made: list[Participant] = []

    def make(target: str, pipeline_id: str) -> Participant:
        made.append(Participant(target, pipeline_id=pipeline_id))
        return made[-1]

    yield make
    for participant in made:
        participant.close()


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Points this process (the driver) at ``env``'s store."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def no_profile_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


def s3_policy(bucket: str, deny_actions: str | list[str] | None = None,
              deny_prefix: str | None = None) -> dict:
    """Everything on ``bucket``, except ``deny_actions`` on the keys below ``deny_prefix``."""
    statements: list[dict] = [{"Effect": "Allow", "Action": "s3:*", "Resource": [
        f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]
    if deny_prefix:
        statements.append({"Effect": "Deny", "Action": deny_actions or "s3:*",
                           "Resource": f"arn:aws:s3:::{bucket}/{deny_prefix}/*"})
    return {"Version": "2012-10-17", "Statement": statements}


def start_daemon(daemon_factory, tmp_path: Path, root: str, env: dict[str, str]):  # noqa: ANN001, ANN201
    return daemon_factory.start(["--roll-forward-after", "3600", "--txn-timeout", "60"],
                                warehouse=root, data_dir=tmp_path / "data", env=env,
                                name="s3-faults")


def rows(spark, batch_id: int, table: str):  # noqa: ANN001, ANN201
    """Two rows per table and batch, different for each."""
    return spark.createDataFrame([(batch_id * 10 + i, f"{table}-{batch_id}-{i}") for i in (0, 1)],
                                 "id long, name string")


class Batch:
    """The user's function of a batch writing ``uris`` in order; counts its calls, records
    what an admin listing shows below each table after its write (the attempt's objects), and
    runs ``before[name]()`` (once) just before the write of table ``name``."""

    def __init__(self, spark, uris: dict[str, str], listing: Callable[[str], list[str]],  # noqa: ANN001
                 before: dict[str, Callable[[], object]] | None = None) -> None:
        self.spark = spark
        self.uris = uris
        self.listing = listing
        self.before = dict(before or {})
        self.calls = 0
        self.written: dict[str, list[str]] = {}

    def __call__(self, df, batch_id: int, txn) -> None:  # noqa: ANN001
        self.calls += 1
        self.written.clear()
        for name, uri in self.uris.items():
            if name in self.before:
                self.before.pop(name)()
            txn.write(rows(self.spark, batch_id, name), uri)
            txn.finish_writes()  # these faults are about one write at a time
            self.written[name] = self.listing(name)


def attempts(stub, pipeline: str, batch_id: int = 0) -> list[tuple[int, int]]:  # noqa: ANN001
    return sorted((t.attempt, t.state) for t in transactions(stub, pipeline)
                  if t.batch_id == batch_id)


def assert_committed_once(stub, pipeline: str, uris: dict[str, str],  # noqa: ANN001
                          keys: Callable[[str], list[str]]) -> pb.Transaction:
    """Batch 0 committed by exactly one attempt, applied to every table as its version 0 (the
    only version), holding exactly the batch's rows, with only that attempt's objects."""
    committed = committed_batches(stub, pipeline)
    assert list(committed) == [0]
    txn = committed[0]
    assert txn.state == pb.APPLIED
    assert {p.table: p.delta_version for p in txn.participants} == {u: 0 for u in uris.values()}
    for name, uri in uris.items():
        got = sorted(read_delta_table(uri).to_pylist(), key=lambda r: r["id"])
        assert got == [{"id": i, "name": f"{name}-0-{i}"} for i in (0, 1)]
        below = keys(name)
        log_keys = [k for k in below if "/_delta_log/" in k]
        assert [k for k in log_keys if not k.endswith(".crc")] == [
            f"{ROOT}/{name}/_delta_log/{0:020d}.json"]
        assert all(k == f"{ROOT}/{name}/_delta_log/{0:020d}.crc"  # its checksum, if written yet
                   for k in log_keys if k.endswith(".crc"))
        assert [k for k in below if "/_delta_log/" not in k] and all(
            f"/_percolake/{txn.txn_id}/" in k for k in below if "/_delta_log/" not in k)
    return txn


# ---------------------------------------------------------------- access denied (IAM)


@pytest.mark.parametrize("denied_actions", ["s3:*", "s3:PutObject"],
                         ids=["all-access-denied", "writes-denied"])
def test_access_denied_on_one_table_aborts_the_whole_batch_and_its_replay_commits_once(
        spark, daemon_factory, make_participant, iam_moto, monkeypatch, tmp_path, denied_actions):
    """Three tables, the last one's prefix denied to the job's IAM user (everything, or only
    writes, so that the executors' write is what fails). The batch fails naming that table and
    "access denied"; the attempt is ABORTED; no table has a Delta version; the objects written
    to the two allowed tables are deleted. With the policy fixed, the replay of batch 0
    commits once; a second replay changes nothing."""
    bucket = iam_moto.create_bucket()
    user = unique("job")
    key_id, secret = iam_moto.create_user(
        user, s3_policy(bucket, denied_actions, f"{ROOT}/denied"))
    env = iam_moto.env(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret)
    daemon = start_daemon(daemon_factory, tmp_path, f"s3://{bucket}/{ROOT}", env)
    use_env(monkeypatch, env)
    uris = {name: f"s3://{bucket}/{ROOT}/{name}" for name in TABLES}

    def keys(name: str) -> list[str]:  # as the admin: sees the denied prefix too
        return iam_moto.keys(bucket, f"{ROOT}/{name}/")

    pipeline = unique("denied")
    participant = make_participant(daemon.target, pipeline)
    batch = Batch(spark, uris, keys)
    with pytest.raises(StorageRefused) as refused:
        participant.wrap(batch)(spark.range(1), 0)
    message = str(refused.value)
    assert "access denied" in message and uris["denied"] in message, message
    assert f"{ROOT}/a" not in message and f"{ROOT}/b" not in message, message
    assert secret not in message and iam_moto.secret not in message

    # the two allowed tables got their objects before the denied write failed ...
    assert set(batch.written) == {"a", "b"}
    assert all(batch.written[n] for n in ("a", "b")), batch.written
    # ... and the batch was aborted as a whole: no Delta version anywhere, no object left
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED)]
    for name in TABLES:
        assert keys(name) == [], f"objects left below table {name}"

    iam_moto.set_user_policy(user, s3_policy(bucket))  # the fix: the whole bucket
    participant.wrap(batch)(spark.range(1), 0)
    assert participant.wait_for_reports()  # the applied report is off the batch's path
    assert batch.calls == 2
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert_committed_once(daemon.stub, pipeline, uris, keys)

    participant.wrap(batch)(spark.range(1), 0)  # Spark replays it once more: nothing to do
    assert batch.calls == 2
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert_committed_once(daemon.stub, pipeline, uris, keys)


# ---------------------------------------------------------------- credentials missing


@pytest.mark.parametrize(("unset", "named"), [
    (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "AWS_ACCESS_KEY_ID"),
    (("AWS_SECRET_ACCESS_KEY",), "AWS_SECRET_ACCESS_KEY"),
], ids=["no-keys", "no-secret"])
def test_missing_credentials_in_the_driver_fail_the_first_write_naming_the_variable(
        spark, daemon_factory, make_participant, moto_server, s3_bucket, monkeypatch, tmp_path,
        unset, named):
    """The coordinator has its credentials, the driver has none (or half a pair): the first
    write of the batch fails naming the variable to set, before any object is written; the
    attempt is aborted. With the variables back, the replay commits once."""
    env = moto_server.env()
    daemon = start_daemon(daemon_factory, tmp_path, f"s3://{s3_bucket}/{ROOT}", env)
    use_env(monkeypatch, env)
    no_profile_files(monkeypatch, tmp_path)
    for name in unset:
        monkeypatch.delenv(name)
    uris = {name: f"s3://{s3_bucket}/{ROOT}/{name}" for name in ("a", "b")}

    def keys(name: str) -> list[str]:
        return moto_server.keys(s3_bucket, f"{ROOT}/{name}/")

    pipeline = unique("nokeys")
    participant = make_participant(daemon.target, pipeline)
    batch = Batch(spark, uris, keys)
    with pytest.raises(StorageSettingsError, match=named) as refused:
        participant.wrap(batch)(spark.range(1), 0)
    assert moto_server.secret not in str(refused.value)
    assert batch.written == {}  # the first write failed
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED)]
    assert moto_server.keys(s3_bucket) == []  # nothing written, no Delta log

    use_env(monkeypatch, env)
    participant.wrap(batch)(spark.range(1), 0)
    assert participant.wait_for_reports()  # the applied report is off the batch's path
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert_committed_once(daemon.stub, pipeline, uris, keys)


# ---------------------------------------------------------------- bucket missing


def test_a_missing_bucket_fails_the_batch_naming_it_and_its_replay_commits_once(
        spark, daemon_factory, make_participant, moto_server, monkeypatch, tmp_path):
    """The warehouse's bucket does not exist (yet): the batch fails naming the bucket, the
    attempt is aborted, and no bucket was created on the way. Once the bucket exists, the
    replay of the same batch id commits once."""
    bucket = f"pl-missing-{uuid.uuid4().hex[:12]}"
    env = moto_server.env()
    daemon = start_daemon(daemon_factory, tmp_path, f"s3://{bucket}/{ROOT}", env)
    use_env(monkeypatch, env)
    uris = {name: f"s3://{bucket}/{ROOT}/{name}" for name in ("a", "b")}

    def keys(name: str) -> list[str]:
        return moto_server.keys(bucket, f"{ROOT}/{name}/")

    pipeline = unique("nobucket")
    participant = make_participant(daemon.target, pipeline)
    batch = Batch(spark, uris, keys)
    with pytest.raises(StorageRefused) as refused:
        participant.wrap(batch)(spark.range(1), 0)
    assert f"bucket {bucket!r} does not exist" in str(refused.value), str(refused.value)
    assert batch.written == {}
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED)]
    buckets = [b["Name"] for b in moto_server.client.list_buckets()["Buckets"]]
    assert bucket not in buckets  # nothing created it

    moto_server.client.create_bucket(Bucket=bucket)
    participant.wrap(batch)(spark.range(1), 0)
    assert participant.wait_for_reports()  # the applied report is off the batch's path
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert_committed_once(daemon.stub, pipeline, uris, keys)


# ---------------------------------------------------------------- endpoint unreachable


def test_an_unreachable_endpoint_fails_the_batch_within_bounds_and_its_replay_commits_once(
        spark, daemon_factory, make_participant, moto_server, s3_bucket, monkeypatch, tmp_path):
    """The driver's endpoint is a closed port: the batch fails within a bound, saying the
    store did not answer; the attempt is aborted (the failure came before the commit request,
    so nothing is left undecided), nothing is written. With the right endpoint the replay of
    the same batch id commits once."""
    env = moto_server.env()
    daemon = start_daemon(daemon_factory, tmp_path, f"s3://{s3_bucket}/{ROOT}", env)
    endpoint = f"http://127.0.0.1:{CLOSED_PORT}"
    use_env(monkeypatch, {**env, "AWS_ENDPOINT_URL": endpoint})
    uris = {name: f"s3://{s3_bucket}/{ROOT}/{name}" for name in ("a", "b")}

    def keys(name: str) -> list[str]:
        return moto_server.keys(s3_bucket, f"{ROOT}/{name}/")

    pipeline = unique("unreachable")
    participant = make_participant(daemon.target, pipeline)
    batch = Batch(spark, uris, keys)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as unavailable:
        participant.wrap(batch)(spark.range(1), 0)
    elapsed = time.monotonic() - started
    assert elapsed < FAULT_BOUND_S, f"the batch took {elapsed:.1f} s to fail"
    message = str(unavailable.value)
    assert "did not answer" in message and endpoint in message, message
    assert moto_server.secret not in message
    assert batch.written == {}
    states = attempts(daemon.stub, pipeline)
    assert states == [(1, pb.ABORTED)]  # decided by the abort, not guessed committed
    assert moto_server.keys(s3_bucket) == []

    use_env(monkeypatch, env)
    participant.wrap(batch)(spark.range(1), 0)
    assert participant.wait_for_reports()  # the applied report is off the batch's path
    assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
    assert_committed_once(daemon.stub, pipeline, uris, keys)


def test_a_store_going_away_during_the_executors_write_fails_the_batch_within_bounds(
        spark, daemon_factory, make_participant, moto_server, s3_bucket, monkeypatch, tmp_path):
    """The driver reaches the store through a relay that goes down at the first write of the
    second table (table a's objects are written by then): the executors' write fails within a
    bound, saying the store did not answer; the attempt is aborted, and the coordinator (which
    still reaches the store) deletes table a's objects although the driver cannot. With the
    store back, the replay of the same batch id commits once."""
    env = moto_server.env()
    daemon = start_daemon(daemon_factory, tmp_path, f"s3://{s3_bucket}/{ROOT}", env)
    relay = FlakyEndpoint(moto_server.port).start()
    try:
        use_env(monkeypatch, {**env, "AWS_ENDPOINT_URL": relay.endpoint})
        uris = {name: f"s3://{s3_bucket}/{ROOT}/{name}" for name in ("a", "b")}

        def keys(name: str) -> list[str]:
            return moto_server.keys(s3_bucket, f"{ROOT}/{name}/")

        pipeline = unique("goes-away")
        participant = make_participant(daemon.target, pipeline)
        batch = Batch(spark, uris, keys, before={"b": relay.arm})
        started = time.monotonic()
        with pytest.raises(StorageUnavailable) as unavailable:
            participant.wrap(batch)(spark.range(1), 0)
        elapsed = time.monotonic() - started
        assert relay.went_down.is_set()  # it failed because the store went away mid-write
        assert elapsed < FAULT_BOUND_S, f"the batch took {elapsed:.1f} s to fail"
        message = str(unavailable.value)
        assert "did not answer" in message and f"{uris['b']}/_percolake/" in message, message
        assert moto_server.secret not in message
        assert list(batch.written) == ["a"] and batch.written["a"]  # a's objects were written
        assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED)]
        wait_for(lambda: not keys("a") and not keys("b"), CLEANUP_WAIT_S,
                 "the coordinator to delete the aborted attempt's objects")

        relay.restore()
        participant.wrap(batch)(spark.range(1), 0)
        assert participant.wait_for_reports()  # the applied report is off the batch's path
        assert attempts(daemon.stub, pipeline) == [(1, pb.ABORTED), (2, pb.APPLIED)]
        assert_committed_once(daemon.stub, pipeline, uris, keys)
    finally:
        relay.stop()
