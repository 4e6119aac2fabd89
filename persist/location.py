"""Locations: turning a URL into a blob store (and, for writers, a writer lock).

    mem://name              in-process, shared by name (tests)
    file:///abs/path, path  a local directory; lock in <path>/LOCK
    s3://bucket/prefix      S3 (extra ``s3``); lock in DynamoDB or in S3 itself
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from persist.blob.base import Blob, BlobRead
from persist.blob.file import MAP_MIN_BYTES, FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import InvalidUsage
from persist.lock.base import WriterLock
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock


@dataclass(frozen=True)
class Location:
    url: str
    blob: Blob
    lock_factory: Any  # Callable[[], WriterLock]

    def lock(self) -> WriterLock:
        lock: WriterLock = self.lock_factory()
        return lock

    def read_half(self) -> BlobRead:
        return self.blob.read_only()


def resolve(
    url: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    lease_seconds: float = 30.0,
) -> Location:
    """Parses ``url`` into a Location.

    Raises:
        InvalidUsage: an unknown scheme or malformed URL.
    """
    text = os.fspath(url)
    parsed = urlparse(text)
    opts = dict(storage_options or {})
    if parsed.scheme == "mem":
        name = parsed.netloc + parsed.path
        if not name:
            raise InvalidUsage(f"mem:// URL needs a name: {text!r}")
        return Location(text, MemoryBlob(name),
                        lambda: MemoryLock(name, lease_seconds=lease_seconds))
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else text
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidUsage(f"file:// URL with a host is not supported: {text!r}")
        if not path:
            raise InvalidUsage("empty location path")
        root = os.path.abspath(path)
        fsync = opts.pop("fsync", True)
        map_min_bytes = _map_min_bytes(opts.pop("map_min_bytes", MAP_MIN_BYTES))
        if opts:
            raise InvalidUsage(f"unknown storage_options for a file location: {sorted(opts)}")
        return Location(text, FileBlob(root, fsync=bool(fsync), map_min_bytes=map_min_bytes),
                        lambda: FileLock(root, lease_seconds=lease_seconds))
    if parsed.scheme == "s3":
        try:
            from persist.blob import s3  # type: ignore[attr-defined,unused-ignore]
        except ImportError as e:  # pragma: no cover - depends on the installed extras
            raise InvalidUsage(f"s3:// locations need the 's3' extra (boto3): {e}") from e
        loc: Location = s3.location(text, opts, lease_seconds=lease_seconds)
        return loc
    raise InvalidUsage(f"unsupported location {text!r}: use mem://, file://, a path, or s3://")


def _map_min_bytes(value: Any) -> int | None:
    """The ``map_min_bytes`` storage option: a size in bytes, or None / False / 0 for never
    (reads then use ``read(2)`` only; see :mod:`persist.blob.file`)."""
    if value is None or value is False or value in (0, "0"):
        return None
    try:
        n = -1 if isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 1:
        raise InvalidUsage(f"storage option map_min_bytes must be a size in bytes or None, "
                           f"not {value!r}")
    return n
