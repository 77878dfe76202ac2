"""Delta's partition values as percolake writes and reads them (delta-spark is the reference)."""

from __future__ import annotations

import datetime
import zoneinfo

import numpy
import pytest

from percolake.lake.partition_values import (
    floating_partition_value,
    timestamp_partition_value,
    typed_partition_value,
)

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


@pytest.mark.parametrize(("value", "single", "text"), [
    (0.1, True, "0.1"), (0.1, False, "0.1"), (100.0, True, "100.0"), (1e20, True, "1.0E20"),
    (1e20, False, "1.0E20"), (1e-5, False, "1.0E-5"), (1234567.0, True, "1234567.0"),
    (12345678.0, False, "1.2345678E7"), (0.001, False, "0.001"), (-2.5e-4, True, "-2.5E-4"),
    (0.0, False, "0.0"), (-0.0, True, "-0.0"), (float("nan"), True, "NaN"),
    (float("-inf"), False, "-Infinity")])
def test_a_floating_value_is_spelled_as_javas_float_and_double_to_string(value, single, text):
    """delta-spark writes Java's Float.toString / Double.toString: the S3 writer's values are
    the local writer's (Spark's folder names), not Python's (0.10000000149011612, 1e+20)."""
    assert floating_partition_value(value, single) == text
    if text not in ("NaN", "-Infinity"):  # the shortest digits that read back as the value
        kind = numpy.float32 if single else numpy.float64
        assert kind(text) == kind(value)


def test_the_object_store_writer_spells_float_partitions_as_spark_names_their_folders():
    """The S3 writer's partition values of float and double columns are Java's, as the local
    writer's (Spark's folder names) and delta-spark's are."""
    import pyarrow as pa

    from sparkside.object_writer import _split

    table = pa.table({"x": pa.array([1, 2], pa.int64()),
                      "f": pa.array([0.1, 1e20], pa.float32()),
                      "d": pa.array([1e-5, 2.5], pa.float64())})
    assert sorted((values["f"], values["d"]) for values, _ in _split(table, ("f", "d"))) \
        == [("0.1", "1.0E-5"), ("1.0E20", "2.5")]
