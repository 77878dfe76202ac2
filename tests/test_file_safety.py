"""File safety (issue 17 item 8): nothing the daemon deletes lies outside
``<table>/_percolake/<txn_id>``, also with hostile symlinks made inside the warehouse while it
runs.

Each case runs the real deletion code (``percolake.lake.cleanup.remove_attempt_files`` with the
daemon's roots, the core's ``_remove_locations``) or a real daemon aborting a transaction, with
precious files outside the warehouse that must survive. The deletion walks from the root's open
folder one component at a time with ``O_NOFOLLOW`` and deletes relative to the open folder
(``dir_fd``), so a symlink swapped in after a check is refused or never followed: the race tests
swap at the exact points between the check and each deletion.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.core.maintenance import Maintenance
from percolake.lake import cleanup
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.warehouse import (
    ATTEMPT_DIR,
    UnsafeLocation,
    Warehouse,
    canonical_table_uri,
    local_path,
    write_location,
)
from percolake.records import TableEntry
from percolake.v1 import coordinator_pb2 as pb

TXN = "0123456789abcdef0123456789abcdef"
PRECIOUS = ["precious", f"{TXN}/precious", f"{ATTEMPT_DIR}/{TXN}/precious", "deep/er/precious"]


@pytest.fixture
def wh(tmp_path: Path) -> Path:
    root = tmp_path / "warehouse"
    root.mkdir()
    return Path(os.path.realpath(root))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the warehouse shaped like an attempt folder, full of precious files."""
    root = Path(os.path.realpath(tmp_path)) / "outside"
    for relative in PRECIOUS:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(b"keep me")
    return root


def assert_intact(outside: Path) -> None:
    """Every precious file outside the warehouse is still there, unchanged."""
    for relative in PRECIOUS:
        path = outside / relative
        assert not path.is_symlink() and path.read_bytes() == b"keep me", path


def table_of(wh: Path, name: str = "t") -> str:
    return Warehouse([str(wh)]).resolve(f"{wh}/{name}")


def make_attempt(table: str, txn_id: str = TXN) -> Path:
    folder = Path(local_path(write_location(table, txn_id)))
    (folder / "sub").mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"data")
    (folder / "sub" / "part-1.parquet").write_bytes(b"data")
    return folder


def remove(table: str, wh: Path, txn_id: str = TXN) -> None:
    remove_attempt_files(write_location(table, txn_id), roots=[str(wh)])


# ---------------------------------------------------------------- symlinks made before


def test_an_attempt_folder_that_is_a_symlink_to_outside_is_refused(wh, outside):
    table = table_of(wh)
    folder = Path(local_path(write_location(table, TXN)))
    folder.parent.mkdir(parents=True)
    folder.symlink_to(outside)
    with pytest.raises(UnsafeLocation, match="symlink"):
        remove(table, wh)
    assert_intact(outside)
    assert folder.is_symlink()  # refused: not even the link is touched


def test_a_percolake_folder_that_is_a_symlink_to_outside_is_refused(wh, outside):
    table = table_of(wh)
    Path(local_path(table)).mkdir()
    (Path(local_path(table)) / ATTEMPT_DIR).symlink_to(outside)  # outside/<TXN> exists
    with pytest.raises(UnsafeLocation, match=f"{ATTEMPT_DIR} on its path is a symlink"):
        remove(table, wh)
    assert_intact(outside)


def test_a_table_folder_that_is_a_symlink_to_outside_is_refused(wh, outside):
    table = table_of(wh)
    Path(local_path(table)).symlink_to(outside)  # outside/_percolake/<TXN> exists
    with pytest.raises(UnsafeLocation, match="t on its path is a symlink"):
        remove(table, wh)
    assert_intact(outside)


def test_a_parent_folder_of_the_table_that_is_a_symlink_is_refused(wh, outside):
    table = table_of(wh, "db/t")
    (wh / "db").symlink_to(outside / "deep")
    (outside / "deep" / "t" / ATTEMPT_DIR / TXN).mkdir(parents=True)
    (outside / "deep" / "t" / ATTEMPT_DIR / TXN / "x").write_bytes(b"keep me too")
    with pytest.raises(UnsafeLocation, match="db on its path is a symlink"):
        remove(table, wh)
    assert_intact(outside)
    assert (outside / "deep" / "t" / ATTEMPT_DIR / TXN / "x").exists()


