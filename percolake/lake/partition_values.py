"""Delta's partition values as values: the strings a log entry holds, or the typed values
delta-rs hands back, compared by what they mean."""

from __future__ import annotations

import datetime
import decimal


def typed_partition_value(value: object, delta_type: str) -> object:
    """A partition value, given as Delta's string or as delta-rs's typed value, as a value."""
    if value is None:
        return None
    try:
        if delta_type in ("timestamp", "timestamp_ntz"):
            if not isinstance(value, datetime.datetime):
                text = str(value).strip().replace("T", " ").removesuffix("Z")
                value = datetime.datetime.fromisoformat(text)
            if value.tzinfo is not None:
                value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            return value
        if delta_type == "date":
            return value if isinstance(value, datetime.date) \
                else datetime.date.fromisoformat(str(value))
        if delta_type in ("byte", "short", "integer", "long"):
            return int(value)
        if delta_type in ("float", "double"):
            return float(value)
        if delta_type.startswith("decimal"):
            return decimal.Decimal(str(value))
        if delta_type == "boolean":
            return value if isinstance(value, bool) else str(value).lower() == "true"
    except (TypeError, ValueError, decimal.InvalidOperation):
        pass
    return str(value)


def timestamp_partition_value(moment: datetime.datetime) -> str:
    """A timestamp partition value as delta-spark writes it: an instant (a zone-aware value,
    a ``timestamp`` column's) in UTC, ISO 8601 with a ``Z``; a local date-time (naive, a
    ``timestamp_ntz`` column's) without a zone. delta-spark reads a zoneless value of a
    ``timestamp`` column in the reading session's time zone."""
    if moment.tzinfo is None:
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f")
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
