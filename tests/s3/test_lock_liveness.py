"""A failing lock store ends ``persist.open`` in a typed error within ``lock_timeout``: the S3
and DynamoDB locks against the moto server behind a proxy that answers every lock write with
the store's own ``500 InternalError`` (over the wire: boto3, HTTP, the real error parsing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import persist
from persist.errors import ExternalError
from tests.support.bounded import within
from tests.support.faulty_proxy import FaultyProxy, dynamodb_put_items, s3_puts
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.s3

LOCK_TIMEOUT = 5.0
#: Beyond the lock timeout: creating boto3 clients and the last attempts, which a loaded machine
#: slows (a wait that ignored lock_timeout would take the 30 s lease, or forever).
SLACK = 15.0


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    return within(seconds, fn, what='persist.open still blocked')


def _open_fails_in_time(url: str, options: dict[str, Any]) -> ExternalError:
    start = time.monotonic()
    err = _within(PATIENCE, lambda: persist.open(url, storage_options=options,
                                           lock_timeout=LOCK_TIMEOUT))
    elapsed = time.monotonic() - start
    if isinstance(err, persist.Client):
        err.stop()
    assert isinstance(err, ExternalError), err
    assert elapsed < LOCK_TIMEOUT + SLACK
    return err


def test_s3_lock_outage_ends_open_within_lock_timeout(aws_options: dict[str, Any],
                                                      s3_endpoint: str, bucket: str) -> None:
    with FaultyProxy(s3_endpoint, s3_puts) as proxy:
        err = _open_fails_in_time(f"s3://{bucket}/loc",
                                  {**aws_options, "endpoint_url": proxy.url})
        assert proxy.failed >= 2
    assert "lock" in str(err)
    assert "InternalError" in str(err)


@pytest.mark.dynamodb
def test_dynamodb_lock_outage_ends_open_within_lock_timeout(
    aws_options: dict[str, Any], dynamodb_endpoint: str, bucket: str, dynamodb_table: str
) -> None:
    # NB: DynamoDB's own endpoint: beside SeaweedFS it is not the S3 one
    with FaultyProxy(dynamodb_endpoint, dynamodb_put_items) as proxy:
        err = _open_fails_in_time(f"s3://{bucket}/loc", {
            **aws_options, "dynamodb_endpoint_url": proxy.url, "lock_table": dynamodb_table})
        assert proxy.failed >= 2
    assert "lock" in str(err)
    assert "InternalServerError" in str(err)
