"""Tables whose properties row-level writes cannot honour are refused when the first operation
reads the table, before anything is written (no Spark needed: the refusal comes first)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sparkside.errors import RowLevelWriteRefused
from sparkside.row_level import RowLevelTable


@pytest.mark.parametrize(("configuration", "named"), [
    ({"delta.enableChangeDataFeed": "true"}, "change data feed"),
])
def test_a_table_whose_property_a_rewrite_would_break_is_refused_naming_it(tmp_path, configuration,
                                                                           named):
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"id": [1, 2]}), configuration=configuration)
    with pytest.raises(RowLevelWriteRefused, match=named):
        RowLevelTable.read(None, table, table)


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
    assert RowLevelTable.read(None, table, table).read_version == 0
