"""Deletion vectors of a row-level write, computed and stored by Spark's executors.

On a table with ``delta.enableDeletionVectors=true`` a DELETE, UPDATE or MERGE keeps the files of
the table it touches and marks the rows it deletes or updates in a deletion vector per file, as
delta-spark does (docs/row-level-writes.md, Deletion vectors). The rows are named by their
``_metadata.row_index`` (the row's position in its Parquet file). Each task of the job below takes
some files' new row indexes, adds the rows of the file's vector so far (the one it had at the
read version, or one an earlier operation of the batch gave it: a file's vector always holds all
its deleted rows), and writes the vectors into one ``deletion_vector_<uuid>.bin`` file of the
operation's folder in the attempt's folder (``percolake.lake.deletion_vector_files``), so an
aborted attempt's vectors are deleted with it (I10). Only the descriptors reach the driver.

Executors run in Spark's forked Python workers: nothing here may use deltalake.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from percolake.lake.deleted_rows import deleted_rows
from percolake.lake.deletion_vector_files import bitmap_array, vector_file, vector_file_name
from percolake.lake.warehouse import local_path

ROW_INDEX = "__percolake_row_index"  # a row's _metadata.row_index: its position in its file
_FILE, _ROWS, _VECTOR = "file", "rows", "vector"
_RESULT_SCHEMA = ("file string, vector_path string, vector_file_size long, offset long, "
                  "size_in_bytes long, cardinality long, new_rows long")


@dataclass(frozen=True)
class StoredVector:
    """A file's new deletion vector, stored: where, and how many rows it deletes."""

    file: str  # the data file as Spark read it (_metadata.file_path)
    vector_path: str  # the vector file, relative to the table root
    vector_file_size: int
    offset: int
    size_in_bytes: int
    cardinality: int  # all the rows it deletes
    new_rows: int  # of which this operation deleted


def table_relative(table_uri: str, spark_path: str) -> str:
    """A data file's path relative to the table root, from Spark's ``_metadata.file_path``."""
    root = _uri_path(table_uri).rstrip("/") + "/"
    key = unquote(urlparse(spark_path).path)
    if not key.startswith(root):
        raise AssertionError(f"Spark read {spark_path}, not a file of {table_uri}")
    return key[len(root):]


def _uri_path(uri: str) -> str:
    if "://" not in uri:
        return local_path(uri)
    return unquote(urlparse(uri).path)


def write_vectors(deleted: DataFrame, file_column: str, table_uri: str, folder: str,
                  earlier: Mapping[str, Mapping[str, Any]]) -> list[StoredVector]:
    """Has the executors store the deletion vector of each file of ``deleted`` (rows with
    ``file_column`` and ``ROW_INDEX``): its rows there plus those of its vector so far
    (``earlier``, descriptors by relative path), under ``folder`` (relative to the table
    root, in the attempt's folder). Returns one ``StoredVector`` per file."""
    root = local_path(table_uri)
    previous = {path: json.dumps(dict(vector)) for path, vector in earlier.items()}

    def store(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        files, vectors, new_rows = [], [], []
        for frame in frames:
            for file, rows in zip(frame[_FILE], frame[_ROWS], strict=True):
                rows = np.unique(np.asarray(rows, dtype=np.int64))
                before = previous.get(table_relative(table_uri, file))
                if before is not None:
                    old = deleted_rows(table_uri, json.loads(before))
                    rows, fresh = np.union1d(rows, old), len(np.setdiff1d(rows, old))
                else:
                    fresh = len(rows)
                files.append(file)
                vectors.append(rows)
                new_rows.append(fresh)
        if not files:
            return
        data = [bitmap_array(rows) for rows in vectors]
        content, offsets = vector_file(data)
        file_id = uuid.uuid4()
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        path = f"{folder}/{vector_file_name(file_id)}"
        with open(os.path.join(root, path), "xb") as out:
            out.write(content)
        yield pd.DataFrame({
            "file": files, "vector_path": path, "vector_file_size": len(content),
            "offset": offsets, "size_in_bytes": [len(d) for d in data],
            "cardinality": [len(rows) for rows in vectors], "new_rows": new_rows})

    grouped = deleted.groupBy(F.col(file_column).alias(_FILE)).agg(
        F.collect_list(ROW_INDEX).alias(_ROWS))
    return [StoredVector(**row.asDict())
            for row in grouped.mapInPandas(store, _RESULT_SCHEMA).collect()]


def deleted_by(spark: SparkSession, table_uri: str, file_column: str,
               vectors: Mapping[str, Mapping[str, Any]]) -> DataFrame:
    """The rows the deletion ``vectors`` (descriptors by ``_metadata.file_path``) delete:
    ``file_column`` and ``ROW_INDEX``, decoded by the executors."""
    def decode(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            for file, vector in zip(frame[_FILE], frame[_VECTOR], strict=True):
                rows = deleted_rows(table_uri, json.loads(vector))
                yield pd.DataFrame({file_column: file, ROW_INDEX: rows})

    described = spark.createDataFrame(
        [(file, json.dumps(dict(vector))) for file, vector in sorted(vectors.items())],
        f"{_FILE} string, {_VECTOR} string")
    return described.mapInPandas(decode, f"`{file_column}` string, `{ROW_INDEX}` long")
