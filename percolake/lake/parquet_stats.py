"""Delta's per-file statistics from a Parquet footer: what lets readers skip files."""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow.parquet as pq


def _json_value(value: object) -> object:
    """A Parquet statistic as a Delta stats JSON value, or None when it has none that is exact."""
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN is not JSON, and Parquet's order of NaN is not Delta's
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # timestamp_ntz: no zone to name
            return value.isoformat(timespec="microseconds")
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None) \
            .isoformat(timespec="microseconds") + "Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        as_float = float(value)
        return as_float if decimal.Decimal(as_float) == value else None  # never a rounded bound
    return None  # binary and other types: no min/max


def delta_stats(metadata: pq.FileMetaData) -> dict[str, object]:
    """numRecords, and min/max/nullCount of top-level columns over all row groups.

    A column gets a bound or a null count only when every row group has it. Floating-point
    columns get no min/max: Parquet's statistics may leave NaN out, while Spark orders NaN
    above every number, so a bound could make a reader skip a file it needs.
    """
    mins: dict[str, object] = {}
    maxs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    no_bounds: set[str] = set()
    no_nulls: set[str] = set()
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            name = column.path_in_schema
            if "." in name:
                continue  # nested fields: no stats
            stats = column.statistics
            if stats is None or not stats.has_null_count:
                no_nulls.add(name)
            else:
                nulls[name] = nulls.get(name, 0) + stats.null_count
            if column.physical_type in ("FLOAT", "DOUBLE"):
                no_bounds.add(name)
            elif stats is not None and stats.has_min_max:
                low, high = _json_value(stats.min), _json_value(stats.max)
                if low is None or high is None:
                    no_bounds.add(name)
                    continue
                mins[name] = low if name not in mins else min(mins[name], low)  # type: ignore
                maxs[name] = high if name not in maxs else max(maxs[name], high)  # type: ignore
            elif stats is None or stats.null_count != group.num_rows:
                no_bounds.add(name)  # values without bounds (an all-null group has none)
    return {
        "numRecords": metadata.num_rows,
        "minValues": {n: v for n, v in mins.items() if n not in no_bounds},
        "maxValues": {n: v for n, v in maxs.items() if n not in no_bounds},
        "nullCount": {n: v for n, v in nulls.items() if n not in no_nulls},
    }
