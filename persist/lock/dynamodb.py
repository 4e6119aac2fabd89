"""The writer lock as one DynamoDB item, compare-and-set by conditional ``PutItem``.

Table schema (the same table serves :mod:`persist.blob.dynamo_commit`; :func:`create_table`)::

    path        S  partition key   the lock's id: "s3://<bucket>/<prefix>/LOCK"
    etag        S  sort key        "#writer-lock" (commit decisions use "*decided")
    ttl         N  TTL attribute   cleanup of records of the old commit protocol only; never
                                   on a lock item or a commit decision

Lock item attributes (one per location; the fields of :class:`~persist.lock.base.LockRecord`)::

    holder S, generation N, beat N, lease_ms N, wall_ms N, released BOOL, version N,
    host S, host_id S, pid N, pid_start N      (the holder's process; absent in older items)

``_cas(expected, new)`` is a ``PutItem`` of ``new`` conditioned on ``attribute_not_exists``
(``expected`` is None) or on every attribute equal to ``expected``.

NB: the condition covers the whole record, not only ``(generation, beat)``: a release keeps
generation and beat and sets ``released``, so a heartbeat racing its own holder's release would
otherwise pass its condition and silently un-release the lock. The process attributes are left
out of it: they change only with the generation, and items of older persists lack them.

NB: no TTL on the lock item. If DynamoDB expired it, the next holder would start again at
generation 1 and its fence commit would be refused by a log at a higher epoch (safe, but the
location would be stuck until an operator intervened).

Ambiguous failures (a timeout after sending, a 5xx) are resolved with a consistent read
(:class:`~persist.lock.conditional.ConditionalStoreLock`, shared with :mod:`persist.lock.s3`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

from persist.blob import aws
from persist.errors import Corruption, Determinate, IncompatibleFormat, InvalidUsage
from persist.lock.base import (
    LEASE_SECONDS,
    LOCK_FORMAT_VERSION,
    MAX_SKEW_RATE,
    STORE_TIMEOUT,
    LockRecord,
)
from persist.lock.conditional import ConditionalStoreLock

LOCK_SORT_KEY = "#writer-lock"
_FIELDS = ("holder", "generation", "beat", "lease_ms", "wall_ms", "released", "version")


def _encode(rec: LockRecord) -> dict[str, Any]:
    return {
        "holder": {"S": rec.holder},
        "generation": {"N": str(rec.generation)},
        "beat": {"N": str(rec.beat)},
        "lease_ms": {"N": str(rec.lease_ms)},
        "wall_ms": {"N": str(rec.wall_ms)},
        "released": {"BOOL": rec.released},
        "version": {"N": str(rec.version)},
        "host": {"S": rec.host},
        "host_id": {"S": rec.host_id},
        "pid": {"N": str(rec.pid)},
        "pid_start": {"N": str(rec.pid_start)},
    }


def _decode(lock_id: str, item: Mapping[str, Any]) -> LockRecord:
    try:
        version = int(item["version"]["N"])
        if version > LOCK_FORMAT_VERSION:
            raise IncompatibleFormat(
                f"lock record {lock_id} has version {version}; this persist reads up to "
                f"{LOCK_FORMAT_VERSION}"
            )
        return LockRecord(
            version=version,
            holder=item["holder"]["S"],
            generation=int(item["generation"]["N"]),
            beat=int(item["beat"]["N"]),
            lease_ms=int(item["lease_ms"]["N"]),
            wall_ms=int(item["wall_ms"]["N"]),
            released=bool(item["released"]["BOOL"]),
            host=item.get("host", {}).get("S", ""),
            host_id=item.get("host_id", {}).get("S", ""),
            pid=int(item.get("pid", {}).get("N", 0)),
            pid_start=int(item.get("pid_start", {}).get("N", 0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise Corruption(lock_id, f"malformed lock item: {e!r}") from e


class DynamoLock(ConditionalStoreLock):
    """A writer lock kept in one DynamoDB item (see the module docstring for the schema)."""

    def __init__(
        self,
        client: aws.Client,
        table: str,
        lock_id: str,
        *,
        lease_seconds: float = LEASE_SECONDS,
        max_skew_rate: float = MAX_SKEW_RATE,
        retry: aws.RetryPolicy | None = None,
        store_timeout: float = STORE_TIMEOUT,
    ) -> None:
        """Args:
            client: a boto3 DynamoDB client (not closed by this lock).
            table: the table (see :func:`create_table`).
            lock_id: the partition key of this location's lock item.
            lease_seconds: the lease a holder claims.
            max_skew_rate: tolerated clock rate difference (see ``persist.lock.base``).
            retry: backoff for transient DynamoDB failures.
            store_timeout: seconds an operation retries a failing DynamoDB (at least).

        Raises:
            InvalidUsage: bad lease parameters or an empty lock id.
        """
        super().__init__(lease_seconds=lease_seconds, max_skew_rate=max_skew_rate, retry=retry,
                         store_timeout=store_timeout)
        if not lock_id or not table:
            raise InvalidUsage("DynamoLock needs a table and a non-empty lock id")
        self.client = client
        self.table = table
        self.lock_id = lock_id
        self._key = {"path": {"S": lock_id}, "etag": {"S": LOCK_SORT_KEY}}

    @property
    @override
    def where(self) -> str:
        return f"{self.lock_id} in table {self.table}"

    def __repr__(self) -> str:
        return f"<DynamoLock {self.where}>"

    @override
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        response = aws.call(
            lambda: self.client.get_item(TableName=self.table, Key=self._key, ConsistentRead=True),
            what=f"read lock {self.where}", write=False, idempotent=True,
            retry=self.retry, deadline=deadline,
        )
        item = response.get("Item")
        return None if not item else _decode(self.lock_id, item)

    @override
    def _put_if(self, expected: LockRecord | None, new: LockRecord, *,
                deadline: float | None) -> bool:
        if expected is None:
            condition = "attribute_not_exists(#path)"
            names = {"#path": "path"}
            values: dict[str, Any] = {}
        else:
            names = {f"#{f}": f for f in _FIELDS}
            encoded = _encode(expected)
            values = {f":{f}": encoded[f] for f in _FIELDS}
            condition = " AND ".join(f"#{f} = :{f}" for f in _FIELDS)
        item = {**self._key, **_encode(new)}

        def put() -> bool:
            try:
                self.client.put_item(
                    TableName=self.table, Item=item, ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    **({"ExpressionAttributeValues": values} if values else {}),
                )
                return True
            except aws.AWS_ERRORS as e:
                if aws.error_code(e)[0] == "ConditionalCheckFailedException":
                    return False
                raise

        return aws.call(put, what=f"write lock {self.where}", write=True, idempotent=False,
                        retry=self.retry, deadline=deadline)


def create_table(client_or_options: aws.Client | Mapping[str, Any], name: str) -> None:
    """Creates the persist DynamoDB table (locks and commit records) if it does not exist.

    On-demand billing; TTL enabled on ``ttl``. Idempotent: an existing table with the right key
    schema is accepted, and TTL is (re-)enabled.

    Args:
        client_or_options: a boto3 DynamoDB client, or ``storage_options`` to build one.
        name: the table name.

    Raises:
        InvalidUsage: a table of that name exists with another key schema.
        ExternalError: DynamoDB failed.
    """
    if isinstance(client_or_options, Mapping):
        opts, _ = aws.AwsOptions.split(client_or_options)
        client = aws.client("dynamodb", opts)
    else:
        client = client_or_options
        opts = aws.AwsOptions()
    retry = opts.retry
    schema = [{"AttributeName": "path", "KeyType": "HASH"},
              {"AttributeName": "etag", "KeyType": "RANGE"}]

    def create() -> None:
        try:
            client.create_table(
                TableName=name,
                KeySchema=schema,
                AttributeDefinitions=[{"AttributeName": "path", "AttributeType": "S"},
                                      {"AttributeName": "etag", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except aws.AWS_ERRORS as e:
            if aws.error_code(e)[0] != "ResourceInUseException":
                raise

    aws.call(create, what=f"create table {name}", write=True, idempotent=True, retry=retry)
    deadline = time.monotonic() + 120
    while True:
        table = aws.call(lambda: client.describe_table(TableName=name)["Table"],
                         what=f"describe table {name}", write=False, idempotent=True, retry=retry)
        if sorted((k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]) != \
                [("etag", "RANGE"), ("path", "HASH")]:
            raise InvalidUsage(f"table {name!r} exists with another key schema: "
                               f"{table['KeySchema']}; persist needs path (HASH), etag (RANGE)")
        if table.get("TableStatus") == "ACTIVE":
            break
        if time.monotonic() > deadline:
            raise Determinate(f"table {name!r} did not become ACTIVE in 120 s")
        time.sleep(0.5)

    def enable_ttl() -> None:
        try:
            client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
            )
        except aws.AWS_ERRORS as e:
            # AWS refuses to enable TTL twice ("TimeToLive is already enabled").
            if aws.error_code(e)[0] != "ValidationException" or "already" not in str(e):
                raise

    aws.call(enable_ttl, what=f"enable TTL on {name}", write=True, idempotent=True, retry=retry)


__all__ = ["LOCK_SORT_KEY", "DynamoLock", "create_table"]
