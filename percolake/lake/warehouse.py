"""Table URIs: canonical form and confinement to the coordinator's warehouse roots.

Two kinds of table: local folders and object-store prefixes (``s3://bucket/prefix/table``).

The canonical name of a local table is ``file://`` + its real path (symlinks followed, no
trailing slash) percent-encoded outside ``A-Za-z0-9_.-~/``. A plain absolute path is taken
literally (a ``#`` or ``?`` in it is part of a folder name); a ``file:`` URI is decoded once,
and is refused when decoding could change its meaning (query, fragment, an encoded ``/`` or NUL,
a ``..`` segment, an invalid escape, bytes that are not UTF-8). So ``local_path`` inverts the
encoding exactly and canonicalising is a fixed point (I11; docs/design-notes.md). A real path
holding ``%`` and two hex digits is refused: delta-rs decodes it and would use another folder.

The canonical name of an object-store table is ``<scheme>://<bucket>/<key>`` in the scheme's one
canonical spelling (``s3a://`` and ``S3://`` name the same table as ``s3://``), the key decoded
once and made only of ``A-Za-z0-9_.-~`` and ``/``, without empty, ``.`` or ``..`` segments or a
trailing ``/``: so it needs no escape, canonicalising is a fixed point, and each object prefix
has one name. There are no symlinks in an object store: every check is on the name alone.
A scheme is one row of ``OBJECT_STORES`` (what delta-rs and Hadoop call it, what a bucket name
looks like); its settings and credentials live in ``percolake.lake.storage``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from percolake.errors import InvalidArgument, PermissionDenied

ATTEMPT_DIR = "_percolake"
MAX_URI_LENGTH = 4096
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNSAFE_ESCAPE = re.compile(r"%(2[Ff]|00)")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_.~-]+")


@dataclass(frozen=True)
class ObjectStore:
    """One object-store URI scheme that delta-rs and Hadoop both speak.

    ``scheme`` is the canonical spelling (what delta-rs opens), ``aliases`` other spellings
    naming the same objects, ``hadoop_scheme`` what Spark's Hadoop connector reads and writes
    through, ``bucket`` what a bucket (container) name must look like, ``max_key_bytes`` the
    longest object key the store takes. Adding ``gs://`` is a row here plus its settings in
    ``percolake.lake.storage``.
    """

    scheme: str
    aliases: tuple[str, ...]
    hadoop_scheme: str
    bucket: re.Pattern[str]
    max_key_bytes: int


OBJECT_STORES = {
    # S3 bucket names: 3-63 lower-case letters, digits, dots, hyphens, a letter or digit at
    # both ends (no upper case: one bucket, one spelling)
    "s3": ObjectStore("s3", ("s3a",), "s3a",
                      re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"), 1024),
}
_SPELLINGS = {name: store for store in OBJECT_STORES.values()
              for name in (store.scheme, *store.aliases)}
# room below a table's key for "/_percolake/<32 hex>/" and a data file's relative path
TABLE_KEY_RESERVE = 300


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
    elif object_store_of(uri) is not None:
        raise InvalidArgument(f"table {safe_repr(uri)} is an object-store table, not a local "
                              "path")
    elif "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise InvalidArgument(
            f"table {uri!r}: scheme {scheme!r} is not supported; use an absolute path, "
            f"file:///, or {', '.join(s + '://' for s in sorted(_SPELLINGS))}"
        )
    else:
        raise InvalidArgument(f"table {uri!r} must be an absolute path or a file:/// URI")
    if ".." in path.split("/"):
        raise InvalidArgument(f"table {uri!r} contains '..': name the table by its real path")
    _check_characters(uri, path)
    return path


def _check_characters(uri: str, path: str) -> None:
    if path.isprintable() and "\\" not in path:  # the usual case, in one pass in C
        return
    odd = next((c for c in path if c == "\\" or not c.isprintable()), None)
    if odd is not None:  # delta-rs refuses control characters and reads '\' as a separator
        raise InvalidArgument(
            f"table {uri!r}: character U+{ord(odd):04X} is not allowed in a table path "
            "(control and invisible characters, backslashes)")


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
    return _decode_once(rest, repr(uri))


def _decode_once(text: str, shown: str) -> str:
    """Percent-decodes ``text`` once, refusing what decoding could make ambiguous."""
    if _BAD_ESCAPE.search(text):
        raise InvalidArgument(f"table {shown}: '%' must start an escape such as %25")
    if _UNSAFE_ESCAPE.search(text):
        raise InvalidArgument(f"table {shown}: an encoded '/' or NUL (%2F, %00) is not allowed")
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument(f"table {shown}: escapes must encode UTF-8 text") from None


def object_store_of(uri: str) -> ObjectStore | None:
    """The object store ``uri`` names by its scheme (any spelling, any case), None if local."""
    if uri.startswith(("/", "file:")):  # a local path or file URI, the usual case: no parsing
        return None
    scheme, sep, _ = uri.partition("://")
    return _SPELLINGS.get(scheme.lower()) if sep else None


def is_object_store(uri: str) -> bool:
    return object_store_of(uri) is not None


def safe_repr(uri: str) -> str:
    """``repr(uri)``, or a stand-in when the URI carries user information (``user:secret@``):
    such a name may hold a credential, and refusals are logged and sent back over gRPC."""
    store = object_store_of(uri)
    if store is not None and "@" in uri.partition("://")[2].partition("/")[0]:
        return f"'{uri.partition('://')[0]}://<user information removed>@...'"
    return repr(uri)


def split_object_uri(uri: str) -> tuple[ObjectStore, str, str]:
    """``(store, bucket, key)`` of an object-store URI, its key decoded once (no other check).

    Raises:
        InvalidArgument: not an object-store URI, or one that cannot be read unambiguously.
    """
    store = object_store_of(uri)
    if store is None:
        raise InvalidArgument(f"table {uri!r} is not an object-store URI")
    shown = safe_repr(uri)
    rest = uri.partition("://")[2]
    authority, _, key = rest.partition("/")
    if "@" in authority:
        raise InvalidArgument(f"table {shown}: a table URI cannot carry user information or "
                              "credentials; the object store's settings come from the "
                              "environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")
    if "?" in rest or "#" in rest:
        raise InvalidArgument(f"table {shown}: an object-store URI cannot carry a query or "
                              "fragment")
    if not store.bucket.fullmatch(authority):
        raise InvalidArgument(f"table {shown}: {authority!r} is not a valid bucket name (no port, "
                              "upper case or other characters)")
    return store, authority, _decode_once(key, shown)


def _canonical_object_uri(uri: str) -> str:
    store, bucket, key = split_object_uri(uri)
    shown = safe_repr(uri)
    key = key.rstrip("/")
    segments = key.split("/") if key else []
    if ".." in segments or "." in segments:
        raise InvalidArgument(f"table {shown} contains a '.' or '..' segment: name the table by "
                              "its own prefix")
    if "" in segments:
        raise InvalidArgument(f"table {shown}: an empty segment ('//') is not allowed")
    odd = next((s for s in segments if not _KEY_SEGMENT.fullmatch(s)), None)
    if odd is not None:
        raise InvalidArgument(
            f"table {shown}: {odd!r} has a character not allowed in an object-store table path "
            "(only letters, digits, '_', '.', '-', '~' and '/')")
    if len(key.encode()) > store.max_key_bytes - TABLE_KEY_RESERVE:
        raise InvalidArgument(f"table {shown}: its key is longer than "
                              f"{store.max_key_bytes - TABLE_KEY_RESERVE} bytes")
    return f"{store.scheme}://{bucket}/{key}" if key else f"{store.scheme}://{bucket}"


def canonical_table_uri(uri: str) -> str:
    """The canonical URI of a table: ``file:///...`` with symlinks resolved, or
    ``s3://bucket/key`` (no root check)."""
    if len(uri) > MAX_URI_LENGTH:
        raise InvalidArgument(f"table URI is {len(uri)} characters; at most {MAX_URI_LENGTH}")
    if "\x00" in uri:
        raise InvalidArgument("table URI contains a NUL character")
    if is_object_store(uri):
        return _canonical_object_uri(uri)
    path = os.path.realpath(parse_local_path(uri))
    path = "/" + path.strip("/")  # POSIX keeps a leading '//': one folder, one name
    _check_characters(uri, path)  # also where a symlink led: the name must be a fixed point
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


