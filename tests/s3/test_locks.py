"""The writer locks of s3:// locations against the moto server: the shared lock conformance
suite for DynamoLock and S3Lock, table creation, and which lock a location picks."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from persist.blob import aws
from persist.errors import Fenced, InvalidUsage
from persist.location import resolve
from persist.lock.dynamodb import LOCK_SORT_KEY, DynamoLock, create_table
from persist.lock.s3 import S3Lock
from tests.lock.conformance import LockConformance, MakeLock
from tests.s3.conftest import unique

pytestmark = pytest.mark.s3


@pytest.mark.dynamodb
class TestDynamoLock(LockConformance):
    @pytest.fixture
    def make_lock(self, aws_options: dict[str, Any], dynamodb_table: str) -> MakeLock:
        opts, _ = aws.AwsOptions.split(aws_options)
        client = aws.client("dynamodb", opts)
        lock_id = f"s3://bucket/{uuid.uuid4().hex}/LOCK"

        def make(**kw: Any) -> DynamoLock:
            return DynamoLock(client, dynamodb_table, lock_id, retry=opts.retry, **kw)

        return make

    def test_item_is_readable_and_has_no_ttl(self, make_lock: MakeLock,
                                             dynamodb_table: str) -> None:
        lock = make_lock()
        assert isinstance(lock, DynamoLock)
        lock.acquire("a")
        item = lock.client.get_item(TableName=dynamodb_table, Key={
            "path": {"S": lock.lock_id}, "etag": {"S": LOCK_SORT_KEY}})["Item"]
        assert item["holder"] == {"S": "a"}
        assert item["generation"] == {"N": "1"}
        assert "ttl" not in item


class TestS3Lock(LockConformance):
    @pytest.fixture
    def make_lock(self, s3_client: Any, bucket: str) -> MakeLock:
        def make(**kw: Any) -> S3Lock:
            return S3Lock(s3_client, bucket, "loc/LOCK", **kw)

        return make

    def test_record_is_an_enveloped_blob(self, make_lock: MakeLock, aws_options: dict[str, Any],
                                         bucket: str) -> None:
        from persist.blob.s3 import S3Blob
        from persist.lock.base import decode_record

        make_lock().acquire("a")
        data = S3Blob(bucket, "loc", storage_options=aws_options).get("LOCK")
        assert data is not None
        assert decode_record(data).holder == "a"

    def test_heartbeat_after_the_record_vanished_is_fenced(self, make_lock: MakeLock,
                                                            s3_client: Any, bucket: str) -> None:
        # The heartbeat is a PUT with If-Match on a key that no longer exists. AWS, moto and
        # ministack answer 404 NoSuchKey, SeaweedFS 412 PreconditionFailed: both mean "lost".
        lock = make_lock()
        lease = lock.acquire("a")
        s3_client.delete_object(Bucket=bucket, Key="loc/LOCK")
        with pytest.raises(Fenced):
            lock.heartbeat(lease)
        assert make_lock().acquire("b").generation == 1  # nothing left: a fresh start


@pytest.mark.dynamodb
def test_create_table_is_idempotent(aws_options: dict[str, Any], s3_client: Any) -> None:
    name = unique("persist")
    create_table(aws_options, name)
    create_table(aws_options, name)
    opts, _ = aws.AwsOptions.split(aws_options)
    client = aws.client("dynamodb", opts)
    create_table(client, name)
    table = client.describe_table(TableName=name)["Table"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = client.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED"
    assert ttl["AttributeName"] == "ttl"


@pytest.mark.dynamodb
def test_create_table_refuses_another_schema(aws_options: dict[str, Any]) -> None:
    opts, _ = aws.AwsOptions.split(aws_options)
    client = aws.client("dynamodb", opts)
    name = unique("other")
    client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    with pytest.raises(InvalidUsage, match="key schema"):
        create_table(client, name)


def test_location_defaults_to_s3_lock(aws_options: dict[str, Any], bucket: str) -> None:
    loc = resolve(f"s3://{bucket}/x", storage_options=aws_options)
    lock = loc.lock()
    assert isinstance(lock, S3Lock)
    assert lock.key == "x/LOCK"
    assert lock.acquire("w").generation == 1


@pytest.mark.dynamodb
@pytest.mark.parametrize("option", ["dynamodb_table", "lock_table"])
def test_location_uses_dynamodb_lock_when_a_table_is_given(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, option: str
) -> None:
    loc = resolve(f"s3://{bucket}/x", storage_options={**aws_options, option: dynamodb_table},
                  lease_seconds=7)
    lock = loc.lock()
    assert isinstance(lock, DynamoLock)
    assert lock.lease_seconds == 7
    assert lock.lock_id == f"s3://{bucket}/x/LOCK"
    assert lock.acquire("w").generation == 1
    forced = resolve(f"s3://{bucket}/x",
                     storage_options={**aws_options, option: dynamodb_table, "lock": "s3"})
    assert isinstance(forced.lock(), S3Lock)


def test_dynamodb_lock_needs_a_table(aws_options: dict[str, Any], bucket: str) -> None:
    with pytest.raises(InvalidUsage, match="lock_table"):
        resolve(f"s3://{bucket}/x", storage_options={**aws_options, "lock": "dynamodb"})
