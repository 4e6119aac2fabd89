"""The composition root: turning a URL into a blob store, a writer lock and a running client.

    mem://name              in-process, shared by name (tests)
    file:///abs/path, path  a local directory; lock in <path>/LOCK
    s3://bucket/prefix      S3 (extra ``s3``); lock in DynamoDB or in S3 itself

This is the one module that knows the blob, lock and runtime layers together: :func:`resolve`
assembles a store and its lock for every scheme, :func:`open_writer` opens a writer's engine
under the lock (what every writer does before its first commit), and :func:`open`
(``persist.open``) adds the runtime on top. No layer has to know another's implementations:
the blob layer never imports the lock layer, and the runtime never resolves URLs.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlparse

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.blob.file import FLUSH_BYTES, MAP_MIN_BYTES, FileBlob
from persist.blob.memory import MemoryBlob
from persist.blob.metered import metered
from persist.blob.options import option_bool, option_size_or_off
from persist.errors import Fenced, InvalidUsage, MissingResource
from persist.indexed.engine import Indexed, Options
from persist.indexed.maintenance.offload import MergeWorker
from persist.indexed.read.scan import Address
from persist.lock.base import LEASE_SECONDS, MAX_SKEW_RATE, Lease, WriterLock
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock
from persist.runtime.client import Client
from persist.runtime.commands import forbid_in_event_loop
from persist.runtime.notify import Notifier
from persist.runtime.replica import open_replica
from persist.runtime.runtime import Runtime

log = logging.getLogger("persist.location")


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
    lease_seconds: float = LEASE_SECONDS,
) -> Location:
    """Parses ``url`` into a Location. Nothing is contacted or created yet.

    Args:
        url: ``mem://name``, ``file:///abs/path``, a path, or ``s3://bucket/prefix``.
        storage_options: per scheme: ``fsync``, ``map_min_bytes`` and ``flush_bytes`` for
            files; boto3's connection options and the persist S3 options
            (:class:`persist.blob.s3.S3Config`) for S3. Unknown options are refused.
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
        flush_bytes = option_size_or_off("flush_bytes", opts.pop("flush_bytes", FLUSH_BYTES))
        if opts:
            raise InvalidUsage(f"unknown storage_options for a file location: {sorted(opts)}")
        return Location(text, FileBlob(root, fsync=fsync, map_min_bytes=map_min_bytes,
                                       flush_bytes=flush_bytes),
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
    skew = cfg.max_clock_skew_rate or MAX_SKEW_RATE
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


@dataclass(frozen=True)
class Writer:
    """A writer opened on a location: the lock it holds, its lease, and its engine, fenced."""

    lock: WriterLock
    lease: Lease
    engine: Indexed

    def close(self) -> None:
        """Releases the lock and closes it (the engine needs no closing).

        Raises:
            ExternalError: releasing failed (the lease then lapses by itself).
        """
        try:
            self.lock.release(self.lease)
        finally:
            self.lock.close()


def open_writer(loc: Location, writer: str, *, lock_timeout: float,
                options: Options | None = None) -> Writer:
    """Opens ``loc`` as writer ``writer``: takes its writer lock (waiting up to
    ``lock_timeout`` for another holder), loads the engine stamped with the lock's generation,
    and fences the log with it (DESIGN.md §5), so no older writer can commit after this one.
    The engine reads and writes through the blob metrics when they are on.

    Raises:
        LockHeld: another writer holds the lock (nothing held).
        Fenced: a newer writer took the lock over before the fence (nothing held).
        ExternalError, Corruption: storage failed, or holds bytes persist cannot trust
            (nothing held).
    """
    lock = loc.lock()
    try:
        lease = lock.acquire(writer, timeout=lock_timeout)
    except BaseException:
        lock.close()
        raise
    try:
        ix = Indexed.open(metered(loc.blob), epoch=lease.generation, writer=writer,
                          options=options)
        ix.fence(reload=False)
    except BaseException:
        try:
            lock.release(lease)
        finally:
            lock.close()
        raise
    return Writer(lock, lease, ix)


def open(
    url: str | os.PathLike[str],
    *,
    reentrance_id: str | None = None,
    read_only: bool = False,
    missing_ok: bool = False,
    lock_timeout: float = 0.0,
    lease_seconds: float = LEASE_SECONDS,
    storage_options: dict[str, Any] | None = None,
    options: Options | None = None,
    on_lock_lost: Callable[[Fenced], None] | None = None,
    poll_interval: tuple[float, float] = (0.005, 0.5),
    notify: bool | Literal["unix", "tcp"] = False,
) -> Client:
    """Opens a location for writing (taking its writer lock) or, with ``read_only``, as a replica.

    Args:
        url: ``file:///path``, a plain path, ``mem://name`` or ``s3://bucket/prefix``.
        reentrance_id: the writer's identity. A writer opening with the same id as the current
            holder takes over at once and fences it (a restarted process under its deployment
            id). None (the default) means a fresh id: the lock is not reentrant.
        read_only: open without the lock and without any ability to write.
        missing_ok: with ``read_only``, open a location where nothing was ever committed (a
            replica started before its writer), which then follows the first writer. Without
            it such an open fails, since a mistyped URL looks exactly like that.
        lock_timeout: seconds to wait for a lock held by another id to be released or lapse;
            also how long a failing lock store is retried, if longer than 5 s.
        lease_seconds: the writer lock's lease (heartbeated every third of it).
        storage_options: passed to the storage client (boto3 for S3) as given.
        options: engine tuning (inline threshold, rollup cadence, GC grace, compaction, group
            commit); a writer can replace them later with :meth:`Client.set_options`.
        on_lock_lost: called (on a background thread) if the lock is lost while open.
        poll_interval: replicas' (min, max) seconds between polls of the metadata log.
        notify: push notifications (advisory; see docs/replicas.md). A writer serves them on
            a Unix socket (True or "unix") or loopback TCP ("tcp") and advertises it in
            ``meta/notify``; a replica subscribes when one is advertised and reachable, and
            polls as usual otherwise.

    Raises:
        MissingResource: ``read_only`` without ``missing_ok``, and no location exists there;
            or the bucket or table of an S3 location does not exist.
        LockHeld: another writer holds the lock.
        Fenced: another writer took the lock over between this one's acquisition and its
            fence commit (open again, or with another reentrance id).
        InvalidUsage: a malformed URL, or called from inside a running asyncio loop.
        ExternalError, Corruption: storage failed or holds bytes persist cannot trust.
    """
    forbid_in_event_loop("persist.open()")
    loc = resolve(url, storage_options=storage_options, lease_seconds=lease_seconds)
    if notify not in (False, True, "unix", "tcp"):
        raise InvalidUsage(f"notify must be a bool, 'unix' or 'tcp', not {notify!r}")
    if missing_ok and not read_only:
        raise InvalidUsage("missing_ok applies to read_only opens (a writer creates the location)")
    if read_only:
        ix, follower = open_replica(loc.read_half(), options=options,
                                    poll_interval=poll_interval, notify=bool(notify))
        if ix.state.seq == 0 and not missing_ok:
            follower.stop()
            raise MissingResource.nothing_committed(
                loc.url, "pass missing_ok=True to open a replica that waits for its first "
                         "writer")
        ix.machine.start_prefetch()  # NB: once open (DESIGN.md §4, "Lazy pieces")
        return Client(loc.url, ix, follower=follower, storage_options=storage_options)
    rid = reentrance_id or f"anon-{uuid.uuid4().hex}"
    w = open_writer(loc, rid, lock_timeout=lock_timeout, options=options)
    w.engine.merger = _merger(loc.url, storage_options)
    runtime = Runtime(w.engine, lock=w.lock, lease=w.lease, on_lock_lost=on_lock_lost)
    notifier = None
    if notify:
        notifier = Notifier.start(loc.blob, runtime.published, epoch=w.lease.generation,
                                  writer=rid, transport="tcp" if notify == "tcp" else "unix")
    w.engine.machine.start_prefetch()  # NB: once open (DESIGN.md §4, "Lazy pieces")
    return Client(loc.url, w.engine, runtime=runtime, notifier=notifier,
                  storage_options=storage_options)


#: The module a writer's merge worker runs (named, not imported: it stands above this one).
MERGE_WORKER = "persist.distributed.merge_worker"


def _merger(url: str, storage_options: dict[str, Any] | None) -> MergeWorker | None:
    """The merge worker of a writer at ``url`` (not started yet), or None: a memory store
    cannot be shared with another process, and storage options that cannot be sent to one
    (a live object) keep merges in-process."""
    if urlparse(url).scheme not in ("", "file", "s3"):
        return None
    try:
        where = msgspec.msgpack.encode(Address.of(url, storage_options))
    except (msgspec.EncodeError, TypeError, OverflowError) as e:
        log.info("merging in-process at %s: storage options cannot be sent to a merge "
                 "worker: %s", url, e)
        return None
    return MergeWorker(MERGE_WORKER, where)


__all__ = ["Location", "Writer", "open", "open_writer", "resolve"]
