"""Row-level writes read a table with what its writes need (column mapping, the change data
feed, both) when the first operation reads it (no Spark needed); none of these properties is
refused any more."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from sparkside.row_level import RowLevelTable


def test_a_table_with_the_change_data_feed_is_read_to_write_change_files(tmp_path):
    """No longer refused: operations write its change data files (tests/spark/
    test_row_level_cdf.py compares its change feed with delta-spark's)."""
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": [1, 2]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    assert RowLevelTable.read(None, table, table).change_data


def test_a_column_mapped_table_with_the_change_data_feed_is_read_with_both(tmp_path):
    """No longer refused: its change files are written under the physical names
    (tests/spark/test_row_level_cdf.py compares its change feed with delta-spark's)."""
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": [1, 2]}),
                    configuration={"delta.enableChangeDataFeed": "true",
                                   "delta.columnMapping.mode": "name",
                                   "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"})
    state = RowLevelTable.read(None, table, table)
    assert state.change_data and state.mapping is not None and set(state.mapping.names) == {"id"}


def test_a_column_mapped_table_is_read_with_its_mapping(tmp_path):
    """Column mapping is not refused: the rewrite writes the table's physical names
    (tests/spark/test_row_level.py runs it against delta-spark)."""
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": [1, 2]}),
                    configuration={"delta.columnMapping.mode": "name",
                                   "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"})
    state = RowLevelTable.read(None, table, table)
    assert state.mapping is not None and set(state.mapping.names) == {"id"}


def test_a_table_with_the_change_data_feed_turned_off_is_read(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": [1, 2]}),
                    configuration={"delta.enableChangeDataFeed": "false"})
    state = RowLevelTable.read(None, table, table)
    assert state.read_version == 0 and not state.change_data
