"""Table names of the session's catalog resolved to the locations percolake keys tables by.

Wherever sparkside takes a table it takes a path or URI (``/lake/t``, ``file:///lake/t``,
``s3://bucket/t``) or a name of the SparkSession's catalog (``t``, ``db.t``,
``spark_catalog.db.t``, another configured catalog's ``cat.db.t``): the name becomes the
table's location, as the catalog records it. The coordinator only ever sees locations.
"""

from __future__ import annotations

import re

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from percolake.lake.warehouse import object_store_of
from sparkside.errors import UnknownTable

# a catalog identifier: dot-separated parts, each plain or backtick-quoted
_PART = r"(?:[A-Za-z_][\w$]*|`(?:[^`]|``)+`)"
_IDENTIFIER = re.compile(rf"{_PART}(?:\.{_PART}){{0,2}}")


def is_table_name(table: str) -> bool:
    """Whether ``table`` is a catalog name rather than a path or URI."""
    return (not table.startswith("/") and ":" not in table.split(".", 1)[0]
            and object_store_of(table) is None and _IDENTIFIER.fullmatch(table) is not None)


def resolve_table(spark: SparkSession | None, table: str) -> str:
    """``table`` itself if it is a path or URI; else the location of the catalog table it
    names.

    Raises:
        UnknownTable: no such table in the session's catalog (or one without a location, a
            view), or a name given without a SparkSession to look it up in.
    """
    if not is_table_name(table):
        return table
    if spark is None:
        raise UnknownTable(f"{table!r} is a table name, and there is no SparkSession to look "
                           "it up in; give the table's path or URI")
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    except AnalysisException as exc:
        raise UnknownTable(
            f"table {table!r} is not in the session's catalog (current catalog "
            f"{spark.catalog.currentCatalog()!r}, database {spark.catalog.currentDatabase()!r}):"
            f" {str(exc).splitlines()[0][:300]}. Give an existing table's name, or its path or "
            "URI") from None
    for row in rows:
        if (row[0] or "").strip() == "Location" and row[1]:
            return str(row[1]).strip()
    raise UnknownTable(f"table {table!r} of the session's catalog has no location (a view?); "
                       "percolake writes and reads Delta tables by their location")
