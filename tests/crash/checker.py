"""The invariant checker: Delta logs (every version) + coordinator records + reader observations.

It trusts nothing it checks: the Delta tables are read with ``deltalake`` and the raw ``_delta_log``
JSON (no percolake code), the coordinator through its public RPCs, and the data files by value.
Each violation is a sentence naming the invariant, the table, the version and the transaction.

What is checked (docs/protocol.md):
- I2 every committed logical batch appears in exactly one Delta version of each table it wrote,
  with exactly its rows (by value), and every expected batch is committed exactly once;
- I3 no version of any table holds a file of a transaction that is not committed, and the
  attempt folders of aborted transactions are deleted (eventually);
- I4 every committed transaction is applied to all its tables (after a roll-forward);
- I6 timestamps are unique, and commits of one pipeline generation follow batch order;
- I7 on each table the protocol versions follow commit_ts order, and each version holds exactly
  the committed transactions at or below its commit_ts (appends) or the newest one (overwrite);
- I1 every reader observation equals the state the committed transactions define at its
  snapshot_ts (same transactions, same rows), the bank balances add up, and snapshot_ts never
  goes backwards; when asked (``spark_reads``), delta-spark reads every version with exactly the
  rows deltalake reads.

Tables may be local folders or object-store URIs (``s3://bucket/key``): the checker reads those
with deltalake and Arrow's S3 filesystem set up here from the standard AWS variables of the
environment (endpoint, keys, region), not with percolake's storage settings (only the row count
cross-check goes through ``percolake.lake.arrow_read``, as for local tables).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from percolake.lake.arrow_read import read_delta_table
from percolake.v1 import coordinator_pb2 as pb
from tests.crash import workload
from tests.crash.rpc import COMMITTED_STATES, Client, state_name

ATTEMPT_RE = re.compile(r"(?:^|/)_percolake/([0-9A-Za-z_-]+)/")
Row = tuple[Any, ...]


def txn_of_path(relative_path: str) -> str | None:
    """The attempt (txn id) a data file belongs to, from its ``_percolake/<txn_id>/`` folder."""
    match = ATTEMPT_RE.search(relative_path)
    return match.group(1) if match else None


def local_path(uri: str) -> str:
    return unquote(uri[len("file://"):]) if uri.startswith("file://") else uri


# ---------------------------------------------------------------- local folders and S3 alike

def is_object_store(path: str | Path) -> bool:
    return str(path).startswith(("s3://", "s3a://"))


def _s3_key(uri: str) -> str:
    """``bucket/key`` of an ``s3://`` or ``s3a://`` URI (what Arrow's S3 filesystem takes)."""
    return str(uri).split("://", 1)[1].rstrip("/")


_S3_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP")


def s3_filesystem() -> pafs.S3FileSystem:
    """Arrow's S3 filesystem with the AWS variables of the environment."""
    return _s3_filesystem(tuple(os.environ.get(name, "") for name in _S3_VARIABLES))


@functools.lru_cache(maxsize=4)
def _s3_filesystem(values: tuple[str, ...]) -> pafs.S3FileSystem:
    env = dict(zip(_S3_VARIABLES, values, strict=True))
    scheme, _, netloc = env["AWS_ENDPOINT_URL"].partition("://")
    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
        session_token=env["AWS_SESSION_TOKEN"] or None,
        region=env["AWS_REGION"] or "us-east-1",
        scheme=scheme or "https", endpoint_override=netloc or None)


def storage_options(path: str | Path) -> dict[str, str]:
    """deltalake's ``storage_options`` of a table: the AWS variables for an object store."""
    if not is_object_store(path):
        return {}
    return {name: os.environ[name] for name in _S3_VARIABLES if os.environ.get(name)}


def table_root(path: str | Path) -> str:
    """A table's root as its file URIs start: the real local path, or ``s3://bucket/key``."""
    if is_object_store(path):
        return "s3://" + _s3_key(str(path))
    return os.path.realpath(path)


