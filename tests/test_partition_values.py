"""Delta's partition values as percolake writes and reads them (delta-spark is the reference)."""

from __future__ import annotations

import datetime
import zoneinfo

from percolake.lake.partition_values import timestamp_partition_value, typed_partition_value

NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def test_a_timestamp_value_is_the_instant_in_utc_with_a_z_as_delta_spark_writes_it():
    seven_in_new_york = datetime.datetime(2026, 1, 1, 7, 0, 0, 250, tzinfo=NEW_YORK)
    assert timestamp_partition_value(seven_in_new_york) == "2026-01-01T12:00:00.000250Z"
    assert timestamp_partition_value(seven_in_new_york.astimezone(datetime.timezone.utc)) \
        == "2026-01-01T12:00:00.000250Z"


def test_a_timestamp_ntz_value_stays_the_local_date_time_without_a_zone():
    assert timestamp_partition_value(datetime.datetime(2026, 1, 1, 7)) \
        == "2026-01-01 07:00:00.000000"


def test_values_written_either_way_read_back_as_the_same_utc_moment():
    moment = datetime.datetime(2026, 1, 1, 12)
    for text in ("2026-01-01T12:00:00.000000Z", "2026-01-01 12:00:00.000000",
                 "2026-01-01 12:00:00"):
        assert typed_partition_value(text, "timestamp") == moment, text
    aware = datetime.datetime(2026, 1, 1, 7, tzinfo=NEW_YORK)
    assert typed_partition_value(timestamp_partition_value(aware), "timestamp") == moment
