"""The writer lock as one S3 object, compare-and-set by conditional ``PutObject``.

The record (a msgpack :class:`~persist.lock.base.LockRecord` in the blob envelope, framed under
the blob key ``LOCK`` so ``S3Blob.get("LOCK")`` verifies it too) lives at ``<prefix>/LOCK``.
``_cas(expected, new)`` writes ``new`` with ``If-None-Match: *`` when ``expected`` is None, else
with ``If-Match: <etag of expected>``. An S3 ETag of a single-part object is the MD5 of its
bytes, so "the etag still matches" is exactly "the stored record still equals ``expected``".
412 (or 404: the object vanished) means another party moved first; 409
``ConditionalRequestConflict`` is retried with backoff.

Used by default for ``s3://`` locations without a DynamoDB table: it needs nothing but a bucket
with conditional writes (AWS S3 since 2024; most S3-compatible stores).

Ambiguous failures are resolved by reading the record back
(:class:`~persist.lock.conditional.ConditionalStoreLock`, shared with :mod:`persist.lock.dynamodb`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from typing_extensions import override

from persist import layout
from persist.blob import aws, envelope
from persist.errors import Corruption, InvalidUsage
from persist.lock.base import (
    LEASE_SECONDS,
    MAX_SKEW_RATE,
    STORE_TIMEOUT,
    LockRecord,
    decode_record,
    encode_record,
)
from persist.lock.conditional import ConditionalStoreLock

_ETAGS_KEPT = 16


class S3Lock(ConditionalStoreLock):
    """A writer lock kept in one S3 object (see the module docstring)."""

    def __init__(
        self,
        client: aws.Client,
        bucket: str,
        key: str,
        *,
        blob_key: str = layout.LOCK_KEY,
        lease_seconds: float = LEASE_SECONDS,
        max_skew_rate: float = MAX_SKEW_RATE,
        retry: aws.RetryPolicy | None = None,
        store_timeout: float = STORE_TIMEOUT,
    ) -> None:
        """Args:
            client: a boto3 S3 client (not closed by this lock).
            bucket: the bucket.
            key: the object key of the lock record (``<prefix>/LOCK``).
            blob_key: the key the record is framed under (the blob-relative name).
            lease_seconds: the lease a holder claims.
            max_skew_rate: tolerated clock rate difference (see ``persist.lock.base``).
            retry: backoff for transient S3 failures.
            store_timeout: seconds an operation retries a failing S3 (at least).

        Raises:
            InvalidUsage: bad lease parameters or an empty key.
        """
        super().__init__(lease_seconds=lease_seconds, max_skew_rate=max_skew_rate, retry=retry,
                         store_timeout=store_timeout)
        if not key:
            raise InvalidUsage("S3Lock needs a non-empty object key")
        self.client = client
        self.bucket = bucket
        self.key = key
        self.blob_key = blob_key
        self._url = f"s3://{bucket}/{key}"
        # NB: the ETag each recently seen record was stored with, so a CAS right after a read
        # (the protocol's pattern) costs one request, not two. Keyed by the record itself.
        self._etags: OrderedDict[LockRecord, str] = OrderedDict()
        self._etags_lock = threading.Lock()

    @property
    @override
    def where(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"<S3Lock {self._url}>"

    def _remember(self, rec: LockRecord, etag: str) -> None:
        with self._etags_lock:
            self._etags[rec] = etag
            self._etags.move_to_end(rec)
            while len(self._etags) > _ETAGS_KEPT:
                self._etags.popitem(last=False)

    def _read_with_etag(self, deadline: float | None) -> tuple[LockRecord, str] | None:
        got = aws.call(lambda: aws.get_object(self.client, self.bucket, self.key),
                       what=f"read lock {self._url}", write=False, idempotent=True,
                       retry=self.retry, deadline=deadline)
        if got is None:
            return None
        data, etag = got
        payload = envelope.unframe(self.blob_key, data)
        try:
            rec = decode_record(bytes(payload))
        except (ValueError, TypeError) as e:  # msgspec.DecodeError is a ValueError
            raise Corruption(self.blob_key, f"undecodable lock record: {e}") from e
        self._remember(rec, etag)
        return rec, etag

    @override
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        got = self._read_with_etag(deadline)
        return None if got is None else got[0]

    @override
    def _put_if(self, expected: LockRecord | None, new: LockRecord, *,
                deadline: float | None) -> bool:
        if expected is None:
            precondition = {"IfNoneMatch": "*"}
        else:
            with self._etags_lock:
                etag = self._etags.get(expected)
            if etag is None:
                current = self._read_with_etag(deadline)
                if current is None or current[0] != expected:
                    return False
                etag = current[1]
            precondition = {"IfMatch": etag}
        body = bytes(envelope.frame(self.blob_key, encode_record(new)))

        def put() -> bool:
            try:
                response = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body,
                                                  **precondition)
            except aws.AWS_ERRORS as e:
                code, status = aws.error_code(e)
                # 412: the record changed (or exists, for a create); 404: it vanished.
                if status == 412 or (status == 404 and code != "NoSuchBucket"):
                    return False
                raise
            self._remember(new, str(response["ETag"]))
            return True

        return aws.call(put, what=f"write lock {self._url}", write=True, idempotent=False,
                        retry=self.retry, deadline=deadline)


__all__ = ["S3Lock"]
