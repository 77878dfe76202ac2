"""Reading a local Delta table into Arrow so that the process can still exit cleanly.

``DeltaTable.to_pyarrow_table()`` scans through a Python filesystem (delta-rs's storage
handler), so the scan's read-ahead buffers are Python objects. Arrow's threads release them
after the call has returned; a thread that does so while the interpreter is finalizing needs
the GIL, CPython ends it with ``pthread_exit``, the unwind meets a ``noexcept`` C++ frame, and
the process aborts (``terminate called without an active exception``, status 134, instead of
its real status; apache/arrow#34314). Here the same fragments (partition values included) are
read through Arrow's native local filesystem: no Python object is left for Arrow's threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow
import pyarrow.fs as pafs
from deltalake import DeltaTable

from percolake.lake.warehouse import local_path


def read_delta_table(table: str, version: int | None = None,
                     columns: Sequence[str] | None = None) -> pyarrow.Table:
    """The rows of the local Delta table ``table`` (path or ``file://`` URI), at ``version``
    if given, with only ``columns`` if given."""
    path = local_path(table)
    delta = DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    files = pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    return delta.to_pyarrow_dataset(filesystem=files).to_table(
        columns=list(columns) if columns is not None else None)
