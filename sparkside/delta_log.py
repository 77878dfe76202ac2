"""A Delta table's transaction log read with pyarrow only: no delta-rs, so it is safe in Spark's
forked Python workers (the percolake source's planner and executors).

What the percolake source needs of a log: the newest table schema (``metaData``), and the data
files one version added (its ``add`` actions). Log entries are ``_delta_log/%020d.json``; the
newest ``metaData`` is searched from the newest entry back to the last checkpoint, whose Parquet
file holds it when no later entry changed it. Local tables are read through Arrow's local
filesystem, ``s3://`` tables through Arrow's S3 filesystem with ``percolake.lake.storage``'s
settings (the environment's, as every other percolake client).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from percolake.lake import storage
from percolake.lake.warehouse import canonical_table_uri, is_object_store, local_path
from sparkside.errors import NotAppendOnly, TableNotWritten

_ENTRY = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.\d{10}\.\d{10})?\.parquet")
LOG_DIR = "_delta_log"


@dataclass(frozen=True)
class DataFile:
    """One data file an ``add`` action names: its filesystem path (local path or
    ``bucket/key``), size and partition values (as Delta writes them: strings or None)."""

    path: str
    size: int
    partition_values: tuple[tuple[str, str | None], ...]


def table_filesystem(canonical: str) -> tuple[pafs.FileSystem, str]:
    """Arrow's filesystem of a canonical table URI and the table root's path in it."""
    if is_object_store(canonical):
        return storage.s3_filesystem(), storage.arrow_path(canonical)
    return pafs.LocalFileSystem(), local_path(canonical)


class TableLog:
    """The Delta log of one table (a path, ``file://`` or ``s3://`` URI)."""

    def __init__(self, table: str) -> None:
        self.table = canonical_table_uri(table)
        self.filesystem, self.root = table_filesystem(self.table)
        self.log_dir = f"{self.root}/{LOG_DIR}"

    # ------------------------------------------------------------ log files

    def _listing(self) -> tuple[list[int], list[tuple[int, str]]]:
        """The versions of the JSON entries and the checkpoint files present, ascending."""
        infos = self.filesystem.get_file_info(pafs.FileSelector(self.log_dir,
                                                                allow_not_found=True))
        entries: list[int] = []
        checkpoints: list[tuple[int, str]] = []
        for info in infos:
            name = info.base_name
            if match := _ENTRY.fullmatch(name):
                entries.append(int(match.group(1)))
            elif match := _CHECKPOINT.fullmatch(name):
                checkpoints.append((int(match.group(1)), info.path))
        return sorted(entries), sorted(checkpoints)

    def entry(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of log entry ``version``, None if the entry does not exist."""
        name = f"{LOG_DIR}/{version:020d}.json"
        if is_object_store(self.table):  # one GET (Arrow's streams send a HEAD first)
            entry = storage.read_object(f"{self.table}/{name}")
            if entry is None:
                return None
            text = entry.decode()
        else:
            try:
                with self.filesystem.open_input_stream(f"{self.root}/{name}") as stream:
                    text = stream.read().decode()
            except FileNotFoundError:
                return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def latest_version(self) -> int | None:
        entries, checkpoints = self._listing()
        versions = entries + [v for v, _ in checkpoints]
        return max(versions) if versions else None

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        """The newest ``metaData`` action of the table.

        Raises:
            TableNotWritten: the table has no Delta commit yet.
        """
        entries, checkpoints = self._listing()
        if not entries and not checkpoints:
            raise TableNotWritten(
                f"table {self.table} has no Delta commit yet: the percolake source takes its "
                "schema from the table, so start the pipeline that writes it first")
        newest = max(entries + [v for v, _ in checkpoints])
        floor = checkpoints[-1][0] if checkpoints else -1
        for version in range(newest, floor, -1):
            actions = self.entry(version)
            if actions is None:
                raise TableNotWritten(f"table {self.table}: Delta log entry {version} is "
                                      "missing and no checkpoint covers it")
            found = [a["metaData"] for a in actions if "metaData" in a]
            if found:
                return found[-1]
        if checkpoints:
            paths = [p for v, p in checkpoints if v == floor]
            for path in paths:
                rows = pq.read_table(path, columns=["metaData"],
                                     filesystem=self.filesystem).column("metaData").to_pylist()
                found = [r for r in rows if r]
                if found:
                    return _checkpoint_metadata(found[-1])
        raise TableNotWritten(f"table {self.table} has no metaData action in its Delta log")

    def schema_json(self) -> str:
        """The table's newest schema (Delta's schema JSON, which Spark's StructType reads).

        Raises:
            TableNotWritten: no commit yet. NotAppendOnly: column mapping is on (its files'
                column names are not the schema's).
        """
        metadata = self.metadata()
        mode = (metadata.get("configuration") or {}).get("delta.columnMapping.mode", "none")
        if mode not in ("none", None):
            raise NotAppendOnly(f"table {self.table} uses Delta column mapping ({mode}); the "
                                "percolake source reads tables without it")
        return metadata["schemaString"]

    # ------------------------------------------------------------ data files

    def data_files(self, version: int) -> list[DataFile]:
        """The data files version ``version`` added.

        Raises:
            TableNotWritten: the log entry is gone (cleaned up) or never existed.
            NotAppendOnly: the version removed data (an overwrite, a delete, a merge): the
                source streams appended rows only.
        """
        actions = self.entry(version)
        if actions is None:
            raise TableNotWritten(f"table {self.table}: Delta log entry {version} does not "
                                  "exist (cleaned up?); its rows cannot be read any more")
        files: list[DataFile] = []
        for action in actions:
            remove = action.get("remove")
            if remove is not None and remove.get("dataChange", True):
                raise NotAppendOnly(
                    f"table {self.table}: version {version} removed data (an overwrite or a "
                    "delete); the percolake source streams appended rows only. Read a table "
                    "written by overwrite whole inside the batch with txn.read(table)")
            add = action.get("add")
            if add is None or not add.get("dataChange", True):
                continue
            if add.get("deletionVector"):
                raise NotAppendOnly(f"table {self.table}: version {version} adds a file with a "
                                    "deletion vector, which the percolake source cannot read")
            values = add.get("partitionValues") or {}
            files.append(DataFile(self._file_path(add["path"]), int(add.get("size", 0)),
                                  tuple(sorted(values.items()))))
        return files

    def _file_path(self, path: str) -> str:
        """The filesystem path of an add action's path (a relative or absolute URI)."""
        if "://" not in path and not path.startswith("file:"):
            return f"{self.root}/{unquote(path)}"
        canonical = canonical_table_uri(path)
        same_kind = is_object_store(canonical) == is_object_store(self.table)
        if not same_kind:
            raise NotAppendOnly(f"table {self.table}: data file {path} lies on another kind of "
                                "storage than the table")
        return table_filesystem(canonical)[1]


def _checkpoint_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``metaData`` struct as the JSON action reads (its maps are key/value
    lists in Arrow)."""
    configuration = row.get("configuration") or {}
    if isinstance(configuration, list):
        configuration = dict(configuration)
    return {**row, "configuration": configuration}