def open_delta(path: str | Path, version: int | None = None) -> DeltaTable:
    target = table_root(path) if is_object_store(path) else str(path)
    if version is None:
        return DeltaTable(target, storage_options=storage_options(path))
    return DeltaTable(target, version=version, storage_options=storage_options(path))


def is_delta_table(path: str | Path) -> bool:
    if is_object_store(path):
        return DeltaTable.is_deltatable(table_root(path), storage_options=storage_options(path))
    return DeltaTable.is_deltatable(str(path))


def relative_to_root(file_uri: str, root: str) -> str:
    """The path of a data file (a URI deltalake lists) relative to its table's root."""
    if is_object_store(root):
        full = unquote(file_uri)
        prefix = root.rstrip("/") + "/"
        if full.startswith("s3a://"):
            full = "s3://" + full[len("s3a://"):]
        return full[len(prefix):] if full.startswith(prefix) else full
    return os.path.relpath(local_path(file_uri), root)


def read_text(path: str) -> str | None:
    """A whole (small) file or object as text; None when it does not exist."""
    if is_object_store(path):
        try:
            with s3_filesystem().open_input_stream(_s3_key(path)) as stream:
                return stream.read().decode()
        except FileNotFoundError:
            return None
    file = Path(path)
    return file.read_text() if file.exists() else None


def read_parquet(path: str, columns: list[str] | None = None) -> Any:
    """A Parquet file (local path or ``s3://`` URI) as an Arrow table."""
    if is_object_store(path):
        return pq.read_table(_s3_key(path), columns=columns, filesystem=s3_filesystem())
    return pq.read_table(path, columns=columns)


def list_below(prefix: str) -> list[str]:
    """Every file below a folder or object-store prefix (empty if there is none)."""
    if is_object_store(prefix):
        infos = s3_filesystem().get_file_info(
            pafs.FileSelector(_s3_key(prefix), recursive=True, allow_not_found=True))
        return [i.path for i in infos if i.type == pafs.FileType.File]
    if not os.path.exists(prefix):
        return []
    return [os.path.join(d, f) for d, _, files in os.walk(prefix) for f in files]


def exists(path: str) -> bool:
    """A local path exists, or an object-store prefix has an object below it."""
    if is_object_store(path):
        return bool(list_below(path))
    return os.path.exists(path)


@dataclass(frozen=True)
class TableSpec:
    """A table of a workload: where it is, how it is written, what each batch must put in it."""

    name: str
    path: str                      # absolute local path, or an s3:// URI
    overwrite: bool                # True: every write replaces the whole table
    columns: tuple[str, ...]       # columns compared by value
    expected: Callable[[Any], list[Row]]  # rows a committed transaction must contribute

    @property
    def uri(self) -> str:
        """The table's canonical name at the coordinator."""
        if is_object_store(self.path):
            return table_root(self.path)
        return "file://" + os.path.realpath(self.path)


def bank_tables(lake: str | Path, k: int, prefix: str = "") -> list[TableSpec]:
    """The three tables of the bank workload under ``lake`` (see workload.py)."""
    lake = str(lake)
    cols = ("batch", "i", "account", "amount")
    return [
        TableSpec(prefix + workload.DEBITS, f"{lake}/{prefix}{workload.DEBITS}", False, cols,
                  lambda t: workload.debit_rows(t.batch_id, k)),
        TableSpec(prefix + workload.CREDITS, f"{lake}/{prefix}{workload.CREDITS}", False, cols,
                  lambda t: workload.credit_rows(t.batch_id, k)),
        TableSpec(prefix + workload.BALANCES, f"{lake}/{prefix}{workload.BALANCES}", True,
                  ("account", "balance", "batch"),
                  lambda t: workload.balance_rows(t.batch_id, k)),
    ]


@dataclass
class DeltaVersion:
    version: int
    files: frozenset[str]          # relative paths of the version's files (deltalake)
    adds: tuple[str, ...]          # relative paths added by this commit (raw log)
    removes: tuple[str, ...]
    app_txns: tuple[tuple[str, int], ...]
    commit_info: dict[str, Any]

    def tag(self, key: str) -> Any:
        """A percolake.* value of commitInfo, wherever the writer put it."""
        return _find_key(self.commit_info, key)


