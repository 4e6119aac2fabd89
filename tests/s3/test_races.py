"""Exactly one winner when separate processes race through the real (serialized) moto server:
conditional creates in both commit modes, and the writer locks. Also the DynamoDB commit's
stale-record takeover and its wait behind a live holder."""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import threading
import time
from typing import Any

import pytest

from persist.blob.dynamo_commit import CREATE_ETAG
from persist.blob.s3 import S3Blob
from tests.s3 import workers

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
            r, me, outcome = results.get(timeout=60)
            by_round[r].append((me, outcome))
    finally:
        for p in procs:
            p.join(timeout=30)
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


def _plant_record(blob: S3Blob, key: str, *, timeout_ms: int, owner: str = "ghost") -> None:
    blob.dynamodb_client().put_item(TableName=blob.config.dynamodb_table, Item={
        "path": {"S": blob.url(key)}, "etag": {"S": CREATE_ETAG},
        "generation": {"N": "1"}, "owner": {"S": owner}, "timeout": {"N": str(timeout_ms)},
        "ttl": {"N": str(int(time.time()) + 3600)},
    })


@pytest.mark.dynamodb
def test_stale_record_of_a_dead_writer_is_taken_over(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str
) -> None:
    blob = _commit_blob(aws_options, bucket, dynamodb_table, max_clock_skew_rate=1.5)
    _plant_record(blob, "meta/log/1", timeout_ms=200)  # a creator that died holding it
    start = time.monotonic()
    assert blob.set_if_absent("meta/log/1", b"mine") is True
    assert time.monotonic() - start >= 0.3  # 200 ms x skew 1.5, on our clock
    assert blob.get("meta/log/1") == b"mine"


@pytest.mark.dynamodb
def test_live_record_is_waited_out_and_its_object_respected(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, s3_client: Any
) -> None:
    blob = _commit_blob(aws_options, bucket, dynamodb_table)
    _plant_record(blob, "meta/log/1", timeout_ms=20_000)
    outcome: list[bool] = []
    t = threading.Thread(target=lambda: outcome.append(blob.set_if_absent("meta/log/1", b"b")))
    t.start()
    time.sleep(0.5)
    assert outcome == []  # still waiting behind the live holder
    # The holder finishes: writes its object, releases its record.
    other = S3Blob(bucket, "dc", storage_options=aws_options)
    other.set("meta/log/1", b"holder's")
    blob.dynamodb_client().delete_item(TableName=dynamodb_table, Key={
        "path": {"S": blob.url("meta/log/1")}, "etag": {"S": CREATE_ETAG}})
    t.join(timeout=10)
    assert outcome == [False]
    assert blob.get("meta/log/1") == b"holder's"
