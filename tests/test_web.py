"""The web view (serve --http-port, docs/operations.md) of a real daemon with real
transactions: every page and /api endpoint over HTTP, the filters, escaping, authentication,
the topology and leases pages of a root and a downstream pipeline, and every page loaded in
headless Chromium with a screenshot kept as an artifact."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordinator.launcher import DaemonProcess
from coordinator.oracle import wall_ms_of
from coordinator.table_names import catalog_names
from coordinator.views import topology_json, utc_time
from percolake.barriers import barrier_at_or_below
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import apply_all, canonical, table_write, unique, wait_for

ROOT = Path(__file__).resolve().parent.parent
EVIL = "<script>alert('x')</script>"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, token: str = "") -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET, errors included."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                     if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def get_json(url: str, token: str = "") -> Any:
    status, headers, body = get(url, token)
    assert status == 200, f"{url}: expected 200, got {status}: {body}"
    assert headers["Content-Type"] == "application/json"
    return json.loads(body)


def get_html(url: str) -> str:
    status, headers, body = get(url)
    assert status == 200, f"{url}: expected 200, got {status}: {body}"
    assert headers["Content-Type"].startswith("text/html")
    return body


class Scene:
    """A daemon with --http-port and: an applied batch, a live (PREWRITTEN) transaction, and
    an aborted one whose pipeline id and abort reason carry markup."""

    def __init__(self, daemon: Any, port: int) -> None:
        self.daemon = daemon
        self.url = f"http://127.0.0.1:{port}"
        stub = daemon.stub
        self.pipeline = unique("web")
        self.table = str(daemon.warehouse / unique("t"))
        self.query_id = str(uuid.uuid4())
        self.epoch = stub.RegisterPipeline(pb.RegisterPipelineRequest(
            pipeline_id=self.pipeline, query_id=self.query_id), timeout=30).pipeline.epoch
        self.applied = stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=self.pipeline, batch_id=0, epoch=self.epoch, query_id=self.query_id),
            timeout=30).transaction.txn_id
        stub.Prewrite(pb.PrewriteRequest(txn_id=self.applied, epoch=self.epoch, writes=[
            table_write(self.table, self.applied, files=2, rows=3)]), timeout=30)
        stub.CommitTransaction(pb.CommitTransactionRequest(txn_id=self.applied,
                                                           epoch=self.epoch), timeout=30)
        versions = apply_all(stub, self.applied)
        assert stub.ReportApplied(pb.ReportAppliedRequest(
            txn_id=self.applied, epoch=self.epoch, tables=[
                pb.AppliedTable(table=t, delta_version=v) for t, v in versions.items()]),
            timeout=30).transaction.state == pb.APPLIED
        self.live_pipeline = unique("web-live")
        self.live = self._open(self.live_pipeline, 0)
        stub.Prewrite(pb.PrewriteRequest(txn_id=self.live, writes=[
            table_write(str(daemon.warehouse / unique("t")), self.live)]), timeout=30)
        self.evil_pipeline = unique(EVIL)
        self.aborted = self._open(self.evil_pipeline, 0)
        stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=self.aborted, reason=EVIL),
                              timeout=30)

    def _open(self, pipeline: str, batch: int) -> str:
        return self.daemon.stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=batch), timeout=30).transaction.txn_id

    def pages(self) -> dict[str, str]:
        """Each HTML page with a text it must show."""
        quote = urllib.parse.quote
        return {"/": self.pipeline,
                f"/transactions?pipeline={quote(self.pipeline)}": self.applied,
                f"/transactions/{self.applied}": self.applied,
                f"/pipelines/{quote(self.pipeline, safe='')}": self.pipeline,
                "/hanging?older-than=0s": self.live}


@pytest.fixture(scope="module")
def scene(daemon_factory) -> Any:
    port = _free_port()
    daemon = daemon_factory.start(["--http-port", str(port)], name="web")
    wait_for(lambda: _reachable(f"http://127.0.0.1:{port}/api/pipelines"), 15, "the web view")
    yield Scene(daemon, port)
    daemon.stop()


class TopologyScene:
    """A daemon with --http-port and short global barriers: a root pipeline ``bank`` writing
    ``debits`` (applied), a downstream pipeline ``ledger`` reading it and writing ``out`` with
    a batch at a planned input barrier, a root ``stuck`` whose commit to ``held`` is never
    applied (its completed barrier stays below that commit), a reader with markup in its id,
    and a lease on ``debits``."""

    INTERVAL_MS = 200
    DEBITS_NAME = "sales.debits"  # the catalog name bank wrote debits by

    def __init__(self, daemon: Any, port: int) -> None:
        self.daemon = daemon
        self.url = f"http://127.0.0.1:{port}"
        stub = daemon.stub
        self.bank, self.ledger, self.stuck = unique("bank"), unique("ledger"), unique("stuck")
        self.evil_reader = unique(EVIL)
        self.debits, self.out, self.held = (canonical(daemon.warehouse / unique(name))
                                            for name in ("debits", "out", "held"))
        self._write(self.bank, self.debits, apply=True, catalog_name=self.DEBITS_NAME)
        for reader in (self.ledger, self.evil_reader):
            stub.RegisterReads(pb.RegisterReadsRequest(pipeline_id=reader,
                                                       tables=[self.debits]), timeout=30)
        self.input_barrier = wait_for(lambda: (plan := stub.PlanBarrier(pb.PlanBarrierRequest(
            pipeline_id=self.ledger, generation=0, after_barrier=0), timeout=30)).barrier > 0
            and plan.barrier, 30, "debits to complete a barrier")
        ledger_txn = self._write(self.ledger, self.out, apply=True)
        assert ledger_txn.input_barrier == self.input_barrier
        stuck_txn = self._write(self.stuck, self.held, apply=False)
        self.held_barrier = barrier_at_or_below(stuck_txn.commit_ts - 1, self.INTERVAL_MS)
        self.lease = stub.GetSnapshot(pb.GetSnapshotRequest(
            tables=[self.debits], lease_ms=3_600_000, lease_holder=EVIL), timeout=30).lease

    def _write(self, pipeline: str, table: str, apply: bool,
               catalog_name: str = "") -> pb.Transaction:
        stub = self.daemon.stub
        txn_id = stub.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id=pipeline, batch_id=0, tables=[table]), timeout=30).transaction.txn_id
        write = table_write(table, txn_id)
        write.catalog_name = catalog_name
        stub.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=txn_id, tables=[table], writes=[write]), timeout=30)
        if apply:
            stub.ReportApplied(pb.ReportAppliedRequest(txn_id=txn_id, tables=[
                pb.AppliedTable(table=t, delta_version=v)
                for t, v in apply_all(stub, txn_id).items()]), timeout=30)
        return stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id), timeout=30)

    def pages(self) -> dict[str, str]:
        return {"/topology": self.ledger, "/leases": self.lease.lease_id,
                f"/leases?table={urllib.parse.quote(self.debits)}": self.lease.lease_id}


@pytest.fixture(scope="module")
def topology_scene(daemon_factory) -> Any:
    port = _free_port()
    # no roll-forward of the stuck commit while the module runs: its barrier must stay put
    daemon = daemon_factory.start(["--http-port", str(port), "--barrier-interval",
                                   f"{TopologyScene.INTERVAL_MS / 1000:g}",
                                   "--roll-forward-after", "3600"], name="web-topology")
    wait_for(lambda: _reachable(f"http://127.0.0.1:{port}/api/topology"), 15, "the web view")
    yield TopologyScene(daemon, port)
    daemon.stop()


def _reachable(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False


# ---------------------------------------------------------------- JSON endpoints

def test_api_lists_pipelines_and_filters_transactions(scene):
    pipelines = {p["pipeline_id"]: p for p in get_json(scene.url + "/api/pipelines")}
    assert pipelines[scene.pipeline]["last_committed_batch_id"] == 0
    quote = urllib.parse.quote
    mine = get_json(f"{scene.url}/api/transactions?pipeline={quote(scene.pipeline)}")
    assert [(t["txn_id"], t["state"]) for t in mine] == [(scene.applied, "APPLIED")]
    live = get_json(scene.url + "/api/transactions?state=PREWRITTEN&state=OPEN")
    assert scene.live in {t["txn_id"] for t in live}
    assert all(t["state"] in ("PREWRITTEN", "OPEN") for t in live)
    assert get_json(scene.url + "/api/transactions?older-than=1h") == []
    assert len(get_json(scene.url + "/api/transactions?limit=1")) == 1


def test_api_describes_a_transaction_with_its_tables_and_versions(scene):
    txn = get_json(f"{scene.url}/api/transactions/{scene.applied}")
    assert txn["txn_id"] == scene.applied and txn["state"] == "APPLIED"
    assert txn["pipeline_id"] == scene.pipeline and txn["generation"] == 0
    assert txn["epoch"] == scene.epoch >= 1 and txn["query_id"] == scene.query_id
    assert txn["commit_ts"] > txn["start_ts"] > 0 and txn["created"] and txn["updated"]
    [table] = txn["tables"]
    assert table["file_count"] == 2 and table["row_count"] == 6
    assert table["applied"] and table["delta_version"] == 0 and table["write_location"]
    assert table["table"].endswith(Path(scene.table).name)


def test_api_describes_a_pipeline_and_finds_the_hanging_transaction(scene):
    pipeline = get_json(f"{scene.url}/api/pipelines/{urllib.parse.quote(scene.pipeline)}")
    assert pipeline["pipeline_id"] == scene.pipeline and pipeline["live_attempts"] == []
    assert pipeline["tables"] and pipeline["tables"][0].endswith(Path(scene.table).name)
    found = get_json(scene.url + "/api/hanging?older-than=0s")
    ids = {t["txn_id"] for t in found["transactions"]}
    assert scene.live in ids and scene.applied not in ids and scene.aborted not in ids
    assert scene.live not in {t["txn_id"] for t in get_json(
        scene.url + "/api/hanging")["transactions"]}  # default threshold 2m: too young


def test_bad_requests_are_refused_with_the_reason(scene):
    for path, status, words in (
            ("/api/transactions?state=DONE", 400, "state must be"),
            ("/api/transactions?limit=0", 400, "limit must be"),
            ("/api/transactions?older-than=soon", 400, "older-than"),
            ("/api/transactions/no-such-txn", 404, "no-such-txn"),
            ("/api/pipelines/no-such-pipeline", 404, "no-such-pipeline"),
            ("/nowhere", 404, "no page")):
        got, _, body = get(scene.url + path)
        assert got == status, f"{path}: expected {status}, got {got}: {body}"
        assert words in body, f"{path}: {words!r} not in {body!r}"
    request = urllib.request.Request(scene.url + "/", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 501  # read-only: only GET is answered


# ---------------------------------------------------------------- HTML

def test_every_html_page_shows_its_data(scene):
    for path, text in scene.pages().items():
        body = get_html(scene.url + path)
        assert text in body, f"{path}: {text!r} not on the page"
    detail = get_html(f"{scene.url}/transactions/{scene.applied}")
    assert "APPLIED" in detail and scene.pipeline in detail and "Write location" in detail
    hanging = get_html(scene.url + "/hanging?older-than=0s")
    assert "PREWRITTEN" in hanging


def test_markup_in_ids_and_reasons_is_escaped(scene):
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    quote = urllib.parse.quote
    for path in (f"/transactions/{scene.aborted}", "/transactions?state=ABORTED",
                 f"/pipelines/{quote(scene.evil_pipeline, safe='')}", "/"):
        body = get_html(scene.url + path)
        assert "<script" not in body, f"{path}: an unescaped <script> tag"
        assert escaped in body, f"{path}: the escaped markup is not shown"
    status, headers, _ = get(scene.url + "/")
    assert "default-src 'none'" in headers["Content-Security-Policy"]


# ---------------------------------------------------------------- topology and leases

_MOVING = frozenset({"now_ts", "now_unix_ms", "now", "completed_barrier_ts",
                     "completed_barrier_unix_ms", "completed_barrier", "delay_ms",
                     "own_delay_ms", "end_to_end_delay_ms", "bottleneck_pipeline",
                     "bottleneck_delay_ms"})


def _without_time(value: Any) -> Any:
    """``value`` with every field that moves with time replaced by whether it is known (the
    bottleneck follows the delays, so it moves too)."""
    if isinstance(value, dict):
        return {k: (v is not None) if k in _MOVING else _without_time(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_without_time(v) for v in value]
    return value


def test_api_topology_is_the_clis_json_of_the_same_view(topology_scene):
    scene = topology_scene
    for query, request in (("", pb.GetTopologyRequest()),
                           (f"?table={urllib.parse.quote(scene.out)}",
                            pb.GetTopologyRequest(tables=[scene.out]))):
        def cli_json(request: pb.GetTopologyRequest = request) -> dict:  # as the CLI's
            def call(name: str, message: object) -> object:
                return getattr(scene.daemon.stub, name)(message, timeout=30)
            reply = call("GetTopology", request)
            return topology_json(reply, catalog_names(call, [t.writer for t in reply.tables]))

        before = cli_json()
        shown = get_json(scene.url + "/api/topology" + query)
        after = cli_json()
        assert _without_time(shown) == _without_time(before) == _without_time(after)
        assert before["now_ts"] <= shown["now_ts"] <= after["now_ts"]
    tables = {t["table"]: t for t in shown["tables"]}
    assert list(tables) == [scene.out] and tables[scene.out]["writer"] == scene.ledger
    (ledger,) = shown["pipelines"]
    assert ledger["last_input_barrier_ts"] == scene.input_barrier and not ledger["root"]


def _row_cells(body: str, section: str, first_cell: str) -> list[str]:
    """The cells (HTML) of the row whose first cell is ``first_cell`` in the table after the
    heading ``section``."""
    table = body.split(f"<h2>{section}</h2>", 1)[1].split("</table>", 1)[0]
    for row in re.findall(r"<tr>(.*?)</tr>", table):
        cells = re.findall(r"<td>(.*?)</td>", row)
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} under {section!r}")


def test_topology_page_shows_tables_writers_readers_barriers_and_delays(topology_scene):
    scene = topology_scene
    held = f"{scene.url}/api/topology?table={urllib.parse.quote(scene.held)}"
    (before,) = get_json(held)["tables"]
    body = get_html(scene.url + "/topology")
    (after,) = get_json(held)["tables"]

    def link(pipeline: str) -> str:
        return f'<a href="/pipelines/{urllib.parse.quote(pipeline, safe="")}">{pipeline}</a>'

    # debits shows the catalog name bank's last batch wrote it by; held, written by path, none
    debits = _row_cells(body, "Tables",
                        f"<code>{scene.debits}</code> <b>{scene.DEBITS_NAME}</b>")
    assert debits[1] == link(scene.bank)
    assert before["name"] is None
    shown = {t["table"]: t["name"] for t in get_json(scene.url + "/api/topology")["tables"]}
    assert shown[scene.debits] == scene.DEBITS_NAME
    assert link(scene.ledger) in debits[2] and "&lt;script&gt;" in debits[2]
    assert "ts " in debits[3] and debits[4].endswith("s")
    out = _row_cells(body, "Tables", f"<code>{scene.out}</code>")
    assert (out[1], out[2]) == (link(scene.ledger), "-")
    # the held table's completed barrier stays below its unapplied commit: shown as UTC and as
    # the raw timestamp, with the delay since (the page was read between the two JSON reads)
    row = _row_cells(body, "Tables", f"<code>{scene.held}</code>")
    assert before["completed_barrier_ts"] == after["completed_barrier_ts"] == scene.held_barrier
    assert row[1] == link(scene.stuck) and row[2] == "-"
    assert row[3] == (f"{utc_time(wall_ms_of(scene.held_barrier))}<br>"
                      f"<small>ts {scene.held_barrier}</small>")
    delay_s = float(row[4].removesuffix("s"))
    assert before["delay_ms"] / 1000 - 0.05 <= delay_s <= after["delay_ms"] / 1000 + 0.05
    assert row[5].startswith(link(scene.stuck))  # the only pipeline on its way: the bottleneck
    # pipelines: kind, reads, writes, delays, and the downstream one's last input barrier
    ledger = _row_cells(body, "Pipelines", link(scene.ledger))
    assert ledger[2:5] == ["downstream",
                           f"<code>{scene.debits}</code> <b>{scene.DEBITS_NAME}</b>",
                           f"<code>{scene.out}</code>"]
    assert ledger[5].endswith("s") and ledger[6].endswith("s")
    assert ledger[7] == (f"{utc_time(wall_ms_of(scene.input_barrier))}<br>"
                         f"<small>ts {scene.input_barrier}</small>")
    bank = _row_cells(body, "Pipelines", link(scene.bank))
    assert bank[2:5] == ["root", "-", f"<code>{scene.debits}</code> <b>{scene.DEBITS_NAME}</b>"]
    assert bank[7] == "-"
    assert 'href="/topology"' in body and 'href="/leases"' in body  # in the navigation


def test_topology_and_leases_pages_escape_markup(topology_scene):
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    for path in ("/topology", "/leases"):
        body = get_html(topology_scene.url + path)
        assert "<script" not in body, f"{path}: an unescaped <script> tag"
        assert escaped in body, f"{path}: the escaped markup is not shown"


def test_leases_page_lists_live_leases_with_tables_versions_barrier_and_expiry(
        topology_scene):
    scene = topology_scene
    lease = scene.lease
    shown = get_json(scene.url + "/api/leases")
    (listed,) = [entry for entry in shown["leases"] if entry["lease_id"] == lease.lease_id]
    assert listed["holder"] == EVIL
    assert listed["tables"] == [{"table": t.table, "name": scene.DEBITS_NAME,
                                 "delta_version": t.delta_version} for t in lease.tables]
    assert f"<b>{scene.DEBITS_NAME}</b>" in get_html(scene.url + "/leases")
    bank = f"{scene.url}/api/pipelines/{urllib.parse.quote(scene.bank)}"
    assert get_json(bank)["table_names"] == {scene.debits: scene.DEBITS_NAME}
    assert f"<b>{scene.DEBITS_NAME}</b>" in get_html(bank.replace("/api/", "/"))
    assert [t["table"] for t in listed["tables"]] == [scene.debits]
    assert listed["barrier_ts"] == lease.barrier_ts > 0
    assert listed["barrier"] == utc_time(wall_ms_of(lease.barrier_ts))
    assert listed["expires_unix_ms"] == lease.expires_unix_ms
    assert 0 < listed["expires_in_s"] <= 3600
    assert get_json(scene.url + "/api/leases?table="
                    + urllib.parse.quote(scene.out))["leases"] == []
    body = get_html(scene.url + "/leases?table=" + urllib.parse.quote(scene.debits))
    for text in (lease.lease_id, scene.debits, f"ts {lease.barrier_ts}", listed["barrier"],
                 listed["expires"], f"v{lease.tables[0].delta_version}"):
        assert text in body, f"{text!r} not on the leases page"
    assert "no live lease" in get_html(scene.url + "/leases?table="
                                       + urllib.parse.quote(scene.out))


# ---------------------------------------------------------------- authentication

def _cli(*args: str) -> Any:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, "-m", "coordinator", *args, "--json"],
                          capture_output=True, text=True, timeout=90, cwd=ROOT, env=env)
    assert done.returncode == 0, f"{args}: exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout) if done.stdout.strip() else None


class _Authorized:
    """``stub`` whose every call carries ``authorization: Bearer <token>``."""

    def __init__(self, stub: Any, token: str) -> None:
        self._stub = stub
        self._token = token

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        return lambda request, **kwargs: method(
            request, metadata=[("authorization", f"Bearer {self._token}")],
            **{"timeout": 30, **kwargs})


def test_with_authenticate_pages_need_a_bearer_token_and_the_rpcs_permission(
        daemon_factory, tmp_path):
    port = _free_port()
    admin_file = tmp_path / "admin.token"
    daemon = daemon_factory.start(["--authenticate", "--open-health", "--admin-token-file",
                                   str(admin_file), "--http-port", str(port)], name="web-auth")
    try:
        url = f"http://127.0.0.1:{port}"
        admin = ["--target", daemon.target, "--token-file", str(admin_file)]
        for path in ("/", "/api/pipelines", "/api/hanging", "/transactions", "/topology",
                     "/api/topology", "/leases", "/api/leases"):
            status, headers, body = get(url + path)
            assert status == 401, f"{path} without a token: expected 401, got {status}"
            assert headers["WWW-Authenticate"].startswith("Bearer") and "Bearer" in body
        assert get(url + "/api/pipelines", "plk_0123456789abcdef_" + "x" * 43)[0] == 401
        assert get_json(url + "/api/pipelines", admin_file.read_text().strip()) == []
        bob = _cli("tokens", "create", "--principal", "bob", *admin)["bearer_token"]
        _cli("acl", "add", "--principal", "bob", "--pipeline", "*", "--permission",
             "DESCRIBE", *admin)
        status, _, body = get(url + "/api/pipelines", bob)  # ListPipelines needs ADMIN '*'
        assert status == 403 and "ADMIN" in body, body
        assert get(url + "/api/transactions?pipeline=p", bob)[0] == 200  # DESCRIBE suffices
        assert get_json(url + "/api/topology", bob)["pipelines"] == []  # GetTopology: DESCRIBE
        assert "Topology" in get(url + "/topology", bob)[2]
        table = canonical(daemon.warehouse / "leased")
        leases_of_table = "/api/leases?table=" + urllib.parse.quote(table)
        for path, words in (("/api/leases", "ADMIN"), (leases_of_table, "READ"),
                            ("/leases", "ADMIN")):
            status, _, body = get(url + path, bob)
            assert status == 403 and words in body, f"{path}: {status} {body}"
        carol, dave = (_cli("tokens", "create", "--principal", name, *admin)["bearer_token"]
                       for name in ("carol", "dave"))
        for name, scope, permission in (("carol", "--pipeline", "WRITE"),
                                        ("carol", "--table", "WRITE"),
                                        ("dave", "--table", "READ")):
            _cli("acl", "add", "--principal", name, scope, "*", "--permission", permission,
                 *admin)
        status, _, body = get(url + "/api/topology", dave)
        assert status == 403 and "DESCRIBE" in body, body
        as_carol = _Authorized(daemon.stub, carol)
        txn_id = as_carol.OpenTransaction(pb.OpenTransactionRequest(
            pipeline_id="carol-job", batch_id=0, tables=[table])).transaction.txn_id
        as_carol.CommitTransaction(pb.CommitTransactionRequest(
            txn_id=txn_id, tables=[table], writes=[table_write(table, txn_id)]))
        as_carol.ReportApplied(pb.ReportAppliedRequest(txn_id=txn_id, tables=[
            pb.AppliedTable(table=t, delta_version=v)
            for t, v in apply_all(as_carol, txn_id).items()]))
        lease = as_carol.GetSnapshot(pb.GetSnapshotRequest(
            tables=[table], lease_ms=600_000, lease_holder="carol's reader")).lease
        assert lease.lease_id and [t.table for t in lease.tables] == [table]
        # ListLeases' rule: the id only to its taker and to an ADMIN on every pipeline
        for token, path, shown_id in (
                (carol, leases_of_table, lease.lease_id), (dave, leases_of_table, None),
                (admin_file.read_text().strip(), "/api/leases", lease.lease_id)):
            (listed,) = get_json(url + path, token)["leases"]
            assert (listed["lease_id"], listed["holder"]) == (shown_id, "carol's reader")
        status, _, body = get(url + "/leases?table=" + urllib.parse.quote(table), dave)
        assert status == 200 and "hidden" in body and lease.lease_id not in body
    finally:
        daemon.stop()


# ---------------------------------------------------------------- high availability

def test_a_standby_answers_503_naming_the_leader(tmp_path, pg_dsn):
    """Two daemons on one PostgreSQL store: the leader's view serves, the standby's names the
    leader (in the body and the X-Percolake-Leader header)."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    started: list[DaemonProcess] = []
    try:
        urls = []
        for name, serving in (("leader", True), ("standby", False)):
            port, http_port = _free_port(), _free_port()
            daemon = DaemonProcess(tmp_path / name, [str(warehouse)], extra_args=[
                "--store", pg_dsn, "--advertise", f"127.0.0.1:{port}", "--lease-s", "1.5",
                "--shutdown-grace", "2", "--http-port", str(http_port)])
            daemon.port = port
            started.append(daemon.start(serving=serving))
            urls.append(f"http://127.0.0.1:{http_port}")
        leader, _ = started
        assert get_json(urls[0] + "/api/pipelines") == []
        for path, is_api in (("/api/transactions", True), ("/hanging", False)):
            status, headers, body = get(urls[1] + path)
            assert status == 503, f"standby {path}: expected 503, got {status}: {body}"
            assert headers["X-Percolake-Leader"] == leader.target
            assert leader.target in body and "standby" in body
            if is_api:
                assert json.loads(body)["leader"] == leader.target
    finally:
        for daemon in started:
            daemon.stop(timeout_s=10)