def test_a_file_symlink_inside_the_attempt_folder_is_unlinked_and_its_target_kept(wh, outside):
    table = table_of(wh)
    folder = make_attempt(table)
    (folder / "link.parquet").symlink_to(outside / "precious")
    (folder / "sub" / "link.parquet").symlink_to(outside / TXN / "precious")
    (folder / "dangling").symlink_to(outside / "no-such-file")
    remove(table, wh)
    assert not os.path.lexists(folder)
    assert_intact(outside)


def test_a_folder_symlink_inside_the_attempt_folder_is_unlinked_never_entered(wh, outside):
    table = table_of(wh)
    folder = make_attempt(table)
    (folder / "into-outside").symlink_to(outside, target_is_directory=True)
    (folder / "sub" / "into-deep").symlink_to(outside / "deep", target_is_directory=True)
    (folder / "into-root").symlink_to("/", target_is_directory=True)
    (folder / "relative").symlink_to("../../../../outside", target_is_directory=True)
    remove(table, wh)
    assert not os.path.lexists(folder)
    assert_intact(outside)


def test_a_hard_link_inside_the_attempt_folder_loses_only_its_name(wh, outside):
    table = table_of(wh)
    folder = make_attempt(table)
    os.link(outside / "precious", folder / "hard.parquet")
    remove(table, wh)
    assert not os.path.lexists(folder)
    assert_intact(outside)


# ---------------------------------------------------------------- recorded locations


@pytest.mark.parametrize("location", [
    "file://{wh}/t/_percolake/..",
    "file://{wh}/t/_percolake/%2E%2E",
    "file://{wh}/t/_percolake/.",
    "file://{wh}/t/_percolake/",
    "file://{wh}/t/../../outside/_percolake/" + TXN,
    "file://{wh}/t/%2E%2E/%2E%2E/outside/_percolake/" + TXN,
    "{wh}/t/_percolake/../../../outside",
    "file://{wh}/t/_percolake//{outside}",
    "file://{wh}/t/_percolake/%2F{outside}",
    "file://{wh}/t/_percolake/" + TXN + "/../../../../outside",
    "{outside}/_percolake/" + TXN,
    "file://{outside}/_percolake/" + TXN,
    "file:///_percolake/" + TXN,
    "file://{wh}/_percolake/" + TXN,
    "file://{wh}/t/_percolake/" + TXN + "/_percolake/x",
    "file://{wh}/t/_percolake/" + TXN + "%00",
    "file://otherhost{wh}/t/_percolake/" + TXN,
    "{wh}/t/_percolake/" + TXN + "\x00/../../..",
    "file://{wh}/t/outside/_percolake/" + TXN,  # t/outside is a symlink to outside
    "file://{wh}/t/outside/" + TXN,
])
def test_dot_dot_and_absolute_components_in_a_recorded_location_are_refused(
        wh, outside, location):
    table = table_of(wh)
    folder = make_attempt(table)
    link = Path(local_path(table)) / "outside"
    link.symlink_to(outside)
    with pytest.raises(UnsafeLocation):
        remove_attempt_files(location.format(wh=wh, outside=outside), roots=[str(wh)])
    assert_intact(outside)
    assert (folder / "part-0.parquet").exists()


@pytest.mark.parametrize("txn_id", ["..", ".", "../../outside", "/", "a/b", "", "/.."])
def test_a_hostile_txn_id_cannot_name_a_folder_outside_its_own(wh, outside, txn_id):
    table = table_of(wh)
    kept = make_attempt(table, "kept")
    with pytest.raises(UnsafeLocation):
        remove(table, wh, txn_id)
    assert_intact(outside)
    assert (kept / "part-0.parquet").exists()


class _Cleaner(Maintenance):
    """The core's deletion path (``_remove_locations``) without a store."""

    def __init__(self, roots: list[str]) -> None:  # noqa: D107 - only what the path uses
        self._remove_files = lambda location: remove_attempt_files(location, roots=roots)


