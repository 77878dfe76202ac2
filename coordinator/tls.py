"""The daemon's transport: TLS or mutual TLS on its one port, and the rule that an address
other than loopback is served only with TLS and authentication (or with --insecure).

Everything is checked at start, before the port is bound or the store opened, with messages
that name the flag and the file.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from typing import Protocol

import grpc

log = logging.getLogger("percolake.tls")


class TransportOptions(Protocol):
    """The fields of ``ServerOptions`` this module reads."""

    host: str
    port: int
    tls_cert: str
    tls_key: str
    client_ca: str
    insecure: bool
    authenticate: bool
    metrics_port: int
    metrics_open: bool


class TransportSettingsError(ValueError):
    """The TLS files or the exposure rule refuse this start; the message says what to fix."""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``: reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # another host name, or empty (every interface)


def missing_protection(options: TransportOptions) -> list[str]:
    """What a non-loopback address lacks: ``TLS`` and/or ``authentication``."""
    missing = []
    if not options.tls_cert:
        missing.append("TLS (--tls-cert and --tls-key)")
    if not (options.authenticate or options.client_ca):
        missing.append("authentication (--authenticate, or --client-ca for mTLS)")
    return missing


def check(options: TransportOptions) -> None:
    """Checks the TLS files and the exposure rule without binding anything.

    Raises:
        TransportSettingsError: a file is missing, unreadable or not what its flag needs, the
            key is not the certificate's, or a non-loopback address lacks TLS or
            authentication without --insecure.
    """
    server_credentials(options)
    _exposure(options)
    _metrics_exposure(options)


def add_port(server: grpc.Server, options: TransportOptions) -> int:
    """Binds ``host:port`` with TLS when configured; returns the bound port (0 if not bound).
    Serving a non-loopback address unprotected (--insecure) is logged as a warning.

    Raises:
        TransportSettingsError: as :func:`check`.
    """
    missing = _exposure(options)
    address = f"{options.host}:{options.port}"
    credentials = server_credentials(options)
    port = server.add_insecure_port(address) if credentials is None \
        else server.add_secure_port(address, credentials)
    if missing and port:
        log.warning(
            "INSECURE: serving %s:%s without %s because of --insecure: anyone who can reach "
            "this port can read the traffic and commit, abort or reset any pipeline",
            options.host or "*", port, " and ".join(missing),
            extra={"host": options.host, "port": port, "insecure": True, "missing": missing})
    return port


def server_credentials(options: TransportOptions) -> grpc.ServerCredentials | None:
    """The port's TLS credentials, None for plaintext. With ``client_ca`` a client certificate
    signed by it is required.

    Raises:
        TransportSettingsError: see :func:`check`.
    """
    if not (options.tls_cert or options.tls_key or options.client_ca):
        return None
    if not options.tls_cert or not options.tls_key:
        given = "--tls-cert" if options.tls_cert else "--tls-key" if options.tls_key \
            else "--client-ca"
        raise TransportSettingsError(
            f"{given} needs both --tls-cert and --tls-key (the server's certificate and its "
            "private key, PEM files)")
    cert = _read_pem(options.tls_cert, "--tls-cert", "CERTIFICATE")
    key = _read_pem(options.tls_key, "--tls-key", "PRIVATE KEY")
    _check_pair(options.tls_cert, options.tls_key)
    client_ca = None
    if options.client_ca:
        client_ca = _read_pem(options.client_ca, "--client-ca", "CERTIFICATE")
        _check_ca(options.client_ca)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def _exposure(options: TransportOptions) -> list[str]:
    """What a non-loopback bind lacks ([] when nothing); refused unless --insecure."""
    if is_loopback(options.host):
        return []
    missing = missing_protection(options)
    if missing and not options.insecure:
        raise TransportSettingsError(
            f"refusing to serve {options.host or 'every interface'}:{options.port} without "
            f"{' and '.join(missing)}: the address is not loopback, so other machines can "
            "reach it. Add what is missing, bind 127.0.0.1, or pass --insecure to accept the "
            "risk")
    return missing


def metrics_open_because(options: TransportOptions) -> str:
    """Why /metrics answers callers without a credential ("" when it needs one, as gRPC
    does): ``--metrics-open``, or no authentication at all (no --authenticate, no
    --client-ca)."""
    if options.metrics_open:
        return "--metrics-open"
    if not (options.authenticate or options.client_ca):
        return "authentication is off"
    return ""


def _metrics_exposure(options: TransportOptions) -> None:
    """/metrics open to anyone is served on loopback, or with --metrics-open."""
    if (options.metrics_port and not is_loopback(options.host) and not options.metrics_open
            and metrics_open_because(options)):
        raise TransportSettingsError(
            f"refusing to serve /metrics on {options.host or 'every interface'}:"
            f"{options.metrics_port} to anyone who reaches it: the address is not loopback "
            "and authentication is off. Add --authenticate or --client-ca (then /metrics "
            "needs a credential, as gRPC does), bind 127.0.0.1, or pass --metrics-open to "
            "serve it open on purpose")


def _read_pem(path: str, flag: str, kind: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise TransportSettingsError(
            f"cannot read the {flag} file {path}: {exc.strerror or exc}") from exc
    if f"-----BEGIN {kind}".encode() not in data and not (
            kind == "PRIVATE KEY" and b"PRIVATE KEY-----" in data):
        raise TransportSettingsError(
            f"the {flag} file {path} holds no PEM {kind} (-----BEGIN {kind}-----)")
    return data


def _no_password() -> bytes:
    raise TransportSettingsError("the private key is encrypted; give an unencrypted key file")


def _check_pair(cert_path: str, key_path: str) -> None:
    """The key must be the certificate's (grpc would only fail at each handshake)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_password)
    except TransportSettingsError as exc:
        raise TransportSettingsError(f"the --tls-key file {key_path}: {exc}") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TransportSettingsError(
                f"the --tls-key file {key_path} is not the private key of the --tls-cert "
                f"certificate {cert_path}") from exc
        raise TransportSettingsError(
            f"cannot use the --tls-cert file {cert_path} with the --tls-key file {key_path}: "
            f"{exc}") from exc


def _check_ca(path: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TransportSettingsError(
            f"the --client-ca file {path} is not a PEM CA bundle: {exc}") from exc