# ---------------------------------------------------------------- a real browser

def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the pages "
                "were not checked in a browser")


def _chromium_run(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--window-size=1280,900", *args],
            capture_output=True, text=True, timeout=120)


def _render_in_chromium(binary: str, artifacts: Path, url: str,
                        pages: dict[str, str], prefix: str) -> None:
    """Each page's DOM in Chromium shows its text; a screenshot of it is a non-empty PNG."""
    for index, (path, text) in enumerate(pages.items()):
        page = url + path
        dom = _chromium_run(binary, "--dump-dom", page)
        assert dom.returncode == 0, f"{page}: chromium exit {dom.returncode}: {dom.stderr}"
        assert text in dom.stdout, f"{page}: {text!r} not in the rendered DOM"
        assert "<table>" in dom.stdout or "<dl>" in dom.stdout
        name = path.strip("/").split("?")[0].replace("/", "_") or "index"
        shot = artifacts / f"{prefix}{index}-{name}.png"
        done = _chromium_run(binary, f"--screenshot={shot}", page)
        assert done.returncode == 0 and shot.exists(), f"{page}: no screenshot: {done.stderr}"
        data = shot.read_bytes()
        assert data.startswith(PNG_SIGNATURE), f"{shot} is not a PNG"
        assert len(data) > 5000, f"{shot} is only {len(data)} bytes: an empty page?"


def test_every_page_renders_in_headless_chromium(scene, tmp_path_factory):
    binary = _chromium()
    artifacts = tmp_path_factory.mktemp("web-screenshots")
    print(f"web view screenshots in {artifacts}")
    _render_in_chromium(binary, artifacts, scene.url, scene.pages(), "")
    evil = _chromium_run(binary, "--dump-dom", f"{scene.url}/transactions/{scene.aborted}")
    assert evil.returncode == 0 and scene.aborted in evil.stdout, evil.stderr
    assert "<script" not in evil.stdout and "&lt;script&gt;" in evil.stdout  # text, no element


def test_topology_and_leases_pages_render_in_headless_chromium(topology_scene,
                                                               tmp_path_factory):
    binary = _chromium()
    artifacts = tmp_path_factory.mktemp("web-topology-screenshots")
    print(f"topology page screenshots in {artifacts}")
    scene = topology_scene
    _render_in_chromium(binary, artifacts, scene.url, scene.pages(), "topology-")
    dom = _chromium_run(binary, "--dump-dom", scene.url + "/topology")
    assert dom.returncode == 0 and scene.evil_reader not in dom.stdout, dom.stderr
    assert "<script" not in dom.stdout and "&lt;script&gt;" in dom.stdout  # text, no element
