"""Replicas of an ``s3://`` location, on each S3 test server (tests/support/s3_fixtures.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import persist
from tests.replica.conftest import Proc
from tests.replica.helpers import acks, append_times, check_listened, events, eventually
from tests.replica.helpers import listened_rows as listen_rows
from tests.replica.workers import key

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_loc(bucket: str) -> str:
    return f"s3://{bucket}/replicated"


def test_pushed_replica_of_an_s3_location(s3_loc: str, aws_options: dict[str, Any]) -> None:
    with persist.open(s3_loc, storage_options=aws_options, notify=True) as writer:
        w, r = events(writer)
        append_times(w, 0, 3)
        with persist.open(s3_loc, storage_options=aws_options, read_only=True, notify=True,
                          poll_interval=(3600.0, 3600.0)) as replica:
            _, rr = events(replica)
            listener = rr.listen(2)
            eventually(lambda: replica.stats["push"]["live"], what="subscribed over S3's advert")
            append_times(w, 3, 15)
            # the replica polls once an hour: only pushes can have made it follow within
            # the test's patience (far less than that)
            assert listen_rows(listener, 15) == [(key(t), t, 1) for t in range(3, 15)]
            for as_of in (0, 7, 14):
                assert rr.snapshot(as_of).to_arrow().equals(r.snapshot(as_of).to_arrow())
            listener.close()


def test_blue_green_handover_on_s3(
    s3_loc: str, aws_options: dict[str, Any], spawn: Callable[..., Proc]
) -> None:
    opts = ["--storage-options", json.dumps(aws_options)]
    blue = spawn("writer", "--url", s3_loc, "--rid", "svc", "--notify", "--interval", "0.01",
                 *opts)
    blue.wait_for("ack", pred=lambda e: e["t"] >= 3)
    # one pushed replica here; two replicas, pushed and polling, run on files in test_processes
    replicas = [spawn("listener", "--url", s3_loc, "--notify", *opts)]
    for p in replicas:
        p.wait_for("ready")
    blue.wait_for("ack", pred=lambda e: e["t"] >= 20)
    green = spawn("writer", "--url", s3_loc, "--rid", "svc", "--count", "20", "--notify", *opts)
    opened = green.wait_for("open")
    blue.wait_for("fenced")
    until = green.wait_for("done")["upper"]
    acked = acks(blue) | acks(green)
    assert max(acks(blue)) < opened["upper"]
    for p in replicas:
        p.send(f"until {until}")
    for p in replicas:
        check_listened(p.wait_for("done"), until, acked)
