"""Exactly one winner when separate processes race through the real (serialized) moto server:
conditional creates in both commit modes, and the writer locks. Also what the DynamoDB-decided
create does with the leftovers of a creator that died at each step."""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import time
from typing import Any

import pytest

from persist.blob import envelope
from persist.blob.dynamo_commit import DECISION_ETAG
from persist.blob.s3 import S3Blob
from persist.layout import PENDING_PREFIX
from tests.s3 import workers
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.s3

PROCS = 6
#: Rounds per race test; raise it for a longer soak (docs/s3.md quotes a 100-round run).
ROUNDS = int(os.environ.get("PERSIST_RACE_ROUNDS", "15"))


def _run(target: Any, args: tuple[Any, ...], rounds: int) -> dict[int, list[tuple[int, Any]]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCS)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, rounds, barrier, results))
             for i in range(PROCS)]
    for p in procs:
        p.start()
    by_round: dict[int, list[tuple[int, Any]]] = collections.defaultdict(list)
    try:
        for _ in range(PROCS * rounds):
            r, me, outcome = results.get(timeout=PATIENCE)
            by_round[r].append((me, outcome))
    finally:
        for p in procs:
            p.join(timeout=PATIENCE)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return by_round


@pytest.mark.parametrize("mode", ["native", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def test_processes_racing_set_if_absent_one_winner(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, mode: str
) -> None:
    options = {**aws_options, "conditional_put": mode}
    if mode == "dynamodb":
        options["dynamodb_table"] = dynamodb_table
    by_round = _run(workers.create_racer, (bucket, "race", options), ROUNDS)
    blob = S3Blob(bucket, "race", storage_options=aws_options)
    for r in range(ROUNDS):
        winners = [me for me, won in by_round[r] if won]
        assert len(winners) == 1, f"round {r}: winners {winners}"
        assert blob.get(f"meta/log/{r:05d}") == f"writer {winners[0]}".encode()


@pytest.mark.parametrize("lock", ["s3", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def test_processes_racing_for_the_lock_one_holder(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, lock: str
) -> None:
    options = {**aws_options, "lock": lock, "lock_table": dynamodb_table}
    by_round = _run(workers.lock_racer, (f"s3://{bucket}/locks", options), ROUNDS)
    for r in range(ROUNDS):
        holders = [(me, gen) for me, gen in by_round[r] if gen is not None]
        assert len(holders) == 1, f"round {r}: holders {holders}"
        assert holders[0][1] == 1


def _commit_blob(aws_options: dict[str, Any], bucket: str, table: str, **extra: Any) -> S3Blob:
    return S3Blob(bucket, "dc", storage_options={
        **aws_options, "conditional_put": "dynamodb", "dynamodb_table": table, **extra})


def _plant(blob: S3Blob, key: str, value: bytes | None, *, decided: bool) -> str:
    """What a creator that died mid-create leaves: its temporary object (None: already deleted)
    and, if it got that far, its decision. Returns the temporary object's blob key."""
    temp = f"{PENDING_PREFIX}{key}/ghost"
    if value is not None:
        blob._set(temp, envelope.frame(key, value))
    if decided:
        blob.dynamodb_client().put_item(TableName=blob.config.dynamodb_table, Item={
            "path": {"S": blob.url(key)}, "etag": {"S": DECISION_ETAG},
            "owner": {"S": "ghost"}, "temp": {"S": blob.full_key(temp)},
        })
    return temp


@pytest.mark.dynamodb
def test_creator_that_died_after_deciding_is_rolled_forward(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob = _commit_blob(aws_options, bucket, dynamodb_table)
    _plant(blob, "meta/log/1", b"ghost's", decided=True)
    start = time.monotonic()
    assert blob.set_if_absent("meta/log/1", b"mine") is False  # no waiting: it is decided
    assert time.monotonic() - start < 2
    plain = S3Blob(bucket, "dc", storage_options=aws_options)
    assert plain.get("meta/log/1") is None  # not in place yet
    assert blob.get("meta/log/1") == b"ghost's"  # ... and now rolled forward
    assert plain.get("meta/log/1") == b"ghost's"
    assert blob.list_keys("") == ["meta/log/1"]  # neither temporary object is left


@pytest.mark.dynamodb
def test_creator_that_died_before_deciding_decides_nothing(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob = _commit_blob(aws_options, bucket, dynamodb_table)
    temp = _plant(blob, "meta/log/1", b"ghost's", decided=False)
    assert blob.get("meta/log/1") is None
    assert blob.set_if_absent("meta/log/1", b"mine") is True
    assert blob.get("meta/log/1") == b"mine"
    assert blob.list_keys(PENDING_PREFIX) == [temp]  # a leftover, listed for cleanup


@pytest.mark.dynamodb
def test_decided_key_whose_temp_is_gone_was_deleted(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    # The decision outlived its object and temp object: a delete of the key stopped between
    # deleting the object and the decision. The key reads absent, is not created again until
    # the delete is repeated, and nothing resurrects a value.
    blob = _commit_blob(aws_options, bucket, dynamodb_table)
    _plant(blob, "meta/log/1", None, decided=True)
    assert blob.get("meta/log/1") is None
    assert blob.set_if_absent("meta/log/1", b"mine") is False
    blob.delete("meta/log/1")
    assert blob.set_if_absent("meta/log/1", b"mine") is True
    assert blob.get("meta/log/1") == b"mine"
