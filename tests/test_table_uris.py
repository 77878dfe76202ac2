"""Table names (I11): canonicalisation is a fixed point, one physical folder has one name, what
cannot be represented is refused; cleanup deletes only a real attempt folder below a root."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from coordinator.core import CoordinatorConfig, TransactionCoordinator
from coordinator.store import MemoryStore
from percolake.errors import InvalidArgument, PermissionDenied
from percolake.lake.cleanup import remove_attempt_files
from percolake.lake.warehouse import (
    ATTEMPT_DIR,
    UnsafeLocation,
    Warehouse,
    canonical_table_uri,
    local_path,
    write_location,
)
from percolake.records import AddFileRecord, TableWriteRecord, WriteMode
from percolake.states import TxnState

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}'


@pytest.fixture
def wh(tmp_path: Path) -> Path:
    root = tmp_path / "wh"
    root.mkdir()
    return root


def attempt(table: str, txn_id: str) -> Path:
    """Creates one data file in the attempt folder of ``table``; returns the file."""
    folder = Path(local_path(write_location(table, txn_id)))
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"x")
    return folder / "part-0.parquet"


# ---------------------------------------------------------------- the scenarios of issue 13 item 1

def test_a_percent_and_two_hex_digits_in_a_table_path_is_refused_before_any_hold(wh):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(wh)]))
    (wh / "sales%2025").mkdir()
    (wh / "alias").symlink_to(wh / "sales%2025")
    for spelling in (f"{wh}/sales%2025", f"file://{wh}/sales%252025", f"{wh}/alias"):
        with pytest.raises(InvalidArgument, match="delta-rs"):
            core.open_transaction("p", 0, tables=[spelling])
    txn, _ = core.open_transaction("p", 0, tables=[f"{wh}/ok"])
    assert txn.attempt == 1 and list(txn.tables) == [canonical_table_uri(f"{wh}/ok")]
    with pytest.raises(InvalidArgument, match="delta-rs"):
        Warehouse([str(wh / "sales%2025")])
    literal = Warehouse([str(wh)]).resolve(f"{wh}/50% off")  # no escape: a literal '%'
    assert local_path(write_location(literal, "t1")) == f"{wh}/50% off/{ATTEMPT_DIR}/t1"
    assert Warehouse([str(wh)]).resolve(literal) == literal


def test_commit_with_release_unwritten_keeps_the_files_of_a_table_named_with_hash(wh):
    core = TransactionCoordinator(MemoryStore(), CoordinatorConfig([str(wh)]),
                                  applier=lambda *a, **k: 0)
    txn, _ = core.open_transaction("p", 0, tables=[f"{wh}/sales 25#1?"])
    [table] = txn.tables
    written = attempt(table, txn.txn_id)
    add = AddFileRecord(f"{ATTEMPT_DIR}/{txn.txn_id}/part-0.parquet", 1, {}, 0,
                        '{"numRecords":1}')
    done = core.commit(txn.txn_id, None, [table],
                       [TableWriteRecord(table, WriteMode.APPEND, (add,), SCHEMA)],
                       release_unwritten=True)
    assert done.state == TxnState.COMMITTED and list(done.tables) == [table]
    assert written.exists() and written.parent.parent.parent == wh / "sales 25#1?"


def test_an_encoded_slash_is_refused_so_one_folder_cannot_get_two_holds(wh):
    warehouse = Warehouse([str(wh)])
    for spelling in (f"file://{wh}/t%2Fx", f"file://{wh}/t%2fx", f"{wh}/t%2Fx"):
        with pytest.raises(InvalidArgument):
            warehouse.resolve(spelling)
    assert local_path(warehouse.resolve(f"{wh}/t/x")) == f"{wh}/t/x"


def test_a_fragment_or_query_is_refused_and_a_hash_in_a_plain_path_names_its_own_table(wh):
    warehouse = Warehouse([str(wh)])
    for spelling in (f"file://{wh}/t#1", f"file://{wh}/t?x=1", f"file://{wh}/t#"):
        with pytest.raises(InvalidArgument, match="query or fragment"):
            warehouse.resolve(spelling)
    hashed = warehouse.resolve(f"{wh}/t#1")
    assert hashed != warehouse.resolve(f"{wh}/t")
    assert local_path(write_location(hashed, "x")) == f"{wh}/t#1/{ATTEMPT_DIR}/x"


def test_a_table_name_cannot_reach_another_pipelines_attempt_folder(wh):
    victim_file = attempt(canonical_table_uri(f"{wh}/v"), "victim")
    warehouse = Warehouse([str(wh)])
    for spelling in (f"file://{wh}/v/%5Fpercolake/victim#", f"file://{wh}/v/%5Fpercolake/victim",
                     f"{wh}/v/%5Fpercolake/victim", f"{wh}/v/_percolake/victim"):
        with pytest.raises(InvalidArgument):
            warehouse.resolve(spelling)
    for old_record in (f"file://{wh}/v/%5Fpercolake/victim#/_percolake/x",
                       f"file://{wh}/v/_percolake/victim#/_percolake/x"):
        with pytest.raises(UnsafeLocation):
            remove_attempt_files(old_record, roots=warehouse.roots)
    assert victim_file.exists()


def test_a_symlink_plus_an_encoded_slash_cannot_leave_the_warehouse(wh, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (wh / "link").symlink_to(outside)
    warehouse = Warehouse([str(wh)])
    for spelling in (f"file://{wh}/link%2Fx", f"{wh}/link%2Fx"):
        with pytest.raises(InvalidArgument):
            warehouse.resolve(spelling)
    with pytest.raises(PermissionDenied):
        warehouse.resolve(f"{wh}/link/x")
    with pytest.raises(UnsafeLocation):  # a location recorded before the fix
        remove_attempt_files(f"file://{wh}/link%2Fx/_percolake/t1", roots=warehouse.roots)


def test_dot_dot_after_decoding_is_refused_and_cleanup_of_an_old_record_raises_a_named_error(
        wh):
    warehouse = Warehouse([str(wh)])
    for spelling in (f"file://{wh}/a%2F..%2Fb", f"file://{wh}/a/%2E%2E/b", f"{wh}/a/../b",
                     f"{wh}/a%2F..%2Fb"):
        with pytest.raises(InvalidArgument):
            warehouse.resolve(spelling)
    with pytest.raises(UnsafeLocation):
        remove_attempt_files(f"file://{wh}/a%2F..%2Fb/_percolake/t1", roots=warehouse.roots)


@pytest.mark.parametrize("spelling", [
    "file:///wh/a%zz", "file:///wh/a%", "file:///wh/a%2", "file:///wh/a%00", "/wh/a\x00b",
    "file:///wh/%FF", "file://host/wh/a", "hdfs://namenode/a", "wh/a", "file:wh/a", "", " ",
    "file://localhost", "file:///wh/a;b?c",
])
def test_names_that_cannot_be_represented_are_refused(spelling):
    with pytest.raises(InvalidArgument):
        canonical_table_uri(spelling)


# ---------------------------------------------------------------- fixed point, one name per folder

def test_two_spellings_of_one_folder_get_one_name(wh):
    (wh / "t").mkdir()
    (wh / "alias").symlink_to(wh / "t")
    spellings = [f"{wh}/t", f"{wh}/t/", f"{wh}//t", f"{wh}/./t", f"/{wh}/t", f"file://{wh}/t",
                 f"file://{wh}/t/", f"file://localhost{wh}/t", f"FILE://LOCALHOST{wh}/t",
                 f"file:{wh}/t", f"file:///{wh}/t", f"file://{wh}/%74", f"{wh}/alias",
                 f"file://{wh}/alias/"]
    names = {Warehouse([str(wh)]).resolve(s) for s in spellings}
    assert names == {f"file://{quote(str(wh))}/t"}


FRAGMENTS = [" ", "%", "%25", "%2F", "%2f", "%zz", "#", "?", "+", "é", "e\u0301", "日本", ":",
             ";", "=", "&", "@", "'", "~", "\\", "a"]


def refused_name(name: str) -> bool:
    """Names every spelling is refused for: '%' and two hex digits (delta-rs decodes them), a
    backslash (delta-rs reads it as a separator)."""
    return bool(re.search("%[0-9A-Fa-f]{2}", name)) or "\\" in name


def corpus() -> list[str]:
    """Folder names made of every pair of fragments, plus each fragment alone."""
    names = {a + b for a, b in itertools.product(FRAGMENTS, repeat=2)} | set(FRAGMENTS)
    return sorted(n for n in names if n not in (".", ".."))


def spellings_of(wh: Path, name: str) -> list[tuple[str, bool]]:
    """Spellings of the folder ``real/name``, each with whether it must name that folder (a
    URI with raw ``%`` may name another folder of the corpus, or be refused)."""
    real, alias = f"{wh}/real/{name}", f"{wh}/link/{name}"
    exact = [real, real + "/", alias, alias + "/", f"file://{quote(real)}",
             f"file://localhost{quote(real)}/", f"file:{quote(alias)}"]
    return [(s, True) for s in exact] + [(f"file://{quote(alias, safe='/%')}", False)]


def test_canonicalisation_is_a_fixed_point_with_one_name_per_folder_over_a_corpus(wh):
    (wh / "real").mkdir()
    (wh / "link").symlink_to(wh / "real")
    for name in corpus():
        (wh / "real" / name).mkdir()
    warehouse = Warehouse([str(wh)])
    names_of: dict[int, set[str]] = {}
    for name in corpus():
        for spelling, exact in spellings_of(wh, name):
            try:
                canonical = warehouse.resolve(spelling)
            except InvalidArgument:
                assert not exact or refused_name(name), spelling
                continue
            assert not re.search("%[0-9A-Fa-f]{2}", local_path(canonical)), spelling
            assert warehouse.resolve(canonical) == canonical, spelling
            assert canonical_table_uri(canonical) == canonical, spelling
            assert local_path(write_location(canonical, "t")) == \
                os.path.join(local_path(canonical), ATTEMPT_DIR, "t")
            if exact:
                assert os.path.samefile(local_path(canonical), wh / "real" / name), spelling
            if os.path.exists(local_path(canonical)):
                names_of.setdefault(os.stat(local_path(canonical)).st_ino, set()).add(canonical)
    assert all(len(names) == 1 for names in names_of.values()), \
        [n for n in names_of.values() if len(n) > 1]
    representable = [n for n in corpus() if not refused_name(n)]
    assert len(names_of) == len(representable)  # distinct folders, distinct names
    assert "e\u0301" in corpus() and "\u00e9" in corpus()  # NFD and NFC: two folders


# ---------------------------------------------------------------- cleanup on the real path

def test_cleanup_deletes_the_attempt_folder_and_tolerates_a_missing_one(wh):
    table = canonical_table_uri(f"{wh}/t")
    written = attempt(table, "t1")
    remove_attempt_files(write_location(table, "t1"), roots=[str(wh)])
    remove_attempt_files(write_location(table, "t1"), roots=[str(wh)])
    remove_attempt_files(write_location(table, "t1"))
    assert not written.parent.exists() and written.parent.parent.is_dir()


@pytest.mark.parametrize("relative", ["t", f"t/{ATTEMPT_DIR}", f"{ATTEMPT_DIR}/t1",
                                      f"v/{ATTEMPT_DIR}/victim/{ATTEMPT_DIR}/t1"])
def test_cleanup_refuses_what_is_not_an_attempt_folder_below_a_root_with_a_named_error(
        wh, relative):
    (wh / relative).mkdir(parents=True)
    (wh / relative / "keep").write_bytes(b"x")
    with pytest.raises(UnsafeLocation):
        remove_attempt_files(canonical_table_uri(f"{wh}/{relative}"), roots=[str(wh)])
    assert (wh / relative / "keep").exists()


def test_cleanup_with_roots_refuses_a_location_outside_every_root(wh, tmp_path):
    other = canonical_table_uri(f"{tmp_path}/other")
    written = attempt(other, "t1")
    with pytest.raises(UnsafeLocation, match="outside"):
        remove_attempt_files(write_location(other, "t1"), roots=[str(wh)])
    assert written.exists()


@pytest.mark.parametrize("swapped", ["t", f"t/{ATTEMPT_DIR}", f"t/{ATTEMPT_DIR}/t1"])
def test_cleanup_does_not_follow_a_symlink_swapped_in_after_the_name_was_checked(
        wh, tmp_path, swapped):
    table = Warehouse([str(wh)]).resolve(f"{wh}/t")
    attempt(table, "t1")
    outside = tmp_path / "outside"
    victim = outside / Path(f"t/{ATTEMPT_DIR}/t1").relative_to(swapped) / "precious"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"x")
    moved = wh / swapped
    moved.rename(tmp_path / "moved")
    moved.symlink_to(outside)
    for roots in ([str(wh)], None):
        with pytest.raises(UnsafeLocation, match="symlink"):
            remove_attempt_files(write_location(table, "t1"), roots=roots)
    assert victim.exists()


def test_cleanup_accepts_a_root_configured_through_a_symlink(wh, tmp_path):
    (tmp_path / "alias").symlink_to(wh)
    table = Warehouse([str(tmp_path / "alias")]).resolve(f"{tmp_path}/alias/t")
    written = attempt(table, "t1")
    remove_attempt_files(write_location(table, "t1"), roots=[str(tmp_path / "alias")])
    assert not written.exists()


@pytest.mark.parametrize("name", ["tab\tx", "nl\nx", "del\x7fx", "back\\slash", "lrm\u200ex",
                                  "para\u2029x", "nbsp\u00a0x"])
def test_control_invisible_and_backslash_characters_are_refused(wh, name):
    for spelling in (f"{wh}/{name}", f"file://{quote(str(wh))}/{quote(name)}"):
        with pytest.raises(InvalidArgument, match="not allowed in a table path"):
            Warehouse([str(wh)]).resolve(spelling)


@pytest.mark.parametrize("name", ["back\\slash", "ctl\x01x", "zw\u200bx"])
def test_a_symlink_to_a_folder_with_a_refused_name_is_refused(wh, name):
    """The character rule applies to the real path too, so canonical names stay a fixed point
    (a name that resolves to a refused folder would be held but never committed or cleaned)."""
    (wh / name).mkdir()
    (wh / "alias").symlink_to(wh / name)
    with pytest.raises(InvalidArgument, match="not allowed in a table path"):
        Warehouse([str(wh)]).resolve(f"{wh}/alias")
