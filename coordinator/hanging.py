"""Which transactions hang, and on whom: shared by ``transactions find-hanging`` and the web
view (docs/operations.md). Works on transactions as ``ops_cli.txn_json`` shapes them."""

from __future__ import annotations

from typing import Any


def find_hanging(unfinished: list[dict[str, Any]], every: list[dict[str, Any]],
                 older_than_s: float) -> list[dict[str, Any]]:
    """The transactions of ``unfinished`` (OPEN, PREWRITTEN or COMMITTED) older than
    ``older_than_s``, each with ``waiting_for``: None, or the table it waits to take and the
    transaction of ``every`` (all unfinished ones, of any pipeline) holding that table."""
    holders = {table["table"]: txn for txn in every for table in txn["tables"]}
    hanging = []
    for txn in unfinished:
        if txn["age_s"] < older_than_s:
            continue
        waited = txn["waiting_for_table"]
        holder = holders.get(waited) if waited else None
        hanging.append({**txn, "waiting_for": None if not waited else {
            "table": waited, "holder_txn_id": holder["txn_id"] if holder else "",
            "holder_pipeline_id": holder["pipeline_id"] if holder else "",
            "holder_state": holder["state"] if holder else "",
            "holder_age_s": holder["age_s"] if holder else None}})
    return hanging
