"""Model-based test of the row-level conflict rules (percolake/lake/conflicts.py) over any
interleaving of outside commits after a row-level write read its table.

A model table maps each data file to the rows it holds. A row-level write reads it at one
version and replaces some of its files. Outside writers then append, delete, rearrange
(OPTIMIZE: dataChange=false) or change the metadata, and the write's own commit may be among
them. The properties:
- before the commit point a write is let through only if no outside commit changed data or
  metadata since its read (WriteSerializable, conservatively: the whole table counts as read);
- after the commit point (``committed=True``) a write is let through only if applying it now
  gives exactly the rows it computed plus the rows every outside commit kept: no row lost,
  none doubled.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from percolake.lake.conflicts import conflict_since_read
from percolake.lake.delta_commit import TXN_ID_KEY
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode

OWN_TXN = "own-txn"


class RowLevelConflicts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="conflict-model-"))
        (self.root / "_delta_log").mkdir()
        self.table = canonical_table_uri(str(self.root))
        self.names = (f"f{n}.parquet" for n in itertools.count())
        self.rows = itertools.count()
        self.files: dict[str, frozenset[int]] = {}  # the table now: file -> its rows
        self.version = -1
        self.outside_data_change = False  # since the read: any outside data or metadata change
        self.lost_by_rearranging = False  # an outside rearrangement removed a replaced file
        self.own_committed = False

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _commit(self, actions: list[dict], txn_id: str = "outside") -> None:
        self.version += 1
        entry = [{"commitInfo": {"operation": "WRITE", TXN_ID_KEY: txn_id}}, *actions]
        (self.root / "_delta_log" / f"{self.version:020d}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in entry))

    def _add(self, rows: frozenset[int], data_change: bool = True) -> dict:
        name = next(self.names)
        self.files[name] = rows
        return {"add": {"path": name, "size": 1, "partitionValues": {},
                        "dataChange": data_change}}

    def _remove(self, name: str, data_change: bool = True) -> dict:
        del self.files[name]
        return {"remove": {"path": name, "dataChange": data_change}}

    def _new_rows(self, n: int) -> frozenset[int]:
        return frozenset(next(self.rows) for _ in range(n))

    @initialize(files=st.integers(1, 4), replaced=st.integers(0, 3))
    def read_and_compute(self, files: int, replaced: int) -> None:
        self._commit([self._add(self._new_rows(2)) for _ in range(files)])
        self.read_files = dict(self.files)
        self.read_version = self.version
        gone = sorted(self.files)[:min(replaced, files)]
        self.replaced = set(gone)
        self.new_rows = self._new_rows(2)  # the rewrite's rows, in one new file
        self.write = TableWriteRecord(
            self.table, WriteMode.ROW_LEVEL, (AddFileRecord("new.parquet", 1),), "{}",
            remove_files=tuple(RemoveFileRecord(p, 1) for p in gone),
            read_version=self.read_version, operation="MERGE")

    @rule(n=st.integers(1, 3))
    def outside_append(self, n: int) -> None:
        self._commit([self._add(self._new_rows(n))])
        self.outside_data_change = True

    @rule(pick=st.integers(0, 10))
    def outside_delete(self, pick: int) -> None:
        if self.files:
            name = sorted(self.files)[pick % len(self.files)]
            self._commit([self._remove(name)])
            self.outside_data_change = True

    @rule(pick=st.integers(0, 10), width=st.integers(1, 3))
    def outside_optimize(self, pick: int, width: int) -> None:
        names = sorted(self.files)
        if not names:
            return
        chosen = names[pick % len(names):][:width]
        rows = frozenset().union(*(self.files[n] for n in chosen))
        self.lost_by_rearranging |= bool(set(chosen) & self.replaced)
        self._commit([*(self._remove(n, data_change=False) for n in chosen),
                      self._add(rows, data_change=False)])

    @rule()
    def outside_metadata_change(self) -> None:
        self._commit([{"metaData": {"id": "t", "schemaString": "{}"}}])
        self.outside_data_change = True

    @rule()
    def own_commit_lands(self) -> None:
        if not self.own_committed:
            self.own_committed = True
            self._commit([{"remove": {"path": p, "dataChange": True}} for p in self.replaced]
                         + [{"add": {"path": "own.parquet", "size": 1, "dataChange": True}}],
                         txn_id=OWN_TXN)
            for p in self.replaced:
                self.files.pop(p, None)

    @invariant()
    def before_the_commit_point_only_an_untouched_table_passes(self) -> None:
        if self.own_committed:
            return  # the pre-commit check runs before the write's own commit exists
        # conservative: any outside commit since the read, a rearrangement too, conflicts
        assert (conflict_since_read(self.write) is None) == (self.version == self.read_version)

    @invariant()
    def after_the_commit_point_a_passed_apply_is_exact(self) -> None:
        if self.own_committed:
            return
        if conflict_since_read(self.write, own_txn_id=OWN_TXN, committed=True) is not None:
            assert self.outside_data_change or self.lost_by_rearranging
            return
        assert all(p in self.files for p in self.replaced), "a replaced file went elsewhere"
        applied = [r for p, rows in self.files.items() if p not in self.replaced for r in rows]
        applied += list(self.new_rows)
        expected = [r for p, rows in self.read_files.items() if p not in self.replaced
                    for r in rows] + list(self.new_rows)
        assert sorted(applied) == sorted(expected)


RowLevelConflicts.TestCase.settings = settings(max_examples=150, stateful_step_count=20,
                                               deadline=None, derandomize=True)
test_row_level_conflicts = RowLevelConflicts.TestCase