def _find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for value in obj.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    if isinstance(obj, str) and key in obj:
        try:
            return _find_key(json.loads(obj), key)
        except ValueError:
            return None
    return None


def read_versions(path: str) -> list[DeltaVersion]:
    """Every version of a Delta table: deltalake's file list plus the raw commit actions."""
    if not is_delta_table(path):
        return []
    root = table_root(path)
    dt = open_delta(path)
    latest = dt.version()
    out: list[DeltaVersion] = []
    for version in range(latest + 1):
        log_text = read_text(f"{root}/_delta_log/{version:020d}.json")
        if log_text is None:
            continue  # cleaned up by a checkpoint; percolake never enables that
        adds: list[str] = []
        removes: list[str] = []
        app_txns: list[tuple[str, int]] = []
        info: dict[str, Any] = {}
        for line in log_text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                adds.append(unquote(action["add"]["path"]))
            elif "remove" in action:
                removes.append(unquote(action["remove"]["path"]))
            elif "txn" in action:
                app_txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
            elif "commitInfo" in action:
                info = action["commitInfo"]
        dt.load_as_version(version)
        files = frozenset(relative_to_root(u, root) for u in dt.file_uris())
        out.append(DeltaVersion(version, files, tuple(adds), tuple(removes), tuple(app_txns),
                                info))
    return out


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    batches_verified: int = 0
    versions_checked: int = 0
    spark_versions_checked: int = 0
    snapshot_reads_checked: int = 0
    committed: int = 0
    aborted: int = 0

    def add(self, invariant: str, message: str) -> None:
        self.violations.append(f"{invariant}: {message}")

    def merge(self, other: Report) -> None:
        self.violations += other.violations
        self.batches_verified += other.batches_verified
        self.versions_checked += other.versions_checked
        self.spark_versions_checked += other.spark_versions_checked
        self.snapshot_reads_checked += other.snapshot_reads_checked
        self.committed += other.committed
        self.aborted += other.aborted

    def summary(self) -> str:
        head = (f"{self.batches_verified} batches, {self.versions_checked} Delta versions "
                f"({self.spark_versions_checked} also through delta-spark), "
                f"{self.snapshot_reads_checked} snapshot reads, {self.committed} committed, "
                f"{self.aborted} aborted txns: {len(self.violations)} violations")
        return "\n".join([head, *self.violations[:50]])


def _rows(table: TableSpec, file_path: str) -> list[Row]:
    data = read_parquet(file_path, columns=list(table.columns)).to_pydict()
    return list(zip(*(data[c] for c in table.columns), strict=True))


