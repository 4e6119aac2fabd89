"""Conditional create for object stores without conditional writes, synchronized in DynamoDB.

Used by :class:`persist.blob.s3.S3Blob` when ``storage_options["conditional_put"] ==
"dynamodb"`` (S3-compatible stores that ignore ``If-None-Match``, or deployments that want the
commit arbitrated outside the object store). It follows the DynamoDB commit protocol that
object_store / delta-rs used before S3 had conditional writes, with one change, marked below.

Table schema (shared with :class:`persist.lock.dynamodb.DynamoLock`; see ``create_table``)::

    path        S  partition key   "s3://<bucket>/<key>" of the object being created
    etag        S  sort key        "*" for a create (the precondition "absent")
    generation  N                  1 when created, +1 on every takeover of a stale record
    owner       S                  random token of the acquisition (see NB in ``_Record``)
    timeout     N                  the holder's operation timeout, milliseconds
    ttl         N                  epoch seconds after which DynamoDB may delete the record

To create ``path`` (etag ``*``):

1. If the object exists, fail (return False).
2. Create the record with ``attribute_not_exists(path)``.
   1. On success: check the object is still absent (the NB below), then write it within the
      record's ``timeout``, then delete the record (conditioned on our owner token).
   2. On conflict: poll. If the object appears, fail. If the record is gone, go to 2. If the
      record's ``(generation, owner)`` stays unchanged for ``timeout * max_clock_skew_rate``
      seconds of *our* monotonic clock, replace it with ``generation + 1`` conditioned on the
      observed ``(generation, owner)``: on success go to 2.1, on conflict keep polling.

Invariant: at most one writer holds the record for ``(path, "*")`` at a time, up to the timeout
assumption: a holder finishes (or abandons) its write within ``timeout`` of its own clock, and no
clock runs more than ``max_clock_skew_rate`` times faster than another's.

NB (the change): the seed leaves records for TTL to collect. Here a holder whose write succeeded
deletes its record, so deleting an object and creating it again (persist's tests do; GC could)
need not wait out ``timeout * skew``. That is safe only because step 2.1 checks the object again
*after* taking the record: a writer that saw "absent", then lost the race to a holder that wrote
and released, finds the object on that second check. A holder whose write is ambiguous never
deletes its record; it stands until it is stale, by which time the write has landed or never will.

Limitations (as in the seed): only conditional creates are synchronized. Plain ``set`` and
``delete`` are not; persist never mixes them with ``set_if_absent`` on one key except to delete a
key for good. TTL is cleanup only and never needed for correctness.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from persist import aws
from persist.errors import ExternalError, Indeterminate, InvalidUsage

log = logging.getLogger(__name__)

CREATE_ETAG = "*"


@dataclass(frozen=True)
class _Record:
    """A commit record as read from the table.

    NB: the owner token, not only the generation, identifies a record. A record deleted by its
    holder and created afresh starts again at generation 1; a contender that had been watching
    the old generation-1 record for a while must not take the new one over at once. Observing
    and conditioning on ``(generation, owner)`` tells the two apart.
    """

    generation: int
    owner: str
    timeout_ms: int


@dataclass(frozen=True)
class Hold:
    """This writer's claim on ``(path, etag)``: its write must finish before ``deadline``."""

    path: str
    etag: str
    generation: int
    owner: str
    #: ``time.monotonic()`` by which the guarded write must be complete.
    deadline: float

    def remaining(self) -> float:
        """Seconds left before the hold may be taken over by others."""
        return self.deadline - time.monotonic()


