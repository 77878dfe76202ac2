"""A micro-batch's source offsets from a Spark streaming checkpoint's offset log.

Spark writes ``<checkpoint>/offsets/<batch_id>`` before it runs the batch: a version line
(``v1``), the batch's metadata (JSON), then one line per source, that source's end offset
(JSON, or ``-`` for a source without one). The participant records them with the batch's commit
(``source_offsets``) so that a revision can say where a root pipeline restarts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow.fs as pafs

from percolake.errors import InvalidArgument
from percolake.lake import storage
from percolake.lake.warehouse import is_object_store, object_store_of, parse_local_path

log = logging.getLogger("percolake.participant")


def check_checkpoint_location(checkpoint: str) -> str:
    """``checkpoint`` if the offset log can be read there: an absolute local path, a
    ``file://`` URI or an object store URI (s3://, s3a://).

    Raises:
        ValueError: anything else (a relative path, another scheme), naming the argument.
    """
    if isinstance(checkpoint, str) and is_object_store(checkpoint):
        return checkpoint
    try:
        parse_local_path(checkpoint)
    except (InvalidArgument, TypeError, AttributeError):
        raise ValueError(
            "checkpoint_location must be the query's checkpointLocation as an absolute local "
            f"path, a file:// URI or an object store URI, got {checkpoint!r}") from None
    return checkpoint


def _location(checkpoint: str) -> tuple[pafs.FileSystem, str]:
    if is_object_store(checkpoint):
        store = object_store_of(checkpoint)
        assert store is not None
        uri = f"{store.scheme}://{checkpoint.partition('://')[2].rstrip('/')}"
        return storage.s3_filesystem(), storage.arrow_path(uri)
    path = checkpoint if checkpoint.startswith("/") else parse_local_path(checkpoint)
    return pafs.LocalFileSystem(), path.rstrip("/")


def batch_source_offsets(checkpoint: str, batch_id: int) -> str:
    """The JSON list of batch ``batch_id``'s source offsets (None for a source without one),
    or "" if the offset log has no such batch.

    Raises:
        ValueError: the entry is not a Spark offset log entry.
    """
    filesystem, root = _location(checkpoint)
    try:
        with filesystem.open_input_stream(f"{root}/offsets/{batch_id}") as stream:
            lines = stream.read().decode().splitlines()
    except FileNotFoundError:
        log.warning("no offset log entry %s/offsets/%s for the running batch: its source "
                    "offsets are not recorded (is checkpoint_location the query's "
                    "checkpointLocation?)", root, batch_id)
        return ""
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"{root}/offsets/{batch_id} is not a Spark offset log entry")
    offsets: list[Any] = [None if line.strip() == "-" else json.loads(line)
                          for line in lines[2:] if line.strip()]
    return json.dumps(offsets, separators=(",", ":"))
