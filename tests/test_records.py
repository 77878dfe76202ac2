import dataclasses
import json

from percolake.records import AddFileRecord, TableWriteRecord, WriteMode


def test_an_intent_renamed_is_the_intent_under_the_new_name_and_encodes_it():
    """``with_table`` is ``dataclasses.replace(write, table=...)``: equal to it, its encoding
    names the new table (a memoised encoding of the old name is not carried over) and its
    row count stays."""
    write = TableWriteRecord("/w/a", WriteMode.APPEND,
                             (AddFileRecord("_percolake/t/f.parquet", 12, {}, 5,
                                            '{"numRecords":3}'),),
                             '{"type":"struct","fields":[]}')
    assert json.loads(write.json_text)["table"] == "/w/a"  # memoised under the old name
    write.remember_row_count(3)
    renamed = write.with_table("file:///w/a")
    assert renamed == dataclasses.replace(write, table="file:///w/a")
    assert json.loads(renamed.json_text)["table"] == "file:///w/a"
    assert renamed.row_count() == 3
    assert write.table == "/w/a" and json.loads(write.json_text)["table"] == "/w/a"
