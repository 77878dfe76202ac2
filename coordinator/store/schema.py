"""Versioned store schemas: a ``meta`` row ``schema_version``; an older schema is migrated in one
transaction, a newer one refused (this coordinator would misread it).

PostgreSQL's schema is an ordered list of migrations: version 1 holds the records (the same
tables as SQLite's), version 2 adds the leader lease, version 3 the security records (tokens,
ACL entries, the principal of each transaction), version 4 the lineage (each table's owning
pipeline, the tables each pipeline reads), version 5 the input barriers (of transactions and
snapshot-index rows), source offsets, the pipelines' input starts and remembered plans, and the
snapshot leases, version 6 the snapshot-index rows a revision superseded and its restore rows,
version 7 the timestamp from which each read edge counts (a lineage transition), version 8 the
quarantined tables (docs/row-level-writes.md); SQLite's goes
from 1 to 3 to 4 to 5 to 6 to 7 to 8. Two processes
creating or migrating the same database at once take turns on an advisory lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.store.base import StoreSchemaError
from percolake.records import QuarantineRecord

if TYPE_CHECKING:  # psycopg is loaded only by the PostgreSQL store
    import psycopg

# The record columns both SQL stores read and write, in the order of their tables.
TXN_COLUMNS = (
    "txn_id", "pipeline_id", "generation", "batch_id", "attempt", "epoch", "query_id", "state",
    "start_ts", "commit_ts", "tables", "abort_reason", "created_ms", "updated_ms", "row_version",
    "principal", "input_barrier", "source_offsets",
)
# Fixed when a transaction's row is inserted: an update never rewrites them (nor, so, the
# index entries they key) and refuses a record whose values differ (StoreConflict).
TXN_IDENTITY_COLUMNS = (
    "txn_id", "pipeline_id", "generation", "batch_id", "attempt", "epoch", "query_id",
    "start_ts", "created_ms", "principal",
)
TXN_UPDATED_COLUMNS = tuple(c for c in TXN_COLUMNS if c not in TXN_IDENTITY_COLUMNS)
PIPELINE_COLUMNS = (
    "pipeline_id", "generation", "epoch", "query_id", "created_ms", "last_commit_ms", "resets",
    "row_version", "start_barrier", "plan_generation", "plan_after", "plan_barrier",
)
TABLE_COMMIT_COLUMNS = (
    "table_uri, commit_ts, txn_id, delta_version, input_barrier, superseded_ts, restore")
SELECT_TXN = f"SELECT {', '.join(TXN_COLUMNS)} FROM transactions"

def key_column(by_input_barrier: bool) -> str:
    """The SQL expression of ``TableCommit.barrier``: keyed by input barrier, a row without
    one (committed before its writer read any percolake table) is keyed by its commit_ts."""
    if by_input_barrier:
        return "(CASE WHEN input_barrier > 0 THEN input_barrier ELSE commit_ts END)"
    return "commit_ts"


def live_clauses(as_of_ts: int | None, changes: bool, placeholder: str) -> list[str]:
    """The SQL conditions of ``TableCommit.live_at`` (two ``placeholder`` parameters, both
    ``as_of_ts``, when it is given), and for changes the restores left out (``Store``'s
    input-barrier queries)."""
    clauses: list[str] = []
    if as_of_ts is None:
        clauses.append("superseded_ts = 0")
    else:
        clauses.append(f"commit_ts <= {placeholder} AND (superseded_ts = 0 "
                       f"OR superseded_ts > {placeholder})")
    if changes:
        clauses.append("NOT restore")
    return clauses


MIGRATION_LOCK = 0x7065_7263_6F6C_616B  # "percolak": pg_advisory_xact_lock key (a bigint)


@dataclass(frozen=True)
class Migration:
    version: int
    statements: tuple[str, ...]


def refuse_newer(where: str, found: int, known: int) -> None:
    """Raises StoreSchemaError if the store's schema ``found`` is newer than ``known``."""
    if found > known:
        raise StoreSchemaError(
            f"the store at {where} has schema {found}; this coordinator knows up to {known}: "
            "upgrade the coordinator")


POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, (
        "CREATE TABLE meta (key TEXT COLLATE \"C\" PRIMARY KEY, value BIGINT NOT NULL)",
        """CREATE TABLE pipelines (
            pipeline_id TEXT COLLATE "C" PRIMARY KEY,
            generation BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            query_id TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            last_commit_ms BIGINT NOT NULL,
            resets TEXT NOT NULL,
            row_version BIGINT NOT NULL)""",
        """CREATE TABLE transactions (
            txn_id TEXT COLLATE "C" PRIMARY KEY,
            pipeline_id TEXT COLLATE "C" NOT NULL,
            generation BIGINT NOT NULL,
            batch_id BIGINT NOT NULL,
            attempt BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            query_id TEXT NOT NULL,
            state TEXT COLLATE "C" NOT NULL,
            start_ts BIGINT NOT NULL UNIQUE,
            commit_ts BIGINT NOT NULL,
            tables TEXT NOT NULL,
            abort_reason TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL,
            row_version BIGINT NOT NULL)""",
        "CREATE INDEX transactions_by_batch ON transactions (pipeline_id, generation, batch_id)",
        "CREATE INDEX transactions_unfinished ON transactions (state) "
        "WHERE state IN ('OPEN', 'PREWRITTEN', 'COMMITTED')",
        "CREATE INDEX transactions_by_pipeline_ts ON transactions (pipeline_id, start_ts)",
        "CREATE INDEX transactions_by_state_created ON transactions (state, created_ms)",
        """CREATE TABLE table_commits (
            table_uri TEXT COLLATE "C" NOT NULL,
            commit_ts BIGINT NOT NULL,
            txn_id TEXT NOT NULL,
            delta_version BIGINT,
            PRIMARY KEY (table_uri, commit_ts))""",
        "CREATE INDEX table_commits_unapplied ON table_commits (table_uri, commit_ts) "
        "WHERE delta_version IS NULL",
    )),
    Migration(2, (
        # One row: who leads, with which fencing epoch, until when (the database's clock).
        """CREATE TABLE leader_lease (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            holder TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            address TEXT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL)""",
        "INSERT INTO leader_lease VALUES (1, '', 0, '', to_timestamp(0))",
    )),
    Migration(3, (
        # Security (docs/security.md): who opened each transaction, tokens, ACL entries.
        "ALTER TABLE transactions ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE tokens (
            token_id TEXT COLLATE "C" PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            principal TEXT NOT NULL,
            description TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            revoked_ms BIGINT NOT NULL)""",
        """CREATE TABLE acl_entries (
            principal TEXT COLLATE "C" NOT NULL,
            resource TEXT COLLATE "C" NOT NULL,
            pattern TEXT COLLATE "C" NOT NULL,
            permission TEXT COLLATE "C" NOT NULL,
            created_ms BIGINT NOT NULL,
            PRIMARY KEY (principal, resource, pattern, permission))""",
    )),
    Migration(4, (
        # Lineage (docs/topology.md): a table's one writing pipeline; what each pipeline reads.
        """CREATE TABLE table_writers (
            table_uri TEXT COLLATE "C" PRIMARY KEY,
            pipeline_id TEXT COLLATE "C" NOT NULL,
            registered_ms BIGINT NOT NULL)""",
        """CREATE TABLE read_edges (
            pipeline_id TEXT COLLATE "C" NOT NULL,
            table_uri TEXT COLLATE "C" NOT NULL,
            registered_ms BIGINT NOT NULL,
            PRIMARY KEY (pipeline_id, table_uri))""",
    )),
    Migration(5, (
        # Input barriers, source offsets, plans and snapshot leases (docs/topology.md).
        "ALTER TABLE transactions ADD COLUMN input_barrier BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE transactions ADD COLUMN source_offsets TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE table_commits ADD COLUMN input_barrier BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX table_commits_by_input_barrier ON table_commits (table_uri, input_barrier) "
        "WHERE input_barrier > 0",
        # a generation's last input barrier: the top of its range, not every attempt
        "CREATE INDEX transactions_by_input_barrier ON transactions "
        "(pipeline_id, generation, input_barrier) WHERE input_barrier > 0",
        "ALTER TABLE pipelines ADD COLUMN start_barrier BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE pipelines ADD COLUMN plan_generation BIGINT NOT NULL DEFAULT -1",
        "ALTER TABLE pipelines ADD COLUMN plan_after BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE pipelines ADD COLUMN plan_barrier BIGINT NOT NULL DEFAULT 0",
        """CREATE TABLE leases (
            lease_id TEXT COLLATE "C" PRIMARY KEY,
            holder TEXT NOT NULL,
            tables TEXT NOT NULL,
            barrier_ts BIGINT NOT NULL,
            created_ms BIGINT NOT NULL,
            expires_ms BIGINT NOT NULL,
            principal TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX transactions_by_pipeline_commit ON transactions (pipeline_id, commit_ts)",
    )),
    Migration(6, (
        # A revision of a derived table supersedes the rows it rolled back; a revision's rows
        # are versions, never changes (docs/topology.md).
        "ALTER TABLE table_commits ADD COLUMN superseded_ts BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE table_commits ADD COLUMN restore BOOLEAN NOT NULL DEFAULT false",
        "CREATE INDEX table_commits_restores ON table_commits (table_uri, commit_ts) "
        "WHERE restore",
    )),
    Migration(7, (
        # A read edge counts from the oracle timestamp it was registered at when its pipeline
        # already wrote tables (a lineage transition, docs/topology.md); 0: from the start.
        "ALTER TABLE read_edges ADD COLUMN since_ts BIGINT NOT NULL DEFAULT 0",
    )),
    Migration(8, (
        # Tables quarantined because a committed row-level write could not be applied as it
        # read them, and what an operator chose (docs/row-level-writes.md, "Quarantine").
        """CREATE TABLE quarantines (
            table_uri TEXT COLLATE "C" NOT NULL,
            txn_id TEXT COLLATE "C" NOT NULL,
            reason TEXT NOT NULL,
            quarantined_ms BIGINT NOT NULL,
            choice TEXT NOT NULL,
            chosen_by TEXT NOT NULL,
            chosen_ms BIGINT NOT NULL,
            choice_reason TEXT NOT NULL,
            as_of_version BIGINT NOT NULL,
            released_ms BIGINT NOT NULL,
            delta_version BIGINT NOT NULL,
            PRIMARY KEY (table_uri, txn_id))""",
    )),
)

