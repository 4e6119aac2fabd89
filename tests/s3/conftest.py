"""Fixtures for tests against a real (serialized) moto server: never the in-process mock.

``moto_endpoint`` starts ``tests/support/moto_server.py`` once per session on a free port;
``bucket`` and ``dynamodb_table`` make fresh, uniquely named resources per test.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from persist.lock.dynamodb import create_table

SERVER = Path(__file__).resolve().parents[1] / "support" / "moto_server.py"


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE,
                                stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            proc.kill()
            pytest.fail(f"moto server did not start: {line!r}\n{log.read_text()}")
        url = f"http://127.0.0.1:{line}"
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        deadline = time.monotonic() + 30
        while True:
            try:
                s3.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        s3.close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="session")
def aws_options(moto_endpoint: str) -> dict[str, Any]:
    """Connection storage_options for the moto server (boto3 spellings)."""
    return {
        "endpoint_url": moto_endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "addressing_style": "path",
        # Tests that exercise failures want them fast.
        "retry_base_delay": 0.01,
        "retry_max_delay": 0.2,
    }


@pytest.fixture(scope="session")
def s3_client(aws_options: dict[str, Any]) -> Any:
    from persist.blob import aws

    opts, _ = aws.AwsOptions.split(aws_options)
    return aws.client("s3", opts)


def unique(prefix: str) -> str:
    """A resource name moto accepts (3-63 lower-case characters)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = unique("persist")
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def dynamodb_table(aws_options: dict[str, Any]) -> str:
    name = unique("persist")
    create_table(aws_options, name)
    return name
