"""ACL entries: what a pattern names, how entries are checked and matched.

Pipeline patterns: an exact pipeline id, ``prefix*`` (every id starting with ``prefix``) or
``*`` (every pipeline). Table patterns: ``*`` (every table) or a table URI or folder, which
names that table and every table below it (``file:///lake/sales`` covers
``file:///lake/sales/orders``, not ``file:///lake/salesforce``); it is stored canonical, as the
core canonicalises tables (symlinks followed, ``s3a://`` read as ``s3://``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from coordinator import validation
from coordinator.auth_records import (
    ANY_PRINCIPAL,
    IMPLIED,
    PERMISSIONS_OF,
    AclRecord,
    Permission,
    Resource,
)
from percolake.errors import InvalidArgument

EVERYTHING = "*"
# A client certificate whose subject CN is ``alice`` is principal ``cert:alice``: certificate
# principals never meet token principals (a CN ``admin`` is not the bootstrap admin).
CERT_PREFIX = "cert:"
# The bootstrap token's principal (--admin-token-file): no stored token may name it, so its
# ADMIN on every pipeline goes to that token alone.
BOOTSTRAP_PRINCIPAL = "admin"


def check_principal(principal: str, *, wildcard: bool = False) -> None:
    """A principal is printable text: a token's name, or ``cert:`` and a client certificate's
    common name; ``*`` only where it means every authenticated principal (an ACL entry)."""
    validation.check_id("principal", principal)
    if principal == ANY_PRINCIPAL and not wildcard:
        raise InvalidArgument("principal '*' is reserved for ACL entries (every authenticated "
                              "principal); name one principal")
    if principal[:len(CERT_PREFIX)].lower() == CERT_PREFIX:
        if not principal.startswith(CERT_PREFIX):
            raise InvalidArgument(f"principal {principal[:80]!r}: write the certificate "
                                  f"prefix in lower case, {CERT_PREFIX!r}")
        check_common_name(principal[len(CERT_PREFIX):])


def check_common_name(name: str) -> None:
    """What may follow ``cert:``: one principal name (not ``*``)."""
    validation.check_id("certificate common name", name)
    if name == ANY_PRINCIPAL:
        raise InvalidArgument("certificate common name '*' names no principal")


def check_token_principal(principal: str) -> None:
    """A token's principal: any principal but a certificate's (``cert:...``) and the
    bootstrap admin."""
    check_principal(principal)
    if principal.lower().startswith(CERT_PREFIX):
        raise InvalidArgument(f"principal {principal[:80]!r} names a client certificate "
                              f"({CERT_PREFIX}<CN>); a token's principal cannot start with "
                              f"{CERT_PREFIX!r}")
    if principal == BOOTSTRAP_PRINCIPAL:
        raise InvalidArgument(f"principal {BOOTSTRAP_PRINCIPAL!r} is reserved for the "
                              "bootstrap token (--admin-token-file); create the token for "
                              "another principal (e.g. 'ops') and grant it ADMIN on '*'")


def check_entry(entry: AclRecord, canonical_table: Callable[[str], str]) -> AclRecord:
    """The entry with its pattern in stored form; InvalidArgument naming what is wrong."""
    check_principal(entry.principal, wildcard=True)
    if entry.permission not in PERMISSIONS_OF[entry.resource]:
        allowed = ", ".join(p.value for p in PERMISSIONS_OF[entry.resource])
        raise InvalidArgument(f"permission {entry.permission.value} does not apply to "
                              f"{entry.resource.value}s; use one of {allowed}")
    pattern = entry.pattern
    if entry.resource == Resource.PIPELINE:
        validation.check_id("pipeline pattern", pattern)
        if "*" in pattern[:-1]:
            raise InvalidArgument(f"pipeline pattern {pattern!r}: '*' may only end it "
                                  "(an id, 'prefix*' or '*')")
    elif pattern != EVERYTHING:
        if not pattern.strip():
            raise InvalidArgument("table pattern must be '*' or a table URI or folder")
        pattern = canonical_table(pattern).rstrip("/")
    return AclRecord(entry.principal, entry.resource, pattern, entry.permission,
                     entry.created_ms)


def matches(resource: Resource, pattern: str, name: str) -> bool:
    if pattern in (EVERYTHING, name):
        return True
    if resource == Resource.PIPELINE:
        return pattern.endswith("*") and name.startswith(pattern[:-1])
    return name.startswith(pattern + "/")


class Policy:
    """An immutable view of every ACL entry, indexed by principal."""

    def __init__(self, entries: Iterable[AclRecord] = ()) -> None:
        self.entries = tuple(entries)
        self._by_principal: dict[str, list[AclRecord]] = defaultdict(list)
        for entry in self.entries:
            self._by_principal[entry.principal].append(entry)

    def _of(self, principal: str) -> list[AclRecord]:
        return self._by_principal.get(principal, []) + self._by_principal.get(ANY_PRINCIPAL, [])

    def allows(self, principal: str, resource: Resource, name: str,
               permission: Permission) -> bool:
        """Whether some entry of ``principal`` (or of ``*``) grants ``permission`` on ``name``."""
        return any(e.resource == resource and permission in IMPLIED[e.permission]
                   and matches(resource, e.pattern, name) for e in self._of(principal))

    def allows_every(self, principal: str, resource: Resource, permission: Permission) -> bool:
        """Whether ``permission`` is granted on every pipeline (table) by a ``*`` entry."""
        return any(e.resource == resource and e.pattern == EVERYTHING
                   and permission in IMPLIED[e.permission] for e in self._of(principal))
