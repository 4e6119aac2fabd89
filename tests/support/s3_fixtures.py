"""Pytest fixtures for tests against real S3/DynamoDB servers (never an in-process mock).

Loaded for the whole suite by ``tests/conftest.py``. ``s3_server`` is a session fixture
parametrized over the servers of ``tests/support/s3_servers.py`` (default ``moto`` and
``ministack``; ``PERSIST_TEST_S3_SERVERS`` / ``PERSIST_TEST_S3_ENDPOINT`` change that), so every
test that uses any fixture below runs once per server, with the server in its id
(``test_x[moto]``, ``test_x[ministack]``). One server runs at a time: pytest orders the tests by
server and stops a server before it starts the next.

``aws_options`` / ``s3_connection`` are the storage_options reaching that server; ``bucket`` and
``dynamodb_table`` are fresh, uniquely named resources per test. A test that depends on a
behaviour only some servers have calls ``requires(s3_server, trait, reason)``, which skips it
elsewhere with the reason in the report (``-ra``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import s3_servers
from tests.support.s3_servers import Server


def unique(prefix: str) -> str:
    """A bucket or table name every server accepts (3-63 lower-case characters)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def requires(server: Server, trait: str, reason: str) -> None:
    """Skips the calling test unless ``server`` has ``trait``; ``reason`` says why it needs it."""
    if trait not in server.traits:
        pytest.skip(f"needs a server with {trait!r} ({server.name} has not): {reason}")


@pytest.fixture(scope="session", params=s3_servers.configured())
def s3_server(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    name: str = request.param
    if name == "external":
        yield s3_servers.external()
        return
    with s3_servers.start(name, tmp_path_factory.mktemp(name)) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: Server) -> str:
    return s3_server.endpoint_url


@pytest.fixture(scope="session")
def dynamodb_endpoint(s3_server: Server) -> str:
    """Where DynamoDB answers: the S3 endpoint, except beside SeaweedFS (its own ministack)."""
    return s3_server.dynamodb_endpoint_url or s3_server.endpoint_url


@pytest.fixture(scope="session")
def s3_connection(s3_server: Server) -> dict[str, str]:
    """storage_options that only connect (strings: they may travel as Spark options)."""
    return s3_server.connection()


@pytest.fixture(scope="session")
def aws_options(s3_connection: dict[str, str]) -> dict[str, Any]:
    """Connection storage_options, with fast retries (tests that exercise failures want them)."""
    return {**s3_connection, "retry_base_delay": 0.01, "retry_max_delay": 0.2}


@pytest.fixture(scope="session")
def s3_client(aws_options: dict[str, Any]) -> Any:
    from persist.blob import aws

    opts, _ = aws.AwsOptions.split(aws_options)
    return aws.client("s3", opts)


@pytest.fixture
def bucket(s3_server: Server, s3_client: Any) -> Iterator[str]:
    name = unique("persist")
    s3_client.create_bucket(Bucket=name)
    yield name
    if s3_server.cleanup:
        _delete_bucket(s3_client, name)


@pytest.fixture
def dynamodb_table(s3_server: Server, aws_options: dict[str, Any]) -> str:
    from persist.lock.dynamodb import create_table

    requires(s3_server, s3_servers.DYNAMODB, "the test keeps commits or locks in DynamoDB")
    name = unique("persist")
    create_table(aws_options, name)
    return name


def _delete_bucket(s3: Any, name: str) -> None:
    """Best effort: every object and unfinished upload of bucket ``name``, then the bucket."""
    with contextlib.suppress(Exception):
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for up in page.get("Uploads", []):
                s3.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
    with contextlib.suppress(Exception):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        s3.delete_bucket(Bucket=name)
