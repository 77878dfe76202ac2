"""Bearer tokens: ``plk_<id>_<secret>``, 16 hex characters of public id and 43 characters
(32 random bytes, URL-safe base64) of secret.

Only SHA-256 of the secret is stored. A slow password hash (bcrypt, argon2) protects secrets
people choose, which can be guessed; a 256-bit random secret cannot, so one SHA-256 makes a
stolen hash useless while each call is checked in microseconds. The id finds the record; the
hashes are compared with ``hmac.compare_digest`` (constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "plk_"
_TOKEN = re.compile(r"plk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_TOKEN_ID = re.compile(r"[0-9a-f]{16}")
MIN_BOOTSTRAP_CHARS = 32


@dataclass(frozen=True)
class NewToken:
    token_id: str
    secret_hash: str
    bearer: str  # the whole token, shown once to whoever created it


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> NewToken:
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return NewToken(token_id, secret_hash(secret), f"{PREFIX}{token_id}_{secret}")


def split(bearer: str) -> tuple[str, str] | None:
    """(token id, secret) of a well-formed token, else None."""
    match = _TOKEN.fullmatch(bearer)
    return (match[1], match[2]) if match else None


def matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(secret_hash(secret), stored_hash)


def is_token_id(text: str) -> bool:
    return _TOKEN_ID.fullmatch(text) is not None
