"""Quarantine of a table whose committed row-level write cannot be applied as it read the table
(I12, docs/row-level-writes.md "Quarantine"), and the operator's way out.

The roll-forward that finds the write unappliable (``CannotApplyAsRead``) records the table as
quarantined, durably, and answers ``TableQuarantined``; the committed transaction keeps holding
the table, so every later transaction declaring it, and every snapshot that must include the
write, is refused before its commit point with that error, naming the recovery command. No
roll-forward of a quarantined table touches the Delta log again until an operator chooses:

- ``reapply``: the write's files are applied onto the table as it is now. Allowed only when the
  pre-commit check passes against the current version (same layout, every file the write
  removes still in the table): then no row is lost or written twice, but rows an outside writer
  added meanwhile were not seen by the MERGE/UPDATE/DELETE (the operator judges that).
- ``abandon``: the write is never applied; the table keeps none of its changes (the batch's
  other tables keep theirs). Its files stay in the attempt's folder for inspection.

The choice is recorded before it acts (I10) and kept for good with who made it and why; a
reapply cut short by a crash is finished by the next roll-forward with the recorded choice.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from coordinator import validation
from coordinator.core.state import CoreState, wall_ms
from coordinator.principal import current_principal
from percolake.errors import FailedPrecondition, InvalidArgument, NotFound, TableQuarantined
from percolake.records import (
    RECOVERY_COMMAND,
    QuarantineChoice,
    QuarantineRecord,
    TableWriteRecord,
)
from percolake.states import COMMITTED_STATES

log = logging.getLogger("percolake.coordinator")


def quarantined_error(record: QuarantineRecord) -> TableQuarantined:
    """The refusal of anything that needs the quarantined table's write applied."""
    return TableQuarantined(
        f"table {record.table} is quarantined: transaction {record.txn_id} is committed but "
        f"its row-level write cannot be applied as it read the table ({record.reason}). New "
        "commits to the table are refused until an operator chooses what becomes of that "
        "write: " + RECOVERY_COMMAND.format(table=record.table, txn_id=record.txn_id) +
        " (docs/row-level-writes.md, Quarantine)")


