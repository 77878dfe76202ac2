"""Deleting the files of aborted attempts: only a recorded ``<table>/_percolake/<txn_id>``.

The folder is reached from the real warehouse root one component at a time, never following a
symlink (``O_NOFOLLOW``, then calls relative to the open folder), so a symlink swapped in after
the name was checked makes the deletion refuse instead of reaching outside the warehouse.

On an object store there are no folders and no symlinks, only keys: the location's name is
checked (canonical, below an object-store root, ``<table>/_percolake/<txn_id>``), the objects
under ``<location>/`` are listed, each listed key is checked to lie under that prefix again, and
each is deleted with one DELETE (``percolake.lake.storage.delete_objects``: writes nothing).
A deleted or missing object is fine, so a repeat or a concurrent cleaner is harmless. Each
request is retried by its client (bounded, ``percolake.lake.storage.Limits``); a round that still
fails (an endpoint not answering, throttling) is tried once more after a pause, then the error
goes to the caller, whose cleanup stays pending and is retried on the next pass.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence

from percolake.errors import InvalidArgument, Unavailable
from percolake.lake.warehouse import (
    ATTEMPT_DIR,
    UnsafeLocation,
    is_object_store,
    key_below_root,
    local_path,
    real_root_of,
)
from percolake.lake.warehouse import write_location as attempt_folder

log = logging.getLogger("percolake.cleanup")
OBJECT_STORE_ROUNDS = 2  # list-and-delete rounds tried before a transient error is raised

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def check_own_location(location: str, table: str, txn_id: str) -> None:
    """Checks that ``location`` is the attempt folder of ``txn_id`` in ``table`` and no other
    (a record naming another transaction's folder is refused, never deleted).

    Raises:
        UnsafeLocation: it is not.
    """
    own = attempt_folder(table, txn_id)
    if location != own:
        raise UnsafeLocation(f"refusing to delete {location}: the attempt folder of transaction "
                             f"{txn_id} in {table} is {own}")


def remove_attempt_files(write_location: str, *, roots: Sequence[str] | None = None) -> None:
    """Deletes one attempt's folder of data files; a missing folder is fine.

    Args:
        write_location: ``<canonical table>/_percolake/<txn_id>``.
        roots: the warehouse roots; the folder must lie strictly below one of them (real paths,
            now). None checks only the folder's shape and that no symlink is on its path.

    Raises:
        UnsafeLocation: not an attempt folder, outside the roots, or a symlink on the way:
            nothing was deleted; log it and skip.
        OSError: the deletion failed part-way; retrying later is safe.
        StorageUnavailable, StorageRefused, StorageSettingsError: an object-store deletion
            failed (after retries); retrying later is safe.
    """
    if is_object_store(write_location):
        _remove_attempt_objects(write_location, roots)
        return
    try:
        path = local_path(write_location)
    except InvalidArgument as exc:
        raise UnsafeLocation(f"refusing to delete {write_location!r}: {exc}") from None
    root = real_root_of(path, roots)
    parts = path[len(root):].strip("/").split("/")
    if (len(parts) < 3 or parts[-2] != ATTEMPT_DIR or ATTEMPT_DIR in parts[:-2]
            or any(p in ("", ".") for p in parts)):
        raise UnsafeLocation(f"refusing to delete {path}: not a <table>/{ATTEMPT_DIR}/<txn_id> "
                             "folder")
    def refusal(name: str, exc: OSError) -> UnsafeLocation | None:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return UnsafeLocation(f"refusing to delete {path}: {name} on its path is a "
                                  "symlink or not a folder")
        return None

    fd = walk_folders(os.open(root, os.O_RDONLY | os.O_DIRECTORY), parts[:-1], refusal)
    if fd is None:
        return
    try:
        _remove_tree(fd, parts[-1], path)
    finally:
        os.close(fd)


def walk_folders(fd: int, names: Sequence[str],
                 refusal: Callable[[str, OSError], UnsafeLocation | None]) -> int | None:
    """From the open folder ``fd`` down through ``names``, following no symlink: the last
    folder's descriptor (the caller closes it), or None if one of them is missing. ``fd`` is
    the walk's to close. An error opening a folder raises ``refusal(name, error)``, or the
    error itself when that is None."""
    for name in names:
        try:
            child = os.open(name, _OPEN_DIR, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            return None
        except OSError as exc:
            os.close(fd)
            refused = refusal(name, exc)
            if refused is not None:
                raise refused from None
            raise
        os.close(fd)
        fd = child
    return fd


def _remove_tree(parent_fd: int, name: str, path: str) -> None:
    """Removes the folder ``name`` of ``parent_fd`` and everything in it, following no link."""
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=parent_fd).st_mode):
            raise UnsafeLocation(f"refusing to delete {path}: it is a symlink or not a folder")
        fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    try:
        with os.scandir(fd) as entries:
            for entry in list(entries):
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(fd, entry.name, f"{path}/{entry.name}")
                else:
                    with contextlib.suppress(FileNotFoundError):  # another cleaner was first
                        os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)


def _remove_attempt_objects(location: str, roots: Sequence[str] | None) -> None:
    """``remove_attempt_files`` for an object-store location."""
    parts = key_below_root(location, roots, "delete")
    if len(parts) < 3 or parts[-2] != ATTEMPT_DIR or ATTEMPT_DIR in parts[:-2]:
        raise UnsafeLocation(f"refusing to delete {location}: not a <table>/{ATTEMPT_DIR}/"
                             "<txn_id> prefix")
    from percolake.lake import storage  # Arrow's S3 and delta-rs load only when needed

    for round_ in range(OBJECT_STORE_ROUNDS):
        try:
            listed = storage.list_files(location)
            doomed = sorted(p for p in listed
                            if p and not p.startswith("/") and ".." not in p.split("/"))
            if len(doomed) != len(listed):
                raise UnsafeLocation(f"refusing to delete below {location}: a listed key is "
                                     "not a plain relative path")
            storage.delete_objects(location, doomed)
            if not doomed:
                return
        except Unavailable as exc:
            if round_ + 1 == OBJECT_STORE_ROUNDS:
                raise
            log.info("object-store cleanup failed; retrying",
                     extra={"location": location, "round": round_, "error": str(exc)})
            time.sleep(0.2 * 2**round_)
    if storage.list_files(location):
        raise storage.StorageUnavailable(f"objects keep appearing below {location} while it "
                                         "is deleted; will retry")
