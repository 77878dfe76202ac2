"""The bank workload: every row is derived from (batch, i), so duplicates and losses show by value.

Batch ``b`` moves ``k`` transfers: transfer ``(b, i)`` takes ``amount(b, i)`` from account
``source(b, i)`` (a row in ``debits``) to ``target(b, i)`` (a row in ``credits``). ``balances`` is
overwritten every batch with each account's balance after that batch. Pure functions, no I/O.
"""

from __future__ import annotations

ACCOUNTS = 5
DEBITS, CREDITS, BALANCES = "debits", "credits", "balances"
APPEND_TABLES = (DEBITS, CREDITS)
TABLES = (DEBITS, CREDITS, BALANCES)

# The same formulas as Spark SQL expressions over the input columns ``seq`` (batch) and ``i``.
AMOUNT_SQL = "((seq * 7919 + i * 104729) % 1000) + 1"
SOURCE_SQL = f"(seq + i) % {ACCOUNTS}"
TARGET_SQL = f"(seq * 3 + i + 1) % {ACCOUNTS}"


def amount(b: int, i: int) -> int:
    return (b * 7919 + i * 104729) % 1000 + 1


def source(b: int, i: int) -> int:
    return (b + i) % ACCOUNTS


def target(b: int, i: int) -> int:
    return (b * 3 + i + 1) % ACCOUNTS


def debit_rows(b: int, k: int) -> list[tuple[int, int, int, int]]:
    """(batch, i, account, amount) of every debit of batch b."""
    return [(b, i, source(b, i), amount(b, i)) for i in range(k)]


def credit_rows(b: int, k: int) -> list[tuple[int, int, int, int]]:
    return [(b, i, target(b, i), amount(b, i)) for i in range(k)]


def balances_after(b: int, k: int) -> dict[int, int]:
    """Each account's balance after batches 0..b of one generation (all start at 0)."""
    balance = dict.fromkeys(range(ACCOUNTS), 0)
    for batch in range(b + 1):
        for i in range(k):
            balance[source(batch, i)] -= amount(batch, i)
            balance[target(batch, i)] += amount(batch, i)
    return balance


def balance_rows(b: int, k: int) -> list[tuple[int, int, int]]:
    """(account, balance, batch) rows the balances table holds right after batch b."""
    return [(a, v, b) for a, v in sorted(balances_after(b, k).items())]


def input_rows(b: int, k: int) -> list[dict[str, int]]:
    """The rows of input file b of the streaming source: one per transfer."""
    return [{"seq": b, "i": i} for i in range(k)]