def test_the_core_deletes_only_the_folder_of_the_aborted_transaction_itself(wh, outside,
                                                                            caplog):
    table = table_of(wh)
    mine, other = make_attempt(table, "a" * 32), make_attempt(table, "b" * 32)
    cleaner = _Cleaner([str(wh)])
    forged = TableEntry(table, write_location(table, "b" * 32))
    assert cleaner._remove_locations("a" * 32, [forged]) is True  # refused: never retried
    assert (other / "part-0.parquet").exists()
    assert "refused to delete" in caplog.text
    assert cleaner._remove_locations("a" * 32, [TableEntry(table, write_location(table,
                                                                                 "a" * 32))])
    assert not mine.exists() and other.exists()
    assert_intact(outside)


# ---------------------------------------------------------------- symlinks swapped in while it runs


def test_a_symlink_swapped_in_after_the_location_was_checked_is_not_followed(
        wh, outside, monkeypatch):
    """The names are checked (``real_root_of``), then an attacker swaps the table folder for a
    symlink before the walk: the walk opens each component with O_NOFOLLOW and refuses."""
    table = table_of(wh)
    folder = make_attempt(table)
    real_check = cleanup.real_root_of

    def check_then_swap(path, roots):  # noqa: ANN001, ANN202
        root = real_check(path, roots)
        Path(local_path(table)).rename(wh / "moved")
        Path(local_path(table)).symlink_to(outside)
        return root

    monkeypatch.setattr(cleanup, "real_root_of", check_then_swap)
    with pytest.raises(UnsafeLocation, match="symlink"):
        remove(table, wh)
    assert_intact(outside)
    assert (wh / "moved" / folder.relative_to(local_path(table)) / "part-0.parquet").exists()


def _swap_on_scandir(monkeypatch: pytest.MonkeyPatch, when: int, swap) -> None:  # noqa: ANN001
    """Calls ``swap()`` right after the ``when``-th listing of a folder by the deletion (0 is
    the attempt folder itself): between the listing and the deletions it leads to."""
    real = os.scandir
    calls = [0]

    @contextlib.contextmanager
    def listing(fd):  # noqa: ANN001, ANN202
        with real(fd) as entries:
            listed = list(entries)
        if calls[0] == when:
            swap()
        calls[0] += 1
        yield iter(listed)

    monkeypatch.setattr(cleanup.os, "scandir", listing)


def test_the_attempt_folder_swapped_for_a_symlink_after_it_was_opened_is_emptied_by_its_fd(
        wh, outside, monkeypatch):
    """Deletion is relative to the opened folder: after the swap it goes on in the real folder
    (now moved inside the warehouse), never in the symlink's target, and the final rmdir of the
    name (now a symlink) fails instead of following it."""
    table = table_of(wh)
    folder = make_attempt(table)
    moved = wh / "moved-attempt"

    def swap() -> None:
        folder.rename(moved)
        folder.symlink_to(outside / TXN)

    _swap_on_scandir(monkeypatch, 0, swap)
    with pytest.raises(NotADirectoryError):
        remove(table, wh)
    monkeypatch.undo()
    assert_intact(outside)
    assert moved.is_dir() and list(moved.iterdir()) == []  # emptied through the fd
    assert folder.is_symlink()
    with pytest.raises(UnsafeLocation, match="symlink"):  # the retry refuses at once
        remove(table, wh)
    assert_intact(outside)


def test_a_subfolder_swapped_for_a_symlink_after_it_was_listed_is_not_entered(
        wh, outside, monkeypatch):
    table = table_of(wh)
    folder = make_attempt(table)

    def swap() -> None:
        (folder / "sub").rename(wh / "moved-sub")
        (folder / "sub").symlink_to(outside, target_is_directory=True)

    _swap_on_scandir(monkeypatch, 0, swap)
    with pytest.raises(UnsafeLocation, match="symlink"):
        remove(table, wh)
    monkeypatch.undo()
    assert_intact(outside)
    assert (wh / "moved-sub" / "part-1.parquet").exists()


def test_a_file_swapped_for_a_symlink_after_it_was_listed_loses_only_the_link(
        wh, outside, monkeypatch):
    table = table_of(wh)
    folder = make_attempt(table)

    def swap() -> None:
        (folder / "part-0.parquet").unlink()
        (folder / "part-0.parquet").symlink_to(outside / "precious")

    _swap_on_scandir(monkeypatch, 0, swap)
    remove(table, wh)
    monkeypatch.undo()
    assert not os.path.lexists(folder)
    assert_intact(outside)


