"""Who may call what: one rule per RPC, checked before the core runs, with what the answer
may show; and the audit lines of refusals and administrative actions.

The rules (docs/security.md has the table):
- RegisterPipeline, OpenTransaction: WRITE on the pipeline; the applied reports an Open
  carries: as ReportApplied.
- DeclareTables, Prewrite, CommitTransaction, ReportApplied, Heartbeat: WRITE on the
  transaction's pipeline, and being the principal that opened the transaction.
- AbortTransaction: as above for one's own transaction; another principal's needs ADMIN.
- Every table a request makes a transaction write (Open, Declare, Prewrite, Commit; a Commit
  also every table the transaction holds): WRITE on the table.
- GetTransaction: DESCRIBE on its pipeline (``include_writes`` needs WRITE);
  ListTransactions: DESCRIBE on the pipeline filter, ADMIN on every pipeline without one;
  GetPipeline: DESCRIBE. Epochs and query ids are shown only to WRITE holders.
- ListPipelines: ADMIN on every pipeline ('*').
- GetSnapshot: READ on every table; ``as_of_batch`` also DESCRIBE on that pipeline.
- RegisterReads: WRITE on the pipeline (as OpenTransaction) and READ on every table.
- GetTopology: DESCRIBE on every pipeline ('*'): it shows them all.
- PlanBarrier: WRITE on the pipeline (its sources run in its driver, with its credentials;
  the plan is recorded in the pipeline's record).
- GetTableChanges: READ on the table.
- ReleaseLease: being the principal that took the lease; another's needs ADMIN on '*'
  (audited). A lease that does not exist (or expired) needs nothing: the answer is false.
- ListLeases: READ on every table named; without tables (every lease): ADMIN on '*'. The ids
  of leases other principals took are shown empty unless the caller is ADMIN on '*'.
- Vacuum: ADMIN on every pipeline ('*') and WRITE on the table: it deletes files (audited).
- Revise: ADMIN on every pipeline ('*'): it rewrites tables and resets pipelines (audited).
- ListQuarantines: DESCRIBE on the pipeline filter, on every pipeline ('*') without one.
  ReleaseQuarantine: ADMIN on every
  pipeline ('*') and WRITE on the table: it decides what becomes of a committed write (audited).
- Nobody drives the reserved pipeline ``percolake.revise`` (the coordinator's revisions): a
  request naming it as its pipeline, or acting on one of its transactions, is refused.
- ResetPipeline: ADMIN; with ``require_idle`` and no ``start_barrier`` (a driver's automatic
  reset on a new checkpoint, refused while the pipeline is active) WRITE is enough. Where the
  new generation's input starts (skipping or re-reading a range) is an operator's decision.
- The administrative RPCs (ACL entries, tokens): ADMIN on every pipeline ('*').
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from coordinator import validation
from coordinator.auth import audit
from coordinator.auth.audit import AuditLog
from coordinator.auth.credentials import Credentials
from coordinator.auth_records import Permission, Resource
from coordinator.core.revision import check_not_reserved
from coordinator.principal import current_principal
from coordinator.status_codes import status_for
from percolake.errors import PermissionDenied, ProtocolError
from percolake.v1 import coordinator_pb2 as pb

ADMIN_RPCS = ("AddAcl", "RemoveAcl", "ListAcls", "CreateToken", "RevokeToken", "ListTokens")
_ADMIN_CHANGES = {"AddAcl": "acl add", "RemoveAcl": "acl remove", "CreateToken": "token create",
                  "RevokeToken": "token revoke"}


class AccessDenied(PermissionDenied):
    """The caller lacks a permission; the message names it and the resource."""


@dataclass
class Decision:
    """What a permitted call may show, and the administrative action it is (audited)."""

    action: str = ""
    hide_identity: Callable[[Any], None] | None = None  # clears epochs and query ids


def _hide_pipeline(reply: pb.Pipeline) -> None:
    reply.epoch = 0
    reply.query_id = ""
    for reset in reply.resets:
        reset.previous_query_id = ""
        reset.bound_query_id = ""


def _hide_txn(reply: pb.Transaction) -> None:
    reply.epoch = 0
    reply.query_id = ""


class Checks:
    """The rules of one call: the caller, the policy in memory, the serving core."""

    def __init__(self, principal: str, credentials: Credentials, core: Any) -> None:
        self.principal = principal
        self.policy = credentials.policy
        self.core = core

    def _who(self) -> str:
        return f"principal {self.principal!r}" if self.principal else "an unnamed caller"

    def has(self, permission: Permission, pipeline: str) -> bool:
        return self.policy.allows(self.principal, Resource.PIPELINE, pipeline, permission)

    def pipeline(self, permission: Permission, pipeline: str, doing: str = "") -> None:
        audit.note(pipeline=pipeline)
        if not self.has(permission, pipeline):
            raise AccessDenied(f"permission denied: {self._who()} lacks {permission.value} on "
                               f"pipeline {pipeline!r}{doing}")

    def every_pipeline(self, permission: Permission, doing: str) -> None:
        if not self.policy.allows_every(self.principal, Resource.PIPELINE, permission):
            raise AccessDenied(f"permission denied: {self._who()} lacks {permission.value} on "
                               f"every pipeline ('*'), needed to {doing}")

    def tables(self, permission: Permission, tables: Iterable[str], what: str = "tables",
               canonical: bool = False,
               count_check: Callable[[int, str], None] | None = None) -> None:
        """``permission`` on each table, canonicalised as the core does; the count is
        checked first (by default against the transaction's table limit) so that no
        per-table work is done for a request the method would refuse anyway."""
        names = list(dict.fromkeys(tables))
        if not canonical:
            (count_check or self.core.check_txn_tables)(len(names), what)
        for name in names:
            table = name if canonical else self.core.resolve_table(name)
            if not self.policy.allows(self.principal, Resource.TABLE, table, permission):
                audit.note(table=table)
                raise AccessDenied(f"permission denied: {self._who()} lacks "
                                   f"{permission.value} on table {table}")

    def own_transaction(self, txn_id: str, *, admin_may: bool = False) -> tuple[str, bool]:
        """WRITE on the transaction's pipeline and being its opener (or, with
        ``admin_may``, ADMIN on the pipeline). Returns the pipeline and whether the
        transaction is another principal's."""
        audit.note(txn_id=txn_id)
        pipeline, opener, _ = self.core.transaction_owner(txn_id)
        audit.note(pipeline=pipeline)
        if opener == self.principal and opener:
            self.pipeline(Permission.WRITE, pipeline)
            return pipeline, False
        if admin_may:
            self.pipeline(Permission.ADMIN, pipeline,
                          f", needed to abort transaction {txn_id} opened by "
                          f"{_opener(opener)}")
            return pipeline, True
        self.pipeline(Permission.WRITE, pipeline)
        raise AccessDenied(f"permission denied: transaction {txn_id} was opened by "
                           f"{_opener(opener)}; only its opener may use it ({self._who()} "
                           "is not)")


