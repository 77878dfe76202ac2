"""Delta's partition values as values: the strings a log entry holds, or the typed values
delta-rs hands back, compared by what they mean."""

from __future__ import annotations

import datetime
import decimal
import math


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


def floating_partition_value(value: float, single: bool) -> str:
    """A float (``single``) or double partition value as delta-spark writes it: Java's
    ``Float.toString`` / ``Double.toString``, the shortest digits that read back as the value,
    ``0.1`` and ``100.0`` between 10^-3 and 10^7, ``1.0E20`` and ``1.0E-5`` outside."""
    import numpy  # the executors' writer and the daemon have it; the operator's commands do not

    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    number = numpy.float32(value) if single else numpy.float64(value)
    if number == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(number) < 1e7:
        return numpy.format_float_positional(number, unique=True, trim="0")
    mantissa, exponent = numpy.format_float_scientific(number, unique=True, trim="0").split("e")
    return f"{mantissa}E{int(exponent)}"