# Flips each path between its real folder and a symlink to ``target`` until ``seconds`` pass;
# prints how many times a symlink stood in a folder's place.
ATTACKER = """
import os, sys, time
target, seconds, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
flips, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    for path in paths:
        try:
            os.rename(path, path + ".aside")
        except OSError:
            continue
        try:
            os.symlink(target, path)
            flips += 1
            time.sleep(0.0002)
            os.unlink(path)
        except OSError:
            pass
        try:
            os.rename(path + ".aside", path)
        except OSError:
            pass
print(flips)
"""


def test_symlinks_flipping_in_and_out_while_the_deletion_runs_never_reach_outside(
        wh, outside):
    """Another process flips the table's _percolake folder, the attempt folder and a
    subfolder between real folders and symlinks to outside, as fast as it can, while the
    deletion runs again and again."""
    table = table_of(wh)
    folder = Path(local_path(write_location(table, TXN)))
    make_attempt(table)
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(outside), "3",
         *map(str, (folder.parent, folder, folder / "sub"))], stdout=subprocess.PIPE, text=True)
    outcomes: dict[str, int] = {}
    try:
        while attacker.poll() is None:
            with contextlib.suppress(OSError):  # the writer, too, meets the attacker's links
                make_attempt(table)
            try:
                remove(table, wh)
                outcome = "deleted"
            except UnsafeLocation:
                outcome = "refused"
            except OSError as exc:
                outcome = type(exc).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        flips = int(attacker.communicate(timeout=30)[0] or 0)
    print(f"symlink flips {flips}, deletions {outcomes}")
    assert flips > 20 and outcomes.get("deleted", 0) > 10, (flips, outcomes)
    assert outcomes.get("refused", 0) > 0, outcomes  # the race was met
    assert_intact(outside)


# ---------------------------------------------------------------- object stores: key prefixes


def test_an_object_store_deletion_takes_only_keys_below_the_prefix_and_its_slash(
        moto_server, s3_env, s3_bucket):
    """No folders and no symlinks, only keys: ``.../_percolake/abc`` must not take ``abcd``,
    ``abc.json`` or ``abc-x`` (the listing's prefix ends with ``/``)."""
    keys = ["wh/t/_percolake/abc/part-0.parquet", "wh/t/_percolake/abc/p=1/part-1.parquet",
            "wh/t/_percolake/abcd/part-0.parquet", "wh/t/_percolake/abc.json",
            "wh/t/_percolake/abc-x/part-0.parquet", "wh/t/_percolake/ab/part-0.parquet",
            "wh/t/_percolake/abc", "wh/t2/_percolake/abc/part-0.parquet", "wh/t/data.parquet",
            "wh/tt/_percolake/abc/part-0.parquet"]
    for key in keys:
        moto_server.put(s3_bucket, key)
    remove_attempt_files(write_location(f"s3://{s3_bucket}/wh/t", "abc"),
                         roots=[f"s3://{s3_bucket}/wh"])
    assert sorted(moto_server.keys(s3_bucket)) == sorted(
        k for k in keys if not k.startswith("wh/t/_percolake/abc/"))


@pytest.mark.parametrize("hostile", ["wh/t/_percolake/abc/../../../victim",
                                     "wh/t/_percolake/abc/x/../../../../victim"])
def test_an_object_store_key_with_dot_dot_below_the_prefix_makes_the_deletion_refuse(
        moto_server, s3_env, s3_bucket, hostile):
    keys = ["wh/t/_percolake/abc/part-0.parquet", hostile, "wh/victim", "victim"]
    for key in keys:
        moto_server.put(s3_bucket, key)
    with pytest.raises(UnsafeLocation, match="not a plain relative path"):
        remove_attempt_files(write_location(f"s3://{s3_bucket}/wh/t", "abc"),
                             roots=[f"s3://{s3_bucket}/wh"])
    assert sorted(moto_server.keys(s3_bucket)) == sorted(keys)


