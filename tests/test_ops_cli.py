"""The operating commands (`transactions`, `pipelines`, `snapshot`) against one real daemon
holding real transactions: applied, committed-but-unapplied (left so by a failpoint), live,
and one blocked waiting for a table the live one holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, table_write, unique, wait_for

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = Path(sys.executable).parent / "percolake-coordinator"
STUCK_QUERY, DONE_QUERY = (str(uuid.uuid4()) for _ in range(2))
DONE_NAME = "sales.done"


def cli(*args: str, program: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([*(program or [sys.executable, "-m", "coordinator"]), *args],
                          capture_output=True, text=True, timeout=90, cwd=ROOT, env=env)


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.returncode == 0, f"{args}: exit {result.returncode}: {result.stderr}"
    return result.stdout


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


class Scene:
    """The daemon and the transactions made on it."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon
        self.target = daemon.target
        stub = daemon.stub
        self.stuck_pipeline, self.done_pipeline = unique("stuck"), unique("done")
        self.live_pipeline, self.wait_pipeline = unique("live"), unique("wait")
        self.stuck_table, self.done_table, self.live_table = (
            str(daemon.warehouse / unique(name)) for name in ("stuck", "done", "live"))

        # 1. committed, never applied: the failpoint fails the reply after the durable commit
        epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(
            pipeline_id=self.stuck_pipeline, query_id=STUCK_QUERY), timeout=30).pipeline.epoch
        stuck = self._open(self.stuck_pipeline, epoch=epoch, query_id=STUCK_QUERY)
        with pytest.raises(grpc.RpcError):
            stub.CommitTransaction(pb.CommitTransactionRequest(
                txn_id=stuck, epoch=epoch, tables=[self.stuck_table],
                writes=[table_write(self.stuck_table, stuck)]), timeout=30)
        self.stuck = stuck

        # 2. applied: two files of three rows each
        self.done_epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(
            pipeline_id=self.done_pipeline, query_id=DONE_QUERY), timeout=30).pipeline.epoch
        done = self._open(self.done_pipeline, epoch=self.done_epoch, query_id=DONE_QUERY)
        write = table_write(self.done_table, done, files=2, rows=3)
        write.catalog_name = DONE_NAME  # written by its catalog name
        stub.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=done, epoch=self.done_epoch, tables=[self.done_table], writes=[write]),
            timeout=30)
        versions = apply_all(stub, done)
        self.done_version = stub.ReportApplied(pb.ReportAppliedRequest(
            txn_id=done, epoch=self.done_epoch, tables=[
                pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]),
            timeout=30).transaction.participants[0].delta_version
        self.done = done

        # 3. live (PREWRITTEN), holding its table
        self.live = self._open(self.live_pipeline)
        stub.Prewrite(pb.PrewriteRequest(txn_id=self.live, writes=[
            table_write(self.live_table, self.live)]), timeout=30)

        # 4. blocked in DeclareTables on the live one's table (--conflict-wait 540)
        self.waiter = self._open(self.wait_pipeline)
        self.waiter_result: list[Any] = []
        self.waiter_thread = threading.Thread(target=self._declare_waiting, daemon=True)
        self.waiter_thread.start()
        wait_for(lambda: stub.GetTransaction(pb.GetTransactionRequest(txn_id=self.waiter),
                                             timeout=30).waiting_for_table, 30,
                 "the waiter to wait for the live transaction's table")

    def _open(self, pipeline: str, **fields: Any) -> str:
        return self.daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=0, **fields), timeout=30).transaction.txn_id

    def _declare_waiting(self) -> None:
        try:
            self.waiter_result.append(self.daemon.stub.DeclareTables(pb.DeclareTablesRequest(
                txn_id=self.waiter, tables=[self.live_table]), timeout=600))
        except grpc.RpcError as exc:
            self.waiter_result.append(exc)


@pytest.fixture(scope="module")
def scene(daemon_factory):
    daemon = daemon_factory.start(
        # --shared-table-writers: pipelines of their own wait for one table (find-hanging)
        # the waiter waits for the whole module (its tests may run minutes apart under load)
        ["--conflict-wait", "540", "--roll-forward-after", "3600", "--txn-timeout", "600",
         "--shared-table-writers"],
        env={"PERCOLAKE_FAILPOINTS": "after-commit-durable-before-reply=1*raise"},
        name="ops-cli")
    made = Scene(daemon)
    yield made
    daemon.stop()


