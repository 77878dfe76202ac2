"""The rows a deletion vector deletes: its descriptor (``deletion_vectors``) to the row indexes.

Delta's format (PROTOCOL.md, "Deletion Vector Format"): a descriptor's ``storageType`` is
``i`` (the vector inline, Z85-encoded in ``pathOrInlineDv``), ``u`` (a file
``<table>/<prefix>/deletion_vector_<uuid>.bin`` named by a random prefix and the Z85-encoded
UUID) or ``p`` (a file's absolute path). A vector file starts with a version byte; at the
descriptor's ``offset`` the vector is stored as its size (4 bytes, big-endian), the data, and a
CRC-32. The data is a RoaringBitmapArray: a magic number (4 bytes, little-endian), the number of
32-bit bitmaps (8 bytes), then each bitmap's high 32 bits (4 bytes) and the bitmap itself in
Roaring's portable serialization. A row index is the row's position in its Parquet file.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from percolake.errors import FailedPrecondition
from percolake.lake import storage
from percolake.lake.warehouse import is_object_store, local_path

Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(Z85)}
MAGIC = 1681511377
_NO_RUN_COOKIE, _RUN_COOKIE = 12346, 12347
_ARRAY_LIMIT = 4096  # a container holding more values is a bitmap


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ's base 85): each 5 characters are 4 bytes, big-endian."""
    if len(text) % 5:
        raise ValueError(f"Z85 text of {len(text)} characters is not a multiple of 5")
    out = bytearray()
    for start in range(0, len(text), 5):
        value = 0
        for char in text[start:start + 5]:
            value = value * 85 + _Z85_VALUE[char]
        out += value.to_bytes(4, "big")
    return bytes(out)


def deleted_rows(table_uri: str, vector: Mapping[str, Any]) -> np.ndarray:
    """The row indexes (sorted, int64) the deletion vector ``vector`` (a descriptor as the log
    has it) deletes.

    Raises:
        FailedPrecondition: a kind of vector not known here, a file missing, or data that is
            not a deletion vector (its checksum, magic or size does not match).
    """
    kind = vector.get("storageType")
    size = int(vector["sizeInBytes"])
    if kind == "i":
        data = z85_decode(vector["pathOrInlineDv"])[:size]
    elif kind in ("u", "p"):
        location = vector_file(table_uri, vector)
        data = _stored_vector(location, _read(location), int(vector.get("offset") or 1), size)
    else:
        raise FailedPrecondition(f"table {table_uri}: deletion vector storage type {kind!r} "
                                 "is not one Delta defines (i, u, p)")
    rows = bitmap_array_values(data)
    cardinality = vector.get("cardinality")
    if cardinality is not None and len(rows) != int(cardinality):
        raise FailedPrecondition(f"table {table_uri}: a deletion vector holds {len(rows)} rows, "
                                 f"its descriptor says {cardinality}")
    return rows


def vector_file(table_uri: str, vector: Mapping[str, Any]) -> str:
    """The file (URI, or local path) of a ``u`` or ``p`` deletion vector."""
    text = vector["pathOrInlineDv"]
    if vector["storageType"] == "p":
        return text
    prefix, encoded = text[:-20], text[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return "/".join(p for p in (table_uri.rstrip("/"), prefix, name) if p)


def _read(location: str) -> bytes:
    if is_object_store(location):
        data = storage.read_object(location)
        if data is None:
            raise FailedPrecondition(f"deletion vector file {location} is missing")
        return data
    path = Path(local_path(location))
    if not path.is_file():
        raise FailedPrecondition(f"deletion vector file {location} is missing")
    return path.read_bytes()


def _stored_vector(location: str, content: bytes, offset: int, size: int) -> bytes:
    """The data of the vector stored at ``offset`` of a vector file: size, data, CRC-32."""
    if content[:1] != b"\x01":
        raise FailedPrecondition(f"deletion vector file {location} has format version "
                                 f"{content[:1]!r}, not 1")
    (stored_size,) = struct.unpack_from(">i", content, offset)
    data = content[offset + 4:offset + 4 + size]
    (checksum,) = struct.unpack_from(">I", content, offset + 4 + size)
    if stored_size != size or len(data) != size or zlib.crc32(data) != checksum:
        raise FailedPrecondition(f"deletion vector file {location}: the vector at offset "
                                 f"{offset} does not match its descriptor (size {size}) or its "
                                 "checksum")
    return data


def bitmap_array_values(data: bytes) -> np.ndarray:
    """The values of a serialized RoaringBitmapArray (sorted, int64)."""
    (magic,) = struct.unpack_from("<i", data, 0)
    if magic != MAGIC:
        raise FailedPrecondition(f"not a deletion vector: magic number {magic}, not {MAGIC}")
    (count,) = struct.unpack_from("<q", data, 4)
    position = 12
    parts = []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, position)
        values, position = portable_bitmap_values(data, position + 4)
        parts.append(values.astype(np.int64) | (np.int64(high) << 32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def portable_bitmap_values(data: bytes, position: int) -> tuple[np.ndarray, int]:
    """The values of a 32-bit Roaring bitmap in its portable serialization at ``position``,
    and the position after it."""
    (cookie,) = struct.unpack_from("<I", data, position)
    position += 4
    if cookie & 0xFFFF == _RUN_COOKIE:
        containers = (cookie >> 16) + 1
        flags = data[position:position + (containers + 7) // 8]
        position += (containers + 7) // 8
        runs = [bool(flags[i // 8] >> (i % 8) & 1) for i in range(containers)]
    elif cookie == _NO_RUN_COOKIE:
        (containers,) = struct.unpack_from("<I", data, position)
        position += 4
        runs = [False] * containers
    else:
        raise FailedPrecondition(f"not a Roaring bitmap: cookie {cookie}")
    header = np.frombuffer(data, "<u2", 2 * containers, position).reshape(containers, 2)
    position += 4 * containers
    if not any(runs) or containers >= 4:  # the offsets of the containers: not needed here
        position += 4 * containers
    parts = []
    for (key, cardinality_less_one), is_run in zip(header, runs, strict=True):
        cardinality = int(cardinality_less_one) + 1
        if is_run:
            (count,) = struct.unpack_from("<H", data, position)
            pairs = np.frombuffer(data, "<u2", 2 * count, position + 2).reshape(count, 2)
            position += 2 + 4 * count
            low = np.concatenate([np.arange(int(s), int(s) + int(n) + 1) for s, n in pairs]) \
                if count else np.zeros(0, np.int64)
        elif cardinality > _ARRAY_LIMIT:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, position),
                                 bitorder="little")
            position += 8192
            low = np.flatnonzero(bits)
        else:
            low = np.frombuffer(data, "<u2", cardinality, position).astype(np.int64)
            position += 2 * cardinality
        parts.append(low.astype(np.int64) | (int(key) << 16))
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values, position
