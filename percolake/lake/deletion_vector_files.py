"""Deletion vectors as Delta stores them, written: the inverse of ``percolake.lake.deleted_rows``.

Delta's format (PROTOCOL.md, "Deletion Vector Format"), as delta-spark writes it: a vector file
``deletion_vector_<uuid>.bin`` holds a version byte (1), then per vector its size (4 bytes,
big-endian), its data and the CRC-32 of the data (4 bytes, big-endian). The data is a
RoaringBitmapArray in its portable form: the magic number (4 bytes, little-endian), the number
of 32-bit bitmaps (8 bytes, little-endian), then for each high half of the 64-bit row indexes,
ascending from 0, that half (4 bytes) and the 32-bit Roaring bitmap of the low halves in
Roaring's portable serialization. The descriptor a file's ``add`` carries names the file by
storage type ``u``: ``pathOrInlineDv`` is a folder prefix relative to the table root followed by
the file's UUID in Z85 (20 characters), so delta-spark reads it at
``<table>/<prefix>/deletion_vector_<uuid>.bin``. percolake's prefix is the attempt's folder
(``_percolake/<txn_id>/op<N>``), so an aborted attempt's vector files go with it (I10).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from percolake.lake.deleted_rows import MAGIC, Z85
from percolake.records import DeletionVectorRecord

VECTOR_FILE_PREFIX = "deletion_vector_"
FORMAT_VERSION = b"\x01"
_NO_RUN_COOKIE = 12346
_ARRAY_LIMIT = 4096  # a container of more values is stored as a bitmap (Roaring's rule)
UUID_STORAGE = "u"


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ's base 85) of ``data``, a multiple of 4 bytes: each 4 (big-endian) as 5."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes multiples of 4 bytes, not {len(data)}")
    out = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], "big")
        chars = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chars.append(Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def vector_file_name(file_id: uuid.UUID) -> str:
    return f"{VECTOR_FILE_PREFIX}{file_id}.bin"


def portable_bitmap(low: np.ndarray) -> bytes:
    """A 32-bit Roaring bitmap of ``low`` (sorted, unique, < 2**32) in the portable
    serialization, without run containers: arrays up to 4096 values, bitmaps above."""
    keys, starts = np.unique((low >> 16).astype(np.uint32), return_index=True)
    ends = [*starts[1:], len(low)] if len(keys) else []
    header = bytearray(struct.pack("<II", _NO_RUN_COOKIE, len(keys)))
    bodies: list[bytes] = []
    for key, start, end in zip(keys, starts, ends, strict=True):
        values = (low[start:end] & 0xFFFF).astype(np.uint16)
        header += struct.pack("<HH", int(key), len(values) - 1)
        if len(values) > _ARRAY_LIMIT:
            bits = np.zeros(65536, np.uint8)
            bits[values] = 1
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
        else:
            bodies.append(values.astype("<u2").tobytes())
    offset = len(header) + 4 * len(keys)  # the containers start after their offsets
    for body in bodies:
        header += struct.pack("<I", offset)
        offset += len(body)
    return bytes(header) + b"".join(bodies)


def bitmap_array(rows: np.ndarray) -> bytes:
    """The portable RoaringBitmapArray of the row indexes ``rows`` (any order, non-negative;
    duplicates count once)."""
    values = np.unique(np.asarray(rows, dtype=np.int64))
    if len(values) and values[0] < 0:
        raise ValueError(f"a row index is never negative ({int(values[0])})")
    highs = (values >> 32).astype(np.int64)
    count = int(highs[-1]) + 1 if len(values) else 0
    out = bytearray(struct.pack("<iq", MAGIC, count))
    for high in range(count):  # every high half up to the largest, as delta-spark writes them
        low = values[highs == high] & 0xFFFFFFFF
        out += struct.pack("<I", high) + portable_bitmap(low)
    return bytes(out)


def vector_file(vectors: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """The content of a vector file holding ``vectors`` (each ``bitmap_array``'s bytes), and
    each vector's offset in it."""
    content = bytearray(FORMAT_VERSION)
    offsets = []
    for data in vectors:
        offsets.append(len(content))
        content += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    return bytes(content), offsets


def descriptor(prefix: str, file_id: uuid.UUID, offset: int, size: int,
               cardinality: int) -> dict[str, Any]:
    """The log's ``deletionVector`` of a vector stored at ``offset`` of the file ``file_id``
    under the table-relative folder ``prefix`` ('' for the table root)."""
    return {"storageType": UUID_STORAGE,
            "pathOrInlineDv": prefix.strip("/") + z85_encode(file_id.bytes),
            "offset": offset, "sizeInBytes": size, "cardinality": cardinality}


def stored_descriptor(vector: DeletionVectorRecord) -> dict[str, Any]:
    """The log's ``deletionVector`` of a write intent's vector (its file's folder is the
    prefix, its name the UUID)."""
    folder, _, name = vector.vector_path.rpartition("/")
    file_id = uuid.UUID(name.removeprefix(VECTOR_FILE_PREFIX).removesuffix(".bin"))
    return descriptor(folder, file_id, vector.offset, vector.size_in_bytes, vector.cardinality)