@functools.lru_cache(maxsize=4096)  # a pure function of the text; refusals are not kept
def local_path(canonical_uri: str) -> str:
    """The local filesystem path of a canonical table URI (or of a write location).

    Raises:
        InvalidArgument: also for an object-store URI (see ``delta_uri``, ``spark_uri``).
    """
    return parse_local_path(canonical_uri)


def delta_uri(canonical_uri: str) -> str:
    """What delta-rs opens for a canonical table URI: the local path, or the ``s3://`` URI."""
    return canonical_uri if is_object_store(canonical_uri) else local_path(canonical_uri)


def spark_uri(canonical_uri: str) -> str:
    """What Spark (Hadoop's filesystems) reads and writes for a canonical table URI or write
    location: the local path, or the object-store URI in the Hadoop connector's scheme
    (``s3a://bucket/key``)."""
    store = object_store_of(canonical_uri)
    if store is None:
        return local_path(canonical_uri)
    return f"{store.hadoop_scheme}://{canonical_uri.partition('://')[2]}"


def object_root_of(location: str, roots: Sequence[str] | None) -> str | None:
    """The canonical object-store root ``location`` (a canonical URI) lies strictly below,
    None without roots.

    Raises:
        UnsafeLocation: ``location`` is outside every root.
    """
    if roots is None:
        return None
    for root in roots:
        if not is_object_store(root):
            continue
        canonical = canonical_table_uri(root)
        if location.startswith(canonical + "/") and location != canonical:
            return canonical
    raise UnsafeLocation(f"{location} is outside the warehouse roots {', '.join(roots)}")


