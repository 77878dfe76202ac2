"""Deletion vectors to row indexes (``percolake.lake.deleted_rows``), on vectors built here by
Delta's and Roaring's format descriptions: each Roaring container kind (array, bitmap, run),
bitmaps above 2^32, inline and file vectors, and the refusals of data that does not match its
descriptor. delta-spark's own vectors are read in the Spark test of optimize
(``tests/spark/test_participant_s3.py``)."""

from __future__ import annotations

import struct
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from percolake.errors import FailedPrecondition
from percolake.lake.deleted_rows import (
    MAGIC,
    Z85,
    bitmap_array_values,
    deleted_rows,
    z85_decode,
)


def z85_encode(data: bytes) -> str:
    assert len(data) % 4 == 0
    out = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], "big")
        out.append("".join(Z85[value // 85**k % 85] for k in range(4, -1, -1)))
    return "".join(out)


def array_bitmap(key: int, low: list[int]) -> bytes:
    """A portable Roaring bitmap of one array container (no run containers)."""
    return (struct.pack("<II", 12346, 1) + struct.pack("<HH", key, len(low) - 1)
            + struct.pack("<I", 16) + struct.pack(f"<{len(low)}H", *low))


def test_z85_decodes_the_zeromq_test_vector():
    assert z85_decode("HelloWorld") == bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_decode(z85_encode(b"\x00\x01\x02\x03" * 3)) == b"\x00\x01\x02\x03" * 3


def test_every_container_kind_and_bitmaps_above_two_to_the_32():
    bits = np.zeros(65536, np.uint8)
    bits[0:10000:2] = 1  # 5000 values: a bitmap container
    bitmap_container = np.packbits(bits, bitorder="little").tobytes()
    mixed = (struct.pack("<I", 12347 | (2 << 16))  # 3 containers, the third a run
             + bytes([0b100])
             + struct.pack("<HHHHHH", 0, 2, 1, 4999, 2, 4)  # keys and cardinalities - 1
             + struct.pack("<3H", 1, 5, 9) + bitmap_container
             + struct.pack("<HHH", 1, 10, 4))  # one run: 10..14
    data = (struct.pack("<iq", MAGIC, 2) + struct.pack("<I", 0) + mixed
            + struct.pack("<I", 1) + array_bitmap(0, [7]))
    values = bitmap_array_values(data)
    expected = ([1, 5, 9] + [65536 + v for v in range(0, 10000, 2)]
                + [2 * 65536 + v for v in range(10, 15)] + [2**32 + 7])
    assert values.tolist() == expected


def vector_data(rows: list[int]) -> bytes:
    return struct.pack("<iq", MAGIC, 1) + struct.pack("<I", 0) + array_bitmap(0, rows)


def test_an_inline_vector_and_a_file_vector_give_their_rows(tmp_path: Path):
    data = vector_data([0, 3, 4])
    padded = data + b"\x00" * (-len(data) % 4)
    inline = {"storageType": "i", "pathOrInlineDv": z85_encode(padded),
              "sizeInBytes": len(data), "cardinality": 3}
    assert deleted_rows(f"file://{tmp_path}", inline).tolist() == [0, 3, 4]

    name = uuid.uuid4()
    (tmp_path / "ab").mkdir()
    stored = struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    (tmp_path / "ab" / f"deletion_vector_{name}.bin").write_bytes(b"\x01" + stored)
    in_file = {"storageType": "u", "pathOrInlineDv": "ab" + z85_encode(name.bytes),
               "offset": 1, "sizeInBytes": len(data), "cardinality": 3}
    assert deleted_rows(f"file://{tmp_path}", in_file).tolist() == [0, 3, 4]

    (tmp_path / "ab" / f"deletion_vector_{name}.bin").write_bytes(
        b"\x01" + stored[:-1] + bytes([stored[-1] ^ 1]))
    with pytest.raises(FailedPrecondition, match="checksum"):
        deleted_rows(f"file://{tmp_path}", in_file)
    with pytest.raises(FailedPrecondition, match="its descriptor says 2"):
        deleted_rows(f"file://{tmp_path}", {**inline, "cardinality": 2})
    with pytest.raises(FailedPrecondition, match="is missing"):
        deleted_rows(f"file://{tmp_path}", {**in_file, "pathOrInlineDv": z85_encode(name.bytes)})