def by_id(txns: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["txn_id"]: t for t in txns}


# ---------------------------------------------------------------- transactions list

def test_transactions_list_json_shows_every_transaction_with_its_state(scene):
    txns = by_id(as_json("transactions", "list", "--target", scene.target))
    assert txns[scene.stuck]["state"] == "COMMITTED"
    assert txns[scene.done]["state"] == "APPLIED"
    assert txns[scene.live]["state"] == "PREWRITTEN"
    assert txns[scene.waiter]["state"] == "OPEN"
    assert txns[scene.done]["created"].endswith("Z")


def test_transactions_list_filters_by_state_pipeline_age_and_limit(scene):
    committed = as_json("transactions", "list", "--target", scene.target, "--state", "committed")
    assert [t["txn_id"] for t in committed] == [scene.stuck]
    live = as_json("transactions", "list", "--target", scene.target, "--state", "OPEN",
                   "--state", "PREWRITTEN")
    assert {t["txn_id"] for t in live} == {scene.live, scene.waiter}
    one = as_json("transactions", "list", "--target", scene.target, "--pipeline",
                  scene.done_pipeline)
    assert [t["txn_id"] for t in one] == [scene.done]
    assert as_json("transactions", "list", "--target", scene.target, "--older-than", "1h") == []
    assert len(as_json("transactions", "list", "--target", scene.target, "--limit", "1")) == 1


def test_transactions_list_table_names_the_key_fields(scene):
    text = ok("transactions", "list", "--target", scene.target)
    header = text.splitlines()[0].split()
    assert header[:6] == ["TXN_ID", "PIPELINE", "GEN", "BATCH", "ATTEMPT", "STATE"]
    row = next(line for line in text.splitlines() if line.startswith(scene.stuck))
    assert scene.stuck_pipeline in row and "COMMITTED" in row


# ---------------------------------------------------------------- transactions describe

def test_transactions_describe_json_has_tables_counts_versions_and_identity(scene):
    txn = as_json("transactions", "describe", scene.done, "--target", scene.target)
    assert (txn["state"], txn["pipeline_id"], txn["batch_id"]) == (
        "APPLIED", scene.done_pipeline, 0)
    assert (txn["epoch"], txn["generation"], txn["query_id"]) == (scene.done_epoch, 0, DONE_QUERY)
    assert txn["commit_ts"] > txn["start_ts"] > 0 and txn["committed"].endswith("Z")
    (table,) = txn["tables"]
    assert table["table"] == canonical(scene.done_table)
    assert (table["file_count"], table["row_count"]) == (2, 6)
    assert table["applied"] and table["delta_version"] == scene.done_version
    assert table["write_location"].startswith(canonical(scene.done_table))


def test_transactions_describe_table_output(scene):
    text = ok("transactions", "describe", scene.done, "--target", scene.target)
    for expected in (scene.done, "APPLIED", DONE_QUERY, canonical(scene.done_table),
                     "WRITE LOCATION", "DELTA VERSION", "commit_ts"):
        assert expected in text, f"{expected!r} missing from:\n{text}"


def test_transactions_describe_unknown_is_refused_with_status_1(scene):
    result = cli("transactions", "describe", "no-such-txn", "--target", scene.target)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr and "no-such-txn" in result.stderr


# ---------------------------------------------------------------- find-hanging

def test_find_hanging_names_the_holder_of_the_waited_table(scene):
    hanging = by_id(as_json("transactions", "find-hanging", "--older-than", "0s",
                            "--target", scene.target))
    assert scene.done not in hanging, "an applied transaction is not hanging"
    assert hanging[scene.stuck]["state"] == "COMMITTED"
    assert hanging[scene.live]["waiting_for"] is None
    wait = hanging[scene.waiter]["waiting_for"]
    assert wait["table"] == canonical(scene.live_table)
    assert (wait["holder_txn_id"], wait["holder_pipeline_id"], wait["holder_state"]) == (
        scene.live, scene.live_pipeline, "PREWRITTEN")
    text = ok("transactions", "find-hanging", "--older-than", "0s", "--target", scene.target)
    row = next(line for line in text.splitlines() if line.startswith(scene.waiter))
    assert canonical(scene.live_table) in row and scene.live in row


