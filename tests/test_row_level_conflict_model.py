"""Model-based test of the row-level conflict rules (percolake/lake/conflicts.py) over any
interleaving of outside commits after a row-level write read its table.

A model table, partitioned by ``p``, maps each data file to its partition and the rows it holds
(each row a unique id). A row-level write reads it at one version, with a read predicate (one
partition, two, or the whole table), under WriteSerializable or Serializable (or, for an
OPTIMIZE, SnapshotIsolation), and replaces some of the files it read. Outside writers then
commit: blind appends, appends that are not blind, rewrites (an outside MERGE: a file removed,
some of its rows kept and new ones added), deletes, OPTIMIZEs (``dataChange=false``) and
metadata changes; the write's own commit may be among them. The model decides each commit
by Delta's rules (WriteSerializable: a blind append never conflicts unless the write changes the
metadata; added data conflicts if it lies in a partition the write read; a removed file
conflicts if the write read it), independently of the code. The properties:

- before the commit point the code lets a write through exactly when the model finds no
  conflicting commit since its read;
- after the commit point (``committed=True``) the code lets through at least what it lets through
  before, and a write it lets through is applied exactly: every file it removes is still in the
  table (no row lost, none doubled), and no row it should have seen arrived in what it read.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from percolake.lake.conflicts import conflict_since_read
from percolake.lake.delta_commit import TXN_ID_KEY
from percolake.lake.read_set import SERIALIZABLE, WRITE_SERIALIZABLE, ReadSet
from percolake.lake.warehouse import canonical_table_uri
from percolake.records import AddFileRecord, RemoveFileRecord, TableWriteRecord, WriteMode

OWN_TXN = "own-txn"
PARTITIONS = (0, 1, 2)
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "p", "type": "integer", "nullable": True, "metadata": {}}]})


def predicate_of(region: frozenset[int]) -> object:
    """The read predicate selecting the partitions ``region``, as the Spark side writes it."""
    if region == frozenset(PARTITIONS):
        return True
    if len(region) == 1:
        return {"column": "p", "op": "=", "value": str(next(iter(region)))}
    return {"column": "p", "op": "in", "values": sorted(str(p) for p in region)}


class RowLevelConflicts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="conflict-model-"))
        (self.root / "_delta_log").mkdir()
        self.table = canonical_table_uri(str(self.root))
        self.names = (f"f{n}.parquet" for n in itertools.count())
        self.rows = itertools.count()
        self.files: dict[str, tuple[int, frozenset[int]]] = {}  # now: file -> (p, its rows)
        self.version = -1
        self.blind_rows: set[int] = set()  # rows blind appends added since the read
        self.model_conflict = ""  # the first commit the model finds conflicting
        self.own_committed = False

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ the log

    def _commit(self, actions: list[dict], txn_id: str = "outside", blind: bool = False,
                operation: str = "WRITE") -> None:
        self.version += 1
        info = {"operation": operation, TXN_ID_KEY: txn_id, "isBlindAppend": blind}
        (self.root / "_delta_log" / f"{self.version:020d}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in [{"commitInfo": info}, *actions]))

    def _add(self, partition: int, rows: frozenset[int], data_change: bool = True) -> dict:
        name = next(self.names)
        self.files[name] = (partition, rows)
        return {"add": {"path": name, "size": 1, "partitionValues": {"p": str(partition)},
                        "dataChange": data_change}}

    def _remove(self, name: str, data_change: bool = True) -> dict:
        partition, _ = self.files.pop(name)
        return {"remove": {"path": name, "dataChange": data_change,
                           "partitionValues": {"p": str(partition)}}}

    def _new_rows(self, n: int) -> frozenset[int]:
        return frozenset(next(self.rows) for _ in range(n))

    def _pick(self, pick: int) -> str | None:
        names = sorted(self.files)
        return names[pick % len(names)] if names else None

    # ------------------------------------------------------------------ the model's rules

    def _judge(self, what: str, added: list[int], removed: list[str],
               blind: bool = False, data_change: bool = True) -> None:
        """Delta's rules, from the model's own state: ``added`` are the partitions of the
        files the commit adds, ``removed`` the files it removes."""
        if self.model_conflict:
            return
        if any(name in self.read_files for name in removed):
            self.model_conflict = f"{what} removed a file the write read"
        elif (data_change and self.isolation != "SnapshotIsolation"
              and not (blind and not self.blind_appends_conflict)
              and any(p in self.region for p in added)):
            self.model_conflict = f"{what} added data where the write read"

    # ------------------------------------------------------------------ the write

    @initialize(layout=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=5),
                region=st.sets(st.sampled_from(PARTITIONS[::-1]), min_size=1),
                replaced=st.integers(0, 3), kind=st.sampled_from(["MERGE", "MERGE", "OPTIMIZE"]),
                serializable=st.booleans(), evolves=st.booleans())
    def read_and_compute(self, layout: list[int], region: set[int], replaced: int, kind: str,
                         serializable: bool, evolves: bool) -> None:
        self._commit([self._add(p, self._new_rows(2)) for p in layout])
        self.read_version = self.version
        self.region = frozenset(region)
        self.read_rows = {r for p, rows in self.files.values() if p in self.region for r in rows}
        selected = sorted(n for n, (p, _) in self.files.items() if p in self.region)
        self.read_files = set(selected)
        self.data_change = kind == "MERGE"
        if not self.data_change:  # an OPTIMIZE compacts files of one partition
            first = self.files[selected[0]][0] if selected else None
            selected = [n for n in selected if self.files[n][0] == first]
        self.replaced = {n: self.files[n] for n in selected[:replaced]}
        self.isolation = ("SnapshotIsolation" if not self.data_change
                          else SERIALIZABLE if serializable else WRITE_SERIALIZABLE)
        self.evolves = evolves and self.data_change
        self.blind_appends_conflict = serializable or self.evolves
        if self.data_change:
            self.new_rows = self._new_rows(2)  # the rewrite's rows, in one new file
        else:
            self.new_rows = frozenset().union(*(rows for _, rows in self.replaced.values()))
        partition = next(iter(self.replaced.values()))[0] if self.replaced else min(region)
        self.write = TableWriteRecord(
            self.table, WriteMode.ROW_LEVEL,
            (AddFileRecord("new.parquet", 1, {"p": str(partition)}),), SCHEMA, ("p",),
            remove_files=tuple(RemoveFileRecord(n, 1, {"p": str(p)})
                               for n, (p, _) in self.replaced.items()),
            merge_schema=self.evolves, read_version=self.read_version, operation=kind,
            data_change=self.data_change,
            read_set=ReadSet(SERIALIZABLE if serializable else WRITE_SERIALIZABLE,
                             predicate_of(self.region)).to_json())

    # ------------------------------------------------------------------ outside commits

    @rule(partition=st.sampled_from(PARTITIONS), n=st.integers(1, 3),
          blind=st.sampled_from([True, False]))
    def outside_append(self, partition: int, n: int, blind: bool) -> None:
        """A blind append (delta-spark's, isBlindAppend=true) or an append that read the
        table (delta-rs writes no isBlindAppend)."""
        rows = self._new_rows(n)
        self._judge("an append", [partition], [], blind=blind)
        self._commit([self._add(partition, rows)], blind=blind)
        if blind:
            self.blind_rows |= rows

    @rule(pick=st.integers(0, 10), kept=st.integers(0, 2), new=st.integers(0, 2))
    def outside_rewrite(self, pick: int, kept: int, new: int) -> None:
        """An outside MERGE or UPDATE: a file replaced by one in its partition holding some
        of its rows and new ones."""
        name = self._pick(pick)
        if name is None:
            return
        partition, rows = self.files[name]
        self._judge("a rewrite", [partition], [name])
        self._commit([self._remove(name),
                      self._add(partition, frozenset(sorted(rows)[:kept]) | self._new_rows(new))],
                     operation="MERGE")

    @rule(pick=st.integers(0, 10))
    def outside_delete(self, pick: int) -> None:
        name = self._pick(pick)
        if name is not None:
            self._judge("a delete", [], [name])
            self._commit([self._remove(name)], operation="DELETE")

    @rule(partition=st.sampled_from(PARTITIONS), start=st.integers(0, 3),
          width=st.integers(1, 3))
    def outside_optimize(self, partition: int, start: int, width: int) -> None:
        names = sorted(n for n, (p, _) in self.files.items() if p == partition)
        if not names:
            return
        chosen = names[start % len(names):][:width]
        rows = frozenset().union(*(self.files[n][1] for n in chosen))
        self._judge("an OPTIMIZE", [partition], chosen, data_change=False)
        self._commit([*(self._remove(n, data_change=False) for n in chosen),
                      self._add(partition, rows, data_change=False)], operation="OPTIMIZE")

    @rule(metadata=st.booleans())
    def outside_commit_without_files(self, metadata: bool) -> None:
        """A metadata change (conflicts), or a commit of no file (does not)."""
        if metadata:
            self.model_conflict = self.model_conflict or "a metadata change"
        self._commit([{"metaData": {"id": "t", "schemaString": SCHEMA,
                                    "partitionColumns": ["p"]}}] if metadata else [])

    @rule()
    def own_commit_lands(self) -> None:
        if not self.own_committed:
            self.own_committed = True
            self._commit([{"remove": {"path": n, "dataChange": self.data_change}}
                          for n in self.replaced if n in self.files]
                         + [{"add": {"path": "own.parquet", "size": 1,
                                     "dataChange": self.data_change}}], txn_id=OWN_TXN)
            for name in self.replaced:
                self.files.pop(name, None)

    # ------------------------------------------------------------------ the properties

    @invariant()
    def before_the_commit_point_exactly_the_non_conflicting_histories_pass(self) -> None:
        if self.own_committed:
            return  # the pre-commit check runs before the write's own commit exists
        problem = conflict_since_read(self.write)
        assert (problem is None) == (not self.model_conflict), (problem, self.model_conflict)

    @invariant()
    def after_the_commit_point_a_passed_apply_is_exact(self) -> None:
        if self.own_committed:
            return
        problem = conflict_since_read(self.write, own_txn_id=OWN_TXN, committed=True)
        if problem is not None:
            assert self.model_conflict, f"refused after the commit point only: {problem}"
            return
        assert all(self.files.get(n) == f for n, f in self.replaced.items()), \
            "a file the write removes is gone or changed: its remove would miss rows"
        kept = Counter(r for n, (_, rows) in self.files.items() if n not in self.replaced
                       for r in rows)
        applied = kept + Counter(self.new_rows)
        assert max(applied.values(), default=1) == 1, "a row would be in the table twice"
        if self.data_change:
            region_now = {r for p, rows in self.files.values() if p in self.region
                          for r in rows}
            unseen = region_now - self.read_rows - (
                set() if self.blind_appends_conflict else self.blind_rows)
            assert not unseen, f"rows {unseen} arrived where the write read, unseen by it"


RowLevelConflicts.TestCase.settings = settings(max_examples=300, stateful_step_count=12,
                                               deadline=None, derandomize=True)
test_row_level_conflicts = RowLevelConflicts.TestCase
