"""Conditional create for object stores without conditional writes, decided in DynamoDB.

Used by :class:`persist.blob.s3.S3Blob` when ``storage_options["conditional_put"] ==
"dynamodb"`` (S3-compatible stores that ignore ``If-None-Match``, or deployments that want the
commit arbitrated outside the object store). The design follows delta-rs' DynamoDB log store: the
object store never arbitrates anything, and no late write can change a created key's bytes.

Table schema (shared with :class:`persist.lock.dynamodb.DynamoLock`; see ``create_table``)::

    path        S  partition key   "s3://<bucket>/<key>" of the object being created
    etag        S  sort key        "*decided" (DECISION_ETAG) for a decision item
    owner       S                  random token of the creator (resolves ambiguous PutItems)
    temp        S                  object key of the creator's temporary copy of the value
    created_ms  N                  wall clock of the creator (for operators only)

The decision item is created once with ``attribute_not_exists`` and is **never** taken over,
replaced or expired: whoever created it won, and it names the only value the key can ever hold
(until the key is deleted). It carries no ``ttl``: a decision that expired while its creator was
paused before copying the value into place would let a second creator win. Items are removed
only by :meth:`S3Blob.delete <persist.blob.s3.S3Blob>` of the key (which GC's trim uses).

To create key ``k`` with value ``v`` (in :mod:`persist.blob.s3`):

1. ``HEAD k``: present → False (cheap refusal; never needed for correctness).
2. ``PUT _pending/<k>/<uuid> = v`` (the temp object), confirmed.
3. ``PutItem`` the decision naming the temp object, ``attribute_not_exists``
   (:meth:`DynamoCommit.claim`). Lost → delete the temp object, False.
4. Won → ``CopyObject`` temp → ``k``, then delete the temp object; True. A late or repeated copy
   writes the same bytes; a copy after the temp object was deleted fails and writes nothing.

Anyone who finds a decision item but not the object (a creator paused or crashed after step 3)
*rolls the write forward*: it reads the named temp object (that is the key's value) and copies it
into place. The temp object is deleted only after the final object exists (or by a delete of the
key, before the object and the item), so "item, no temp object, no final object" means the key
was created and later deleted.

Limitations: only conditional creates go through DynamoDB. Plain ``set`` of a key that is also
created conditionally would race the roll-forward, so persist never mixes them on one key (commit
keys are created once and only ever deleted by GC). TTL is never used on decision items.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from persist.blob import aws
from persist.errors import Determinate, ExternalError, Indeterminate

log = logging.getLogger(__name__)

#: Sort key of decision items. NB: not "*", the sort key of the lease records of the previous
#: protocol (taken over when stale, and expired by TTL): a leftover one must not be mistaken for a
#: decision. The two protocols must not run against one location at the same time.
DECISION_ETAG = "*decided"


@dataclass(frozen=True)
class Decision:
    """The decision for one key: who created it and where its value waits to be copied."""

    owner: str
    #: Object key (full, in the same bucket) of the creator's temporary copy of the value.
    temp: str


class DynamoCommit:
    """Decides conditional creates of object-store keys through one DynamoDB table."""

    def __init__(self, client: aws.Client, table: str, *,
                 retry: aws.RetryPolicy | None = None) -> None:
        """Args:
            client: a boto3 DynamoDB client.
            table: the table name (schema in the module docstring).
            retry: backoff for transient DynamoDB failures.
        """
        self.client = client
        self.table = table
        self.retry = retry or aws.RetryPolicy()

    @staticmethod
    def _key(path: str) -> dict[str, Any]:
        return {"path": {"S": path}, "etag": {"S": DECISION_ETAG}}

    @staticmethod
    def _decode(item: dict[str, Any] | None) -> Decision | None:
        if not item:
            return None
        return Decision(owner=item.get("owner", {}).get("S", ""),
                        temp=item.get("temp", {}).get("S", ""))

    def claim(self, path: str, temp: str) -> tuple[bool, Decision | None]:
        """Creates the decision item for ``path`` naming ``temp``, unless one exists.

        An ambiguous ``PutItem`` is resolved by a consistent read (the owner token is unique, so
        an item carrying it is ours); when the read finds no item the same conditional write is
        sent again (a late landing of the first makes the second fail its condition, and the
        read after that finds our token).

        Returns:
            ``(True, our decision)`` if this call created the item; ``(False, the existing
            decision)`` otherwise (None if it could not be read, or vanished: deleted since).

        Raises:
            Determinate: definitely not created (and no earlier attempt can still land).
            Indeterminate: our item may exist; the temp object must then be kept.
        """
        owner = uuid.uuid4().hex
        item = {
            **self._key(path),
            "owner": {"S": owner},
            "temp": {"S": temp},
            "created_ms": {"N": str(int(time.time() * 1000))},
        }

        def put() -> tuple[bool, Decision | None]:
            try:
                self.client.put_item(
                    TableName=self.table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(#path)",
                    ExpressionAttributeNames={"#path": "path"},
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return True, None
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[0] == "ConditionalCheckFailedException":
                    response = getattr(e, "response", {}) or {}
                    return False, self._decode(response.get("Item"))
                raise

        what = f"create decision {path} in table {self.table}"
        ambiguous: Indeterminate | None = None
        for attempt in range(self.retry.max_attempts):
            try:
                won, existing = aws.call(put, what=what, write=True, idempotent=False,
                                         retry=self.retry)
            except Indeterminate as e:
                ambiguous = e
            except Determinate as e:
                if ambiguous is None:
                    raise
                raise Indeterminate(f"{what}: an earlier ambiguous attempt may still land: {e}") \
                    from e
            else:
                if won:
                    return True, Decision(owner, temp)
                if ambiguous is None:
                    return False, existing
                # NB: a condition failure after an ambiguous attempt may be our own first write.
            try:
                existing = self.lookup(path)
            except ExternalError as e:
                raise Indeterminate(f"{what}: outcome unknown, read-back failed: {e}") from e
            if existing is not None:
                if existing.owner == owner:
                    return True, existing
                return False, existing
            if attempt + 1 < self.retry.max_attempts:
                time.sleep(self.retry.delay(attempt))
        raise Indeterminate(f"{what} failed ambiguously {self.retry.max_attempts} times") \
            from ambiguous

    def lookup(self, path: str) -> Decision | None:
        """The decision for ``path`` (consistent read), or None.

        Raises:
            ExternalError: DynamoDB failed.
        """
        response = aws.call(
            lambda: self.client.get_item(TableName=self.table, Key=self._key(path),
                                         ConsistentRead=True),
            what=f"read decision {path} in table {self.table}",
            write=False,
            idempotent=True,
            retry=self.retry,
        )
        return self._decode(response.get("Item"))

    def forget(self, path: str, decision: Decision) -> None:
        """Deletes the decision item if it is still ``decision`` (used when deleting the key).

        Raises:
            ExternalError: DynamoDB failed.
        """
        def delete() -> None:
            try:
                self.client.delete_item(
                    TableName=self.table,
                    Key=self._key(path),
                    ConditionExpression="#owner = :owner",
                    ExpressionAttributeNames={"#owner": "owner"},
                    ExpressionAttributeValues={":owner": {"S": decision.owner}},
                )
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[0] != "ConditionalCheckFailedException":
                    raise
                # gone already, or a newer decision (the key was deleted and created again)

        aws.call(delete, what=f"delete decision {path} in table {self.table}", write=True,
                 idempotent=True, retry=self.retry)


__all__ = ["DECISION_ETAG", "Decision", "DynamoCommit"]
