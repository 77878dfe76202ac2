"""What a client presents to the coordinator: TLS settings and a bearer token, and the channel
that uses them. Shared by the Spark side, the CLI and the tests.

Each setting comes from an explicit argument, else from the environment:

- ``PERCOLAKE_TLS_CA``: PEM file of the CA bundle that signed the coordinator's certificate.
  Given (or a client certificate given), the channel uses TLS.
- ``PERCOLAKE_TLS_CERT`` / ``PERCOLAKE_TLS_KEY``: PEM files of a client certificate and its key,
  for a coordinator that requires one (mutual TLS).
- ``PERCOLAKE_TOKEN``: a bearer token, or ``PERCOLAKE_TOKEN_FILE``: a file holding one. It is
  sent on every call as ``authorization: Bearer <token>``; it is never logged nor shown.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

log = logging.getLogger("percolake.credentials")

ENV_TLS_CA = "PERCOLAKE_TLS_CA"
ENV_TLS_CERT = "PERCOLAKE_TLS_CERT"
ENV_TLS_KEY = "PERCOLAKE_TLS_KEY"
ENV_TOKEN = "PERCOLAKE_TOKEN"
ENV_TOKEN_FILE = "PERCOLAKE_TOKEN_FILE"
AUTHORIZATION_KEY = "authorization"
BEARER = "Bearer"
_NOT_CONNECTED = "failed to connect to all addresses"  # grpc's words for "never sent"


class SecuritySettingsError(ValueError):
    """A client security setting is missing, unreadable or malformed; the message names the
    setting (argument or environment variable) and the file, never the token."""


@dataclass(frozen=True)
class ClientSecurity:
    """A client's TLS files and bearer token. ``ClientSecurity()`` is plaintext without token.

    Build it with :meth:`resolve` (arguments, else the environment), which checks the files.
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        """Whether channels use TLS: a CA bundle or a client certificate is given."""
        return bool(self.tls_ca or self.tls_cert)

    @classmethod
    def resolve(cls, tls_ca: str | None = None, tls_cert: str | None = None,
                tls_key: str | None = None, token: str | None = None,
                token_file: str | None = None,
                environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """Each setting from its argument, else its ``PERCOLAKE_*`` environment variable
        (empty variables count as unset).

        Raises:
            SecuritySettingsError: a file cannot be read or holds no PEM block; a certificate
                without its key or a key without its certificate; a token and a token file
                given together; an empty token or one that is not printable ASCII.
        """
        env = os.environ if environ is None else environ
        ca = _setting(tls_ca, "tls_ca", env, ENV_TLS_CA)
        cert = _setting(tls_cert, "tls_cert", env, ENV_TLS_CERT)
        key = _setting(tls_key, "tls_key", env, ENV_TLS_KEY)
        if cert is not None and key is None:
            raise SecuritySettingsError(f"a client certificate needs its private key: "
                                        f"{cert[1]} is set but no key (--tls-key or "
                                        f"${ENV_TLS_KEY})")
        if key is not None and cert is None:
            raise SecuritySettingsError(f"a private key needs its client certificate: "
                                        f"{key[1]} is set but no certificate (--tls-cert or "
                                        f"${ENV_TLS_CERT})")
        for value in (ca, cert, key):
            if value is not None:
                _check_pem(*value)
        return cls(tls_ca=ca[0] if ca else None, tls_cert=cert[0] if cert else None,
                   tls_key=key[0] if key else None, token=_token(token, token_file, env))

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """The TLS credentials of a channel (reads the PEM files now).

        Raises:
            SecuritySettingsError: a file cannot be read.
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "tls_ca") if self.tls_ca else None,
            private_key=_read(self.tls_key, "tls_key") if self.tls_key else None,
            certificate_chain=_read(self.tls_cert, "tls_cert") if self.tls_cert else None)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: the token, if any."""
        return ((AUTHORIZATION_KEY, f"{BEARER} {self.token}"),) if self.token else ()


def open_channel(address: str, security: ClientSecurity | None = None,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to one coordinator ``host:port``: TLS when ``security`` says so, the token on
    every call, and connection failures explained (a TLS mismatch is UNAVAILABLE saying so).

    ``security`` None resolves it from the environment.
    """
    security = ClientSecurity.resolve() if security is None else security
    options = list(options)
    if security.tls:
        channel = grpc.secure_channel(address, security.channel_credentials(), options=options)
    else:
        if security.token and not _is_loopback(address):
            log.warning("sending a bearer token to %s without TLS: anyone on the path can read "
                        "it; give the coordinator's CA (%s)", address, ENV_TLS_CA)
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _ClientInterceptor(address, security))


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tls-ca --tls-cert --tls-key --token --token-file`` for a command that calls the
    coordinator; read them back with :func:`security_from_args`."""
    group = parser.add_argument_group(
        "connection security", "each defaults to its environment variable")
    group.add_argument("--tls-ca", metavar="PEM",
                       help=f"CA bundle that signed the coordinator's certificate; given, the "
                       f"connection uses TLS (${ENV_TLS_CA})")
    group.add_argument("--tls-cert", metavar="PEM",
                       help=f"client certificate, for a coordinator that requires one (mTLS) "
                       f"(${ENV_TLS_CERT})")
    group.add_argument("--tls-key", metavar="PEM",
                       help=f"private key of --tls-cert (${ENV_TLS_KEY})")
    token = group.add_mutually_exclusive_group()
    token.add_argument("--token", metavar="TOKEN",
                       help=f"bearer token sent on every call (${ENV_TOKEN}); prefer "
                       f"--token-file: a command line is visible to other users")
    token.add_argument("--token-file", metavar="PATH",
                       help=f"file holding the bearer token (${ENV_TOKEN_FILE})")


def security_from_args(args: argparse.Namespace) -> ClientSecurity:
    """The security of :func:`add_client_arguments`' flags, the environment filling the rest.

    Raises:
        SecuritySettingsError: see :meth:`ClientSecurity.resolve`.
    """
    return ClientSecurity.resolve(tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                                  tls_key=args.tls_key, token=args.token,
                                  token_file=args.token_file)


# --- resolution ---------------------------------------------------------------------------

_FLAG_OF = {"tls_ca": "--tls-ca", "tls_cert": "--tls-cert", "tls_key": "--tls-key"}


def _setting(value: str | None, name: str, env: Mapping[str, str],
             variable: str) -> tuple[str, str] | None:
    """(path, where it came from), or None when neither the argument nor the variable is set."""
    if value is not None:
        if not value:
            raise SecuritySettingsError(f"{name} ({_FLAG_OF[name]}) is empty; give a PEM file")
        return value, f"{name} ({_FLAG_OF[name]})"
    if env.get(variable):
        return env[variable], f"${variable}"
    return None


def _read(path: str, source: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise SecuritySettingsError(
            f"cannot read {source} file {path}: {exc.strerror or exc}") from exc


def _check_pem(path: str, source: str) -> None:
    if b"-----BEGIN " not in _read(path, source):
        raise SecuritySettingsError(f"{source} file {path} holds no PEM block "
                                    "(-----BEGIN ...-----); give a PEM file")


def _token(token: str | None, token_file: str | None, env: Mapping[str, str]) -> str | None:
    if token is not None and token_file is not None:
        raise SecuritySettingsError("give a token or a token file (--token or --token-file), "
                                    "not both")
    if token is not None:
        return _checked_token(token, "token (--token)")
    if token_file is not None:
        return _token_from_file(token_file, "token file (--token-file)")
    if env.get(ENV_TOKEN) and env.get(ENV_TOKEN_FILE):
        raise SecuritySettingsError(f"set ${ENV_TOKEN} or ${ENV_TOKEN_FILE}, not both")
    if env.get(ENV_TOKEN):
        return _checked_token(env[ENV_TOKEN], f"${ENV_TOKEN}")
    if env.get(ENV_TOKEN_FILE):
        return _token_from_file(env[ENV_TOKEN_FILE], f"${ENV_TOKEN_FILE}")
    return None


def _token_from_file(path: str, source: str) -> str:
    raw = _read(path, source)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SecuritySettingsError(f"{source} file {path} is not ASCII text; it must hold "
                                    "the bearer token only") from None
    return _checked_token(text, f"{source} file {path}")


def _checked_token(token: str, source: str) -> str:
    # The message never repeats the token: it is a secret, even when malformed.
    if not token:
        raise SecuritySettingsError(f"{source} is empty; give the bearer token")
    if not all("\x21" <= ch <= "\x7e" for ch in token):
        raise SecuritySettingsError(f"{source} holds a character that is not printable ASCII "
                                    "(a space, a line break?); give the bearer token only")
    return token


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


# --- the channel's interceptor ------------------------------------------------------------

class _CallDetails(namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                               "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _ClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                         grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call; explains a unary call's failure to connect."""

    def __init__(self, address: str, security: ClientSecurity) -> None:
        self._address = address
        self._security = security
        self._metadata = security.metadata()

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = details.metadata
        if self._metadata:
            metadata = [*((k, v) for k, v in (metadata or ()) if k != AUTHORIZATION_KEY),
                        *self._metadata]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: Callable[..., Any],
                              client_call_details: grpc.ClientCallDetails, request: Any) -> Any:
        details = self._details(client_call_details)
        if not details.wait_for_ready or not _blocking(continuation):
            return self._explained(continuation(details, request))
        # A call that waits for the channel to connect would wait out its deadline on a TLS
        # mismatch and end with a bare "Deadline Exceeded". So a blocking one is first made
        # without waiting: connected, it simply runs; a TLS mismatch fails at once, explained;
        # a coordinator that is down (the call was never sent) is then waited for as asked.
        deadline = None if details.timeout is None else time.monotonic() + details.timeout
        outcome = continuation(details._replace(wait_for_ready=False), request)
        if not _never_sent(outcome) or self._explanation(outcome) is not None:
            return self._explained(outcome)
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        return self._explained(continuation(details._replace(timeout=remaining), request))

    def intercept_unary_stream(self, continuation: Callable[..., Any],
                               client_call_details: grpc.ClientCallDetails,
                               request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Iterator[Any]) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable[..., Any],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Iterator[Any]) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def _explanation(self, outcome: Any) -> str | None:
        """A clearer message for a failure to connect that looks like a TLS mismatch."""
        if not isinstance(outcome, grpc.RpcError) or not outcome.done() \
                or outcome.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        details = outcome.details() or ""
        hint = tls_hint(details, self._security.tls)
        if hint is None:
            return None
        return f"cannot connect to the coordinator at {self._address}: {hint} ({details})"

    def _explained(self, outcome: Any) -> Any:
        explanation = self._explanation(outcome)
        return outcome if explanation is None else _ExplainedError(outcome, explanation)


def _blocking(continuation: Callable[..., Any]) -> bool:
    """A blocking call (its outcome is final when the continuation returns), not a future's.
    grpc names no such flag; its blocking continuation is defined in ``_with_call``. Should
    that name change, calls just keep waiting for the channel as they ask."""
    return "_with_call" in getattr(continuation, "__qualname__", "")


def _never_sent(outcome: Any) -> bool:
    """The call failed because the channel could not connect (so the server never saw it)."""
    return isinstance(outcome, grpc.RpcError) and outcome.done() \
        and outcome.code() == grpc.StatusCode.UNAVAILABLE \
        and (outcome.details() or "").startswith(_NOT_CONNECTED)


def tls_hint(details: str, tls: bool) -> str | None:
    """What a connection failure's message says about TLS, None if it says nothing about it."""
    lowered = details.lower()
    if "wrong_version_number" in lowered and tls:
        return ("the TLS handshake failed: the coordinator does not speak TLS on this port "
                "(it serves plaintext); drop the CA setting or start it with --tls-cert")
    if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        return (f"the coordinator's TLS certificate is not trusted: give the CA bundle that "
                f"signed it (--tls-ca or ${ENV_TLS_CA}), and connect to a name its "
                "certificate lists")
    if "handshake" in lowered and tls:
        return (f"the TLS handshake failed; check the CA bundle (--tls-ca or ${ENV_TLS_CA}) "
                f"and the client certificate (--tls-cert/--tls-key)")
    if "socket closed" in lowered or "connection reset" in lowered:
        if tls:
            return ("the coordinator closed the TLS connection during the handshake: it "
                    "probably requires a client certificate (mTLS) signed by its client CA; "
                    f"give one with --tls-cert/--tls-key or ${ENV_TLS_CERT}/${ENV_TLS_KEY}")
        return ("the coordinator closed the plaintext connection: if it serves TLS, give "
                f"the CA bundle that signed its certificate (--tls-ca or ${ENV_TLS_CA})")
    return None


class _ExplainedError(grpc.RpcError, grpc.Call, grpc.Future):
    """A failed connection's error with a clearer message; everything else is the original's
    (the code stays UNAVAILABLE, so callers retry it as before)."""

    def __init__(self, error: grpc.RpcError, details: str) -> None:
        super().__init__(details)
        self._error = error
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        return f"<RPC failed: UNAVAILABLE: {self._details}>"

    def initial_metadata(self) -> Any:
        return self._error.initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._error.trailing_metadata()

    def debug_error_string(self) -> str:
        return self._error.debug_error_string()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> grpc.RpcError:
        return self

    def traceback(self, timeout: float | None = None) -> Any:
        return self._error.traceback()

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)
