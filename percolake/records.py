"""Plain records the coordinator stores: pipelines, transactions and their table writes.

These are the durable state. They carry no behaviour beyond (de)serialisation, so the store,
the core, the Delta applier and the gRPC codec all speak the same types.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_string  # what json.dumps(str) gives
from typing import Any

from percolake.states import TxnState


class WriteMode(enum.Enum):
    APPEND = "append"
    OVERWRITE = "overwrite"
    OVERWRITE_PARTITIONS = "overwrite_partitions"
    ROW_LEVEL = "row_level"  # MERGE, UPDATE, DELETE: explicit removes beside the adds


PartitionValues = dict[str, "str | None"]


@dataclass(frozen=True)
class AddFileRecord:
    """One data file of a Delta add action; ``path`` is relative to the table root."""

    path: str
    size: int
    partition_values: PartitionValues = field(default_factory=dict)
    modification_time: int = 0
    stats: str = ""

    def row_count(self) -> int:
        if not self.stats:
            return 0
        return int(json.loads(self.stats).get("numRecords", 0))


@dataclass(frozen=True)
class RemoveFileRecord:
    """One data file a row-level write removes; ``path`` is relative to the table root."""

    path: str
    size: int
    partition_values: PartitionValues = field(default_factory=dict)


@dataclass(frozen=True)
class ChangeFileRecord:
    """One change data file (Delta's ``cdc`` action) a row-level write adds to a table with the
    change data feed: the changed rows with ``_change_type``; ``path`` is relative to the table
    root (docs/row-level-writes.md, Change data feed)."""

    path: str
    size: int
    partition_values: PartitionValues = field(default_factory=dict)


@dataclass(frozen=True)
class DeletionVectorRecord:
    """A data file of the table a row-level write keeps with rows deleted by a deletion vector
    (docs/row-level-writes.md, Deletion vectors): the commit removes the file as it was (it is
    also in ``remove_files``) and adds it again with this vector, stored in the attempt's
    folder; ``path`` and ``vector_path`` are relative to the table root."""

    path: str
    vector_path: str  # .../deletion_vector_<uuid>.bin under _percolake/<txn_id>/
    vector_file_size: int  # bytes of the vector file (checked before the commit point)
    offset: int
    size_in_bytes: int
    cardinality: int  # every row it deletes, the file's earlier vector's included
    modification_time: int = 0  # the data file's, unchanged
    stats: str = ""  # the data file's statistics, tightBounds false


@dataclass(frozen=True)
class TableWriteRecord:
    """The full write intent of one table: enough to finish its Delta commit alone."""

    table: str
    mode: WriteMode
    add_files: tuple[AddFileRecord, ...]
    schema_json: str
    partition_by: tuple[str, ...] = ()
    replace_partitions: tuple[PartitionValues, ...] = ()
    # the write may add the columns of schema_json the table lacks (docs/schema-evolution.md)
    merge_schema: bool = False
    # the writer's Spark catalog name of the table (display only: tables are keyed by location)
    catalog_name: str = ""
    # ROW_LEVEL only (docs/row-level-writes.md): the files it replaces, the table version it
    # read (I12: checked against the log before the commit point and at the apply), and the
    # operations it composes ("MERGE", "UPDATE", "DELETE", comma-separated in call order) with
    # their Delta operation metrics (a JSON object) for the commitInfo.
    remove_files: tuple[RemoveFileRecord, ...] = ()
    read_version: int = -1
    operation: str = ""
    operation_metrics: str = ""
    # ROW_LEVEL only: False when the write only rearranges rows (OPTIMIZE: Delta's dataChange)
    data_change: bool = True
    # ROW_LEVEL only: the commit's Delta operationParameters (a JSON object of strings)
    operation_parameters: str = ""
    # ROW_LEVEL only, tables with delta.enableChangeDataFeed: the change data files the commit
    # names in its cdc actions (written into the attempt's folder like the add files)
    change_files: tuple[ChangeFileRecord, ...] = ()
    # ROW_LEVEL only: what the write read, for Delta's conflict rules (a JSON object,
    # percolake.lake.read_set.ReadSet; "" for the whole table under Serializable)
    read_set: str = ""
    # ROW_LEVEL only, tables with deletion vectors enabled: files kept with a new vector
    deletion_vectors: tuple[DeletionVectorRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        row_level = {} if self.mode != WriteMode.ROW_LEVEL else {
            "remove_files": [{"path": f.path, "size": f.size,
                              "partition_values": dict(f.partition_values)}
                             for f in self.remove_files],
            "read_version": self.read_version,
            "operation": self.operation,
            "operation_metrics": self.operation_metrics,
            "data_change": self.data_change,
            "operation_parameters": self.operation_parameters,
            # absent when empty: records written before it read the same
            **({"change_files": [{"path": f.path, "size": f.size,
                                  "partition_values": dict(f.partition_values)}
                                 for f in self.change_files]} if self.change_files else {}),
            **({"read_set": self.read_set} if self.read_set else {}),
            **({"deletion_vectors": [dataclasses.asdict(v) for v in self.deletion_vectors]}
               if self.deletion_vectors else {}),
        }
        data = {
            "table": self.table,
            "mode": self.mode.value,
            "add_files": [{"path": f.path, "size": f.size,
                           "partition_values": dict(f.partition_values),
                           "modification_time": f.modification_time, "stats": f.stats}
                          for f in self.add_files],
            "schema_json": self.schema_json,
            "partition_by": list(self.partition_by),
            "replace_partitions": [dict(p) for p in self.replace_partitions],
            **row_level,
        }
        if self.merge_schema:  # absent otherwise: records written before it read the same
            data["merge_schema"] = True
        if self.catalog_name:
            data["catalog_name"] = self.catalog_name
        return data

    @property
    def json_text(self) -> str:
        """``to_json`` serialised once: the record is immutable, and a transaction's record is
        written several times (declare, prewrite, commit, applied), so the largest part of it
        (the add actions) is encoded only once. Memoised in the instance without a lock
        (``functools.cached_property`` of Python 3.11 holds one lock for every instance while
        it computes, which made concurrent requests queue; two threads computing the same
        text at once store equal values)."""
        text = self.__dict__.get("_json_text")
        if text is None:
            text = self.__dict__["_json_text"] = json.dumps(self.to_json(), separators=(",", ":"))
        return text

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableWriteRecord:
        return cls(
            table=data["table"],
            mode=WriteMode(data["mode"]),
            add_files=tuple(AddFileRecord(**f) for f in data["add_files"]),
            schema_json=data["schema_json"],
            partition_by=tuple(data["partition_by"]),
            replace_partitions=tuple(dict(p) for p in data["replace_partitions"]),
            merge_schema=bool(data.get("merge_schema", False)),
            catalog_name=str(data.get("catalog_name", "")),
            remove_files=tuple(RemoveFileRecord(**f) for f in data.get("remove_files", ())),
            read_version=data.get("read_version", -1),
            operation=data.get("operation", ""),
            operation_metrics=data.get("operation_metrics", ""),
            data_change=bool(data.get("data_change", True)),
            operation_parameters=data.get("operation_parameters", ""),
            change_files=tuple(ChangeFileRecord(**f) for f in data.get("change_files", ())),
            read_set=data.get("read_set", ""),
            deletion_vectors=tuple(DeletionVectorRecord(**v)
                                   for v in data.get("deletion_vectors", ())),
        )

    def with_table(self, table: str) -> TableWriteRecord:
        """This intent under another name of its table (its canonical one), without
        ``dataclasses.replace``'s walk over every field: only the table's name differs, so
        the memoised row count stays and the encoding, which names the table, goes."""
        renamed = object.__new__(TableWriteRecord)
        renamed.__dict__.update(self.__dict__)
        renamed.__dict__.pop("_json_text", None)
        renamed.__dict__["table"] = table  # frozen: set as __init__ would
        return renamed

    def row_count(self) -> int:
        """The files' numRecords added up; every reply shows it: the stats are parsed once
        (memoised without a lock, as ``json_text``)."""
        rows = self.__dict__.get("_row_count")
        if rows is None:
            rows = self.__dict__["_row_count"] = sum(f.row_count() for f in self.add_files)
        return rows

    def remember_row_count(self, rows: int) -> None:
        """Primes ``row_count`` with the sum the coordinator's validation took from these very
        stats (numRecords of each file), so they are not parsed a second time."""
        self.__dict__["_row_count"] = rows


_ABANDONED = ',"abandoned":true'


@dataclass
class TableEntry:
    """A table taking part in a transaction: declared, then prewritten, then applied."""

    table: str
    write_location: str
    write: TableWriteRecord | None = None
    delta_version: int | None = None
    # an operator abandoned the write of this quarantined table: delta_version is then the
    # table's version at that choice, which holds none of the write (docs/row-level-writes.md)
    abandoned: bool = False

    @property
    def prewritten(self) -> bool:
        return self.write is not None

    @property
    def applied(self) -> bool:
        return self.delta_version is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "write_location": self.write_location,
            "write": self.write.to_json() if self.write else None,
            "delta_version": self.delta_version,
            **({"abandoned": True} if self.abandoned else {}),
        }

    def json_text(self) -> str:
        """``to_json`` serialised, reusing the write's cached encoding."""
        version = "null" if self.delta_version is None else int(self.delta_version)
        return (f'{{"table":{_json_string(self.table)},'
                f'"write_location":{_json_string(self.write_location)},'
                f'"write":{self.write.json_text if self.write else "null"},'
                f'"delta_version":{version}{_ABANDONED if self.abandoned else ""}}}')

    def copy(self) -> TableEntry:
        return TableEntry(self.table, self.write_location, self.write, self.delta_version,
                          self.abandoned)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableEntry:
        write = data.get("write")
        return cls(
            table=data["table"],
            write_location=data["write_location"],
            write=TableWriteRecord.from_json(write) if write else None,
            delta_version=data.get("delta_version"),
            abandoned=bool(data.get("abandoned", False)),
        )


@dataclass
class TxnRecord:
    """One attempt of the logical transaction (pipeline_id, generation, batch_id)."""

    txn_id: str
    pipeline_id: str
    generation: int
    batch_id: int
    attempt: int
    epoch: int
    query_id: str
    state: TxnState
    start_ts: int
    commit_ts: int = 0
    tables: dict[str, TableEntry] = field(default_factory=dict)
    abort_reason: str = ""
    created_ms: int = 0
    updated_ms: int = 0
    row_version: int = 0  # bumped by every durable update; the store's compare-and-set key
    principal: str = ""  # who opened it ("" without authentication): its owner for permissions
    # docs/topology.md: a downstream batch's input barrier (it read its sources' changes up to
    # it; 0 for a root batch), and a root batch's Spark source offsets (JSON, or "")
    input_barrier: int = 0
    source_offsets: str = ""

    def copy(self) -> TxnRecord:
        """An independent copy; the immutable write intents are shared, not re-encoded."""
        copied = object.__new__(type(self))  # the fields as they are: no __init__ to rerun
        copied.__dict__.update(self.__dict__)
        copied.tables = {name: entry.copy() for name, entry in self.tables.items()}
        return copied

    def tables_json(self) -> str:
        return "[" + ",".join(t.json_text() for t in self.tables.values()) + "]"

    def to_row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in _TXN_ROW_FIELDS}
        row["state"] = self.state.value
        row["tables"] = self.tables_json()
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TxnRecord:
        values = dict(row)
        values["state"] = TxnState(values["state"])
        entries = [TableEntry.from_json(t) for t in json.loads(values.pop("tables") or "[]")]
        return cls(**values, tables={e.table: e for e in entries})


