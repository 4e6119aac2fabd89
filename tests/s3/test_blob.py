"""S3Blob against the moto server: the shared Blob conformance suite in both commit modes, plus
multipart, caching, options and pickling."""

from __future__ import annotations

import pickle
from typing import Any
from urllib.parse import urlparse

import pytest

from persist.blob.dynamo_commit import DECISION_ETAG
from persist.blob.s3 import MIN_PART_SIZE, ImmutableCache, S3Blob, S3Config
from persist.errors import InvalidUsage
from tests.blob.conformance import BlobConformance, ReadExternal
from tests.support.s3_servers import Server

pytestmark = pytest.mark.s3


@pytest.fixture
def read_s3_url(s3_client: Any) -> ReadExternal:
    """Reads an ``s3://bucket/key`` URL with a plain boto3 client, as another program would."""
    def read(url: str) -> bytes | None:
        parsed = urlparse(url)
        assert parsed.scheme == "s3", url
        try:
            body: bytes = s3_client.get_object(Bucket=parsed.netloc,
                                               Key=parsed.path.lstrip("/"))["Body"].read()
        except s3_client.exceptions.NoSuchKey:
            return None
        return body
    return read


class TestS3Blob(BlobConformance):
    @pytest.fixture
    def blob(self, aws_options: dict[str, Any], bucket: str) -> S3Blob:
        return S3Blob(bucket, "some/prefix", storage_options=aws_options)

    @pytest.fixture
    def read_external(self, read_s3_url: ReadExternal) -> ReadExternal:
        return read_s3_url

    def test_external_url_is_under_the_prefix(self, blob: S3Blob) -> None:
        assert blob.external_url("data/1/x") == f"s3://{blob.bucket}/some/prefix/data/1/x"

    def test_native_mode(self, blob: S3Blob) -> None:
        assert blob.commit is None
        assert blob.supports_conditional_create
        assert not blob.is_local


@pytest.mark.dynamodb
class TestS3BlobDynamoCommit(BlobConformance):
    @pytest.fixture
    def blob(self, aws_options: dict[str, Any], bucket: str, dynamodb_table: str) -> S3Blob:
        opts = {**aws_options, "conditional_put": "dynamodb", "dynamodb_table": dynamodb_table}
        return S3Blob(bucket, "p", storage_options=opts)

    @pytest.fixture
    def read_external(self, read_s3_url: ReadExternal) -> ReadExternal:
        return read_s3_url

    def test_dynamodb_mode_never_sends_if_none_match(self, blob: S3Blob) -> None:
        sent: list[tuple[str, dict[str, Any]]] = []
        for op in ("PutObject", "CopyObject"):
            blob.client.meta.events.register(
                f"provide-client-params.s3.{op}",
                lambda params, op=op, **_: sent.append((op, params)))
        assert blob.set_if_absent("k", b"v") is True
        assert blob.set_if_absent("k", b"w") is False  # a HEAD finds the object: no write
        # the temporary copy, then the copy into place
        assert [op for op, _ in sent] == ["PutObject", "CopyObject"]
        assert sent[0][1]["Key"].startswith("p/_pending/k/")
        assert sent[1][1]["Key"] == "p/k"
        assert all("IfNoneMatch" not in params for _, params in sent)

    def test_decision_stays_and_goes_with_the_key(
        self, blob: S3Blob, dynamodb_table: str
    ) -> None:
        assert blob.set_if_absent("meta/log/1", b"v") is True
        items = blob.dynamodb_client().scan(TableName=dynamodb_table)["Items"]
        assert [(i["path"]["S"], i["etag"]["S"]) for i in items] == [
            (blob.url("meta/log/1"), DECISION_ETAG)]
        assert "ttl" not in items[0]  # a decision never expires (docs/s3.md)
        assert items[0]["temp"]["S"].startswith("p/_pending/meta/log/1/")
        assert blob.list_keys("") == ["meta/log/1"]  # the temporary object is gone
        blob.delete("meta/log/1")
        assert blob.dynamodb_client().scan(TableName=dynamodb_table)["Items"] == []
        assert blob.get("meta/log/1") is None
        assert blob.set_if_absent("meta/log/1", b"again") is True
        assert blob.get("meta/log/1") == b"again"

    def test_data_keys_are_not_created_conditionally(self, blob: S3Blob) -> None:
        for key in ("data/1/part", "_pending/x"):
            with pytest.raises(InvalidUsage, match="conditional"):
                blob.set_if_absent(key, b"v")


def test_keys_live_under_the_prefix(aws_options: dict[str, Any], bucket: str,
                                    s3_client: Any) -> None:
    blob = S3Blob(bucket, "/a/b/", storage_options=aws_options)
    blob.set("meta/log/1", b"x")
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["a/b/meta/log/1"]
    other = S3Blob(bucket, "a/bc", storage_options=aws_options)
    other.set("meta/log/1", b"y")
    assert blob.list_keys("") == ["meta/log/1"]
    whole = S3Blob(bucket, "", storage_options=aws_options)
    assert whole.list_keys("a/") == ["a/b/meta/log/1", "a/bc/meta/log/1"]


