"""Deleting the files of aborted attempts: only a recorded ``<table>/_percolake/<txn_id>``."""

from __future__ import annotations

import shutil
from pathlib import Path

from percolake.lake.warehouse import ATTEMPT_DIR, local_path


def remove_attempt_files(write_location: str) -> None:
    """Deletes one attempt's folder of data files; a missing folder is fine.

    Raises:
        AssertionError: the location is not an attempt folder (never delete anything else).
    """
    path = Path(local_path(write_location))
    assert path.parent.name == ATTEMPT_DIR, f"refusing to delete {path}: not an attempt folder"
    shutil.rmtree(path, ignore_errors=False) if path.exists() else None