class Checker:
    """Checks one workload (its tables, its pipelines) against a running coordinator."""

    def __init__(self, client: Client, tables: list[TableSpec],
                 spark_reads: Callable[[list[tuple[TableSpec, list[int]]]], dict[str, Any]]
                 | None = None) -> None:
        """``spark_reads``, if given, reads the listed versions of each table with delta-spark
        and returns, per table name and version (a string), its rows as
        ``[txn_id, *columns]`` lists (``Scenario.spark_reads``)."""
        self.client = client
        self.tables = tables
        self.spark_reads = spark_reads
        self.txns: dict[str, Any] = {}          # txn_id -> pb.Transaction (with writes)
        self.versions: dict[str, list[DeltaVersion]] = {}
        self._file_rows: dict[str, list[Row]] = {}

    # ------------------------------------------------------------------ loading

    def roll_forward(self, timeout_s: float = 60.0) -> None:
        """A snapshot of every table rolls committed-but-unapplied writes forward (I4)."""
        self.client.snapshot([t.path for t in self.tables], wait_ms=int(timeout_s * 1000))

    def load(self) -> None:
        self.txns = {}
        uris = {t.uri for t in self.tables}
        for txn in self.client.list_transactions():
            if not any(p.table in uris for p in txn.participants) and txn.participants:
                continue
            if txn.state in COMMITTED_STATES:
                txn = self.client.transaction(txn.txn_id, include_writes=True)
            self.txns[txn.txn_id] = txn
        self.versions = {t.name: read_versions(t.path) for t in self.tables}

    def committed_writers(self, table: TableSpec) -> list[Any]:
        """Committed transactions that wrote ``table``, in commit_ts order."""
        out = [t for t in self.txns.values() if t.state in COMMITTED_STATES
               and any(p.table == table.uri for p in t.participants)]
        return sorted(out, key=lambda t: t.commit_ts)

    def expected_txns_at(self, table: TableSpec, ts: int) -> set[str]:
        """The transactions whose files a version of ``table`` at ``ts`` must hold exactly."""
        writers = [t for t in self.committed_writers(table) if t.commit_ts <= ts]
        if table.overwrite:
            return {writers[-1].txn_id} if writers else set()
        return {t.txn_id for t in writers}

    def file_rows(self, table: TableSpec, relative: str) -> list[Row]:
        full = f"{table_root(table.path)}/{relative}"
        if full not in self._file_rows:
            self._file_rows[full] = _rows(table, full)
        return self._file_rows[full]

    # ------------------------------------------------------------------ the checks

    def check(
        self,
        expected_batches: dict[tuple[str, int], Iterable[int]] | None = None,
        observations: Iterable[dict[str, Any]] = (),
        cleanup_timeout_s: float = 20.0,
        roll_forward: bool = True,
    ) -> Report:
        """Runs every check; ``expected_batches`` maps (pipeline, generation) to batch ids."""
        report = Report()
        if roll_forward:
            self.roll_forward()
        self._wait_all_applied(report)
        self.load()
        report.committed = sum(t.state in COMMITTED_STATES for t in self.txns.values())
        report.aborted = sum(state_name(t.state) == "ABORTED" for t in self.txns.values())
        self._check_coordinator(report, expected_batches)
        for table in self.tables:
            self._check_versions(table, report)
            self._check_latest_by_value(table, report)
        if self.spark_reads is not None:
            self.check_spark_reads(report)
        self._check_observations(list(observations), report)
        self._check_aborted_cleanup(report, cleanup_timeout_s)
        return report

    def _wait_all_applied(self, report: Report, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            pending = self.client.list_transactions(states=[pb.COMMITTED])
            uris = {t.uri for t in self.tables}
            pending = [t for t in pending if any(p.table in uris for p in t.participants)]
            if not pending:
                return
            if time.monotonic() > deadline:
                for t in pending:
                    report.add("I4", f"transaction {t.txn_id} (pipeline {t.pipeline_id} batch "
                               f"{t.batch_id}) is still COMMITTED, not APPLIED, after "
                               f"{timeout_s:.0f} s and a snapshot")
                return
            self.roll_forward()
            time.sleep(0.5)

    def _check_coordinator(self, report: Report,
                           expected: dict[tuple[str, int], Iterable[int]] | None) -> None:
        by_key: dict[tuple[str, int, int], list[Any]] = defaultdict(list)
        for t in self.txns.values():
            if t.state in COMMITTED_STATES:
                by_key[(t.pipeline_id, t.generation, t.batch_id)].append(t)
                if state_name(t.state) != "APPLIED":
                    report.add("I4", f"txn {t.txn_id} {t.pipeline_id}/g{t.generation}/b"
                               f"{t.batch_id} is {state_name(t.state)}, not APPLIED")
        for key, txns in by_key.items():
            if len(txns) > 1:
                report.add("I2", f"batch {key} committed {len(txns)} times: "
                           f"{[t.txn_id for t in txns]}")
        if expected is not None:
            for (pipeline, generation), batches in expected.items():
                want = set(batches)
                got = {b for (p, g, b) in by_key if p == pipeline and g == generation}
                if got != want:
                    report.add("I2", f"pipeline {pipeline} generation {generation}: committed "
                               f"batches {sorted(got)} != expected {sorted(want)} (missing "
                               f"{sorted(want - got)}, unexpected {sorted(got - want)})")
                report.batches_verified += len(want & got)
        # I6: timestamps are unique; one generation's commits follow its batch order.
        stamps = Counter()
        for t in self.txns.values():
            stamps[t.start_ts] += 1
            if t.commit_ts:
                stamps[t.commit_ts] += 1
        dup = [ts for ts, n in stamps.items() if n > 1]
        if dup:
            report.add("I6", f"timestamps handed out twice: {dup[:5]}")
        chains: dict[tuple[str, int], list[Any]] = defaultdict(list)
        for (p, g, _b), txns in by_key.items():
            chains[(p, g)].append(txns[0])
        for (p, g), txns in chains.items():
            txns.sort(key=lambda t: t.batch_id)
            for a, b in zip(txns, txns[1:], strict=False):
                if b.commit_ts <= a.commit_ts or b.start_ts <= a.commit_ts:
                    report.add("I6", f"{p}/g{g}: batch {b.batch_id} (start_ts {b.start_ts}, "
                               f"commit_ts {b.commit_ts}) is not after batch {a.batch_id} "
                               f"(commit_ts {a.commit_ts})")

    def _check_versions(self, table: TableSpec, report: Report) -> None:
        versions = self.versions[table.name]
        seen_in: dict[str, int] = {}
        last_ts = 0
        for v in versions:
            report.versions_checked += 1
            # I3: every file of every version belongs to a committed attempt.
            for path in v.files:
                owner = txn_of_path(path)
                txn = self.txns.get(owner) if owner else None
                if owner is None:
                    report.add("I3", f"{table.name} v{v.version}: file {path} is outside any "
                               "attempt folder")
                elif txn is None or txn.state not in COMMITTED_STATES:
                    state = state_name(txn.state) if txn is not None else "unknown"
                    report.add("I3", f"{table.name} v{v.version}: file {path} of txn {owner} "
                               f"({state}) is visible")
            if not v.adds and not v.removes:
                continue
            owners = {txn_of_path(p) for p in v.adds}
            tagged = v.tag("percolake.txn_id")
            if len(owners) > 1:
                report.add("I2", f"{table.name} v{v.version} adds files of several attempts "
                           f"{sorted(map(str, owners))}")
                continue
            owner = next(iter(owners)) if owners else tagged
            if tagged is not None and owner != tagged:
                report.add("I2", f"{table.name} v{v.version}: commitInfo names txn {tagged} but "
                           f"adds files of {owner}")
            txn = self.txns.get(owner) if owner else None
            if txn is None or txn.state not in COMMITTED_STATES:
                continue  # reported above as I3 (or a version not made by the protocol)
            if owner in seen_in:
                report.add("I2", f"{table.name}: txn {owner} (batch {txn.batch_id}) applied "
                           f"twice, in v{seen_in[owner]} and v{v.version}")
            seen_in[owner] = v.version
            part = next(p for p in txn.participants if p.table == table.uri)
            want = sorted(f.path for f in part.write.add_files)
            if sorted(v.adds) != want:
                report.add("I2", f"{table.name} v{v.version}: adds {sorted(v.adds)} but txn "
                           f"{owner} prewrote {want}")
            if part.applied and part.delta_version != v.version:
                report.add("I4", f"{table.name}: txn {owner} reported applied at "
                           f"v{part.delta_version} but its commit is v{v.version}")
            tagged_ts = v.tag("percolake.commit_ts")
            if tagged_ts is not None and int(tagged_ts) != txn.commit_ts:
                report.add("I7", f"{table.name} v{v.version}: commitInfo commit_ts {tagged_ts} "
                           f"!= txn commit_ts {txn.commit_ts}")
            if txn.commit_ts <= last_ts:
                report.add("I7", f"{table.name} v{v.version}: commit_ts {txn.commit_ts} (txn "
                           f"{owner}) not above the previous version's {last_ts}")
            last_ts = max(last_ts, txn.commit_ts)
            # The Delta version holds exactly the committed transactions at or below it.
            want_txns = self.expected_txns_at(table, txn.commit_ts)
            got_txns = {txn_of_path(p) for p in v.files}
            if got_txns != want_txns:
                report.add("I1", f"{table.name} v{v.version} (commit_ts {txn.commit_ts}) holds "
                           f"txns {_short(got_txns - want_txns)} it should not and lacks "
                           f"{_short(want_txns - got_txns)}")
            app_ids = [a for a in v.app_txns if txn.pipeline_id in a[0]]
            if not app_ids or app_ids[0][1] not in (txn.batch_id, txn.commit_ts):
                report.add("I2", f"{table.name} v{v.version}: Delta app transaction "
                           f"{v.app_txns} does not name pipeline {txn.pipeline_id} "
                           f"batch {txn.batch_id}")
        for txn in self.committed_writers(table):
            if txn.txn_id not in seen_in:
                report.add("I4", f"{table.name}: committed txn {txn.txn_id} "
                           f"({txn.pipeline_id}/g{txn.generation}/b{txn.batch_id}, commit_ts "
                           f"{txn.commit_ts}) is in no Delta version")

    def _check_latest_by_value(self, table: TableSpec, report: Report) -> None:
        versions = self.versions[table.name]
        want_txns = self.expected_txns_at(table, 2**63 - 1)
        if not versions:
            if want_txns:
                report.add("I4", f"{table.name} does not exist but {len(want_txns)} committed "
                           "transactions wrote it")
            return
        latest = versions[-1]
        rows_by_txn: dict[str, list[Row]] = defaultdict(list)
        for path in latest.files:
            try:
                rows_by_txn[str(txn_of_path(path))].extend(self.file_rows(table, path))
            except FileNotFoundError:
                report.add("I2", f"{table.name} v{latest.version} references {path}, which "
                           "does not exist: committed data was lost")
                return
        for txn_id in sorted(set(rows_by_txn) | want_txns):
            txn = self.txns.get(txn_id)
            got = Counter(rows_by_txn.get(txn_id, []))
            want = Counter(table.expected(txn)) if txn is not None and txn_id in want_txns \
                else Counter()
            if got != want:
                label = (f"{txn.pipeline_id}/g{txn.generation}/b{txn.batch_id}" if txn
                         else "unknown")
                report.add("I2", f"{table.name} latest v{latest.version}, txn {txn_id} "
                           f"({label}): duplicated/unexpected rows {_short(got - want)}, "
                           f"missing rows {_short(want - got)}")
        total = sum(len(r) for r in rows_by_txn.values())
        seen = read_delta_table(table.uri if is_object_store(table.path) else str(table.path),
                                columns=[table.columns[0]]).num_rows
        if seen != total:
            report.add("I2", f"{table.name}: deltalake reads {seen} rows, its files hold {total}")

    def check_spark_reads(self, report: Report) -> None:
        """delta-spark (another reader, through Hadoop's filesystems) sees every version of
        every table with exactly the rows deltalake's file list of that version holds."""
        assert self.spark_reads is not None
        wanted = [(t, [v.version for v in self.versions[t.name]]) for t in self.tables]
        seen = self.spark_reads([(t, vs) for t, vs in wanted if vs])
        for table, numbers in wanted:
            by_version = seen.get(table.name, {})
            for v in self.versions[table.name]:
                expected: Counter[Row] = Counter()
                try:
                    for path in v.files:
                        owner = str(txn_of_path(path))
                        expected.update((owner, *r) for r in self.file_rows(table, path))
                except FileNotFoundError as exc:
                    report.add("I2", f"{table.name} v{v.version}: a file is missing: {exc}")
                    continue
                rows = by_version.get(str(v.version))
                if rows is None:
                    report.add("I1", f"{table.name} v{v.version}: delta-spark did not read it")
                    continue
                got = Counter(tuple(r) for r in rows)
                report.spark_versions_checked += 1
                if got != expected:
                    report.add("I1", f"{table.name} v{v.version}: delta-spark reads "
                               f"{sum(got.values())} rows, deltalake's files hold "
                               f"{sum(expected.values())}: extra {_short(got - expected)}, "
                               f"missing {_short(expected - got)}")
            extra = set(by_version) - {str(n) for n in numbers}
            if extra:
                report.add("I1", f"{table.name}: delta-spark read versions {sorted(extra)} "
                           "deltalake does not have")

    def _check_observations(self, observations: list[dict[str, Any]], report: Report) -> None:
        by_name = {t.name: t for t in self.tables}
        last: dict[str, int] = {}
        for obs in observations:
            if "error" in obs:
                if obs.get("code") not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    report.add("I1", f"reader {obs.get('reader')}: unexpected error {obs}")
                continue
            report.snapshot_reads_checked += 1
            ts = obs["snapshot_ts"]
            reader = obs.get("reader", "")
            if ts < last.get(reader, 0):
                report.add("I1", f"reader {reader}: snapshot_ts went backwards "
                           f"{last[reader]} -> {ts}")
            last[reader] = max(ts, last.get(reader, 0))
            for name, seen in obs["tables"].items():
                table = by_name.get(name)
                if table is None:
                    continue
                want = self.expected_txns_at(table, ts)
                got = set(seen["txns"])
                if got != want:
                    report.add("I1", f"snapshot {ts} of {name} at v{seen['version']}: extra "
                               f"txns {_short(got - want)}, missing {_short(want - got)}")
                for txn_id, (rows, amount) in seen["txns"].items():
                    txn = self.txns.get(txn_id)
                    if txn is None:
                        continue
                    expected = table.expected(txn)
                    if rows != len(expected) or ("amount" in table.columns and amount != sum(
                            r[table.columns.index("amount")] for r in expected)):
                        report.add("I1", f"snapshot {ts} of {name}: txn {txn_id} shows {rows} "
                                   f"rows / {amount}, expected {len(expected)} rows")
            for message in bank_violations(obs):
                report.add("I1", f"snapshot {ts}: {message}")

    def _check_aborted_cleanup(self, report: Report, timeout_s: float) -> None:
        uris = {t.uri for t in self.tables}
        locations = [local_path(p.write_location) for t in self.txns.values()
                     if state_name(t.state) == "ABORTED"
                     for p in t.participants if p.table in uris]
        deadline = time.monotonic() + timeout_s
        left = [p for p in locations if exists(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if exists(p)]
        for path in left:
            report.add("I3", f"attempt folder of an aborted txn still exists after "
                       f"{timeout_s:.0f} s: {path}")


def bank_violations(obs: dict[str, Any]) -> list[str]:
    """The bank invariant of one reader observation: money is neither made nor lost."""
    out: list[str] = []
    for prefix in obs.get("prefixes", [""]):
        tables = obs["tables"]
        debits = tables.get(prefix + workload.DEBITS)
        credits = tables.get(prefix + workload.CREDITS)
        if debits is None or credits is None:
            continue
        d_rows, d_sum = debits["rows"], debits["sum"]
        c_rows, c_sum = credits["rows"], credits["sum"]
        if d_rows != c_rows or d_sum != c_sum:
            out.append(f"{prefix}debits {d_rows} rows / {d_sum} vs credits {c_rows} rows / "
                       f"{c_sum}")
        balances = tables.get(prefix + workload.BALANCES)
        if balances is not None and balances.get("balances") is not None:
            total = sum(b for _, b, _ in balances["balances"])
            if total != 0:
                out.append(f"{prefix}balances sum to {total}, not 0")
            if len({b for _, _, b in balances["balances"]}) > 1:
                out.append(f"{prefix}balances mix several batches: {balances['balances']}")
    return out


def _short(items: Iterable[Any], limit: int = 6) -> str:
    items = list(items)
    text = ", ".join(map(str, items[:limit]))
    return f"[{text}{', ...' if len(items) > limit else ''}] ({len(items)})"


def load_observations(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        if not Path(path).exists():
            continue
        for line in Path(path).read_text().splitlines():
            if line.strip():
                with contextlib.suppress(ValueError):  # a line cut short by a kill
                    out.append(json.loads(line))
    return out