# SQLite's schema: version 1 holds the records; version 2 (PostgreSQL's leader lease) has no
# SQLite counterpart, so a SQLite store goes from 1 straight to 3, the security records, then 4,
# the lineage, then 5, the input barriers and snapshot leases.
SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(3, (
        "ALTER TABLE transactions ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE tokens (
            token_id TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL,
            principal TEXT NOT NULL,
            description TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            revoked_ms INTEGER NOT NULL)""",
        """CREATE TABLE acl_entries (
            principal TEXT NOT NULL,
            resource TEXT NOT NULL,
            pattern TEXT NOT NULL,
            permission TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            PRIMARY KEY (principal, resource, pattern, permission))""",
    )),
    Migration(4, (
        """CREATE TABLE table_writers (
            table_uri TEXT PRIMARY KEY,
            pipeline_id TEXT NOT NULL,
            registered_ms INTEGER NOT NULL)""",
        """CREATE TABLE read_edges (
            pipeline_id TEXT NOT NULL,
            table_uri TEXT NOT NULL,
            registered_ms INTEGER NOT NULL,
            PRIMARY KEY (pipeline_id, table_uri))""",
    )),
    Migration(5, (
        "ALTER TABLE transactions ADD COLUMN input_barrier INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE transactions ADD COLUMN source_offsets TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE table_commits ADD COLUMN input_barrier INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX table_commits_by_input_barrier ON table_commits (table_uri, input_barrier) "
        "WHERE input_barrier > 0",
        # a generation's last input barrier: the top of its range, not every attempt
        "CREATE INDEX transactions_by_input_barrier ON transactions "
        "(pipeline_id, generation, input_barrier) WHERE input_barrier > 0",
        "ALTER TABLE pipelines ADD COLUMN start_barrier INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE pipelines ADD COLUMN plan_generation INTEGER NOT NULL DEFAULT -1",
        "ALTER TABLE pipelines ADD COLUMN plan_after INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE pipelines ADD COLUMN plan_barrier INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE leases (
            lease_id TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            tables TEXT NOT NULL,
            barrier_ts INTEGER NOT NULL,
            created_ms INTEGER NOT NULL,
            expires_ms INTEGER NOT NULL,
            principal TEXT NOT NULL DEFAULT '')""",
        "CREATE INDEX transactions_by_pipeline_commit ON transactions (pipeline_id, commit_ts)",
    )),
    Migration(6, (
        "ALTER TABLE table_commits ADD COLUMN superseded_ts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE table_commits ADD COLUMN restore INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX table_commits_restores ON table_commits (table_uri, commit_ts) "
        "WHERE restore",
    )),
    Migration(7, (
        "ALTER TABLE read_edges ADD COLUMN since_ts INTEGER NOT NULL DEFAULT 0",
    )),
    Migration(8, (
        """CREATE TABLE quarantines (
            table_uri TEXT NOT NULL,
            txn_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            quarantined_ms INTEGER NOT NULL,
            choice TEXT NOT NULL,
            chosen_by TEXT NOT NULL,
            chosen_ms INTEGER NOT NULL,
            choice_reason TEXT NOT NULL,
            as_of_version INTEGER NOT NULL,
            released_ms INTEGER NOT NULL,
            delta_version INTEGER NOT NULL,
            PRIMARY KEY (table_uri, txn_id))""",
    )),
)