def _opener(opener: str) -> str:
    return f"principal {opener!r}" if opener else "no principal (authentication was off)"


def _tables_of_writes(writes: Iterable[Any]) -> list[str]:
    return [w.table for w in writes]


def authorize(name: str, checks: Checks, request: Any) -> Decision:
    """Raises AccessDenied unless the caller may make this call; see the module docstring."""
    if name in ADMIN_RPCS:
        checks.every_pipeline(Permission.ADMIN, "manage ACL entries and tokens")
        return Decision(action=_ADMIN_CHANGES.get(name, ""))
    rule = _RULES.get(name)
    if rule is None:  # a new RPC without a rule is refused, never let through
        raise AccessDenied(f"permission denied: {name} has no access rule")
    return rule(checks, request)


def _register(checks: Checks, request: Any) -> Decision:
    checks.pipeline(Permission.WRITE, request.pipeline_id)
    return Decision()


def _open(checks: Checks, request: Any) -> Decision:
    checks.pipeline(Permission.WRITE, request.pipeline_id)
    checks.tables(Permission.WRITE, request.tables)
    # Carried applied reports: as ReportApplied's rule, each of one's own transactions (the
    # core also refuses one of another pipeline).
    validation.check_count("applied_reports", len(request.applied_reports),
                           validation.MAX_APPLIED_REPORTS)
    for report in request.applied_reports:
        checks.own_transaction(report.txn_id)
    return Decision()


def _declare(checks: Checks, request: Any) -> Decision:
    checks.own_transaction(request.txn_id)
    checks.tables(Permission.WRITE, request.tables)
    return Decision()


def _prewrite(checks: Checks, request: Any) -> Decision:
    checks.own_transaction(request.txn_id)
    checks.tables(Permission.WRITE, _tables_of_writes(request.writes), "table writes")
    return Decision()


def _commit(checks: Checks, request: Any) -> Decision:
    checks.own_transaction(request.txn_id)
    checks.tables(Permission.WRITE, request.tables)
    checks.tables(Permission.WRITE, _tables_of_writes(request.writes), "table writes")
    checks.tables(Permission.WRITE, checks.core.transaction_owner(request.txn_id)[2],
                  canonical=True)
    return Decision()


def _own(checks: Checks, request: Any) -> Decision:
    checks.own_transaction(request.txn_id)
    return Decision()


def _abort(checks: Checks, request: Any) -> Decision:
    _, others = checks.own_transaction(request.txn_id, admin_may=True)
    return Decision(action="abort another principal's transaction" if others else "")