_TXN_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(TxnRecord) if f.name != "tables")


@dataclass
class ResetRecord:
    from_generation: int
    to_generation: int
    reason: str
    reset_ms: int
    previous_query_id: str
    expected_generation: int | None = None
    bound_query_id: str = ""


@dataclass
class PipelineRecord:
    """A streaming query's identity: generation, the newest epoch and the bound query id."""

    pipeline_id: str
    generation: int = 0
    epoch: int = 0
    query_id: str = ""
    created_ms: int = 0
    last_commit_ms: int = 0
    resets: list[ResetRecord] = field(default_factory=list)
    row_version: int = 0
    # docs/topology.md: where the current generation's percolake input starts, and the
    # remembered PlanBarrier answer (for plan_generation, after plan_after: up to plan_barrier)
    start_barrier: int = 0
    plan_generation: int = -1
    plan_after: int = 0
    plan_barrier: int = 0

    def copy(self) -> PipelineRecord:
        """An independent copy (structural: no JSON round trip of the resets)."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        copied.resets = [dataclasses.replace(reset) for reset in self.resets]
        return copied

    @property
    def fenced_or_bound(self) -> bool:
        """True once a driver registered with an epoch or the pipeline bound a query id."""
        return self.epoch > 0 or bool(self.query_id)

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "resets"}
        row["resets"] = json.dumps([dataclasses.asdict(r) for r in self.resets])
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PipelineRecord:
        values = dict(row)
        resets = [ResetRecord(**r) for r in json.loads(values.pop("resets") or "[]")]
        return cls(**values, resets=resets)


def delta_app_id(pipeline_id: str, generation: int) -> str:
    """The Delta app transaction id of a pipeline generation; its version is the batch id."""
    return f"percolake:{pipeline_id}:g{generation}"


class QuarantineChoice(enum.Enum):
    """What an operator chose for a quarantined table's committed write (I10, I12)."""

    REAPPLY = "reapply"  # apply the write's files onto the table as it is now (checked safe)
    ABANDON = "abandon"  # never apply it: the table keeps none of this write's changes


