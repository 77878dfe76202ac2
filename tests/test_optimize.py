"""``percolake-coordinator optimize`` (docs/operations.md): compaction as a percolake
transaction. The plan and the predicate on their own; then the command against a real daemon:
rows unchanged, fewer files, only the selected partitions, exactly once, the record an OPTIMIZE
rearrangement, and refused while another transaction holds the table."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.core.optimizing import optimize_pipeline
from coordinator.store import MemoryStore
from percolake.errors import FailedPrecondition, InvalidArgument
from percolake.lake import compaction
from percolake.lake.conflicts import check_row_level_write
from percolake.lake.delta_commit import apply_table_write, files_of_version, table_layout
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord
from percolake.v1 import coordinator_pb2 as pb
from tests.daemon_support import canonical, table_write
from tests.test_ops_cli import cli
from tests.test_type_widening import long_write, widening_table


def small_files_table(path: Path) -> None:
    """Partition ``a``: three one-row files; ``b``: two; ``c``: one."""
    for i, part in enumerate("aaabbc"):
        write_deltalake(str(path), pa.table({"id": pa.array([i], pa.int64()),
                                             "part": [part]}),
                        partition_by=["part"], mode="append")


def rows(path: Path) -> list[tuple]:
    data = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(zip(data.column("id").to_pylist(), data.column("part").to_pylist(),
                      strict=True))


def files_by_partition(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    version = DeltaTable(str(path)).version()
    for f in files_of_version(canonical_table_uri(str(path)), version).files:
        part = str(f.partition_values["part"])
        counts[part] = counts.get(part, 0) + 1
    return counts


@pytest.mark.parametrize(("where", "selected"), [
    ("part = 'a'", {"a"}), ("part IN ('a', 'c')", {"a", "c"}), ("part != 'a'", {"b", "c"}),
    ("part >= 'b' AND part <> 'c'", {"b"}), ("part IS NOT NULL", {"a", "b", "c"}),
    ("part IS NULL", set()), ("part NOT IN ('b')", {"a", "c"}),
])
def test_a_partition_predicate_selects_those_partitions(tmp_path, where, selected):
    small_files_table(tmp_path / "t")
    layout = table_layout(canonical_table_uri(str(tmp_path / "t")))
    test = compaction.partition_filter(where, layout)
    assert {p for p in "abc" if test({"part": p})} == selected


@pytest.mark.parametrize("where", ["id = 3", "part LIKE 'a%'", "part = 'a' OR part = 'b'",
                                   "part = a"])
def test_anything_but_a_partition_predicate_is_refused_naming_what_is_allowed(tmp_path, where):
    small_files_table(tmp_path / "t")
    with pytest.raises(InvalidArgument, match="partition"):
        compaction.check_where(canonical_table_uri(str(tmp_path / "t")), where)


def test_the_plan_packs_small_files_per_partition_and_leaves_single_and_large_files(tmp_path):
    table = tmp_path / "t"
    small_files_table(table)
    uri = canonical_table_uri(str(table))
    plan = compaction.plan(uri)
    assert sorted(len(g) for g in plan.groups) == [2, 3]  # c's one file is left alone
    assert all(len({str(f.partition_values) for f in g}) == 1 for g in plan.groups)
    assert (plan.considered, plan.partitions) == (6, 2)
    assert compaction.plan(uri, target_size=1).groups == ()  # every file is "large"
    assert [len(g) for g in compaction.plan(uri, "part = 'b'").groups] == [2]


def test_a_rearrangement_that_changes_the_row_count_is_refused_before_the_commit(tmp_path):
    table = tmp_path / "t"
    small_files_table(table)
    uri = canonical_table_uri(str(table))
    plan = compaction.plan(uri, "part = 'b'")
    write = compaction.rewrite(uri, plan, "_percolake/" + "a" * 32)
    check_row_level_write(write)  # the real compaction keeps the rows
    lying = AddFileRecord(write.add_files[0].path, write.add_files[0].size, {"part": "b"}, 0,
                          json.dumps({"numRecords": 1}))
    with pytest.raises(FailedPrecondition, match="adds 1 rows in place of the 2 rows"):
        check_row_level_write(write.__class__(**{**write.__dict__, "add_files": (lying,)}))


def test_the_optimize_pipeline_commits_only_compactions_and_owns_no_table(tmp_path):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(tmp_path)]))
    table = str(tmp_path / "t")
    txn, _ = core.open_transaction(optimize_pipeline(canonical_table_uri(table)), 0,
                                   tables=[table])
    from percolake import codec  # the daemon tests' append, decoded as the servicer does

    append = codec.table_write_from_pb(table_write(table, txn.txn_id))
    with pytest.raises(InvalidArgument, match="commits only compactions"):
        core.prewrite(txn.txn_id, None, [append])
    assert core.store.load_table_writers() == []  # declaring made it no table's writer


@pytest.fixture(scope="module")
def daemon(daemon_factory):
    started = daemon_factory.start(["--conflict-wait", "1"], name="optimize")
    yield started
    started.stop()


def optimize(daemon, *args: str):  # noqa: ANN001, ANN201
    return cli("optimize", *args, "--target", daemon.target)


def test_optimize_compacts_the_selected_partitions_once_keeping_every_row(daemon):
    table = daemon.warehouse / "compact-me"
    small_files_table(table)
    before, version = rows(table), DeltaTable(str(table)).version()
    done = optimize(daemon, "--table", str(table), "--where", "part IN ('a', 'c')", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["files_removed"], result["files_added"], result["read_version"]) == (
        3, 1, version)
    assert result["delta_version"] == version + 1 == DeltaTable(str(table)).version()
    assert rows(table) == before  # the same rows, once each
    assert files_by_partition(table) == {"a": 1, "b": 2, "c": 1}  # b was not selected
    txn = daemon.stub.GetTransaction(pb.GetTransactionRequest(txn_id=result["txn_id"],
                                                              include_writes=True), timeout=30)
    (written,) = [p.write for p in txn.participants]
    assert (txn.pipeline_id, txn.state) == (optimize_pipeline(canonical(table)), pb.APPLIED)
    assert (written.mode, written.operation, written.rearranges_only) == (
        pb.ROW_LEVEL, "OPTIMIZE", True)
    assert json.loads(written.operation_metrics)["numFilesRemoved"] == "3"
    entry = [json.loads(line) for line in
             (table / "_delta_log" / f"{version + 1:020d}.json").read_text().splitlines()]
    assert [a["commitInfo"]["operation"] for a in entry if "commitInfo" in a] == ["OPTIMIZE"]
    changes = [a[k]["dataChange"] for a in entry for k in ("add", "remove") if k in a]
    assert len(changes) == 4 and not any(changes)  # streaming readers skip a compaction
    again = optimize(daemon, "--table", str(table), "--where", "part = 'a'")
    assert again.returncode == 0 and "nothing to compact" in again.stdout
    assert DeltaTable(str(table)).version() == version + 1  # nothing committed twice
    whole = optimize(daemon, "--table", str(table))
    assert whole.returncode == 0 and "compacted 2 file(s)" in whole.stdout
    assert rows(table) == before and files_by_partition(table) == {"a": 1, "b": 1, "c": 1}


def test_optimize_is_refused_while_another_transaction_holds_the_table(daemon):
    table = daemon.warehouse / "held"
    small_files_table(table)
    stub = daemon.stub
    holder = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id="writer", batch_id=0, tables=[canonical(table)]), timeout=30)
    version = DeltaTable(str(table)).version()
    refused = optimize(daemon, "--table", str(table))
    assert refused.returncode == 1
    assert "ABORTED" in refused.stderr and holder.transaction.txn_id in refused.stderr
    assert DeltaTable(str(table)).version() == version
    stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=holder.transaction.txn_id,
                                                     reason="done"), timeout=30)
    assert optimize(daemon, "--table", str(table)).returncode == 0


def test_a_bad_predicate_exits_2_before_anything_is_sent(daemon):
    table = daemon.warehouse / "bad-where"
    small_files_table(table)
    result = optimize(daemon, "--table", str(table), "--where", "id = 1")
    assert result.returncode == 2 and "not a partition column" in result.stderr


def test_a_lost_commit_reply_still_compacts_exactly_once(daemon_factory):
    """The coordinator fails right after the commit point: the command finds its transaction
    committed (not refused) and the coordinator applies it, once."""
    failing = daemon_factory.start(
        env={"PERCOLAKE_FAILPOINTS": "after-commit-durable-before-reply=1*raise"},
        name="optimize-lost-reply")
    try:
        table = failing.warehouse / "lost-reply"
        small_files_table(table)
        before, version = rows(table), DeltaTable(str(table)).version()
        done = cli("optimize", "--table", str(table), "--json", "--target", failing.target)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["delta_version"] == version + 1
        assert DeltaTable(str(table)).version() == version + 1
        assert rows(table) == before and files_by_partition(table) == {"a": 1, "b": 1, "c": 1}
    finally:
        failing.stop()


def table_with_a_deletion_vector(root: Path) -> Path:
    """A table with the deletionVectors feature: partition ``a`` holds two files of ids 0-4 and
    5-9; the first carries an inline vector deleting its rows 1 and 3 (ids 1 and 3)."""
    from tests.test_deleted_rows import vector_data, z85_encode

    (root / "_delta_log").mkdir(parents=True)
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "part", "type": "string", "nullable": True, "metadata": {}}]}
    actions: list[dict] = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"metaData": {"id": "dv", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": ["part"],
                      "configuration": {"delta.enableDeletionVectors": "true"},
                      "createdTime": 1}}]
    data = vector_data([1, 3])
    vector = {"storageType": "i", "pathOrInlineDv": z85_encode(data + b"\0" * (-len(data) % 4)),
              "sizeInBytes": len(data), "cardinality": 2}
    for number, first in enumerate((0, 5)):
        path = root / "part=a" / f"{number}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": pa.array(range(first, first + 5), pa.int64())}), path)
        add = {"path": f"part=a/{number}.parquet", "partitionValues": {"part": "a"},
               "size": path.stat().st_size, "modificationTime": 1, "dataChange": True,
               "stats": json.dumps({"numRecords": 5})}
        actions.append({"add": {**add, "deletionVector": vector} if number == 0 else add})
    (root / "_delta_log" / f"{0:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))
    return root


def test_a_compaction_leaves_out_the_rows_deletion_vectors_delete(tmp_path):
    uri = canonical_table_uri(str(table_with_a_deletion_vector(tmp_path / "dv")))
    plan = compaction.plan(uri)
    assert [len(g) for g in plan.groups] == [2] and set(plan.vectors) == {"part=a/0.parquet"}
    write = compaction.rewrite(uri, plan, "_percolake/" + "b" * 32)
    (add,) = write.add_files
    assert pq.read_table(tmp_path / "dv" / add.path).column("id").to_pylist() == [
        0, 2, 4, 5, 6, 7, 8, 9]
    assert add.row_count() == 8
    assert json.loads(write.operation_metrics)["numDeletionVectorsRemoved"] == "1"
    check_row_level_write(write)  # 10 rows in the files less the 2 their vector deletes


def test_a_compaction_across_a_type_widening_writes_the_wider_type_and_commits(tmp_path):
    """Files of a widened column hold the old type (written before delta.typeChanges) and the
    new one: the compacted file holds the wider type and every row, and the compaction is
    committed (as a log entry of percolake's own: delta-rs commits nothing to such a table)."""
    root = widening_table(tmp_path / "t")  # x integer, one file
    apply_table_write(long_write(root, "txn-1"), app_id="p", app_version=0, txn_id="txn-1",
                      commit_ts=1)  # merge_schema widens x to long, one int64 file
    uri = canonical_table_uri(str(root))
    plan = compaction.plan(uri)
    assert [len(g) for g in plan.groups] == [2]
    write = compaction.rewrite(uri, plan, "_percolake/" + "b" * 32)
    check_row_level_write(write)
    compacted = pq.read_table(root / write.add_files[0].path)
    assert compacted.schema.field("x").type == pa.int64()
    assert sorted(compacted.column("x").to_pylist()) == [1, 2**40]
    version = apply_table_write(write, app_id="p", app_version=1, txn_id="txn-2", commit_ts=2)
    assert [f.path for f in files_of_version(uri, version).files] == [write.add_files[0].path]


def test_a_date_widened_to_timestamp_ntz_is_compacted_as_timestamps():
    old = pa.table({"d": pa.array([datetime.date(2024, 1, 2)], pa.date32())})
    new = pa.table({"d": pa.array([datetime.datetime(2024, 1, 3, 4, 5)], pa.timestamp("us"))})
    rows = compaction.concat_widened([old, new])
    assert rows.schema.field("d").type == pa.timestamp("us")
    assert rows.column("d").to_pylist() == [datetime.datetime(2024, 1, 2),
                                             datetime.datetime(2024, 1, 3, 4, 5)]
