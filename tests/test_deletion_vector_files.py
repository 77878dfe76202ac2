"""Deletion vectors written in Delta's format (``percolake.lake.deletion_vector_files``), read
back by the reader of Delta's format (``percolake.lake.deleted_rows``): every container kind,
bitmaps above 2^32, several vectors in one file, the descriptor's Z85 name. delta-spark reading
percolake's vectors, and percolake reading delta-spark's, is shown in
``tests/spark/test_row_level.py::test_deletion_vectors_on_a_table_that_enables_them_as_delta_spark``."""

from __future__ import annotations

import struct
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from percolake.lake.deleted_rows import bitmap_array_values, deleted_rows, z85_decode
from percolake.lake.deletion_vector_files import (
    bitmap_array,
    descriptor,
    vector_file,
    vector_file_name,
    z85_encode,
)


def test_z85_encodes_the_zeromq_test_vector_and_round_trips():
    assert z85_encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    data = bytes(range(256)) * 4
    assert z85_decode(z85_encode(data)) == data
    with pytest.raises(ValueError, match="multiples of 4"):
        z85_encode(b"abc")


@pytest.mark.parametrize("rows", [
    [0],
    [5, 1, 3, 3],  # unsorted, a duplicate
    list(range(0, 10_000, 2)),  # 5000 values in one container: a bitmap container
    list(range(4096)),  # exactly the array limit
    [7, 65_535, 65_536, 3 * 65_536 + 1],  # several containers
    [1, 2**32 + 7, 3 * 2**32],  # several 32-bit bitmaps, one of them empty
])
def test_bitmap_arrays_round_trip(rows):
    data = bitmap_array(np.array(rows, np.int64))
    assert bitmap_array_values(data).tolist() == sorted(set(rows))


def test_a_bitmap_container_is_used_above_4096_values_and_arrays_below():
    dense = bitmap_array(np.arange(5000, dtype=np.int64))
    sparse = bitmap_array(np.arange(0, 8000, 2, dtype=np.int64))  # 4000 values
    # magic (4) + count (8) + key (4) + cookie and count (8) + header (4) + offset (4)
    assert len(dense) == 32 + 8192
    assert len(sparse) == 32 + 2 * 4000


def test_an_empty_vector_has_no_bitmap_and_negative_rows_are_refused():
    assert bitmap_array_values(bitmap_array(np.zeros(0, np.int64))).tolist() == []
    with pytest.raises(ValueError, match="never negative"):
        bitmap_array(np.array([-1, 3]))


def test_a_file_of_several_vectors_reads_back_through_its_descriptors(tmp_path: Path):
    vectors = [np.array([0, 2, 4]), np.arange(100, 7000), np.array([2**33])]
    content, offsets = vector_file([bitmap_array(v) for v in vectors])
    assert content[:1] == b"\x01"
    file_id = uuid.uuid4()
    prefix = "_percolake/abc/op1"
    (tmp_path / prefix).mkdir(parents=True)
    (tmp_path / prefix / vector_file_name(file_id)).write_bytes(content)
    for rows, offset in zip(vectors, offsets, strict=True):
        data = bitmap_array(rows)
        found = descriptor(prefix, file_id, offset, len(data), len(rows))
        assert found["storageType"] == "u"
        assert found["pathOrInlineDv"].startswith(prefix)
        assert len(found["pathOrInlineDv"]) == len(prefix) + 20
        assert deleted_rows(str(tmp_path), found).tolist() == rows.tolist()
        # the stored layout: size (big-endian), data, CRC-32 (big-endian)
        assert struct.unpack_from(">i", content, offset)[0] == len(data)
        assert struct.unpack_from(">I", content, offset + 4 + len(data))[0] == zlib.crc32(data)


def test_a_descriptor_in_the_table_root_has_only_the_uuid():
    file_id = uuid.uuid4()
    found = descriptor("", file_id, 1, 10, 2)
    assert z85_decode(found["pathOrInlineDv"]) == file_id.bytes
