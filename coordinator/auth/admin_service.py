"""The administrative RPCs (ACL entries, bearer tokens) on the coordinator service.

They write through the serving core's store, so on PostgreSQL they are fenced by the lease
epoch like every other write; once durable, the daemon's view in memory is reloaded, so a
change takes effect at the next call.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from coordinator import validation
from coordinator.auth import acl, tokens
from coordinator.auth.access import Guard
from coordinator.auth.credentials import Credentials
from coordinator.auth_records import AclRecord, Permission, Resource, TokenRecord
from coordinator.core.state import wall_ms
from coordinator.leadership import CoreProvider
from coordinator.servicer import CoordinatorServicer, rpc
from percolake.errors import InvalidArgument, NotFound
from percolake.lake.warehouse import canonical_table_uri
from percolake.v1 import coordinator_pb2 as pb

log = logging.getLogger("percolake.auth")
MAX_DESCRIPTION = 1000
_RESOURCES = {pb.PIPELINE: Resource.PIPELINE, pb.TABLE: Resource.TABLE}
_RESOURCES_PB = {v: k for k, v in _RESOURCES.items()}


def acl_from_pb(entry: pb.AclEntry) -> AclRecord:
    resource = _RESOURCES.get(entry.resource_type)
    if resource is None:
        raise InvalidArgument("resource_type must be PIPELINE or TABLE")
    name = pb.Permission.Name(entry.permission) if entry.permission in pb.Permission.values() \
        else ""
    if name not in Permission.__members__:
        raise InvalidArgument("permission must be one of WRITE, DESCRIBE, ADMIN, READ")
    record = AclRecord(entry.principal, resource, entry.pattern, Permission[name])
    return acl.check_entry(record, canonical_table_uri)


def acl_to_pb(entry: AclRecord) -> pb.AclEntry:
    return pb.AclEntry(principal=entry.principal, resource_type=_RESOURCES_PB[entry.resource],
                       pattern=entry.pattern, permission=pb.Permission.Value(
                           entry.permission.value), created_unix_ms=entry.created_ms)


def token_to_pb(token: TokenRecord) -> pb.Token:
    return pb.Token(token_id=token.token_id, principal=token.principal,
                    created_unix_ms=token.created_ms, revoked_unix_ms=token.revoked_ms,
                    description=token.description)


class SecuredServicer(CoordinatorServicer):
    """The coordinator service with its administrative RPCs; ``credentials`` (None without
    authentication) is reloaded after each change."""

    def __init__(self, cores: CoreProvider, redact: Callable[[str], str] = str,
                 guard: Guard | None = None, credentials: Credentials | None = None) -> None:
        super().__init__(cores, redact, guard)
        self.credentials = credentials

    def _changed(self, core: Any) -> None:
        """The change is durable before the view in memory shows it."""
        core.wait_durable()
        if self.credentials is None:
            return
        try:
            self.credentials.refresh()
        except Exception as exc:  # the loop reloads it shortly
            log.warning("reloading tokens and ACL entries failed", extra={"error": str(exc)})
            self.credentials.refresh_soon()

    @rpc
    def AddAcl(self, core, request, context):  # noqa: N802
        entry = dataclasses.replace(acl_from_pb(request.entry), created_ms=wall_ms())
        changed = core.store.insert_acl(entry)
        self._changed(core)
        stored = next((e for e in core.store.load_acl() if e.key == entry.key), entry)
        log.warning("ACL entry added", extra={"entry": str(entry.key), "changed": changed})
        return pb.AclChangeResponse(entry=acl_to_pb(stored), changed=changed)

    @rpc
    def RemoveAcl(self, core, request, context):  # noqa: N802
        entry = acl_from_pb(request.entry)
        changed = core.store.delete_acl(entry)
        self._changed(core)
        log.warning("ACL entry removed", extra={"entry": str(entry.key), "changed": changed})
        return pb.AclChangeResponse(entry=acl_to_pb(entry), changed=changed)

    @rpc
    def ListAcls(self, core, request, context):  # noqa: N802
        entries = [e for e in core.store.load_acl()
                   if not request.principal or e.principal == request.principal]
        return pb.ListAclsResponse(entries=[acl_to_pb(e) for e in entries])

    @rpc
    def CreateToken(self, core, request, context):  # noqa: N802
        acl.check_token_principal(request.principal)
        validation.check_text("description", request.description, MAX_DESCRIPTION)
        made = tokens.new_token()
        record = TokenRecord(made.token_id, made.secret_hash, request.principal, wall_ms(),
                             description=validation.clean_reason(request.description))
        core.store.insert_token(record)
        self._changed(core)
        log.warning("token created", extra={"token_id": record.token_id,
                                            "principal": record.principal})
        return pb.CreateTokenResponse(token=token_to_pb(record), bearer_token=made.bearer)

    @rpc
    def RevokeToken(self, core, request, context):  # noqa: N802
        if not tokens.is_token_id(request.token_id):
            raise InvalidArgument(f"token_id {request.token_id[:80]!r} is not a token id (16 hex "
                                  "characters, as `tokens list` shows)")
        now = wall_ms()
        before = {t.token_id: t for t in core.store.load_tokens()}.get(request.token_id)
        record = core.store.revoke_token(request.token_id, now)
        if record is None:
            raise NotFound(f"no token {request.token_id}")
        self._changed(core)
        changed = before is not None and before.live
        log.warning("token revoked", extra={"token_id": record.token_id, "changed": changed})
        return pb.RevokeTokenResponse(token=token_to_pb(record), changed=changed)

    @rpc
    def ListTokens(self, core, request, context):  # noqa: N802
        found = [t for t in core.store.load_tokens()
                 if (not request.principal or t.principal == request.principal)
                 and (request.include_revoked or t.live)]
        return pb.ListTokensResponse(tokens=[token_to_pb(t) for t in found])