class Quarantining(CoreState):
    """The quarantine records, their refusals and the operator's release."""

    def list_quarantines(self, include_released: bool = False,
                         pipeline_id: str = "") -> list[QuarantineRecord]:
        """Quarantined tables (and, with ``include_released``, the released ones with the
        choice made), ordered by table and time; with ``pipeline_id`` only those of its
        transactions."""
        if pipeline_id:
            validation.check_id("pipeline_id", pipeline_id)
        if include_released:
            records = self.store.load_quarantines()
        else:
            with self._lock:
                records = [dataclasses.replace(q) for q in
                           sorted(self._quarantined.values(), key=lambda q: q.table)]
        if not pipeline_id:
            return records
        with self._lock:
            return [q for q in records if (txn := self._unfinished.get(q.txn_id)
                                           or self.store.get_txn(q.txn_id)) is not None
                    and txn.pipeline_id == pipeline_id]

    def quarantined_count(self) -> int:
        with self._lock:
            return len(self._quarantined)

    def _write_to_apply(self, txn_id: str, table: str,
                        write: TableWriteRecord) -> TableWriteRecord:
        with self._lock:
            record = self._quarantined.get(table)
        if record is None or record.txn_id != txn_id:
            return write
        if record.choice == QuarantineChoice.REAPPLY:  # chosen, not finished (a crash)
            return dataclasses.replace(write, read_version=record.as_of_version)
        raise quarantined_error(record)

    def _held_back(self, txn_id: str, table: str) -> bool:
        record = self._quarantined.get(table)
        return record is not None and record.txn_id == txn_id and record.choice is None

    def _quarantine(self, txn_id: str, table: str, reason: str) -> TableQuarantined:
        with self._lock:
            record = self._quarantined.get(table)
            # new, or a reapply that an outside commit made unappliable again (a race): the
            # operator chooses again, knowing the new conflict
            if record is None or record.txn_id != txn_id or record.choice is not None:
                record = QuarantineRecord(table, txn_id, reason, wall_ms())
                self.store.put_quarantine(record)
                self._quarantined[table] = record
        self.store.flush()
        log.error("table quarantined: a committed row-level write cannot be applied as read",
                  extra={"txn_id": txn_id, "table": table, "detail": reason})
        return quarantined_error(record)

    def _released_by_apply(self, txn_id: str, table: str, version: int) -> None:
        """Under the lock, after the applied version is recorded: a reapply is finished."""
        record = self._quarantined.get(table)
        if record is None or record.txn_id != txn_id:
            return
        if record.choice != QuarantineChoice.REAPPLY:
            # the write is in the log without a choice (an apply that committed before it
            # found the conflict, or a concurrent participant's): nothing left to decide
            record = dataclasses.replace(record, choice=QuarantineChoice.REAPPLY,
                                         chosen_by="(found applied)", chosen_ms=wall_ms())
        self.store.put_quarantine(dataclasses.replace(record, released_ms=wall_ms(),
                                                      delta_version=version))
        del self._quarantined[table]

    def release_quarantine(self, table: str, txn_id: str, choice: QuarantineChoice,
                           reason: str) -> QuarantineRecord:
        """Applies the operator's ``choice`` for the quarantined ``table`` held by ``txn_id``.

        Raises:
            NotFound: the table is not quarantined (by that transaction).
            FailedPrecondition: another choice was already recorded, or ``reapply`` is not
                safe on the table as it is now (the check's reason is named), or the table's
                current version cannot be read.
        """
        validation.check_id("txn_id", txn_id)
        if not reason.strip():
            raise InvalidArgument("give a reason: it is kept with the choice")
        if len(reason) > validation.MAX_REASON_LENGTH:
            raise InvalidArgument(f"the reason is longer than {validation.MAX_REASON_LENGTH} "
                                  "characters")
        canonical = self._canonical(table)
        with self._lock:
            record = self._quarantined.get(canonical)
            if record is None or record.txn_id != txn_id:
                held = f" (it is by transaction {record.txn_id})" if record else ""
                raise NotFound(f"table {canonical} is not quarantined by transaction "
                               f"{txn_id}{held}")
            if record.choice is not None and record.choice != choice:
                raise FailedPrecondition(
                    f"table {canonical}: {record.choice.value} was already chosen by "
                    f"{record.chosen_by or '(anonymous)'}; it cannot be changed")
            txn = self._get(txn_id)
            assert txn.state in COMMITTED_STATES, f"quarantined by {txn.state} {txn_id}"
            write = txn.tables[canonical].write
            assert write is not None
        if record.choice == QuarantineChoice.REAPPLY:  # chosen before, cut short: finish it
            self._roll_forward(txn_id, canonical, time.monotonic() + self.config.snapshot_wait_s)
            return self._latest_record(canonical, txn_id)
        from percolake.lake.delta_commit import open_table

        current = open_table(canonical)
        if current is None:
            raise FailedPrecondition(f"table {canonical} has no Delta table any more")
        version = current.version()
        chosen = dataclasses.replace(record, choice=choice, chosen_by=current_principal(),
                                     chosen_ms=wall_ms(), choice_reason=reason,
                                     as_of_version=version)
        if choice == QuarantineChoice.REAPPLY:
            rebased = dataclasses.replace(write, read_version=version)
            if self._write_check is not None:
                try:
                    self._write_check(rebased)
                except (FailedPrecondition, InvalidArgument) as exc:
                    raise FailedPrecondition(
                        f"table {canonical}: the write of transaction {txn_id} cannot be "
                        f"reapplied onto version {version} without losing or duplicating "
                        f"rows: {exc}. Choose abandon instead") from exc
            with self._lock:
                self._check_unchanged(canonical, record)
                self.store.put_quarantine(chosen)  # durable before the Delta commit (I10)
                self._quarantined[canonical] = chosen
            self.store.flush()
            self._roll_forward(txn_id, canonical, time.monotonic() + self.config.snapshot_wait_s)
        else:
            self._abandon(txn_id, canonical, record, chosen)
        return self._latest_record(canonical, txn_id)

    def _latest_record(self, table: str, txn_id: str) -> QuarantineRecord:
        return next(q for q in reversed(self.store.load_quarantines())
                    if q.table == table and q.txn_id == txn_id)

    def _check_unchanged(self, table: str, seen: QuarantineRecord) -> None:
        """Under the lock: refuses a choice if another was recorded since ``seen``."""
        if self._quarantined.get(table) is not seen:
            raise FailedPrecondition(f"table {table}: another release of its quarantine ran "
                                     "meanwhile; list it again (tables quarantined --all)")

    def _abandon(self, txn_id: str, table: str, seen: QuarantineRecord,
                 chosen: QuarantineRecord) -> None:
        """Ends the hold without applying: the entry names the table's version at the choice,
        which holds none of the write, so snapshots at and after the commit read that."""
        with self._lock:
            self._check_unchanged(table, seen)
            with self.store.batch():
                self.store.put_quarantine(dataclasses.replace(chosen, released_ms=wall_ms()))
                self._record_applied(self._get(txn_id), {table: chosen.as_of_version},
                                     abandoned={table})
            del self._quarantined[table]
        self.store.flush()
        log.warning("quarantined write abandoned by the operator",
                    extra={"txn_id": txn_id, "table": table, "detail": chosen.choice_reason})