def test_find_hanging_honours_the_threshold(scene):
    assert as_json("transactions", "find-hanging", "--older-than", "1h",
                   "--target", scene.target) == []
    assert "no transaction unfinished for longer than 1h" in ok(
        "transactions", "find-hanging", "--older-than", "1h", "--target", scene.target)


# ---------------------------------------------------------------- pipelines and snapshot

def test_pipelines_list(scene):
    pipelines = {p["pipeline_id"]: p for p in as_json("pipelines", "list",
                                                      "--target", scene.target)}
    done = pipelines[scene.done_pipeline]
    assert (done["epoch"], done["generation"], done["query_id"]) == (
        scene.done_epoch, 0, DONE_QUERY)
    assert done["last_committed_batch_id"] == 0 and done["last_commit"].endswith("Z")
    assert pipelines[scene.live_pipeline]["last_committed_batch_id"] is None
    text = ok("pipelines", "list", "--target", scene.target)
    assert "LAST BATCH" in text.splitlines()[0]
    assert any(line.startswith(scene.done_pipeline) and DONE_QUERY in line
               for line in text.splitlines())


def test_pipelines_describe_shows_tables_and_live_attempt(scene):
    done = as_json("pipelines", "describe", scene.done_pipeline, "--target", scene.target)
    assert done["tables"] == [canonical(scene.done_table)]
    assert done["table_names"] == {canonical(scene.done_table): DONE_NAME}
    assert done["last_committed_batch_id"] == 0 and done["live_attempts"] == []
    live = as_json("pipelines", "describe", scene.live_pipeline, "--target", scene.target)
    assert [t["txn_id"] for t in live["live_attempts"]] == [scene.live]
    text = ok("pipelines", "describe", scene.done_pipeline, "--target", scene.target)
    for expected in (DONE_QUERY, f"{canonical(scene.done_table)} ({DONE_NAME})", "last batch",
                     "live attempts"):
        assert expected in text


def test_snapshot_versions_now_and_as_of(scene):
    missing = str(scene.daemon.warehouse / unique("never"))
    snap = as_json("snapshot", scene.done_table, missing, "--target", scene.target)
    assert snap["snapshot_ts"] > 0
    assert [(t["exists"], t["delta_version"]) for t in snap["tables"]] == [
        (True, scene.done_version), (False, None)]
    done = as_json("transactions", "describe", scene.done, "--target", scene.target)
    before = as_json("snapshot", scene.done_table, "--as-of", str(done["commit_ts"] - 1),
                     "--target", scene.target)
    assert before["tables"][0]["exists"] is False
    at_commit = as_json("snapshot", scene.done_table, "--as-of", done["committed"],
                        "--target", scene.target)
    assert at_commit["tables"][0]["delta_version"] == scene.done_version
    text = ok("snapshot", scene.done_table, "--target", scene.target)
    assert f"snapshot_ts {snap['snapshot_ts']}"[:12] in text
    assert canonical(scene.done_table) in text


def test_snapshot_at_the_other_consistency_levels(scene):
    # the done table's pipeline is a root: its table completes every barrier below its commit
    topo = as_json("snapshot", scene.done_table, "--consistency", "topology",
                   "--target", scene.target)
    assert topo["consistency"] == "topology"
    assert topo["snapshot_ts"] % (1 << 18) == 0  # a global barrier starts its millisecond
    done = as_json("transactions", "describe", scene.done, "--target", scene.target)
    expected = scene.done_version if topo["snapshot_ts"] >= done["commit_ts"] else None
    assert topo["tables"][0]["delta_version"] == expected
    text = ok("snapshot", scene.done_table, "--consistency", "topology", "--target",
              scene.target)
    assert text.startswith("global barrier ")
    latest = as_json("snapshot", scene.done_table, "--consistency", "read_committed",
                     "--target", scene.target)
    assert latest["tables"][0]["delta_version"] == scene.done_version
    bad = cli("snapshot", scene.done_table, "--consistency", "serializable",
              "--target", scene.target)
    assert bad.returncode == 2 and "serializable" in bad.stderr


# ---------------------------------------------------------------- abort

