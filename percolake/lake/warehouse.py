"""Table URIs: canonical form and confinement to the coordinator's warehouse roots.

The canonical name of a local table is ``file://`` + its real path (symlinks followed, no
trailing slash) percent-encoded outside ``A-Za-z0-9_.-~/``. A plain absolute path is taken
literally (a ``#`` or ``?`` in it is part of a folder name); a ``file:`` URI is decoded once,
and is refused when decoding could change its meaning (query, fragment, an encoded ``/`` or NUL,
a ``..`` segment, an invalid escape, bytes that are not UTF-8). So ``local_path`` inverts the
encoding exactly and canonicalising is a fixed point (I11; docs/design-notes.md). A real path
holding ``%`` and two hex digits is refused: delta-rs decodes it and would use another folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from urllib.parse import quote, unquote

from percolake.errors import InvalidArgument, PermissionDenied

ATTEMPT_DIR = "_percolake"
MAX_URI_LENGTH = 4096
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNSAFE_ESCAPE = re.compile(r"%(2[Ff]|00)")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


class UnsafeLocation(PermissionDenied):
    """A location the daemon must not write or delete: outside every warehouse root, not an
    attempt folder, or reached through a symlink. Log it and skip; never retry blindly."""


def parse_local_path(uri: str) -> str:
    """The absolute local path ``uri`` names (plain absolute path or ``file:`` URI), unresolved.

    Raises:
        InvalidArgument: empty, relative, not local, ambiguous once decoded, or with ``..``.
    """
    if not uri or not uri.strip():
        raise InvalidArgument("table must be a non-empty path or file:// URI")
    if "\x00" in uri:
        raise InvalidArgument("table URI contains a NUL character")
    if uri.startswith("/"):
        path = uri
    elif uri[:5].lower() == "file:":
        path = _decode_file_uri(uri)
    elif "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise InvalidArgument(
            f"table {uri!r}: scheme {scheme!r} is not supported; use an absolute path or file:///"
        )
    else:
        raise InvalidArgument(f"table {uri!r} must be an absolute path or a file:/// URI")
    if ".." in path.split("/"):
        raise InvalidArgument(f"table {uri!r} contains '..': name the table by its real path")
    odd = next((c for c in path if c == "\\" or not c.isprintable()), None)
    if odd is not None:  # delta-rs refuses control characters and reads '\' as a separator
        raise InvalidArgument(
            f"table {uri!r}: character U+{ord(odd):04X} is not allowed in a table path "
            "(control and invisible characters, backslashes)")
    return path


def _decode_file_uri(uri: str) -> str:
    rest = uri[5:]
    if rest.startswith("//"):
        host, slash, tail = rest[2:].partition("/")
        if host.lower() not in ("", "localhost") or not slash:
            raise InvalidArgument(f"table {uri!r}: file URIs must name a local path (file:///...)")
        rest = "/" + tail
    if not rest.startswith("/"):
        raise InvalidArgument(f"table {uri!r} must be an absolute path or a file:/// URI")
    if "?" in rest or "#" in rest:
        raise InvalidArgument(f"table {uri!r}: a file URI cannot carry a query or fragment; "
                              "percent-encode '?' and '#' (%3F, %23) or give a plain path")
    if _BAD_ESCAPE.search(rest):
        raise InvalidArgument(f"table {uri!r}: '%' must start an escape such as %25")
    if _UNSAFE_ESCAPE.search(rest):
        raise InvalidArgument(f"table {uri!r}: an encoded '/' or NUL (%2F, %00) is not allowed")
    try:
        return unquote(rest, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument(f"table {uri!r}: escapes must encode UTF-8 text") from None


def canonical_table_uri(uri: str) -> str:
    """The canonical ``file:///...`` URI of a table, symlinks resolved (no root check)."""
    if len(uri) > MAX_URI_LENGTH:
        raise InvalidArgument(f"table URI is {len(uri)} characters; at most {MAX_URI_LENGTH}")
    path = os.path.realpath(parse_local_path(uri))
    path = "/" + path.strip("/")  # POSIX keeps a leading '//': one folder, one name
    if _ESCAPE.search(path):
        raise InvalidArgument(
            f"table {uri!r}: its path {path!r} holds a '%' and two hex digits, which delta-rs "
            "decodes (it would read and write another folder); rename the folder")
    try:
        canonical = "file://" + quote(path, safe="/", errors="strict")
    except UnicodeEncodeError:
        raise InvalidArgument(f"table {uri!r}: the folder's name is not UTF-8") from None
    if len(canonical) > MAX_URI_LENGTH:
        raise InvalidArgument(f"table {uri!r}: its canonical name is longer than "
                              f"{MAX_URI_LENGTH} characters")
    return canonical


def local_path(canonical_uri: str) -> str:
    """The local filesystem path of a canonical table URI (or of a write location)."""
    return parse_local_path(canonical_uri)


def write_location(canonical_uri: str, txn_id: str) -> str:
    """Where an attempt's data files for a table go: ``<table>/_percolake/<txn_id>``."""
    return f"{canonical_uri.rstrip('/')}/{ATTEMPT_DIR}/{quote(txn_id, safe='')}"


def real_root_of(path: str, roots: Sequence[str] | None) -> str:
    """The real path, now, of the root ``path`` lies strictly below (``/`` without roots).

    Raises:
        UnsafeLocation: ``path`` is outside every root.
    """
    if roots is None:
        return "/"
    for root in roots:
        real = local_path(canonical_table_uri(root))
        if path.startswith(real.rstrip("/") + "/") and path != real:
            return real
    raise UnsafeLocation(f"{path} is outside the warehouse roots {', '.join(roots)}")


def check_real_location(path: str, roots: Sequence[str] | None = None) -> None:
    """Checks, on the filesystem now, that ``path`` has no symlink on it and, with ``roots``,
    that it lies strictly below one, with no attempt folder in between.

    Raises:
        UnsafeLocation: it does not.
    """
    if os.path.realpath(path) != path:
        raise UnsafeLocation(f"{path} is reached through a symlink (it resolves to "
                             f"{os.path.realpath(path)}); refusing to write there")
    if ATTEMPT_DIR in path[len(real_root_of(path, roots)):].split("/"):
        raise UnsafeLocation(f"{path} lies inside a {ATTEMPT_DIR} folder")


class Warehouse:
    """The configured warehouse roots; every table must lie below one of them."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = [canonical_table_uri(r) for r in roots]

    def resolve(self, uri: str) -> str:
        """Canonicalises ``uri`` and checks it lies strictly below a warehouse root.

        Raises:
            InvalidArgument: the URI is malformed or cannot be represented safely.
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