def _get_transaction(checks: Checks, request: Any) -> Decision:
    audit.note(txn_id=request.txn_id)
    pipeline = checks.core.transaction_owner(request.txn_id)[0]
    if request.include_writes:
        checks.pipeline(Permission.WRITE, pipeline, " (include_writes shows the write intents)")
    else:
        checks.pipeline(Permission.DESCRIBE, pipeline)
    return Decision(hide_identity=None if checks.has(Permission.WRITE, pipeline)
                    else _hide_txn)


def _list_transactions(checks: Checks, request: Any) -> Decision:
    if not request.pipeline_id:
        checks.every_pipeline(Permission.ADMIN, "list the transactions of every pipeline "
                              "(give pipeline_id to list one pipeline's)")
        return Decision()
    checks.pipeline(Permission.DESCRIBE, request.pipeline_id)
    if checks.has(Permission.WRITE, request.pipeline_id):
        return Decision()

    def hide(reply: pb.ListTransactionsResponse) -> None:
        for txn in reply.transactions:
            _hide_txn(txn)

    return Decision(hide_identity=hide)


def _snapshot(checks: Checks, request: Any) -> Decision:
    if request.WhichOneof("as_of") == "as_of_batch":
        checks.pipeline(Permission.DESCRIBE, request.as_of_batch.pipeline_id)
    checks.tables(Permission.READ, request.tables,
                  count_check=lambda count, what: validation.check_count(what, count))
    return Decision()


def _get_pipeline(checks: Checks, request: Any) -> Decision:
    checks.pipeline(Permission.DESCRIBE, request.pipeline_id)
    return Decision(hide_identity=None if checks.has(Permission.WRITE, request.pipeline_id)
                    else _hide_pipeline)


def _list_pipelines(checks: Checks, request: Any) -> Decision:
    checks.every_pipeline(Permission.ADMIN, "list every pipeline")
    return Decision()


def _register_reads(checks: Checks, request: Any) -> Decision:
    checks.pipeline(Permission.WRITE, request.pipeline_id)
    checks.tables(Permission.READ, request.tables,
                  count_check=lambda count, what: validation.check_count(what, count))
    return Decision()


def _get_topology(checks: Checks, request: Any) -> Decision:
    checks.every_pipeline(Permission.DESCRIBE, "show the topology of every pipeline")
    return Decision()


def _plan_barrier(checks: Checks, request: Any) -> Decision:
    checks.pipeline(Permission.WRITE, request.pipeline_id)
    return Decision()


def _table_changes(checks: Checks, request: Any) -> Decision:
    checks.tables(Permission.READ, [request.table],
                  count_check=lambda count, what: validation.check_count(what, count))
    return Decision()


def _is_admin(checks: Checks) -> bool:
    return checks.policy.allows_every(checks.principal, Resource.PIPELINE, Permission.ADMIN)


def _release_lease(checks: Checks, request: Any) -> Decision:
    lease = checks.core.live_lease(request.lease_id)
    if lease is None or (lease.principal and lease.principal == checks.principal):
        return Decision()
    checks.every_pipeline(Permission.ADMIN, "release a lease another principal took")
    return Decision(action="release another principal's lease")


def _list_leases(checks: Checks, request: Any) -> Decision:
    if not request.tables:
        checks.every_pipeline(Permission.ADMIN, "list every lease (name tables to list "
                              "the leases on them)")
        return Decision()
    checks.tables(Permission.READ, request.tables,
                  count_check=lambda count, what: validation.check_count(what, count))
    if _is_admin(checks):
        return Decision()

    def hide(reply: pb.ListLeasesResponse) -> None:
        # A lease id is what ReleaseLease takes: only its taker sees it.
        owners = checks.core.lease_principals()
        for lease in reply.leases:
            if not checks.principal or owners.get(lease.lease_id) != checks.principal:
                lease.lease_id = ""

    return Decision(hide_identity=hide)


def _vacuum(checks: Checks, request: Any) -> Decision:
    checks.every_pipeline(Permission.ADMIN, "vacuum a table")
    checks.tables(Permission.WRITE, [request.table],
                  count_check=lambda count, what: validation.check_count(what, count))
    return Decision(action="vacuum dry run" if request.dry_run else "vacuum")


def _revise(checks: Checks, request: Any) -> Decision:
    checks.every_pipeline(Permission.ADMIN, "revise a table (it resets the pipelines "
                          "downstream of it)")
    return Decision(action="revise")


def _list_quarantines(checks: Checks, request: Any) -> Decision:
    if request.pipeline_id:
        checks.pipeline(Permission.DESCRIBE, request.pipeline_id)
    else:
        checks.every_pipeline(Permission.DESCRIBE, "list every quarantined table (name a "
                              "pipeline to list those of its transactions)")
    return Decision()