def test_abort_of_a_committed_transaction_is_refused_naming_why(scene):
    result = cli("transactions", "abort", scene.stuck, "--reason", "try", "--target",
                 scene.target)
    assert result.returncode == 1
    assert "FAILED_PRECONDITION" in result.stderr and "committed" in result.stderr
    assert as_json("transactions", "describe", scene.stuck,
                   "--target", scene.target)["state"] == "COMMITTED"


def test_abort_through_the_cli_frees_the_waiting_transaction(scene):
    aborted = json.loads(ok("transactions", "abort", scene.live, "--reason", "operator: stuck",
                            "--target", scene.target, "--json"))
    assert aborted["state"] == "ABORTED" and "operator: stuck" in aborted["abort_reason"]
    scene.waiter_thread.join(30)
    (declared,) = scene.waiter_result
    assert not isinstance(declared, grpc.RpcError), declared
    assert canonical(scene.live_table) in [p.table for p in declared.transaction.participants]


def test_entry_point_runs_the_same_commands(scene):
    if not ENTRY_POINT.exists():
        pytest.skip(f"{ENTRY_POINT} is not installed (pip install -e .)")
    out = cli("pipelines", "describe", scene.done_pipeline, "--target", scene.target, "--json",
              program=[str(ENTRY_POINT)])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pipeline_id"] == scene.done_pipeline


# ---------------------------------------------------------------- arguments

@pytest.mark.parametrize("args", [
    ["transactions", "list", "--older-than", "5x"],
    ["transactions", "list", "--limit", "0"],
    ["transactions", "abort", "t1"],
    ["snapshot", "t", "--as-of", "yesterday"],
    ["pipelines"],
])
def test_bad_arguments_exit_2(args):
    result = cli(*args)
    assert result.returncode == 2 and "error" in result.stderr


def test_unusable_target_exits_2():
    result = cli("pipelines", "list", "--target", "not an address")
    assert result.returncode == 2 and "pipelines list failed" in result.stderr


def test_older_than_parses_units():
    from coordinator.views import duration

    assert [duration(t) for t in ("90s", "5m", "2m", "1h", "1.5h")] == [
        90, 300, 120, 3600, 5400]


def test_every_command_has_help():
    for command in (["transactions", "list"], ["transactions", "describe"],
                    ["transactions", "abort"], ["transactions", "find-hanging"],
                    ["pipelines", "list"], ["pipelines", "describe"], ["snapshot"]):
        text = ok(*command, "--help")
        assert "--target" in text and "--json" in text and "--token" in text, command


# ---------------------------------------------------------------- with authentication

def test_pipelines_list_needs_admin_on_every_pipeline(daemon_factory, tmp_path):
    """ListPipelines' access rule, through the CLI's client security flags."""
    admin_file = tmp_path / "admin.token"
    daemon = daemon_factory.start(["--authenticate", "--open-health", "--admin-token-file",
                                   str(admin_file)],
                                  name="ops-cli-auth")
    try:
        target = ["--target", daemon.target]
        admin = [*target, "--token-file", str(admin_file)]
        assert as_json("pipelines", "list", *admin) == []
        made = as_json("tokens", "create", "--principal", "bob", *admin)
        ok("acl", "add", "--principal", "bob", "--pipeline", "*", "--permission", "DESCRIBE",
           *admin)
        bob = cli("pipelines", "list", *target, "--token", made["bearer_token"])
        assert bob.returncode == 1
        assert "PERMISSION_DENIED" in bob.stderr and "ADMIN" in bob.stderr
        anonymous = cli("pipelines", "list", *target)
        assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
    finally:
        daemon.stop()


def test_list_pipelines_pages_in_id_order_and_refuses_a_foreign_token(scene):
    stub, seen, token = scene.daemon.stub, [], ""
    while True:
        reply = stub.ListPipelines(pb.ListPipelinesRequest(page_size=1, page_token=token),
                                   timeout=30)
        assert len(reply.pipelines) <= 1
        seen.extend(p.pipeline_id for p in reply.pipelines)
        token = reply.next_page_token
        if not token:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {scene.stuck_pipeline, scene.done_pipeline, scene.live_pipeline} <= set(seen)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListPipelines(pb.ListPipelinesRequest(page_token="bm9wZQ=="), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