def _multipart_blob(aws_options: dict[str, Any], bucket: str, **extra: Any) -> S3Blob:
    opts = {**aws_options, "multipart_threshold": MIN_PART_SIZE + 1,
            "multipart_part_size": MIN_PART_SIZE, **extra}
    return S3Blob(bucket, "mp", storage_options=opts)


def test_multipart_round_trip(aws_options: dict[str, Any], bucket: str, s3_client: Any) -> None:
    blob = _multipart_blob(aws_options, bucket)
    value = bytes(range(251)) * (12 * 1024 * 1024 // 251)  # ~12 MiB: parts of 5, 5, ~2 MiB
    blob.set("data/big", value)
    head = s3_client.head_object(Bucket=bucket, Key="mp/data/big")
    assert head["ETag"].endswith('-3"')  # a three-part upload
    blob.cache.discard("data/big")
    assert blob.get("data/big") == value
    assert blob.set_if_absent("meta/big", value) is True
    assert blob.set_if_absent("meta/big", value[::-1]) is False
    assert blob.get("meta/big") == value
    uploads = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads == []  # the refused upload was aborted


@pytest.mark.dynamodb
def test_multipart_under_dynamodb_commit(aws_options: dict[str, Any], bucket: str,
                                         dynamodb_table: str) -> None:
    blob = _multipart_blob(aws_options, bucket, conditional_put="dynamodb",
                           dynamodb_table=dynamodb_table)
    value = b"\x01" * (MIN_PART_SIZE + 100)
    assert blob.set_if_absent("meta/big", value) is True
    assert blob.set_if_absent("meta/big", b"other") is False
    assert blob.get("meta/big") == value


def test_data_blobs_are_cached_meta_never(aws_options: dict[str, Any], bucket: str,
                                          s3_client: Any) -> None:
    blob = S3Blob(bucket, "c", storage_options={**aws_options, "cache_bytes": 1 << 20})
    blob.set("data/1/part", b"columnar bytes")
    blob.set("meta/log/1", b"commit")
    # Remove both objects behind the blob's back: only the immutable data blob may be served.
    s3_client.delete_object(Bucket=bucket, Key="c/data/1/part")
    s3_client.delete_object(Bucket=bucket, Key="c/meta/log/1")
    hits = blob.cache.hits
    assert blob.get("data/1/part") == b"columnar bytes"
    assert blob.cache.hits == hits + 1
    assert blob.get("meta/log/1") is None
    blob.delete("data/1/part")
    assert blob.get("data/1/part") is None


def test_cache_is_bounded_lru() -> None:
    cache = ImmutableCache(100)
    for i in range(10):
        cache.put(f"k{i}", bytes(20))
    assert cache.size <= 100
    assert cache.get("k0") is None
    assert cache.get("k9") is not None
    cache.put("huge", bytes(26))  # over a quarter of the budget: not cached
    assert cache.get("huge") is None


def test_upper_case_deltalake_style_options(s3_server: Server, bucket: str) -> None:
    blob = S3Blob(bucket, "u", storage_options={
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_REGION": s3_server.region_name,
        "AWS_ACCESS_KEY_ID": s3_server.aws_access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_server.aws_secret_access_key,
        "AWS_ALLOW_HTTP": "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "aws_conditional_put": "etag",
    })
    assert blob.set_if_absent("k", b"v") is True
    assert blob.get("k") == b"v"


@pytest.mark.parametrize(
    "bad",
    [
        {"no_such_option": 1},
        {"conditional_put": "sometimes"},
        {"conditional_put": "dynamodb"},  # needs dynamodb_table
        {"multipart_part_size": 1024},
        {"multipart_threshold": "lots"},
        {"addressing_style": "sideways"},
        {"lock": "zookeeper"},
    ],
)
def test_bad_options_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsage):
        S3Blob("some-bucket", storage_options=bad)


@pytest.mark.parametrize("name", ["ab", "Upper", "-x-y", "a" * 64, "under_score"])
def test_bad_bucket_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidUsage, match="bucket"):
        S3Blob(name)


def test_config_defaults() -> None:
    cfg = S3Config.parse({})
    assert cfg.conditional_put == "native"
    assert cfg.multipart_threshold == 16 << 20


def test_pickles_as_its_configuration(aws_options: dict[str, Any], bucket: str) -> None:
    blob = S3Blob(bucket, "pk", storage_options=aws_options)
    blob.set("k", b"v")
    clone = pickle.loads(pickle.dumps(blob))
    assert isinstance(clone, S3Blob)
    assert clone.get("k") == b"v"