# how an operator releases a quarantined table (the coordinator's CLI), as its errors and views say
RECOVERY_COMMAND = ("percolake-coordinator tables release-quarantine --table {table} "
                    "--txn {txn_id} --choice reapply|abandon --reason ...")


@dataclass
class QuarantineRecord:
    """A table whose committed row-level write cannot be applied as it read the table
    (docs/row-level-writes.md, "Quarantine"): refused for new commits until an operator
    chooses; the record keeps the choice, who made it, why and what it led to."""

    table: str
    txn_id: str
    reason: str
    quarantined_ms: int
    choice: QuarantineChoice | None = None
    chosen_by: str = ""
    chosen_ms: int = 0
    choice_reason: str = ""
    # REAPPLY: the table version the write is applied onto; ABANDON: the version the table
    # was at, which the transaction's entry then names (it holds none of the write)
    as_of_version: int = -1
    released_ms: int = 0  # 0 while the table is quarantined
    delta_version: int = -1  # REAPPLY: the Delta commit made

    @property
    def active(self) -> bool:
        return self.released_ms == 0

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["choice"] = self.choice.value if self.choice else ""
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QuarantineRecord:
        values = dict(row)
        values["choice"] = QuarantineChoice(values["choice"]) if values["choice"] else None
        return cls(**values)
