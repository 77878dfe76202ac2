"""A vacuum without a retention keeps what delta-spark's VACUUM without RETAIN keeps: the files
removed within the table's ``delta.deletedFileRetentionDuration`` (a week when it sets none),
so time travel the table promises still finds its files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from percolake.lake.vacuum import interval_hours
from tests.test_vacuum_change_files import prune_far_ahead


@pytest.mark.parametrize(("text", "hours"), [
    ("interval 30 days", 720), ("interval 1 week", 168), ("INTERVAL 2 HOURS", 2),
    ("interval 7 days 12 hours", 180), ("interval 90 minutes", 2), ("interval 0 hours", 0),
    ("bogus", None), ("interval 3 fortnights", None), ("interval", None)])
def test_a_table_propertys_interval_is_read_in_whole_hours_rounded_up(text, hours):
    assert interval_hours(text) == hours


@pytest.mark.parametrize(("retention", "removed"), [(None, False), ("interval 0 hours", True)])
def test_a_vacuum_without_a_retention_takes_the_tables_own(core, warehouse: Path, retention,
                                                           removed):
    table = warehouse / "t"
    configuration = {"delta.deletedFileRetentionDuration": retention} if retention else None
    rows = pa.table({"x": pa.array([1], pa.int64())})
    write_deltalake(str(table), rows, configuration=configuration)
    (first,) = [f.name for f in table.glob("*.parquet")]
    write_deltalake(str(table), rows, mode="overwrite")  # removes version 0's file just now
    prune_far_ahead(core)  # no snapshot reads the versions before any more
    name = core.resolve_table(str(table))
    assert core.vacuum(name).removed_files == ([first] if removed else [])
    assert (table / first).exists() is not removed
    core.vacuum(name, retention_hours=0)  # an explicit retention: the operator's
    assert not (table / first).exists()
    # a file an earlier vacuum deleted is not listed again (delta-rs lists its tombstone)
    assert core.vacuum(name, retention_hours=0).removed_files == []
