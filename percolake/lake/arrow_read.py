"""Reading a local Delta table into Arrow so that the process can still exit cleanly.

``DeltaTable.to_pyarrow_table()`` scans through a Python filesystem (delta-rs's storage
handler), so the scan's read-ahead buffers are Python objects. Arrow's threads release them
after the call has returned; a thread that does so while the interpreter is finalizing needs
the GIL, CPython ends it with ``pthread_exit``, the unwind meets a ``noexcept`` C++ frame, and
the process aborts (``terminate called without an active exception``, status 134, instead of
its real status; apache/arrow#34314). Here the same fragments (partition values included) are
read through Arrow's native local filesystem: no Python object is left for Arrow's threads.
An object-store table is read the same way through Arrow's native S3 filesystem, with the
settings of ``percolake.lake.storage``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow
import pyarrow.fs as pafs
from deltalake import DeltaTable

from percolake.lake import storage
from percolake.lake.warehouse import canonical_table_uri, is_object_store, local_path


def read_delta_table(table: str, version: int | None = None,
                     columns: Sequence[str] | None = None) -> pyarrow.Table:
    """The rows of the Delta table ``table`` (path, ``file://`` or ``s3://`` URI), at
    ``version`` if given, with only ``columns`` if given."""
    if is_object_store(table):
        uri = canonical_table_uri(table)
        options = storage.delta_storage_options(uri)
        delta = (DeltaTable(uri, version=version, storage_options=options)
                 if version is not None else DeltaTable(uri, storage_options=options))
        files = pafs.SubTreeFileSystem(storage.arrow_path(uri), storage.s3_filesystem())
        return delta.to_pyarrow_dataset(filesystem=files).to_table(
            columns=list(columns) if columns is not None else None)
    path = local_path(table)
    delta = DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    files = pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    return delta.to_pyarrow_dataset(filesystem=files).to_table(
        columns=list(columns) if columns is not None else None)
