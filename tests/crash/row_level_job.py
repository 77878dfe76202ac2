"""The row-level part of the crash suite's bank job (issue 32's acceptance run).

With ``--row-level`` the driver (``driver.py``) creates two more tables with delta-spark
(``CREATE TABLE ... USING DELTA``) before its stream starts, as users do, and every batch, in the
same transaction as its appends of debits and credits:

- MERGEs each account's net change into ``accounts`` (keyed by account), so at every snapshot
  each account's balance is its credits minus its debits;
- appends its transfers to ``large_transfers`` (an insert-only MERGE: a table takes either
  ``txn.write`` or ``txn.delta_table`` in one batch) and then deletes the transfers of at most
  ``LARGE_OVER`` from it, so the table keeps every batch's large transfers, each once.

After the stream, the driver reads the latest version of every table with delta-spark into
``--final-read`` (JSON); ``final_violations`` checks that file, ``snapshot_violations`` the
snapshot reader's observations (``reader.py`` sums each table by account).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.crash import workload
from tests.crash.checker import TableSpec

ACCOUNTS_TABLE, LARGE_TABLE = "accounts", "large_transfers"
LARGE_OVER = 500
SCHEMAS = {ACCOUNTS_TABLE: "account BIGINT, balance BIGINT",
           LARGE_TABLE: "batch BIGINT, i BIGINT, amount BIGINT"}


def spark_path(lake: str, name: str) -> str:
    """A table of the lake as delta-spark opens it (``s3a://`` for an object store)."""
    from percolake.lake.warehouse import canonical_table_uri, spark_uri

    return spark_uri(canonical_table_uri(f"{lake}/{name}"))


def create_tables(spark: Any, lake: str) -> None:
    """The row-level tables, made by delta-spark before the stream (kept across restarts)."""
    for name, schema in SCHEMAS.items():
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{spark_path(lake, name)}` ({schema}) "
                  "USING DELTA")


def write_batch(txn: Any, src: Any, lake: str) -> None:
    """The batch's row-level writes; ``src`` holds the batch's (seq, i) input rows."""
    moves = src.selectExpr(f"CAST({workload.TARGET_SQL} AS BIGINT) AS account",
                           f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS net").unionByName(
        src.selectExpr(f"CAST({workload.SOURCE_SQL} AS BIGINT) AS account",
                       f"-CAST({workload.AMOUNT_SQL} AS BIGINT) AS net"))
    net = moves.groupBy("account").sum("net").withColumnRenamed("sum(net)", "net")
    (txn.delta_table(f"{lake}/{ACCOUNTS_TABLE}").alias("t")
        .merge(net.alias("s"), "t.account = s.account")
        .whenMatchedUpdate(set={"balance": "t.balance + s.net"})
        .whenNotMatchedInsert(values={"account": "s.account", "balance": "s.net"})
        .execute())
    transfers = src.selectExpr("seq AS batch", "i",
                               f"CAST({workload.AMOUNT_SQL} AS BIGINT) AS amount")
    large = txn.delta_table(f"{lake}/{LARGE_TABLE}")
    (large.alias("t").merge(transfers.alias("s"), "t.batch = s.batch AND t.i = s.i")
        .whenNotMatchedInsertAll().execute())
    large.delete(f"amount <= {LARGE_OVER}")  # sees the insert above (read your own writes)


def final_read(spark: Any, lake: str, out: str) -> None:
    """Every table's latest version as delta-spark reads it, as JSON rows."""
    columns = {workload.DEBITS: "batch, i, account, amount",
               workload.CREDITS: "batch, i, account, amount",
               ACCOUNTS_TABLE: "account, balance", LARGE_TABLE: "batch, i, amount"}
    rows = {name: [list(r) for r in spark.read.format("delta").load(spark_path(lake, name))
                   .selectExpr(*cols.split(", ")).collect()]
            for name, cols in columns.items()}
    Path(out).write_text(json.dumps(rows))


def reader_tables(lake: str) -> list[TableSpec]:
    """The row-level tables for the snapshot reader (it reads only names and paths)."""
    return [TableSpec(name, f"{lake}/{name}", False, (), lambda t: [])
            for name in (ACCOUNTS_TABLE, LARGE_TABLE)]


def large_rows(batches: int, k: int) -> list[tuple[int, int, int]]:
    return [(b, i, workload.amount(b, i)) for b in range(batches) for i in range(k)
            if workload.amount(b, i) > LARGE_OVER]


def balances_violation(debits: dict[Any, int], credits: dict[Any, int],
                       balances: dict[Any, int]) -> str | None:
    """Why the balances are not credits minus debits per account, None if they are."""
    accounts = set(debits) | set(credits) | set(balances)
    wrong = {a: (balances.get(a, 0), credits.get(a, 0) - debits.get(a, 0))
             for a in sorted(accounts, key=int)
             if balances.get(a, 0) != credits.get(a, 0) - debits.get(a, 0)}
    return f"balance != credits - debits for accounts {wrong}" if wrong else None


def snapshot_violations(observations: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """(snapshot reads checked, violations): each read's balances are its credits minus its
    debits, per account."""
    checked, out = 0, []
    for obs in observations:
        tables = obs.get("tables", {})
        seen = [tables.get(name) for name in (workload.DEBITS, workload.CREDITS,
                                              ACCOUNTS_TABLE)]
        if None in seen:
            continue
        checked += 1
        problem = balances_violation(*(t.get("by_account", {}) for t in seen))
        if problem:
            out.append(f"I1: snapshot {obs['snapshot_ts']} (versions "
                       f"{[t['version'] for t in seen]}): {problem}")
    return checked, out


def final_violations(path: Path, batches: int, k: int) -> list[str]:
    """delta-spark's latest reads hold every batch exactly once, and the balances of all of
    them."""
    if not path.exists():
        return [f"I2: no delta-spark final read at {path} (the last driver did not finish)"]
    seen = json.loads(path.read_text())
    out: list[str] = []
    expected = {workload.DEBITS: [r for b in range(batches) for r in workload.debit_rows(b, k)],
                workload.CREDITS: [r for b in range(batches)
                                   for r in workload.credit_rows(b, k)],
                LARGE_TABLE: large_rows(batches, k)}
    for name, rows in expected.items():
        got, want = Counter(map(tuple, seen[name])), Counter(rows)
        if got != want:
            out.append(f"I2: delta-spark reads {name} with extra rows {sorted(got - want)[:6]}"
                       f" and missing rows {sorted(want - got)[:6]}")
    accounts = Counter(a for a, _ in seen[ACCOUNTS_TABLE])
    if any(n > 1 for n in accounts.values()):
        out.append(f"I2: accounts holds an account more than once: {seen[ACCOUNTS_TABLE]}")
    balances = {a: b for a, b in seen[ACCOUNTS_TABLE]}
    want_balances = {a: b for a, b in workload.balances_after(batches - 1, k).items() if b}
    if {a: b for a, b in balances.items() if b} != want_balances:
        out.append(f"I2: delta-spark reads balances {balances}, every batch once gives "
                   f"{want_balances}")
    return out
