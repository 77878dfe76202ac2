"""A Delta commit written as its log entry: every append (delta-rs's commit rebuilds the state
of every live file, so its cost grows with the table: ``percolake.lake.kept_table``), and the
commits delta-rs cannot make: data files together with a ``metaData`` action (schema
evolution; delta-rs's ``create_write_transaction`` changes the metadata only in overwrite mode,
where it also removes files of its own choosing),
and row-level writes (delta-rs names every commit of pre-written files ``WRITE``, writes
``dataChange=true`` and cannot put a deletion vector on a remove), which must read in
``DESCRIBE HISTORY`` as delta-spark's own MERGE, UPDATE, DELETE or OPTIMIZE.

The entry is the next version's ``_delta_log/<version>.json``, written only if absent, as every
Delta writer commits: a local file is linked into place (fails if the name exists), an object
with ``If-None-Match: *``. Losing that race returns False: the caller re-reads the table and
checks again, as after delta-rs's CommitFailedError.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from percolake.lake import storage
from percolake.lake.warehouse import is_object_store, local_path
from percolake.records import AddFileRecord

ENGINE = "percolake (Delta log entry)"
# what Delta's log keeps unencoded in a path: RFC 3986 path characters, as delta-rs writes them
_PATH_SAFE = "/!$&'()*+,;=:@-._~"


def log_path(path: str) -> str:
    """A data file's relative path as the log stores it (a URI path: percent-encoded)."""
    return quote(path, safe=_PATH_SAFE)


def add_action(add: AddFileRecord, *, data_change: bool = True,
               deletion_vector: Mapping[str, Any] | None = None,
               spelled: str | None = None) -> dict[str, Any]:
    """An add; with ``deletion_vector`` the file's rows that vector names are deleted;
    ``spelled``: the path as the log already spells the file (else ``log_path``)."""
    action = {"path": spelled or log_path(add.path), "partitionValues": dict(add.partition_values),
              "size": add.size, "modificationTime": add.modification_time,
              "dataChange": data_change, "stats": add.stats or "{}"}
    if deletion_vector:
        action["deletionVector"] = dict(deletion_vector)
    return {"add": action}


def remove_action(path: str, size: int, partition_values: Mapping[str, str | None],
                  now_ms: int, *, data_change: bool = True,
                  deletion_vector: Mapping[str, Any] | None = None,
                  spelled: str | None = None) -> dict[str, Any]:
    """A remove; a file that carries a deletion vector is only removed by a remove carrying
    the same descriptor (Delta keys a logical file by its path and deletion vector), and only
    by the path as its add spells it: ``spelled`` (else ``log_path``)."""
    remove: dict[str, Any] = {
        "path": spelled or log_path(path), "dataChange": data_change, "deletionTimestamp": now_ms,
        "extendedFileMetadata": True, "partitionValues": dict(partition_values), "size": size}
    if deletion_vector:
        remove["deletionVector"] = dict(deletion_vector)
    return {"remove": remove}


def change_action(path: str, size: int,
                  partition_values: Mapping[str, str | None]) -> dict[str, Any]:
    """A ``cdc`` action: a change data file of the commit (the changed rows with
    ``_change_type``), read by change data feed readers instead of its adds and removes."""
    return {"cdc": {"path": log_path(path), "partitionValues": dict(partition_values),
                    "size": size, "dataChange": False}}


def app_transaction_action(app_id: str, version: int, now_ms: int) -> dict[str, Any]:
    """The ``txn`` action that makes a replay of the commit find it already applied."""
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}}


def metadata_action(metadata: Any, schema_json: str,
                    configuration: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The table's ``metaData`` (delta-rs's ``DeltaTable.metadata()``) with ``schema_json``:
    the same table id, partitioning, configuration (or ``configuration``) and creation
    time."""
    action: dict[str, Any] = {
        "id": metadata.id, "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_json, "partitionColumns": list(metadata.partition_columns),
        "configuration": dict(metadata.configuration if configuration is None
                              else configuration),
        "createdTime": metadata.created_time}
    if metadata.name is not None:
        action["name"] = metadata.name
    if metadata.description is not None:
        action["description"] = metadata.description
    return {"metaData": action}


def commit_info(mode: str, partition_by: list[str], tags: Mapping[str, object],
                now_ms: int, *, merge_schema: bool = False) -> dict[str, Any]:
    """The ``commitInfo`` of a write: ``tags`` at its top level, as delta-rs's custom
    metadata; ``merge_schema`` adds ``canMergeSchema``, as delta-spark's ``mergeSchema``
    write does."""
    parameters: dict[str, Any] = {"mode": mode, "partitionBy": json.dumps(partition_by)}
    if merge_schema:
        parameters["canMergeSchema"] = True  # a JSON boolean, as delta-spark writes it
    return operation_commit_info("WRITE", parameters, tags, now_ms)


def operation_commit_info(operation: str, parameters: Mapping[str, object],
                          tags: Mapping[str, object], now_ms: int,
                          **fields: object) -> dict[str, Any]:
    """The ``commitInfo`` of ``operation`` (what ``DESCRIBE HISTORY`` shows): its
    ``operationParameters``, Delta's other commitInfo ``fields`` (``readVersion``,
    ``operationMetrics``, ...) and ``tags`` (percolake's) at its top level."""
    return {"commitInfo": {"timestamp": now_ms, "operation": operation,
                           "operationParameters": dict(parameters), **fields,
                           "engineInfo": ENGINE, **tags}}


def entry_bytes(actions: list[dict[str, Any]]) -> bytes:
    """A log entry as ``put_entry`` stores it: one compact JSON object per line."""
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()


def put_entry(table_uri: str, version: int, actions: list[dict[str, Any]] | bytes) -> bool:
    """Writes the log entry of ``version`` unless one exists; False if one does. ``actions``
    may come already encoded (``entry_bytes``)."""
    text = actions if isinstance(actions, bytes) else entry_bytes(actions)
    if is_object_store(table_uri):
        return storage.put_object_if_absent(
            f"{table_uri.rstrip('/')}/_delta_log/{version:020d}.json", text)
    folder = f"{local_path(table_uri)}/_delta_log"
    temporary = f"{folder}/.{version:020d}.json.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as entry:
        entry.write(text)
        entry.flush()
        os.fsync(entry.fileno())
    try:
        os.link(temporary, f"{folder}/{version:020d}.json")  # fails if the version exists
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    return True


def now_ms() -> int:
    return int(time.time() * 1000)
