"""The composition root: turning a URL into a blob store and, for writers, a writer lock.

    mem://name              in-process, shared by name (tests)
    file:///abs/path, path  a local directory; lock in <path>/LOCK
    s3://bucket/prefix      S3 (extra ``s3``); lock in DynamoDB or in S3 itself

This is the one module that knows both the blob layer and the lock layer: it assembles them for
every scheme, so neither layer has to know the other's implementations (the blob layer never
imports the lock layer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.blob.file import MAP_MIN_BYTES, FileBlob
from persist.blob.memory import MemoryBlob
from persist.blob.options import option_bool, option_size_or_off
from persist.errors import InvalidUsage
from persist.lock.base import WriterLock
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock


@dataclass(frozen=True)
class Location:
    """A resolved location: its URL, its blob store, and how to make its writer lock."""

    url: str
    blob: Blob
    lock_factory: Callable[[], WriterLock]

    def lock(self) -> WriterLock:
        """Returns a new, not yet acquired, writer lock of this location."""
        return self.lock_factory()

    def read_half(self) -> BlobRead:
        """Returns the blob store's read-only view (what replicas and readers are given)."""
        return self.blob.read_only()


def resolve(
    url: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    lease_seconds: float = 30.0,
) -> Location:
    """Parses ``url`` into a Location. Nothing is contacted or created yet.

    Args:
        url: ``mem://name``, ``file:///abs/path``, a path, or ``s3://bucket/prefix``.
        storage_options: per scheme: ``fsync`` and ``map_min_bytes`` for files; boto3's
            connection options and the persist S3 options (:class:`persist.blob.s3.S3Config`)
            for S3. Unknown options are refused.
        lease_seconds: the writer lock's lease.

    Raises:
        InvalidUsage: an unknown scheme, a malformed URL or a bad storage option.
    """
    text = os.fspath(url)
    parsed = urlparse(text)
    opts = dict(storage_options or {})
    if parsed.scheme == "mem":
        name = parsed.netloc + parsed.path
        if not name:
            raise InvalidUsage(f"mem:// URL needs a name: {text!r}")
        if opts:
            raise InvalidUsage(f"unknown storage_options for a mem:// location: {sorted(opts)}")
        return Location(text, MemoryBlob(name),
                        lambda: MemoryLock(name, lease_seconds=lease_seconds))
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else text
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise InvalidUsage(f"file:// URL with a host is not supported: {text!r}")
        if not path:
            raise InvalidUsage("empty location path")
        root = os.path.abspath(path)
        if os.path.exists(root) and not os.path.isdir(root):
            raise InvalidUsage(f"location {text!r} is not a directory: {root} is a file")
        fsync = option_bool("fsync", opts.pop("fsync", True))
        map_min_bytes = option_size_or_off("map_min_bytes", opts.pop("map_min_bytes", MAP_MIN_BYTES))
        if opts:
            raise InvalidUsage(f"unknown storage_options for a file location: {sorted(opts)}")
        return Location(text, FileBlob(root, fsync=fsync, map_min_bytes=map_min_bytes),
                        lambda: FileLock(root, lease_seconds=lease_seconds))
    if parsed.scheme == "s3":
        return _s3(text, opts, lease_seconds=lease_seconds)
    raise InvalidUsage(f"unsupported location {text!r}: use mem://, file://, a path, or s3://")


def _s3(url: str, storage_options: Mapping[str, Any], *, lease_seconds: float) -> Location:
    """Assembles ``s3://bucket/prefix``: an S3Blob and its writer lock.

    The lock is a DynamoLock when ``lock_table`` or ``dynamodb_table`` is configured (or
    ``lock="dynamodb"``), else an S3Lock on ``<prefix>/LOCK`` (or with ``lock="s3"``). A missing
    bucket surfaces on first use as :class:`persist.MissingResource`.
    """
    try:
        from persist.blob.s3 import S3Blob, parse_url
        from persist.lock.dynamodb import DynamoLock
        from persist.lock.s3 import S3Lock
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        raise InvalidUsage(f"s3:// locations need the 's3' extra (boto3): {e}") from e

    bucket, prefix = parse_url(url)
    blob = S3Blob(bucket, prefix, storage_options=storage_options)
    cfg = blob.config
    table = cfg.lock_table or cfg.dynamodb_table
    kind = cfg.lock if cfg.lock != "auto" else ("dynamodb" if table else "s3")
    skew = cfg.max_clock_skew_rate or 2.0
    if kind == "dynamodb":
        if table is None:
            raise InvalidUsage("lock='dynamodb' needs storage option lock_table or dynamodb_table")
        ddb = blob.dynamodb_client()
        lock_id = blob.url(layout.LOCK_KEY)

        def dynamo_lock() -> WriterLock:
            return DynamoLock(ddb, table, lock_id, lease_seconds=lease_seconds,
                              max_skew_rate=skew, retry=blob.retry)

        return Location(url, blob, dynamo_lock)

    def s3_lock() -> WriterLock:
        return S3Lock(blob.client, bucket, blob.full_key(layout.LOCK_KEY),
                      lease_seconds=lease_seconds, max_skew_rate=skew, retry=blob.retry)

    return Location(url, blob, s3_lock)


__all__ = ["Location", "resolve"]