def schema_version(conn: psycopg.Connection) -> int:
    """The database's schema version (0: no percolake schema yet)."""
    if conn.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise StoreSchemaError("a table 'meta' without a schema_version: not a percolake store")
    return row[0]


def migrate_postgres(conn: psycopg.Connection, where: str,
                     migrations: Sequence[Migration] = POSTGRES_MIGRATIONS) -> int:
    """Brings the database of ``conn`` (in autocommit mode) to the newest schema of
    ``migrations`` in one transaction, or refuses a newer one; returns the version."""
    known = migrations[-1].version
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        found = schema_version(conn)
        refuse_newer(where, found, known)
        for migration in migrations:
            if migration.version <= found:
                continue
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute("INSERT INTO meta VALUES ('schema_version', %s) ON CONFLICT (key) "
                         "DO UPDATE SET value = excluded.value", (migration.version,))
    return max(found, known)


QUARANTINE_COLUMNS = ("table_uri, txn_id, reason, quarantined_ms, choice, chosen_by, chosen_ms, "
                      "choice_reason, as_of_version, released_ms, delta_version")


def quarantine_values(record: QuarantineRecord) -> tuple:
    """A quarantine record as the values of QUARANTINE_COLUMNS, in order."""
    row = record.to_row()
    return (row["table"], *(row[name] for name in QUARANTINE_COLUMNS.split(", ")[1:]))


def quarantine_from_row(row: dict) -> QuarantineRecord:
    values = dict(row)
    values["table"] = values.pop("table_uri")
    return QuarantineRecord.from_row(values)