class DynamoCommit:
    """Arbitrates conditional creates of object-store keys through one DynamoDB table."""

    def __init__(
        self,
        client: aws.Client,
        table: str,
        *,
        timeout: float = 20.0,
        max_clock_skew_rate: float = 3.0,
        ttl: float = 3600.0,
        retry: aws.RetryPolicy | None = None,
        poll_interval: float = 0.02,
    ) -> None:
        """Args:
            client: a boto3 DynamoDB client.
            table: the table name (schema in the module docstring).
            timeout: seconds a holder may take for its write before others may take over.
            max_clock_skew_rate: how much faster the fastest clock may tick than the slowest.
            ttl: seconds after which DynamoDB may delete a record (cleanup only).
            retry: backoff for transient DynamoDB failures.
            poll_interval: base interval between polls while another writer holds the record.

        Raises:
            InvalidUsage: nonsensical timing parameters.
        """
        if timeout <= 0 or max_clock_skew_rate < 1 or ttl < timeout * max_clock_skew_rate:
            raise InvalidUsage(
                "commit timeout must be > 0, max_clock_skew_rate >= 1, and ttl at least "
                "timeout * max_clock_skew_rate"
            )
        self.client = client
        self.table = table
        self.timeout = timeout
        self.max_clock_skew_rate = max_clock_skew_rate
        self.ttl = ttl
        self.retry = retry or aws.RetryPolicy()
        self.poll_interval = poll_interval

    # -- the protocol ------------------------------------------------------------------------

    def acquire(self, path: str, precondition: Callable[[], bool],
                etag: str = CREATE_ETAG) -> Hold | None:
        """Takes the record for ``(path, etag)``, waiting out a live holder.

        Args:
            path: the object's identity (``s3://bucket/key``).
            precondition: returns True while the operation still makes sense (for a create:
                the object is absent). Checked before, while waiting, and after taking the record.
            etag: ``"*"`` for a create.

        Returns:
            The hold, or None when ``precondition`` failed (for a create: the object exists).

        Raises:
            Determinate: DynamoDB (or the precondition check) definitely failed; no hold taken.
            Indeterminate: the outcome of a record write could not be resolved.
        """
        if not precondition():
            return None
        seen: _Record | None = None
        seen_at = time.monotonic()
        polls = 0
        current: _Record | None = None
        while True:
            if current is None:
                hold, current = self._put(path, etag, generation=1, replacing=None)
            elif self._stale(current, time.monotonic() - seen_at):
                hold, current = self._put(path, etag, generation=current.generation + 1,
                                          replacing=current)
            else:
                hold = None
            if hold is not None:
                # NB: the second check that makes releasing records safe (module docstring).
                try:
                    still = precondition()
                except BaseException:
                    self.release(hold)
                    raise
                if still:
                    return hold
                self.release(hold)
                return None
            if current is not None and current != seen:
                seen, seen_at = current, time.monotonic()
            polls += 1
            time.sleep(self._poll_delay(polls))
            if not precondition():
                return None
            current = self._get(path, etag)
            if current is not None and current != seen:
                seen, seen_at = current, time.monotonic()

    def release(self, hold: Hold) -> None:
        """Deletes the record if ``hold`` still owns it. Never raises: a record left behind
        costs only waiting time (it goes stale), never correctness."""
        def delete() -> None:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key=self._key(hold.path, hold.etag),
                    ConditionExpression="#owner = :owner",
                    ExpressionAttributeNames={"#owner": "owner"},
                    ExpressionAttributeValues={":owner": {"S": hold.owner}},
                )
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[0] != "ConditionalCheckFailedException":
                    raise
                # taken over since (our hold went stale): not ours to delete

        try:
            aws.call(delete, what=f"release commit record {hold.path} in table {self.table}",
                     write=True, idempotent=True, retry=self.retry)
        except ExternalError as e:
            log.warning("could not release commit record %s: %s", hold.path, e)

    # -- pieces ------------------------------------------------------------------------------

    def _stale(self, rec: _Record, unchanged_for: float) -> bool:
        return unchanged_for >= rec.timeout_ms / 1000 * self.max_clock_skew_rate

    def _poll_delay(self, polls: int) -> float:
        cap = min(0.25, self.poll_interval * (1.5 ** min(polls, 12)))
        return cap / 2 + random.uniform(0, cap / 2)

    @staticmethod
    def _key(path: str, etag: str) -> dict[str, Any]:
        return {"path": {"S": path}, "etag": {"S": etag}}

    @staticmethod
    def _decode(item: dict[str, Any] | None) -> _Record | None:
        if not item:
            return None
        return _Record(
            generation=int(item["generation"]["N"]),
            owner=item.get("owner", {}).get("S", ""),
            timeout_ms=int(item.get("timeout", {}).get("N", "0")),
        )

    def _get(self, path: str, etag: str) -> _Record | None:
        response = aws.call(
            lambda: self.client.get_item(
                TableName=self.table, Key=self._key(path, etag), ConsistentRead=True
            ),
            what=f"read commit record {path} in table {self.table}",
            write=False,
            idempotent=True,
            retry=self.retry,
        )
        return self._decode(response.get("Item"))

    def _put(
        self, path: str, etag: str, *, generation: int, replacing: _Record | None
    ) -> tuple[Hold | None, _Record | None]:
        """Writes our record iff the stored one is ``replacing`` (None: absent).

        Returns:
            ``(hold, None)`` on success; ``(None, record now stored)`` on a conflict.
        """
        owner = uuid.uuid4().hex
        start = time.monotonic()
        timeout_ms = int(self.timeout * 1000)
        item = {
            **self._key(path, etag),
            "generation": {"N": str(generation)},
            "owner": {"S": owner},
            "timeout": {"N": str(timeout_ms)},
            "ttl": {"N": str(int(time.time() + self.ttl))},
        }
        if replacing is None:
            condition = "attribute_not_exists(#path)"
            names = {"#path": "path"}
            values: dict[str, Any] = {}
        else:
            condition = "#gen = :gen AND #owner = :owner"
            names = {"#gen": "generation", "#owner": "owner"}
            values = {":gen": {"N": str(replacing.generation)}, ":owner": {"S": replacing.owner}}

        def put() -> tuple[bool, _Record | None]:
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=item,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    **({"ExpressionAttributeValues": values} if values else {}),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return True, None
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[0] == "ConditionalCheckFailedException":
                    response = getattr(e, "response", {}) or {}
                    return False, self._decode(response.get("Item"))
                raise

        try:
            won, existing = aws.call(put, what=f"write commit record {path} in table {self.table}",
                                     write=True, idempotent=False, retry=self.retry)
        except Indeterminate:
            # NB: resolve an ambiguous conditional write by reading: the owner token is unique,
            # so the record carrying it can only be ours. A late landing after this read can
            # leave an orphan record, which only costs others the wait until it is stale.
            existing = self._get(path, etag)
            won = existing is not None and existing.owner == owner
        if won:
            return Hold(path, etag, generation, owner, start + self.timeout), None
        return None, existing
