"""Table URIs: canonical form and confinement to the coordinator's warehouse roots.

The canonical form of a local table is ``file:///absolute/path`` with no trailing slash, ``..``
resolved and symlinks followed. A table must lie strictly below one of the roots.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from percolake.errors import InvalidArgument, PermissionDenied

ATTEMPT_DIR = "_percolake"
MAX_URI_LENGTH = 4096


def parse_local_path(uri: str) -> Path:
    """The absolute local path of ``uri`` (plain absolute path or ``file://`` URI), unresolved.

    Raises:
        InvalidArgument: empty, relative, not a local URI, or with a ``..`` segment.
    """
    if not uri or not uri.strip():
        raise InvalidArgument("table must be a non-empty path or file:// URI")
    if len(uri) > MAX_URI_LENGTH:
        raise InvalidArgument(f"table URI is {len(uri)} characters; at most {MAX_URI_LENGTH}")
    if "\x00" in uri:
        raise InvalidArgument("table URI contains a NUL character")
    if uri.startswith("file:"):
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidArgument(f"table {uri!r}: file URIs must name a local path (file:///...)")
        raw = unquote(parsed.path)
    elif "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise InvalidArgument(
            f"table {uri!r}: scheme {scheme!r} is not supported; use an absolute path or file:///"
        )
    else:
        raw = uri
    if not raw.startswith("/"):
        raise InvalidArgument(f"table {uri!r} must be an absolute path or a file:/// URI")
    if ".." in Path(raw).parts:
        raise InvalidArgument(f"table {uri!r} contains '..': name the table by its real path")
    return Path(raw)


def canonical_table_uri(uri: str) -> str:
    """The canonical ``file:///...`` URI of a table, symlinks resolved (no root check)."""
    path = Path(os.path.realpath(parse_local_path(uri)))
    return "file://" + path.as_posix().rstrip("/") if str(path) != "/" else "file:///"


def local_path(canonical_uri: str) -> str:
    """The local filesystem path of a canonical table URI."""
    return str(parse_local_path(canonical_uri))


def write_location(canonical_uri: str, txn_id: str) -> str:
    """Where an attempt's data files for a table go: ``<table>/_percolake/<txn_id>``."""
    return f"{canonical_uri}/{ATTEMPT_DIR}/{txn_id}"


class Warehouse:
    """The configured warehouse roots; every table must lie below one of them."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = [canonical_table_uri(r) for r in roots]

    def resolve(self, uri: str) -> str:
        """Canonicalises ``uri`` and checks it lies strictly below a warehouse root.

        Raises:
            InvalidArgument: the URI is malformed.
            PermissionDenied: the table is outside every root (also after following symlinks).
        """
        canonical = canonical_table_uri(uri)
        for root in self.roots:
            prefix = root if root.endswith("/") else root + "/"
            if canonical.startswith(prefix) and len(canonical) > len(prefix):
                if ATTEMPT_DIR in canonical[len(prefix):].split("/"):
                    raise InvalidArgument(f"table {uri!r} lies inside a {ATTEMPT_DIR} folder")
                return canonical
        if not self.roots:
            raise PermissionDenied(
                f"table {uri!r}: this coordinator has no warehouse root; start it with --warehouse"
            )
        raise PermissionDenied(
            f"table {uri!r} (resolved to {canonical}) is outside the warehouse roots "
            f"{', '.join(self.roots)}; start the coordinator with --warehouse covering it"
        )
