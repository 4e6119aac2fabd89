"""Error translation at the AWS edge, and the resolution of ambiguous writes.

Faults are injected between persist and a real moto server by wrapping the boto3 client: a
request can fail before it is sent, or be applied by the server and still report a timeout
("did the work, lost the answer"), which is what the read-back logic exists for.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from persist.blob import aws
from persist.blob.s3 import S3Blob
from persist.errors import Determinate, Indeterminate, InvalidUsage
from persist.lock.dynamodb import DynamoLock
from persist.lock.s3 import S3Lock


def _client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, op)


FAULTS: dict[str, Callable[[], BaseException]] = {
    "timeout": lambda: ReadTimeoutError(endpoint_url="http://moto"),
    "reset": lambda: ConnectionClosedError(endpoint_url="http://moto"),
    "refused": lambda: EndpointConnectionError(endpoint_url="http://moto"),
    "409": lambda: _client_error("ConditionalRequestConflict", 409),
    "500": lambda: _client_error("InternalError", 500),
    "503": lambda: _client_error("SlowDown", 503),
    # what SeaweedFS answers to a PUT into a missing bucket (AWS, moto, ministack: 404)
    "403": lambda: _client_error("AccessDenied", 403),
}


class Faulty:
    """A boto3 client whose next calls of a method follow a script.

    Script entries: ``"ok"`` (pass through), a FAULTS name (raise without sending), or
    ``"land+<fault>"`` (send it, let the server apply it, then raise the fault anyway).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.script: dict[str, list[str]] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.script:
            return attr

        def call(**kw: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            steps = self.script[name]
            step = steps.pop(0) if steps else "ok"
            if step == "ok":
                return attr(**kw)
            if step.startswith("land+"):
                attr(**kw)
                step = step.removeprefix("land+")
            raise FAULTS[step]()

        return call


# -- classification (no server needed) ----------------------------------------------------------

@pytest.mark.parametrize(
    ("exc", "write", "expected", "transient"),
    [
        (_client_error("AccessDenied", 403), True, Determinate, False),
        (_client_error("NoSuchBucket", 404), False, aws.MissingResource, False),
        (_client_error("ResourceNotFoundException", 400), True, aws.MissingResource, False),
        (_client_error("SlowDown", 503), True, Determinate, True),
        (_client_error("ProvisionedThroughputExceededException", 400), True, Determinate, True),
        (_client_error("ConditionalRequestConflict", 409), True, Determinate, True),
        (_client_error("InternalError", 500), True, Indeterminate, True),
        (_client_error("InternalError", 500), False, Determinate, True),
        (_client_error("InvalidArgument", 400), True, Determinate, False),
        (EndpointConnectionError(endpoint_url="u"), True, Determinate, True),
        (ConnectTimeoutError(endpoint_url="u"), True, Determinate, True),
        (ReadTimeoutError(endpoint_url="u"), True, Indeterminate, True),
        (ReadTimeoutError(endpoint_url="u"), False, Determinate, True),
        (ConnectionClosedError(endpoint_url="u"), True, Indeterminate, True),
        (ConnectionResetError(), True, Indeterminate, True),
        (NoCredentialsError(), False, Determinate, False),
        (ParamValidationError(report="bad"), True, InvalidUsage, False),
    ],
)
def test_classification(exc: BaseException, write: bool, expected: type, transient: bool) -> None:
    failure = aws.classify(exc, "op", write=write)
    assert type(failure.error) is expected
    assert failure.transient is transient


def test_call_does_not_resend_an_ambiguous_non_idempotent_write() -> None:
    sent: list[int] = []

    def fn() -> None:
        sent.append(1)
        raise ReadTimeoutError(endpoint_url="u")

    with pytest.raises(Indeterminate) as info:
        aws.call(fn, what="create", write=True, idempotent=False, retry=aws.RetryPolicy())
    assert len(sent) == 1
    assert isinstance(info.value.__cause__, ReadTimeoutError)


def test_call_retries_with_capped_backoff() -> None:
    sent: list[float] = []

    def fn() -> str:
        sent.append(time.monotonic())
        if len(sent) < 4:
            raise _client_error("SlowDown", 503)
        return "done"

    policy = aws.RetryPolicy(max_attempts=5, base_delay=0.02, max_delay=0.04)
    assert aws.call(fn, what="put", write=True, idempotent=False, retry=policy) == "done"
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(0.01 <= g < 0.2 for g in gaps)


def test_backoff_delays_are_jittered_and_capped() -> None:
    policy = aws.RetryPolicy(base_delay=0.1, max_delay=0.5)
    for attempt in range(10):
        cap = min(0.5, 0.1 * 2**attempt)
        delays = {policy.delay(attempt) for _ in range(20)}
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(delays) > 1


# -- against the server --------------------------------------------------------------------------

@pytest.fixture
def blob(aws_options: dict[str, Any], bucket: str) -> S3Blob:
    b = S3Blob(bucket, "e", storage_options=aws_options)
    b.client = Faulty(b.client)
    return b


def _script(blob: S3Blob, **steps: list[str]) -> Faulty:
    client = blob.client
    assert isinstance(client, Faulty)
    client.script.update(steps)
    return client


@pytest.mark.s3
def test_create_that_landed_but_timed_out_is_ours(blob: S3Blob) -> None:
    client = _script(blob, put_object=["land+timeout"])
    assert blob.set_if_absent("meta/log/1", b"v") is True
    assert client.calls["put_object"] == 1  # resolved by reading back, not by re-sending
    assert blob.get("meta/log/1") == b"v"


@pytest.mark.s3
def test_create_that_did_not_land_is_sent_again(blob: S3Blob) -> None:
    client = _script(blob, put_object=["timeout", "reset", "ok"])
    assert blob.set_if_absent("meta/log/1", b"v") is True
    assert client.calls["put_object"] == 3


@pytest.mark.s3
def test_ambiguous_create_losing_to_another_writer_is_false(blob: S3Blob,
                                                            aws_options: dict[str, Any]) -> None:
    S3Blob(blob.bucket, "e", storage_options=aws_options).set_if_absent("meta/log/1", b"theirs")
    _script(blob, put_object=["timeout"])
    assert blob.set_if_absent("meta/log/1", b"mine") is False


@pytest.mark.s3
def test_unresolvable_create_is_indeterminate(blob: S3Blob) -> None:
    _script(blob, put_object=["land+timeout"], get_object=["timeout"] * 20)
    with pytest.raises(Indeterminate, match="read back"):
        blob.set_if_absent("meta/log/1", b"v")


@pytest.mark.s3
def test_conditional_conflict_409_is_retried(blob: S3Blob) -> None:
    client = _script(blob, put_object=["409", "409", "ok"])
    assert blob.set_if_absent("meta/log/1", b"v") is True
    assert client.calls["put_object"] == 3


@pytest.mark.s3
def test_reads_retry_server_errors(blob: S3Blob) -> None:
    blob.set("k", b"v")
    client = _script(blob, get_object=["500", "503", "reset", "ok"])
    assert blob.get("k") == b"v"
    assert client.calls["get_object"] == 4


@pytest.mark.s3
def test_plain_set_retries_and_reports_indeterminate_when_it_cannot_tell(blob: S3Blob) -> None:
    _script(blob, put_object=["timeout", "ok"])
    blob.set("k", b"v")
    assert blob.get("k") == b"v"
    _script(blob, put_object=["500"] * 20)
    with pytest.raises(Indeterminate, match="InternalError"):
        blob.set("k", b"w")
    _script(blob, put_object=["refused"] * 20)
    with pytest.raises(Determinate):
        blob.set("k", b"w")
    assert blob.get("k") == b"v"


def _decided_blob(aws_options: dict[str, Any], bucket: str, table: str
                  ) -> tuple[S3Blob, Faulty, Faulty]:
    blob = S3Blob(bucket, "e", storage_options={
        **aws_options, "conditional_put": "dynamodb", "dynamodb_table": table})
    assert blob.commit is not None
    s3, ddb = Faulty(blob.client), Faulty(blob.commit.client)
    blob.client, blob.commit.client = s3, ddb
    return blob, s3, ddb


def _decisions(blob: S3Blob, table: str) -> list[str]:
    return [i["path"]["S"] for i in blob.dynamodb_client().scan(TableName=table)["Items"]]


@pytest.mark.s3
@pytest.mark.dynamodb
def test_dynamodb_decision_that_landed_but_timed_out_is_ours(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob, _, ddb = _decided_blob(aws_options, bucket, dynamodb_table)
    ddb.script["put_item"] = ["land+timeout"]
    assert blob.set_if_absent("meta/log/1", b"v") is True
    assert ddb.calls["put_item"] == 1  # resolved by reading the owner token back
    ddb.script["put_item"] = ["timeout", "land+reset"]
    assert blob.set_if_absent("meta/log/2", b"w") is True  # not landed: sent again
    assert ddb.calls["put_item"] == 3
    assert (blob.get("meta/log/1"), blob.get("meta/log/2")) == (b"v", b"w")
    assert blob.list_keys("") == ["meta/log/1", "meta/log/2"]


@pytest.mark.s3
@pytest.mark.dynamodb
def test_dynamodb_unresolved_decision_is_indeterminate_and_keeps_its_value(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob, _, ddb = _decided_blob(aws_options, bucket, dynamodb_table)
    ddb.script["put_item"] = ["land+timeout"]
    ddb.script["get_item"] = ["timeout"] * 50
    with pytest.raises(Indeterminate, match="read-back failed"):
        blob.set_if_absent("meta/log/1", b"v")
    # NB: the decision landed and names the temporary object, which was kept: the create took
    # effect, and the first read that misses the object rolls it forward.
    assert _decisions(blob, dynamodb_table) == [blob.url("meta/log/1")]
    ddb.script["get_item"] = []
    assert blob.get("meta/log/1") == b"v"
    assert blob.list_keys("") == ["meta/log/1"]


@pytest.mark.s3
@pytest.mark.dynamodb
def test_dynamodb_failed_copy_still_created(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob, s3, _ = _decided_blob(aws_options, bucket, dynamodb_table)
    s3.script["copy_object"] = ["500"] * blob.retry.max_attempts
    assert blob.set_if_absent("meta/log/1", b"v") is True  # decided: the copy can wait
    assert blob.set_if_absent("meta/log/1", b"w") is False
    plain = S3Blob(bucket, "e", storage_options=aws_options)
    assert plain.get("meta/log/1") is None
    assert blob.get("meta/log/1") == b"v"  # rolled forward
    assert plain.get("meta/log/1") == b"v"


@pytest.mark.s3
@pytest.mark.dynamodb
def test_dynamodb_unconfirmed_temp_object_decides_nothing(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob, s3, _ = _decided_blob(aws_options, bucket, dynamodb_table)
    s3.script["put_object"] = ["land+timeout"]
    assert blob.set_if_absent("meta/log/1", b"v") is True  # read back: it is there
    s3.script["put_object"] = ["timeout"] * 50
    with pytest.raises(Determinate, match="temporary") as info:
        blob.set_if_absent("meta/log/2", b"v")
    assert not isinstance(info.value, Indeterminate)
    assert _decisions(blob, dynamodb_table) == [blob.url("meta/log/1")]
    s3.script["put_object"] = []
    assert blob.set_if_absent("meta/log/2", b"v") is True


@pytest.mark.s3
@pytest.mark.dynamodb
def test_lock_writes_that_landed_but_timed_out_count(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, s3_client: Any
) -> None:
    opts, _ = aws.AwsOptions.split(aws_options)
    ddb = Faulty(aws.client("dynamodb", opts))
    ddb.script["put_item"] = ["land+timeout", "land+reset"]
    dlock = DynamoLock(ddb, dynamodb_table, "s3://b/p/LOCK", retry=opts.retry)
    lease = dlock.acquire("a")
    assert lease.generation == 1
    dlock.heartbeat(lease)
    assert ddb.calls["put_item"] == 2

    s3 = Faulty(s3_client)
    s3.script["put_object"] = ["land+timeout", "timeout", "ok"]
    slock = S3Lock(s3, bucket, "p/LOCK", retry=opts.retry)
    lease = slock.acquire("a")
    assert lease.generation == 1
    slock.heartbeat(lease)
    assert s3.calls["put_object"] == 3


@pytest.mark.s3
def test_unreachable_endpoint_is_determinate(aws_options: dict[str, Any]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    blob = S3Blob("some-bucket", storage_options={
        **aws_options, "endpoint_url": f"http://127.0.0.1:{port}", "max_attempts": 2,
        "connect_timeout": 1})
    start = time.monotonic()
    with pytest.raises(Determinate, match="connect") as info:
        blob.get("k")
    assert not isinstance(info.value, Indeterminate)
    with pytest.raises(Determinate):
        blob.set_if_absent("k", b"v")  # refused before sending: definitely not created
    assert time.monotonic() - start < 5


@pytest.mark.s3
def test_missing_bucket_is_a_clear_typed_error(aws_options: dict[str, Any]) -> None:
    blob = S3Blob("no-such-bucket-here", "p", storage_options=aws_options)
    for op in (lambda: blob.get("k"), lambda: blob.set("k", b"v"),
               lambda: blob.set_if_absent("k", b"v"), lambda: blob.list_keys("")):
        with pytest.raises(aws.MissingResource, match="no-such-bucket-here"):
            op()


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["native", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def test_write_refused_with_403_names_a_missing_bucket(
    aws_options: dict[str, Any], bucket: str, mode: str, request: pytest.FixtureRequest
) -> None:
    # SeaweedFS answers a PUT into a missing bucket with 403 AccessDenied, not 404 NoSuchBucket.
    # The same answer is injected here, so every server exercises persist's HeadBucket probe.
    opts = dict(aws_options)
    if mode == "dynamodb":
        opts |= {"conditional_put": "dynamodb",
                 "dynamodb_table": request.getfixturevalue("dynamodb_table")}
    missing = S3Blob("no-such-bucket-403", "p", storage_options=opts)
    client = missing.client = Faulty(missing.client)
    for write in (lambda b: b.set("k", b"v"), lambda b: b.set_if_absent("meta/k", b"v")):
        client.script["put_object"] = ["403"]
        with pytest.raises(aws.MissingResource, match=r"no-such-bucket-403.*403 AccessDenied"):
            write(missing)
    # A 403 from a bucket that exists is a refusal: Determinate, never MissingResource.
    present = S3Blob(bucket, "p", storage_options=opts)
    client = present.client = Faulty(present.client)
    for write in (lambda b: b.set("k", b"v"), lambda b: b.set_if_absent("meta/k", b"v")):
        client.script["put_object"] = ["403"]
        with pytest.raises(Determinate, match="check credentials") as info:
            write(present)
        assert not isinstance(info.value, aws.MissingResource)
    assert present.list_keys("") == []


@pytest.mark.s3
@pytest.mark.dynamodb
def test_missing_table_is_a_clear_typed_error(aws_options: dict[str, Any], bucket: str) -> None:
    blob = S3Blob(bucket, "p", storage_options={
        **aws_options, "conditional_put": "dynamodb", "dynamodb_table": "no-such-table"})
    with pytest.raises(aws.MissingResource, match="no-such-table"):
        blob.set_if_absent("k", b"v")
