"""S3 (and S3-compatible stores) as a Blob.

Layout: blob key ``k`` is the object ``<prefix>/k`` of the bucket; the writer lock, when kept in
S3, is ``<prefix>/LOCK``. Every object holds one enveloped value (see :mod:`.envelope`).

The commit primitive, ``set_if_absent``, has two implementations, chosen by
``storage_options["conditional_put"]``:

``"native"`` (default)
    ``put_object(IfNoneMatch="*")``: S3 itself refuses the second creator with 412. A 409
    ``ConditionalRequestConflict`` (a concurrent conditional write) is retried with backoff.
``"dynamodb"``
    for stores without conditional writes: the value is written to a unique temporary object
    (``_pending/<key>/<uuid>``), a DynamoDB item created once with ``attribute_not_exists``
    decides the winner and names that object, and the winner (or any reader that finds the
    decision but not the object: *roll-forward*) copies it into place (:mod:`.dynamo_commit`).
    A late or repeated copy writes the same bytes, so no late write can change a created key.
    On a miss, ``get`` of a key outside ``data/`` consults the decision (one consistent
    ``GetItem``) and rolls the write forward; ``delete`` of such a key also deletes its decision.

Ambiguous failures of a native ``set_if_absent`` (a timeout or reset after the request was sent,
a 5xx) are never answered by re-sending blindly: the key is read back and compared with the exact
bytes sent. Identical bytes mean the create landed (True). Other bytes mean another writer
created it (False). Absent means it has not landed (yet): the create is sent again, which is safe
because a late landing of the first attempt makes the second fail with 412 and the read-back then
finds our bytes. When the read-back itself fails, or attempts run out, ``Indeterminate`` is
raised. (The DynamoDB mode resolves its decision by an owner token instead: .dynamo_commit.)

NB: "identical bytes mean ours" is exact for persist, whose commit entries name their writer and
epoch: two writers never produce the same bytes for one key.

Immutable data blobs (keys under ``data/``, uniquely named and never rewritten) are kept in a
size-bounded in-memory LRU; ``meta/`` keys and the lock are never cached.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlparse

from typing_extensions import override

from persist import layout
from persist.blob import aws
from persist.blob.base import Blob
from persist.blob.dynamo_commit import Decision, DynamoCommit
from persist.blob.envelope import Framed
from persist.blob.options import option_float, option_int
from persist.errors import (
    Determinate,
    ExternalError,
    Indeterminate,
    InvalidUsage,
    MissingResource,
)

#: S3's smallest part (except the last) of a multipart upload; moto enforces it too.
MIN_PART_SIZE = 5 << 20
#: S3's largest CopyObject source: the DynamoDB mode copies a created value into place.
MAX_COPY_SIZE = 5 << 30

log = logging.getLogger(__name__)

ConditionalPut = Literal["native", "dynamodb"]
LockKind = Literal["auto", "dynamodb", "s3"]

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_CONDITIONAL_PUT = {"native": "native", "etag": "native", "s3": "native",
                    "dynamodb": "dynamodb", "dynamo": "dynamodb"}


@dataclass(frozen=True)
class S3Config:
    """The persist-specific ``storage_options`` of an ``s3://`` location (besides connection).

    ``max_clock_skew_rate`` of None leaves each component its default (3 for the DynamoDB commit
    as in the seed protocol, 2 for the writer lock).
    """

    multipart_threshold: int = 16 << 20
    multipart_part_size: int = 8 << 20
    cache_bytes: int = 64 << 20
    conditional_put: ConditionalPut = "native"
    dynamodb_table: str | None = None
    lock: LockKind = "auto"
    lock_table: str | None = None
    commit_timeout: float = 20.0
    commit_ttl: float = 3600.0
    max_clock_skew_rate: float | None = None

    KEYS = (
        "multipart_threshold", "multipart_part_size", "cache_bytes", "conditional_put",
        "aws_conditional_put", "dynamodb_table", "lock", "lock_table", "commit_timeout",
        "commit_ttl", "max_clock_skew_rate",
    )

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> S3Config:
        """Builds the config from lower-cased option keys (what ``AwsOptions.split`` leaves).

        Raises:
            InvalidUsage: an unknown key, or a bad value.
        """
        unknown = sorted(set(options) - set(cls.KEYS))
        if unknown:
            raise InvalidUsage(
                f"unknown storage_options for an s3:// location: {unknown}; persist accepts the "
                f"boto3 connection options and {sorted(cls.KEYS)}"
            )
        cond_raw = str(options.get("conditional_put", options.get("aws_conditional_put",
                                                                  "native"))).lower()
        if cond_raw not in _CONDITIONAL_PUT:
            raise InvalidUsage(f"conditional_put must be 'native' or 'dynamodb', not {cond_raw!r}")
        conditional: ConditionalPut = "dynamodb" if _CONDITIONAL_PUT[cond_raw] == "dynamodb" \
            else "native"
        lock_raw = str(options.get("lock", "auto")).lower()
        if lock_raw not in ("auto", "dynamodb", "s3"):
            raise InvalidUsage(f"lock must be 'auto', 'dynamodb' or 's3', not {lock_raw!r}")
        lock: LockKind = "dynamodb" if lock_raw == "dynamodb" else (
            "s3" if lock_raw == "s3" else "auto")
        skew = options.get("max_clock_skew_rate")
        cfg = cls(
            multipart_threshold=option_int("multipart_threshold",
                                     options.get("multipart_threshold", cls.multipart_threshold)),
            multipart_part_size=option_int("multipart_part_size",
                                     options.get("multipart_part_size", cls.multipart_part_size)),
            cache_bytes=option_int("cache_bytes", options.get("cache_bytes", cls.cache_bytes)),
            conditional_put=conditional,
            dynamodb_table=options.get("dynamodb_table") or None,
            lock=lock,
            lock_table=options.get("lock_table") or None,
            commit_timeout=option_float("commit_timeout",
                                  options.get("commit_timeout", cls.commit_timeout)),
            commit_ttl=option_float("commit_ttl", options.get("commit_ttl", cls.commit_ttl)),
            max_clock_skew_rate=None if skew is None else option_float("max_clock_skew_rate", skew),
        )
        if cfg.multipart_part_size < MIN_PART_SIZE:
            raise InvalidUsage(
                f"multipart_part_size must be at least {MIN_PART_SIZE} (S3's minimum part size)"
            )
        if cfg.multipart_threshold < 1 or cfg.cache_bytes < 0:
            raise InvalidUsage("multipart_threshold must be >= 1 and cache_bytes >= 0")
        if cfg.conditional_put == "dynamodb" and not cfg.dynamodb_table:
            raise InvalidUsage("conditional_put='dynamodb' needs storage option dynamodb_table")
        return cfg


class ImmutableCache:
    """A thread-safe LRU of immutable values, bounded by their total size in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        """Returns the cached value of ``key`` (refreshing its recency), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: bytes) -> None:
        """Caches ``value`` under ``key``, evicting the least recently used to fit."""
        # NB: one value bigger than a quarter of the budget would evict most of the cache for
        # an object that is usually read once (a compaction input): skip it.
        if len(value) > self.max_bytes // 4:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._size -= len(old)
            self._items[key] = value
            self._size += len(value)
            while self._size > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._size -= len(evicted)

    def discard(self, key: str) -> None:
        """Forgets ``key``."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._size -= len(old)

    @property
    def size(self) -> int:
        """Bytes currently cached."""
        return self._size


