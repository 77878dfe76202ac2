"""The deletion vector descriptors of a table's files at one version, read from its Delta log.

Delta keys a logical file by its path *and* its deletion vector: a remove of a file that carries
one must carry the same descriptor, or the file stays in the table (docs/row-level-writes.md).
delta-rs does not show descriptors, so they are read here: the JSON entries from the version
down to the newest checkpoint at or below it (the newest action on a path decides), then that
checkpoint's add actions for the paths still undecided. Only tables whose protocol has deletion
vectors need this. Paths are the files' real relative paths (the log's, percent-decoded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow.fs as pafs

from percolake.errors import FailedPrecondition
from percolake.lake import storage
from percolake.lake.table_cache import read_entry
from percolake.lake.warehouse import is_object_store, local_path

DeletionVector = dict[str, Any]  # the log's descriptor: storageType, pathOrInlineDv, ...
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet")
_V2_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(?:parquet|json)")


def deletion_vectors(table_uri: str, version: int,
                     paths: Iterable[str] | None = None) -> dict[str, DeletionVector]:
    """The descriptors of the files of ``version`` that carry a deletion vector, by relative
    path; only among ``paths`` when given (files without one are left out).

    Raises:
        FailedPrecondition: the log cannot say (an entry missing and no checkpoint below it,
            a checkpoint kind not read here: v2 checkpoints with sidecars).
        StorageRefused, StorageUnavailable, StorageSettingsError: an object-store log that
            cannot be read now.
    """
    return {path: add.descriptor() for path, add in
            logged_adds(table_uri, version, paths).items() if add.deletion_vector}


class LoggedAdd(NamedTuple):
    """A file's add action at a version as the log holds it."""

    path: str  # as the log spells it (delta-spark leaves some characters unescaped)
    deletion_vector: DeletionVector | None

    def descriptor(self) -> DeletionVector | None:
        """The deletion vector's descriptor without the fields a checkpoint leaves null."""
        if not self.deletion_vector:
            return None
        return {k: v for k, v in self.deletion_vector.items() if v is not None}


def logged_adds(table_uri: str, version: int,
                paths: Iterable[str] | None = None) -> dict[str, LoggedAdd]:
    """The add actions of the files of ``version``, by relative path (percent-decoded); only
    among ``paths`` when given. Raises as ``deletion_vectors``."""
    wanted = None if paths is None else set(paths)
    decided: dict[str, LoggedAdd | None] = {}
    checkpoint = _newest_checkpoint(table_uri, version)
    floor = checkpoint[0] if checkpoint else -1
    for current in range(version, floor, -1):
        actions = _entry(table_uri, current)
        if actions is None:
            raise FailedPrecondition(
                f"table {table_uri}: Delta log entry {current} is missing and no checkpoint "
                f"covers it; the files of version {version} cannot be read")
        # One entry may remove a path and add it again with another vector (delta-spark's
        # DELETE: the logical file is the path and its vector): its add decides.
        in_entry: dict[str, LoggedAdd | None] = {}
        for action in actions:
            if "add" in action:
                add = action["add"]
                in_entry[unquote(add["path"])] = LoggedAdd(add["path"],
                                                           add.get("deletionVector"))
        for action in actions:
            if "remove" in action:
                in_entry.setdefault(unquote(action["remove"]["path"]), None)
        for path, add in in_entry.items():
            if path not in decided and (wanted is None or path in wanted):
                decided[path] = add
        if wanted is not None and wanted <= decided.keys():
            break
    else:
        if checkpoint is not None:
            for add in _checkpoint_adds(table_uri, checkpoint[1]):
                path = unquote(add.path)
                if path not in decided and (wanted is None or path in wanted):
                    decided[path] = add
    return {path: add for path, add in decided.items() if add is not None}


def _log_folder(table_uri: str) -> str:
    if is_object_store(table_uri):
        return f"{table_uri.rstrip('/')}/_delta_log"
    return f"{local_path(table_uri)}/_delta_log"


def _filesystem(table_uri: str) -> tuple[pafs.FileSystem, str]:
    folder = _log_folder(table_uri)
    if is_object_store(table_uri):
        return storage.s3_filesystem(), storage.arrow_path(folder)
    return pafs.LocalFileSystem(), folder


def _entry(table_uri: str, version: int) -> list[dict[str, Any]] | None:
    entry = read_entry(table_uri, version)
    if entry is None:
        return None
    return [json.loads(line) for line in entry.decode(errors="replace").splitlines()
            if line.strip()]


def _newest_checkpoint(table_uri: str, version: int) -> tuple[int, list[str]] | None:
    """The newest complete checkpoint at or below ``version``: its version and part files."""
    filesystem, folder = _filesystem(table_uri)
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except OSError as exc:
        if is_object_store(table_uri):
            raise storage.storage_error(exc, table_uri, "list the Delta log of") from None
        raise
    parts: dict[tuple[int, int], list[str]] = {}
    for info in infos:
        if _V2_CHECKPOINT.fullmatch(info.base_name) \
                and int(info.base_name[:20]) <= version:
            raise FailedPrecondition(
                f"table {table_uri} has v2 checkpoints, whose deletion vectors percolake does "
                "not read yet: write its row-level changes with delta-spark")
        match = _CHECKPOINT.fullmatch(info.base_name)
        if match and int(match.group(1)) <= version:
            of = int(match.group(3) or 1)
            parts.setdefault((int(match.group(1)), of), []).append(info.path)
    complete = [(v, files) for (v, of), files in parts.items() if len(files) == of]
    if not complete:
        return None
    return max(complete, key=lambda c: c[0])


def _checkpoint_adds(table_uri: str, files: list[str]) -> Iterable[LoggedAdd]:
    import pyarrow.dataset as pads  # here: it imports pandas (0.2 s of every process's start)

    filesystem, _ = _filesystem(table_uri)
    dataset = pads.dataset(files, format="parquet", filesystem=filesystem)
    if "add" not in dataset.schema.names:
        return
    for row in dataset.to_table(columns=["add"]).column("add").to_pylist():
        if row:
            yield LoggedAdd(row["path"], row.get("deletionVector"))