def check_table_location(canonical_uri: str, roots: Sequence[str] | None = None) -> None:
    """Checks, now, that a table's Delta log may be written: a local table's path to its
    ``_delta_log`` has no symlink and lies below ``roots`` (if given, on real paths); an
    object-store table's name is canonical and lies below ``roots``, with no attempt folder in
    between.

    Raises:
        UnsafeLocation: it does not.
    """
    if not is_object_store(canonical_uri):
        check_real_location(os.path.join(local_path(canonical_uri), "_delta_log"), roots)
        return
    if ATTEMPT_DIR in key_below_root(canonical_uri, roots, "write"):
        raise UnsafeLocation(f"{canonical_uri} lies inside a {ATTEMPT_DIR} folder")


def key_below_root(uri: str, roots: Sequence[str] | None, doing: str) -> list[str]:
    """The key segments of the canonical object-store ``uri`` below its root (below the bucket
    without ``roots``).

    Raises:
        UnsafeLocation: ``uri`` is not a canonical name, or lies outside every root.
    """
    try:
        canonical = canonical_table_uri(uri)
    except InvalidArgument as exc:
        raise UnsafeLocation(f"refusing to {doing} {safe_repr(uri)}: {exc}") from None
    if canonical != uri:
        raise UnsafeLocation(f"refusing to {doing} {uri}: not a canonical name ({canonical})")
    root = object_root_of(uri, roots)
    return (uri[len(root) + 1:] if root else uri.partition("://")[2].partition("/")[2]).split("/")


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
        if is_object_store(root):
            continue
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
    """The configured warehouse roots, local folders and object-store prefixes mixed; every
    table must lie below one of them."""

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
                    raise InvalidArgument(f"table {safe_repr(uri)} lies inside a {ATTEMPT_DIR} "
                                          "folder")
                return canonical
        if not self.roots:
            raise PermissionDenied(
                f"table {safe_repr(uri)}: this coordinator has no warehouse root; start it with "
                "--warehouse")
        raise PermissionDenied(
            f"table {safe_repr(uri)} (resolved to {canonical}) is outside the warehouse roots "
            f"{', '.join(self.roots)}; start the coordinator with --warehouse covering it"
        )