def parse_url(url: str) -> tuple[str, str]:
    """Splits ``s3://bucket/some/prefix`` into ``("bucket", "some/prefix")``.

    Raises:
        InvalidUsage: not an s3:// URL, or an invalid bucket name.
    """
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InvalidUsage(f"not an s3://bucket/prefix URL: {url!r}")
    if parsed.query or parsed.fragment:
        raise InvalidUsage(f"s3:// URL must not carry a query or fragment: {url!r}")
    return parsed.netloc, parsed.path.strip("/")


def _rebuild(bucket: str, prefix: str, storage_options: dict[str, Any]) -> S3Blob:
    return S3Blob(bucket, prefix, storage_options=storage_options)


class S3Blob(Blob):
    """A Blob over one bucket and key prefix. Thread-safe; share one per location.

    Pickles as its configuration (clients and cache are rebuilt), so it can be shipped to
    worker processes.
    """

    supports_conditional_create = True
    is_local = False

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Args:
            bucket: the bucket name (it must exist).
            prefix: the key prefix of this store inside the bucket ("" for the whole bucket).
            storage_options: connection settings passed to boto3 (``endpoint_url``,
                ``region_name``, ``aws_access_key_id``, ``addressing_style``, ... or the upper-case
                ``AWS_*`` spellings) and persist's own (:class:`S3Config`).

        Raises:
            InvalidUsage: a bad bucket name or storage option.
        """
        if not _BUCKET_RE.match(bucket) or ".." in bucket:
            raise InvalidUsage(f"invalid S3 bucket name {bucket!r} (3-63 of a-z 0-9 . -)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._storage_options = dict(storage_options or {})
        self.aws, rest = aws.AwsOptions.split(self._storage_options)
        self.config = S3Config.parse(rest)
        self.retry = self.aws.retry
        self.client: aws.Client = aws.client("s3", self.aws)
        self.cache = ImmutableCache(self.config.cache_bytes)
        self._dynamodb: aws.Client | None = None
        self._dynamodb_lock = threading.Lock()
        self.commit: DynamoCommit | None = None
        if self.config.conditional_put == "dynamodb":
            assert self.config.dynamodb_table is not None
            # NB: commit_timeout / commit_ttl are accepted but unused since decisions are never
            # taken over or expired (docs/s3.md); max_clock_skew_rate still serves the lock.
            self.commit = DynamoCommit(self.dynamodb_client(), self.config.dynamodb_table,
                                       retry=self.retry)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.bucket, self.prefix, self._storage_options))

    def __repr__(self) -> str:
        mode = self.config.conditional_put
        return f"S3Blob(s3://{self.bucket}/{self.prefix}, conditional_put={mode})"

    # -- naming ------------------------------------------------------------------------------

    @override
    def locator(self) -> tuple[str, str] | None:
        # NB: the endpoint is part of the store: one bucket name on two endpoints is two stores.
        return (f"s3://{self.bucket}@{self.aws.endpoint_url or ''}", self.prefix)

    @override
    def sibling(self, root: str) -> Blob:
        return S3Blob(self.bucket, root, storage_options=self._storage_options)

    def full_key(self, key: str) -> str:
        """Returns the S3 object key of blob key ``key``.

        Raises:
            InvalidUsage: an empty key.
        """
        if not key:
            raise InvalidUsage("blob keys must be non-empty")
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        """Returns ``s3://bucket/<full key>`` of blob key ``key`` (for messages and records)."""
        return f"s3://{self.bucket}/{self.full_key(key)}"

    def dynamodb_client(self) -> aws.Client:
        """Returns the (shared, lazily built) DynamoDB client for this location's options."""
        with self._dynamodb_lock:
            if self._dynamodb is None:
                self._dynamodb = aws.client("dynamodb", self.aws)
            return self._dynamodb

    # -- reads -------------------------------------------------------------------------------

    @override
    def _get(self, key: str) -> bytes | None:
        cacheable = layout.is_immutable(key)
        if cacheable:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
        full = self.full_key(key)
        data = self._fetch(full)
        if data is None and self._decided_by_dynamodb(key):
            data = self._roll_forward(full)
        if data is not None and cacheable:
            self.cache.put(key, data)
        return data

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        hit = self.cache.get(key) if layout.is_immutable(key) else None
        if hit is not None:
            return memoryview(hit)[start:end]
        if end is not None and end == start:
            return b"" if self._exists(self.full_key(key)) else None
        full = self.full_key(key)
        span = f"bytes={start}-" + ("" if end is None else str(end - 1))
        got = aws.call(lambda: aws.get_object(self.client, self.bucket, full, byte_range=span),
                       what=f"get s3://{self.bucket}/{full} ({span})", write=False,
                       idempotent=True, retry=self.retry)
        if got is None and self._decided_by_dynamodb(key):
            return super()._get_range(key, start, end)  # rolls a decided commit forward
        return None if got is None else got[0]

    def _fetch(self, full: str) -> bytes | None:
        got = aws.call(lambda: aws.get_object(self.client, self.bucket, full),
                       what=f"get s3://{self.bucket}/{full}", write=False, idempotent=True,
                       retry=self.retry)
        return None if got is None else got[0]

    def _exists(self, full: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=full)
                return True
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[1] == 404:
                    return False
                raise

        return aws.call(head, what=f"head s3://{self.bucket}/{full}", write=False,
                        idempotent=True, retry=self.retry)

    @override
    def _external_url(self, key: str) -> str:
        return self.url(key)

    @override
    def _list(self, prefix: str) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[str]:
            out: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
                out.extend(obj["Key"][len(root):] for obj in page.get("Contents", ()))
            return out

        # NB: a failed page restarts the whole listing: simpler than resuming from a
        # continuation token, and listings in persist are small (the metadata log).
        return aws.call(listing, what=f"list s3://{self.bucket}/{root}{prefix}", write=False,
                        idempotent=True, retry=self.retry)

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[str]:
            # NB: StartAfter: S3 returns only the keys past it (in UTF-8 binary order, which
            # is Python's order of str), one request per 1,000 of them.
            out: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix,
                                           StartAfter=root + start_after):
                out.extend(obj["Key"][len(root):] for obj in page.get("Contents", ()))
            return out

        return aws.call(listing, what=f"list s3://{self.bucket}/{root}{prefix} after "
                        f"{start_after!r}", write=False, idempotent=True, retry=self.retry)

    # -- writes ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _missing_bucket_if_denied(self) -> Iterator[None]:
        """Turns a write's 403 into ``MissingResource`` when the bucket does not exist.

        NB: AWS, moto and ministack answer a write to a missing bucket with 404 NoSuchBucket
        (``MissingResource`` already); SeaweedFS answers 403 AccessDenied, which alone cannot be
        told from a permission problem. One ``HeadBucket``, on this failure path only, decides.
        """
        try:
            yield
        except Determinate as e:
            if isinstance(e, MissingResource) or not aws.denied(e.__cause__):
                raise
            if not aws.bucket_missing(self.client, self.bucket):
                raise
            raise MissingResource(
                f"bucket {self.bucket!r} does not exist (the store refused a write with "
                f"403 AccessDenied, as some S3-compatible stores do for a missing bucket): {e}"
            ) from e

    @override
    def _set(self, key: str, framed: bytes | Framed) -> None:
        data = bytes(framed)  # one body for the request, the read-back and the cache
        full = self.full_key(key)
        self.cache.discard(key)
        try:
            with self._missing_bucket_if_denied():
                self._write(self.client, full, data, conditional=False)
        except Indeterminate:
            # NB: retried already (an unconditional PUT of the same bytes is idempotent); a
            # last look tells "landed, reply lost" from "unknown".
            if self._readback(full, data) != "ours":
                raise
        if layout.is_immutable(key):
            self.cache.put(key, data)

    @override
    def _set_if_absent(self, key: str, framed: bytes | Framed) -> bool:
        data = bytes(framed)
        full = self.full_key(key)
        with self._missing_bucket_if_denied():
            if self.commit is not None:
                created = self._create_decided(key, full, data)
            else:
                created = self._create_native(full, data)
        if created and layout.is_immutable(key):
            self.cache.put(key, data)
        return created

    @override
    def _delete(self, key: str) -> None:
        with self._missing_bucket_if_denied():
            self._delete_key(key)

    def _delete_key(self, key: str) -> None:
        full = self.full_key(key)
        self.cache.discard(key)
        decision: Decision | None = None
        if self.commit is not None and self._decided_by_dynamodb(key):
            # NB: the order matters. The temp object goes first: once it is gone no roll-forward
            # (a copy from it) can put the value back; then the object; the decision last, so a
            # reader that misses the object meanwhile finds "decided, temp gone" and says absent.
            decision = self.commit.lookup(self._path(full))
            if decision is not None and decision.temp:
                self._delete_object(decision.temp)
        self._delete_object(full)
        if self.commit is not None and decision is not None:
            self.commit.forget(self._path(full), decision)

    def _delete_object(self, full: str) -> None:
        # NB: S3 answers 204 for an absent key, so a retried delete is harmless.
        aws.call(lambda: self.client.delete_object(Bucket=self.bucket, Key=full),
                 what=f"delete s3://{self.bucket}/{full}", write=True, idempotent=True,
                 retry=self.retry)

    @override
    def close(self) -> None:
        for c in (self.client, self._dynamodb):
            close = getattr(c, "close", None)
            if close is not None:
                close()

    # -- the write paths ---------------------------------------------------------------------

    def _create_native(self, full: str, data: bytes) -> bool:
        ambiguous: Indeterminate | None = None
        for attempt in range(self.retry.max_attempts):
            try:
                return self._write(self.client, full, data, conditional=True)
            except Indeterminate as e:
                ambiguous = e
            outcome = self._readback(full, data)
            if outcome != "absent":
                return outcome == "ours"
            # NB: absent after an ambiguous create: re-sending is safe (module docstring).
            if attempt + 1 < self.retry.max_attempts:
                time.sleep(self.retry.delay(attempt))
        raise Indeterminate(
            f"conditional create of s3://{self.bucket}/{full} failed ambiguously "
            f"{self.retry.max_attempts} times and its outcome is unknown"
        ) from ambiguous

    # -- the DynamoDB-decided create (module docstring of .dynamo_commit) ---------------------

    def _decided_by_dynamodb(self, key: str) -> bool:
        """Whether ``key`` may have been created through a DynamoDB decision, so that a miss must
        consult it. NB: ``data/`` keys (immutable, uniquely named, written with ``set``) and the
        temp objects themselves never are, which keeps their misses at one request."""
        return self.commit is not None and not (layout.is_immutable(key) or key.startswith(layout.PENDING_PREFIX))

    def _path(self, full: str) -> str:
        return f"s3://{self.bucket}/{full}"

    def _create_decided(self, key: str, full: str, data: bytes) -> bool:
        assert self.commit is not None
        if not self._decided_by_dynamodb(key):
            raise InvalidUsage(
                f"conditional_put='dynamodb' creates no keys under {layout.DATA_PREFIX!r} or "
                f"{layout.PENDING_PREFIX!r} conditionally (their misses never consult the decisions): "
                f"{key!r}"
            )
        if len(data) > MAX_COPY_SIZE:
            raise InvalidUsage(f"conditional_put='dynamodb' creates values up to {MAX_COPY_SIZE} "
                               f"bytes (S3's CopyObject limit), not {len(data)}")
        if self._exists(full):
            return False
        temp = self.full_key(layout.pending_key(key, uuid.uuid4().hex))
        try:
            self._write(self.client, temp, data, conditional=False)
        except Indeterminate as e:
            try:
                confirmed = self._fetch(temp) == data
            except ExternalError:
                confirmed = False
            if not confirmed:
                self._discard(temp)
                raise Determinate(
                    f"could not confirm the temporary copy s3://{self.bucket}/{temp}; "
                    f"s3://{self.bucket}/{full} was not created"
                ) from e
        except BaseException:
            self._discard(temp)
            raise
        try:
            won, decision = self.commit.claim(self._path(full), temp)
        except Indeterminate:
            # NB: keep the temp object: the decision may exist and name it.
            raise
        except BaseException:
            self._discard(temp)
            raise
        if not won:
            self._discard(temp)
            return False
        assert decision is not None
        assert decision.temp == temp
        try:
            self._finish(full, decision)
        except ExternalError as e:
            # NB: the key is created (decided): the value is durable in the temp object, and any
            # reader rolls it forward (or a delete removes it). True is the truth.
            log.warning("created %s but could not copy it into place yet (readers roll it "
                        "forward): %s", self._path(full), e)
        return True

    def _finish(self, full: str, decision: Decision) -> bool:
        """Copies the decided value into place, then deletes the temp object.

        Returns:
            True if this call copied it; False if the temp object was gone (finished by someone
            else, or the key deleted since: a copy then writes nothing).

        Raises:
            ExternalError: S3 failed (nothing is lost: the temp object stays).
        """
        what = f"copy s3://{self.bucket}/{decision.temp} to s3://{self.bucket}/{full}"

        def copy() -> bool:
            try:
                self.client.copy_object(Bucket=self.bucket, Key=full,
                                        CopySource={"Bucket": self.bucket, "Key": decision.temp})
                return True
            except aws.AWS_ERRORS as e:
                code, status = aws.error_code(e)
                if code == "NoSuchKey" or (status == 404 and code != "NoSuchBucket"):
                    return False
                raise

        # NB: idempotent: every copy of this decision writes the same bytes, and one that
        # arrives after the temp object was deleted fails without writing.
        copied = aws.call(copy, what=what, write=True, idempotent=True, retry=self.retry)
        if copied:
            # NB: only now, with the object in place, may the temp object go.
            self._delete_object(decision.temp)
        return copied

    def _roll_forward(self, full: str) -> bytes | None:
        """The value of a key whose object is missing: a decided but unfinished create's, or
        None. Copies it into place on the way (best effort: a read-only caller may not write)."""
        assert self.commit is not None
        decision = self.commit.lookup(self._path(full))
        if decision is None or not decision.temp:
            return None
        value = self._fetch(decision.temp)
        if value is None:
            # NB: the temp object is deleted only once the object exists, or by a delete of the
            # key; whichever it was, the object tells.
            return self._fetch(full)
        try:
            self._finish(full, decision)
        except ExternalError as e:
            log.info("could not roll %s forward: %s", self._path(full), e)
        return value

    def _discard(self, temp: str) -> None:
        """Deletes an undecided temp object, best effort (a leftover is listed under
        ``_pending/``)."""
        try:
            self._delete_object(temp)
        except ExternalError as e:
            log.warning("could not delete temporary object s3://%s/%s: %s", self.bucket, temp, e)

    def _readback(self, full: str, data: bytes) -> Literal["ours", "other", "absent"]:
        """Resolves an ambiguous write by reading the key.

        Raises:
            Indeterminate: the read failed too.
        """
        try:
            stored = self._fetch(full)
        except Exception as e:
            raise Indeterminate(
                f"could not read back s3://{self.bucket}/{full} after an ambiguous write: {e}"
            ) from e
        if stored is None:
            return "absent"
        return "ours" if stored == data else "other"

    def _write(self, client: aws.Client, full: str, data: bytes, *, conditional: bool,
               deadline: float | None = None) -> bool:
        """One logical PUT (single request or multipart).

        Returns:
            False only for a conditional create that found the key present (412).

        Raises:
            Determinate: definitely not written (retries exhausted or not worth retrying).
            Indeterminate: may have been written. A conditional create is not retried after an
                ambiguous failure; an unconditional write is (re-sending the same bytes is
                idempotent).
        """
        if len(data) >= self.config.multipart_threshold:
            return self._multipart(client, full, data, conditional=conditional, deadline=deadline)
        extra = {"IfNoneMatch": "*"} if conditional else {}

        def put() -> bool:
            try:
                client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra)
                return True
            except aws.AWS_ERRORS as e:
                if conditional and aws.error_code(e)[1] == 412:
                    return False
                raise

        return aws.call(put, what=f"put s3://{self.bucket}/{full}", write=True,
                        idempotent=not conditional, retry=self.retry, deadline=deadline)

    def _multipart(self, client: aws.Client, full: str, data: bytes, *, conditional: bool,
                   deadline: float | None) -> bool:
        what = f"multipart put s3://{self.bucket}/{full}"
        # NB: creating an upload twice only leaves an orphan upload (a lifecycle rule with
        # AbortIncompleteMultipartUpload cleans those; see docs/s3.md).
        upload_id: str = aws.call(
            lambda: client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"],
            what=what, write=True, idempotent=True, retry=self.retry, deadline=deadline,
        )
        finished = False
        try:
            parts: list[dict[str, Any]] = []
            size = self.config.multipart_part_size
            view = memoryview(data)
            for number, offset in enumerate(range(0, len(data), size), start=1):
                upload = functools.partial(
                    client.upload_part, Bucket=self.bucket, Key=full, UploadId=upload_id,
                    PartNumber=number, Body=bytes(view[offset:offset + size]),
                )
                etag: str = aws.call(lambda upload=upload: upload()["ETag"],  # type: ignore[misc]
                                     what=f"{what} part {number}", write=True, idempotent=True,
                                     retry=self.retry, deadline=deadline)
                parts.append({"ETag": etag, "PartNumber": number})
            extra = {"IfNoneMatch": "*"} if conditional else {}

            def complete() -> bool:
                try:
                    client.complete_multipart_upload(
                        Bucket=self.bucket, Key=full, UploadId=upload_id,
                        MultipartUpload={"Parts": parts}, **extra,
                    )
                    return True
                except aws.AWS_ERRORS as e:
                    if conditional and aws.error_code(e)[1] == 412:
                        return False
                    raise

            try:
                # NB: completing is the moment the object appears; it is never re-sent after an
                # ambiguous failure (a second complete of a finished upload fails NoSuchUpload,
                # which would hide the success). Callers resolve it by reading back.
                done = aws.call(complete, what=f"{what} complete", write=True, idempotent=False,
                                retry=self.retry, deadline=deadline)
            except Indeterminate:
                finished = True  # may have completed: aborting would race it; leave it be
                raise
            finished = done
            return done
        finally:
            if not finished:
                self._abort(client, full, upload_id)

    def _abort(self, client: aws.Client, full: str, upload_id: str) -> None:
        # Best effort: a bucket lifecycle rule collects whatever is left behind.
        with contextlib.suppress(Exception):
            aws.call(lambda: client.abort_multipart_upload(Bucket=self.bucket, Key=full,
                                                           UploadId=upload_id),
                     what=f"abort multipart s3://{self.bucket}/{full}", write=True,
                     idempotent=True, retry=self.retry)


__all__ = ["ImmutableCache", "S3Blob", "S3Config", "parse_url"]
