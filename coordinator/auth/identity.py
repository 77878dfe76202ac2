"""Who a caller is, from what it presented: a bearer token or a client certificate. One rule
for every surface (gRPC, the web view, /metrics); each surface only collects the inputs.

A token, once sent, decides (a bad one is refused even with a good certificate). Otherwise a
client certificate (verified against --client-ca by the TLS layer) names principal
``cert:<CN>``, with the common name read from the certificate's parsed subject as a whole: a
subject with no CN or several, or a CN that is not exactly a valid principal name (a NUL, a
control character, surrounding blanks...) is refused, never cut down to something usable.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from coordinator.auth.acl import BOOTSTRAP_PRINCIPAL, CERT_PREFIX, check_common_name
from coordinator.auth.credentials import Credentials
from percolake.errors import InvalidArgument

EXPECTED = ("send a bearer token ('authorization: Bearer <token>') or, where the coordinator "
            "requires client certificates, a certificate whose subject has one common name "
            "(CN) that is a valid principal name")


class Unauthenticated(Exception):
    """The caller cannot be identified; ``code`` UNAVAILABLE when it may succeed later."""

    def __init__(self, problem: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED):
        super().__init__(problem)
        self.code = code


def certificate_principal(certificate: bytes) -> str:
    """``cert:<CN>`` of a client certificate (PEM or DER) the TLS layer has verified.

    Raises:
        Unauthenticated: the certificate cannot be parsed, or its subject has no CN, several,
            or one that is not exactly a valid principal name (the message says which).
    """
    try:
        parsed = (x509.load_pem_x509_certificate(certificate)
                  if certificate.lstrip().startswith(b"-----")
                  else x509.load_der_x509_certificate(certificate))
        names = parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError as exc:
        raise Unauthenticated(f"the client certificate cannot be parsed ({exc})") from exc
    if not names:
        raise Unauthenticated("the client certificate's subject has no common name (CN)")
    if len(names) > 1:
        raise Unauthenticated(f"the client certificate's subject has {len(names)} common names "
                              "(CN); exactly one must name the principal")
    name = names[0].value
    if isinstance(name, bytes):  # only for attribute types that are not strings
        raise Unauthenticated("the client certificate's subject CN is not text")
    try:
        check_common_name(name)
    except InvalidArgument as exc:
        raise Unauthenticated(f"the client certificate's subject CN is not a valid principal "
                              f"name: {exc}") from exc
    return CERT_PREFIX + name


def authenticate(credentials: Credentials, authorization: Sequence[str],
                 certificate: bytes | None) -> str:
    """The caller's principal from its ``authorization`` values (metadata or header) and its
    verified client certificate (None: none was asked for or sent).

    Raises:
        Unauthenticated: saying what is wrong.
    """
    if len(authorization) > 1:
        raise Unauthenticated(f"{len(authorization)} authorization values; send one")
    if authorization:
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("malformed authorization (not 'Bearer <token>')")
        if credentials.is_bootstrap(token):
            return BOOTSTRAP_PRINCIPAL
        principal = credentials.stored_principal_of(token)
        if principal is not None:
            _check_stored_principal(principal)
            return principal
        if not credentials.loaded:
            raise Unauthenticated("the coordinator has not loaded its tokens from the store "
                                  "yet (the store is unreachable); retry",
                                  grpc.StatusCode.UNAVAILABLE)
        raise Unauthenticated("unknown or revoked bearer token")
    if certificate:
        return certificate_principal(certificate)
    raise Unauthenticated("no credential")


def _check_stored_principal(principal: str) -> None:
    """A stored token made before its principal was reserved acts as nobody."""
    if principal.lower().startswith(CERT_PREFIX):
        raise Unauthenticated(f"this token names principal {principal[:80]!r}, which only "
                              "a client certificate may be; revoke it and create one for "
                              "another principal")
    if principal == BOOTSTRAP_PRINCIPAL:
        raise Unauthenticated(f"this token names principal {BOOTSTRAP_PRINCIPAL!r}, which only "
                              "the bootstrap token (--admin-token-file) may be; revoke it and "
                              "create one for another principal")
