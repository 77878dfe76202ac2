"""Catalog names for the percolake streaming source, resolved on the driver.

``spark.readStream.format("percolake")...load("db.orders")`` hands the name to the source's
planner, which runs in a Python worker that has no SparkSession and so cannot ask the catalog.
The driver can: ``install`` (called by ``sparkside.register``) makes the session's
``DataStreamReader`` turn a catalog name given to a percolake ``load`` (as its path, or as
the ``path`` or ``table`` option) into the table's location with ``resolve_table``, the same
resolution ``txn.write`` uses, at the moment Spark itself would resolve a table. An unknown
name is refused there, naming it. The worker never sees a name; if it does (a reader that
bypassed ``register``), the source refuses it saying what to do.

Why not the coordinator: it learns a name only once a writer used it, and a name means a table
only relative to one session's catalog and current database, which the catalog alone knows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming.readwriter import DataStreamReader

from sparkside.catalog import is_table_name, resolve_table

FORMAT = "percolake"
TABLE_OPTIONS = ("path", "table")
_STATE = "_percolake_load"  # per reader: {"format": str, "options": {key: value}}
_INSTALLED = "_percolake_names_installed"


def install() -> None:
    """Makes every ``DataStreamReader`` resolve catalog names given to a percolake load
    (idempotent; other formats pass through untouched)."""
    if getattr(DataStreamReader, _INSTALLED, False):
        return
    DataStreamReader.format = _recording_format(DataStreamReader.format)
    DataStreamReader.option = _recording_option(DataStreamReader.option)
    DataStreamReader.options = _recording_options(DataStreamReader.options)
    DataStreamReader.load = _resolving_load(DataStreamReader.load, DataStreamReader.option)
    setattr(DataStreamReader, _INSTALLED, True)


def _state(reader: DataStreamReader) -> dict[str, Any]:
    return reader.__dict__.setdefault(_STATE, {"format": "", "options": {}})


def _recording_format(original: Callable) -> Callable:
    @functools.wraps(original)
    def format(self: DataStreamReader, source: str) -> DataStreamReader:  # noqa: A001
        _state(self)["format"] = str(source)
        return original(self, source)
    return format


def _recording_option(original: Callable) -> Callable:
    @functools.wraps(original)
    def option(self: DataStreamReader, key: str, value: Any) -> DataStreamReader:
        if str(key).lower() in TABLE_OPTIONS:
            _state(self)["options"][str(key).lower()] = value
        return original(self, key, value)
    return option


def _recording_options(original: Callable) -> Callable:
    @functools.wraps(original)
    def options(self: DataStreamReader, **given: Any) -> DataStreamReader:
        for key, value in given.items():
            if key.lower() in TABLE_OPTIONS:
                _state(self)["options"][key.lower()] = value
        return original(self, **given)
    return options


def _resolving_load(original: Callable, set_option: Callable) -> Callable:
    @functools.wraps(original)
    def load(self: DataStreamReader, path: str | None = None, format: str | None = None,  # noqa: A002
             schema: Any = None, **options: Any) -> Any:
        if str(format or _state(self)["format"]).lower() == FORMAT:
            spark = self._spark
            if isinstance(path, str) and is_table_name(path):
                path = resolve_table(spark, path)
            for key, value in list(options.items()):
                if key.lower() in TABLE_OPTIONS and isinstance(value, str):
                    options[key] = resolve_table(spark, value)
            for key, value in _state(self)["options"].items():
                if isinstance(value, str) and is_table_name(value) and key not in options:
                    set_option(self, key, resolve_table(spark, value))
        return original(self, path, format, schema, **options)
    return load