def _release_quarantine(checks: Checks, request: Any) -> Decision:
    checks.every_pipeline(Permission.ADMIN, "release a quarantined table (it decides what "
                          "becomes of a committed write)")
    checks.tables(Permission.WRITE, [request.table],
                  count_check=lambda count, what: validation.check_count(what, count))
    return Decision(action="release quarantine")


def _reset(checks: Checks, request: Any) -> Decision:
    automatic = request.require_idle and not request.HasField("start_barrier")
    if automatic and checks.has(Permission.WRITE, request.pipeline_id):
        audit.note(pipeline=request.pipeline_id)
    else:
        checks.pipeline(Permission.ADMIN, request.pipeline_id,
                        " (WRITE suffices for a reset with require_idle and no start_barrier)")
    return Decision(action="reset pipeline")


_RULES: dict[str, Callable[[Checks, Any], Decision]] = {
    "RegisterPipeline": _register, "OpenTransaction": _open, "DeclareTables": _declare,
    "Prewrite": _prewrite, "CommitTransaction": _commit, "AbortTransaction": _abort,
    "ReportApplied": _own, "Heartbeat": _own, "GetTransaction": _get_transaction,
    "ListTransactions": _list_transactions, "GetSnapshot": _snapshot,
    "GetPipeline": _get_pipeline, "ResetPipeline": _reset, "ListPipelines": _list_pipelines,
    "RegisterReads": _register_reads, "GetTopology": _get_topology,
    "ReleaseLease": _release_lease, "ListLeases": _list_leases, "Vacuum": _vacuum,
    "PlanBarrier": _plan_barrier, "GetTableChanges": _table_changes, "Revise": _revise,
    "ListQuarantines": _list_quarantines, "ReleaseQuarantine": _release_quarantine,
}


class Guard:
    """Runs each servicer call: the access rule first (with authentication on), then the
    call; audits refusals and administrative actions; hides what the caller may not see."""

    def __init__(self, credentials: Credentials | None = None, audit_log: AuditLog | None = None,
                 redact: Callable[[str], str] = str) -> None:
        self.credentials = credentials
        self.audit_log = audit_log
        self.redact = redact

    def run(self, name: str, core: Any, request: Any, call: Callable[[], Any]) -> Any:
        """``call()``'s reply, as the caller may see it; raises what it (or the rule) raises."""
        principal = current_principal()
        if self.audit_log is not None:
            _note_request(request)
        try:
            decision = (authorize(name, Checks(principal, self.credentials, core), request)
                        if self.credentials is not None else Decision(
                            action=_ADMIN_CHANGES.get(name, "") or _unchecked_action(name)))
            _refuse_reserved(name, core, request)
            reply = call()
        except ProtocolError as exc:
            self._audit(principal, "refused", exc)
            raise
        if decision.hide_identity is not None:
            decision.hide_identity(reply)
        if decision.action:
            self._audit(principal, decision.action, None)
        return reply

    def _audit(self, principal: str, action: str, error: ProtocolError | None) -> None:
        if self.audit_log is None:
            return
        status = status_for(error).name if error is not None else "OK"
        message = self.redact(str(error)) if error is not None else ""
        self.audit_log.write(principal=principal, action=action, status=status,
                             message=message)


def _unchecked_action(name: str) -> str:
    """Without authentication only a reset or a revision is known to be administrative
    (nobody owns a transaction, so no abort is another's)."""
    return {"ResetPipeline": "reset pipeline", "Revise": "revise"}.get(name, "")


_TXN_CHANGES = frozenset({"DeclareTables", "Prewrite", "CommitTransaction", "AbortTransaction",
                          "ReportApplied", "Heartbeat"})


def _refuse_reserved(name: str, core: Any, request: Any) -> None:
    """Clients never drive the coordinator's revision pipeline nor its transactions."""
    fields = request.DESCRIPTOR.fields_by_name
    if "pipeline_id" in fields and name not in ("GetPipeline", "ListTransactions"):
        check_not_reserved(request.pipeline_id)
    if name in _TXN_CHANGES:
        try:
            pipeline = core.transaction_pipeline(request.txn_id)
        except ProtocolError:  # no such transaction: the call itself says so
            return
        check_not_reserved(pipeline)


def _note_request(request: Any) -> None:
    """What the request names, for its audit line."""
    fields = request.DESCRIPTOR.fields_by_name
    pipeline = request.pipeline_id if "pipeline_id" in fields else ""
    txn_id = request.txn_id if "txn_id" in fields else ""
    table = ""
    if "tables" in fields and len(request.tables):
        first = request.tables[0]
        table = first if isinstance(first, str) else first.table
    elif "writes" in fields and len(request.writes):
        table = request.writes[0].table
    elif "table" in fields:  # Vacuum, GetTableChanges, Revise
        table = request.table
    audit.note(pipeline=pipeline, table=table, txn_id=txn_id)
