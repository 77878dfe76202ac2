"""Delta's version checksum (``_delta_log/<version>.crc``) of the versions percolake commits with
its own log entries, as delta-spark writes one after each of its commits.

delta-spark reads a version's protocol and metadata from its checksum instead of running a
Spark job over the log, derives the checksum of its own next commit from it, and compares it
with the table's state at its checkpoints and before some commits (a mismatch fails them:
``delta.checksum.mismatch.fatal``). So a checksum is written only when the version's state is
known exactly: derived from the previous version's checksum and this version's actions (the
way delta-spark derives its own incrementally), or, for a table's first version, from its
entry alone. Without either, none is written: delta-spark tolerates a version without one.

The checksum is not part of the commit: written after the entry's put-if-absent succeeded,
never overwriting one, and any failure to write it is logged and ignored (a crash before it
leaves a valid table without one). On a local table that takes a fraction of a millisecond
and is done at once; on an object store (a GET of the previous checksum and a PUT) it is done
by a background thread, off the batch's path, in commit order.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import uuid
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from percolake.lake import storage
from percolake.lake.table_cache import read_entry
from percolake.lake.warehouse import is_object_store, local_path

log = logging.getLogger("percolake.delta")

_KB, _MB, _GB = 1024, 1024**2, 1024**3
# delta-spark's default file size histogram bins (a table's first checksum starts with them)
FILE_SIZE_BINS: tuple[int, ...] = (
    0, *(k * _KB for k in (8, 16, 32, 64, 128, 256, 512)), *(m * _MB for m in (1, 2, 4)),
    *(m * _MB for m in range(8, 41, 4)), *(m * _MB for m in range(48, 121, 8)),
    *(m * _MB for m in range(124, 145, 4)), *(m * _MB for m in range(160, 577, 16)),
    *(m * _MB for m in range(640, 1409, 64)), *(m * _MB for m in range(1536, 2049, 128)),
    *(m * _MB for m in range(2304, 3841, 256)), *(g * _GB for g in (4, 8, 16, 32, 64, 128, 256)))
# bins of the deleted-records-per-file histogram: [0], [1, 10), ... [2^31 - 1, 2^63 - 1]
DELETED_RECORDS_BINS: tuple[int, ...] = (0, 1, 10, 100, 1000, 10_000, 100_000, 1_000_000,
                                         10_000_000, 2**31 - 1, 2**63 - 1)
MAX_SET_TRANSACTIONS = 100  # delta-spark keeps the app transactions in a checksum up to this
# delta-spark lists a version's files (``allFiles``) in its checksum up to this many files, on
# tables that index at most ALL_FILES_MAX_INDEXED_COLUMNS columns' statistics; a reader of the
# version then needs no Spark job to rebuild its file list (a MERGE's find pass, a snapshot).
ALL_FILES_MAX_FILES = 50
ALL_FILES_MAX_INDEXED_COLUMNS = 32
TRANSACTION_RETENTION_KEY = "delta.setTransactionRetentionDuration"
IN_COMMIT_TIMESTAMPS_KEY = "delta.enableInCommitTimestamps"


def checksum_uri(table_uri: str, version: int) -> str:
    return f"{table_uri.rstrip('/')}/_delta_log/{version:020d}.crc"


def next_checksum(previous: Mapping[str, Any] | None, actions: Sequence[Mapping[str, Any]],
                  txn_id: str | None = None) -> dict[str, Any] | None:
    """The checksum of the version whose log entry holds ``actions``, from ``previous`` (the
    checksum of the version before; None: ``actions`` are the table's first version). None
    when the state is not known exactly: no protocol or metadata, a remove without its size, an
    action this module does not follow (``domainMetadata``), or in-commit timestamps."""
    state = _first_state() if previous is None else _state_of(previous)
    if state is None:
        return None
    schema_before = None if previous is None else _schema(previous["metadata"])
    added_transactions: list[Mapping[str, Any]] = []
    for action in actions:
        if "add" in action:
            state.add(action["add"])
        elif "remove" in action:
            if not state.remove(action["remove"]):
                return None
        elif "metaData" in action:
            state.metadata = dict(action["metaData"])
        elif "protocol" in action:
            state.protocol = dict(action["protocol"])
        elif "txn" in action:
            added_transactions.append(action["txn"])
        elif "domainMetadata" in action:
            return None
        elif "commitInfo" in action:
            if action["commitInfo"].get("inCommitTimestamp") is not None:
                return None
            state.last_manifest_commit = action["commitInfo"].get("lastManifestCommit")
    if state.protocol is None or state.metadata is None:
        return None
    if (state.metadata.get("configuration") or {}).get(IN_COMMIT_TIMESTAMPS_KEY,
                                                        "").lower() == "true":
        return None
    if schema_before is not None and _schema(state.metadata) != schema_before:
        state.all_files = None  # delta-spark lists no files on a version changing the schema
    return state.checksum(txn_id, previous, added_transactions)


class _State:
    """A version's state as a checksum counts it, moved on by one entry's actions."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.size = int(fields["tableSizeBytes"])
        self.files = int(fields["numFiles"])
        self.metadata: dict[str, Any] | None = fields.get("metadata")
        self.protocol: dict[str, Any] | None = fields.get("protocol")
        histogram = fields.get("fileSizeHistogram") or fields.get("histogramOpt")
        self.histogram = None if histogram is None else {
            "sortedBinBoundaries": list(histogram["sortedBinBoundaries"]),
            "fileCounts": list(histogram["fileCounts"]),
            "totalBytes": list(histogram["totalBytes"])}
        # written only while deletion vectors stay writable (decided at the end, as delta-spark)
        self.deleted_records = fields.get("numDeletedRecordsOpt")
        self.deletion_vectors = fields.get("numDeletionVectorsOpt")
        deleted = fields.get("deletedRecordCountsHistogramOpt")
        self.deleted_histogram = None if deleted is None else list(
            deleted["deletedRecordCounts"])
        self.last_manifest_commit = fields.get("lastManifestCommit")
        self.files_before = self.files
        listed = fields.get("allFiles")
        # the version's add actions by file (path and deletion vector), None when not known
        self.all_files: dict[tuple[str, str], dict[str, Any]] | None = None \
            if listed is None else {_file_key(a): dict(a) for a in listed}

    def _count(self, file: Mapping[str, Any], sign: int) -> None:
        size = int(file["size"])
        self.size += sign * size
        self.files += sign
        if self.histogram is not None:
            index = bisect_right(self.histogram["sortedBinBoundaries"], size) - 1
            if index >= 0:
                self.histogram["fileCounts"][index] += sign
                self.histogram["totalBytes"][index] += sign * size
        vector = file.get("deletionVector")
        cardinality = int(vector["cardinality"]) if vector else 0
        if self.deleted_records is not None:
            self.deleted_records += sign * cardinality
        if self.deletion_vectors is not None:
            self.deletion_vectors += sign * (1 if vector else 0)
        if self.deleted_histogram is not None:
            index = (len(self.deleted_histogram) - 1 if cardinality == 2**63 - 1
                     else bisect_right(DELETED_RECORDS_BINS, cardinality) - 1)
            self.deleted_histogram[index] += sign

    def add(self, add: Mapping[str, Any]) -> None:
        self._count(add, 1)
        key = self._listing_key(add)
        if key is not None:
            self.all_files[key] = {**add, "dataChange": False}

    def remove(self, remove: Mapping[str, Any]) -> bool:
        """False for a remove that does not carry its size (its file's state is unknown)."""
        if remove.get("extendedFileMetadata") is not True or remove.get("size") is None:
            return False
        self._count(remove, -1)
        key = self._listing_key(remove)
        if key is not None and self.all_files.pop(key, None) is None:
            self.all_files = None  # a file this listing does not hold: the listing is not exact
        return True

    def _listing_key(self, action: Mapping[str, Any]) -> tuple[str, str] | None:
        """The key of an add or remove's file in the listing; None where no exact listing is
        kept: none is known, or the action names its file by an absolute path (the listing
        is dropped then: see ``_absolute``)."""
        if self.all_files is None:
            return None
        if _absolute(action["path"]):
            self.all_files = None
            return None
        return _file_key(action)

    def checksum(self, txn_id: str | None, previous: Mapping[str, Any] | None,
                 added_transactions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        assert self.metadata is not None and self.protocol is not None
        dv_metrics = _deletion_vectors_writable(self.protocol, self.metadata)
        crc: dict[str, Any] = {}
        if txn_id is not None:
            crc["txnId"] = txn_id
        crc["tableSizeBytes"] = self.size
        crc["numFiles"] = self.files
        if dv_metrics and self.deleted_records is not None:
            crc["numDeletedRecordsOpt"] = self.deleted_records
        if dv_metrics and self.deletion_vectors is not None:
            crc["numDeletionVectorsOpt"] = self.deletion_vectors
        crc["numMetadata"] = 1
        crc["numProtocol"] = 1
        transactions = _set_transactions(previous, self.metadata, added_transactions)
        if transactions is not None:
            crc["setTransactions"] = transactions
        domains = [] if previous is None else previous.get("domainMetadata")
        if domains is not None:
            crc["domainMetadata"] = list(domains)
        crc["metadata"] = self.metadata
        crc["protocol"] = self.protocol
        if self.histogram is not None:
            crc["fileSizeHistogram"] = self.histogram
        if dv_metrics and self.deleted_histogram is not None:
            crc["deletedRecordCountsHistogramOpt"] = {"deletedRecordCounts":
                                                      self.deleted_histogram}
        listing = self._exact_listing()
        # delta-spark lists the files of an empty version (none) whatever its rules; percolake
        # only where the listing it derived says so too (counts alone can be off: a remove
        # spelled otherwise than its add leaves the file in the table)
        if listing is not None and (not listing or _lists_files(
                self.metadata, self.files_before, self.files)):
            crc["allFiles"] = listing
        if self.last_manifest_commit is not None:
            crc["lastManifestCommit"] = self.last_manifest_commit
        return crc

    def _exact_listing(self) -> list[dict[str, Any]] | None:
        """The version's files as derived, None unless they add up to the version's count and
        size (as delta-spark checks its own before listing them)."""
        if self.all_files is None:
            return None
        listed = list(self.all_files.values())
        if len(listed) != self.files or sum(int(a["size"]) for a in listed) != self.size:
            return None
        return listed


def _file_key(action: Mapping[str, Any]) -> tuple[str, str]:
    """An add or remove's file as Delta's log replay keys it: its path and its deletion
    vector's unique id (storage type, path or inline data, ``@offset``)."""
    vector = action.get("deletionVector") or {}
    unique = f"{vector.get('storageType', '')}{vector.get('pathOrInlineDv', '')}"
    if vector.get("offset") is not None:
        unique += f"@{vector['offset']}"
    return action["path"], unique


def _absolute(path: str) -> bool:
    """An absolute path (a URI with a scheme, or from the root). Delta's replay keys a file by
    its path made canonical, and makes an absolute one fully qualified (``/t/f``, ``file:/t/f``
    and ``file:///t/f`` are one file to it); only a relative path is keyed as spelled."""
    return path.startswith("/") or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", path) is not None


def _schema(metadata: Mapping[str, Any]) -> Any:
    return json.loads(metadata.get("schemaString") or "null")


def _lists_files(metadata: Mapping[str, Any], files_before: int, files_after: int) -> bool:
    """delta-spark's rule for listing a version's files in the checksum it derives (with its
    defaults of ``allFilesInCrc``): statistics kept in checkpoints (as JSON or as a struct),
    at most ``ALL_FILES_MAX_INDEXED_COLUMNS`` indexed columns, and at most
    ``ALL_FILES_MAX_FILES`` files before and after the version."""
    configuration = metadata.get("configuration") or {}

    def enabled(key: str) -> bool:
        return str(configuration.get(key, "true")).lower() == "true"

    if not (enabled("delta.checkpoint.writeStatsAsJson")
            or enabled("delta.checkpoint.writeStatsAsStruct")):
        return False
    try:
        indexed = int(configuration.get("delta.dataSkippingNumIndexedCols", "32"))
    except ValueError:
        return False
    return indexed <= ALL_FILES_MAX_INDEXED_COLUMNS \
        and max(files_before, files_after) <= ALL_FILES_MAX_FILES


def _first_state() -> _State:
    """The state before a table's first version: nothing, histograms empty."""
    return _State({"tableSizeBytes": 0, "numFiles": 0,
                   "fileSizeHistogram": {"sortedBinBoundaries": list(FILE_SIZE_BINS),
                                         "fileCounts": [0] * len(FILE_SIZE_BINS),
                                         "totalBytes": [0] * len(FILE_SIZE_BINS)},
                   "numDeletedRecordsOpt": 0, "numDeletionVectorsOpt": 0, "allFiles": [],
                   "deletedRecordCountsHistogramOpt": {
                       "deletedRecordCounts": [0] * (len(DELETED_RECORDS_BINS) - 1)}})


def _state_of(previous: Mapping[str, Any]) -> _State | None:
    """The state a previous checksum records; None if it lacks what the next one needs."""
    try:
        if previous.get("metadata") is None or previous.get("protocol") is None:
            return None
        return _State(previous)
    except (KeyError, TypeError, ValueError):
        return None


def _deletion_vectors_writable(protocol: Mapping[str, Any], metadata: Mapping[str, Any]) -> bool:
    """delta-spark's rule for keeping the deletion vector counts of a checksum it derives from
    the previous one: the table supports deletion vectors and creates them."""
    supported = "deletionVectors" in (protocol.get("writerFeatures") or [])
    enabled = str((metadata.get("configuration") or {}).get(
        "delta.enableDeletionVectors", "false")).lower() == "true"
    return supported and enabled


def _set_transactions(previous: Mapping[str, Any] | None, metadata: Mapping[str, Any],
                      added: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Every app transaction's newest ``txn`` after this version, as delta-spark keeps them:
    None when the previous checksum has none, when the table expires them (a retention
    duration makes the set depend on the clock), or above ``MAX_SET_TRANSACTIONS``."""
    old = [] if previous is None else previous.get("setTransactions")
    if old is None:
        return None
    configurations = [metadata.get("configuration") or {}]
    if previous is not None:
        configurations.append(previous["metadata"].get("configuration") or {})
    if any(TRANSACTION_RETENTION_KEY in c for c in configurations):
        return None
    if max(len(old), len(added)) > MAX_SET_TRANSACTIONS:
        return None
    by_app = {t["appId"]: dict(t) for t in old}
    for transaction in added:
        by_app[transaction["appId"]] = dict(transaction)
    if len(by_app) > MAX_SET_TRANSACTIONS:
        return None
    return list(by_app.values())


def read_checksum(table_uri: str, version: int) -> dict[str, Any] | None:
    """The checksum of ``version`` as stored, None if there is none or it cannot be parsed
    (delta-spark treats such a file as missing too)."""
    uri = checksum_uri(table_uri, version)
    if is_object_store(table_uri):
        content = storage.read_object(uri)
    else:
        try:
            with open(local_path(uri), "rb") as stored:
                content = stored.read()
        except FileNotFoundError:
            content = None
    if not content:
        return None
    try:
        parsed = json.loads(content.decode().splitlines()[0])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def write_checksum(table_uri: str, version: int, actions: Sequence[Mapping[str, Any]],
                   txn_id: str | None = None) -> bool:
    """Writes the checksum of ``version`` (whose entry, just put, holds ``actions``) when its
    state is known exactly: from the previous version's checksum, or for version 0 from the
    entry alone. True if one was written; never raises (the version stands without one)."""
    try:
        previous = None if version == 0 else read_checksum(table_uri, version - 1)
        if version > 0 and previous is None:
            return False
        crc = next_checksum(previous, actions, txn_id)
        if crc is None:
            return False
        return _put_if_absent(table_uri, version,
                              (json.dumps(crc, separators=(",", ":")) + "\n").encode())
    except Exception as exc:  # noqa: BLE001 - the checksum is an optimisation, never the commit
        log.warning("no version checksum written", extra={
            "table": table_uri, "version": version, "error": str(exc)})
        return False


def _put_if_absent(table_uri: str, version: int, data: bytes) -> bool:
    uri = checksum_uri(table_uri, version)
    if is_object_store(table_uri):
        return storage.put_object_if_absent(uri, data)
    target = local_path(uri)
    temporary = f"{os.path.dirname(target)}/.{version:020d}.crc.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as stored:
        stored.write(data)
    try:
        os.link(temporary, target)  # never replaces a checksum another writer put there
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    return True


def write_checksum_of_commit(table_uri: str, version: int, txn_key: str, txn_id: str) -> bool:
    """The checksum of ``version``, a commit delta-rs just made for transaction ``txn_id`` (a
    table's creation, an overwrite): its entry is read back, and used only if it names
    ``txn_id`` under ``txn_key`` in its commitInfo (another writer may have taken the version).
    Never raises."""
    try:
        content = read_entry(table_uri, version) or b""
        actions = [json.loads(line) for line in content.decode().splitlines() if line.strip()]
    except Exception as exc:  # noqa: BLE001 - the checksum is an optimisation, never the commit
        log.warning("no version checksum written", extra={
            "table": table_uri, "version": version, "error": str(exc)})
        return False
    if not any(a.get("commitInfo", {}).get(txn_key) == txn_id for a in actions):
        return False
    return write_checksum(table_uri, version, actions, txn_id)


_background: ThreadPoolExecutor | None = None
_last: Future | None = None
_lock = threading.Lock()


def record_checksum(table_uri: str, version: int, actions: Sequence[Mapping[str, Any]],
                    txn_id: str | None = None, *, read_back: str | None = None) -> None:
    """``write_checksum`` (or with ``read_back``, the commitInfo key naming ``txn_id``,
    ``write_checksum_of_commit``): now on a local table, on the background thread on an
    object store."""
    def write() -> bool:
        if read_back is not None:
            return write_checksum_of_commit(table_uri, version, read_back, txn_id or "")
        return write_checksum(table_uri, version, actions, txn_id)

    if not is_object_store(table_uri):
        write()
        return
    global _background, _last
    with _lock:
        if _background is None:
            _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="percolake-crc")
        _last = _background.submit(write)


def background_written(timeout_s: float = 30.0) -> None:
    """Waits until the checksums handed to the background thread so far are written (or
    given up)."""
    with _lock:
        last = _last
    if last is not None:
        last.result(timeout=timeout_s)