@pytest.mark.parametrize("location", [
    "s3://{b}/wh/t/_percolake/abc/..", "s3://{b}/wh/t/_percolake/%2E%2E",
    "s3://{b}/wh/t/_percolake/abc%2F..%2F..", "s3://{b}/wh/t/_percolake/",
    "s3://{b}/wh/t/_percolake//abc", "s3://{b}/wh/t/_percolake/a*",
])
def test_an_object_store_location_that_is_not_exactly_one_attempt_prefix_is_refused(
        moto_server, s3_env, s3_bucket, location):
    keys = ["wh/t/_percolake/abc/part-0.parquet", "wh/t/_percolake/abcd/part-0.parquet"]
    for key in keys:
        moto_server.put(s3_bucket, key)
    with pytest.raises(UnsafeLocation):
        remove_attempt_files(location.format(b=s3_bucket), roots=[f"s3://{s3_bucket}/wh"])
    assert sorted(moto_server.keys(s3_bucket)) == sorted(keys)


# ---------------------------------------------------------------- through a real daemon


@pytest.fixture
def open_txn(daemon) -> Iterator[tuple]:  # noqa: ANN001 - conftest's Daemon
    """A pipeline with one open transaction on table ``t`` of the daemon's warehouse."""
    stub = daemon.stub
    pipeline = f"safety-{uuid.uuid4().hex[:8]}"
    registered = stub.RegisterPipeline(pb.RegisterPipelineRequest(pipeline_id=pipeline))
    table = f"{os.path.realpath(daemon.warehouse)}/t"
    opened = stub.OpenTransaction(pb.OpenTransactionRequest(
        pipeline_id=pipeline, batch_id=0, epoch=registered.epoch, tables=[table]))
    yield stub, opened.transaction.txn_id, registered.epoch, opened.locations[0].write_location


def _abort(stub, txn_id: str, epoch: int) -> None:  # noqa: ANN001
    reply = stub.AbortTransaction(pb.AbortTransactionRequest(txn_id=txn_id, epoch=epoch,
                                                             reason="test"))
    assert reply.transaction.state == pb.ABORTED


def test_a_daemon_aborting_a_transaction_unlinks_symlinks_and_keeps_their_targets(
        daemon, open_txn, outside):
    stub, txn_id, epoch, location = open_txn
    folder = Path(local_path(location))
    assert folder.name == txn_id and folder.parent.name == ATTEMPT_DIR
    (folder / "sub").mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"data")
    (folder / "file-link").symlink_to(outside / "precious")
    (folder / "dir-link").symlink_to(outside, target_is_directory=True)
    (folder / "sub" / "deep-link").symlink_to(outside / "deep", target_is_directory=True)
    _abort(stub, txn_id, epoch)
    assert not os.path.lexists(folder)
    assert folder.parent.is_dir()
    assert_intact(outside)


def _log_records(daemon) -> list[dict]:  # noqa: ANN001
    records = []
    for line in daemon.log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


def test_a_daemon_aborting_a_transaction_refuses_a_swapped_in_symlink_and_logs_it(
        daemon, open_txn, outside):
    stub, txn_id, epoch, location = open_txn
    folder = Path(local_path(location))
    (outside / ATTEMPT_DIR / txn_id).mkdir(parents=True)
    (outside / ATTEMPT_DIR / txn_id / "precious").write_bytes(b"keep me")
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    folder.parent.parent.rename(folder.parent.parent.with_name("t.moved"))
    folder.parent.parent.symlink_to(outside, target_is_directory=True)  # the table folder
    _abort(stub, txn_id, epoch)
    assert (outside / ATTEMPT_DIR / txn_id / "precious").read_bytes() == b"keep me"
    assert_intact(outside)
    refused = [r for r in _log_records(daemon)
               if r.get("msg") == "refused to delete an attempt folder outside the rules"]
    assert refused and refused[0]["txn_id"] == txn_id and refused[0]["level"] == "error"
    assert "symlink" in refused[0]["exc"]
    state = stub.GetTransaction(pb.GetTransactionRequest(txn_id=txn_id)).state
    assert state == pb.ABORTED and daemon.is_running()


def test_canonical_names_keep_symlinked_tables_out_of_the_warehouse(wh, outside):
    """A table named through a symlink is recorded by its real path: outside the roots it is
    refused before anything is written or deleted."""
    (wh / "alias").symlink_to(outside, target_is_directory=True)
    with pytest.raises(Exception, match="outside the warehouse roots"):
        Warehouse([str(wh)]).resolve(f"{wh}/alias/t")
    assert canonical_table_uri(f"{wh}/alias").startswith(f"file://{outside}")
