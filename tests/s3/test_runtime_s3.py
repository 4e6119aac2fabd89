"""``persist.open("s3://...")`` end to end through the runtime, against the moto server.

For each combination of writer lock (an S3 object, or a DynamoDB item chosen by giving a
``dynamodb_table``) and commit primitive (S3's native conditional put, or the DynamoDB-decided
create): create_or_load, write, seal, append, allow_compaction, background and explicit
compaction and GC (small thresholds, ``gc_grace_seconds=0``), snapshots checked against a model,
listen on the writer and on a replica, and a read-only replica that follows the writer across
compaction, GC and metadata trimming with snapshots identical to the writer's. Then the lock:
a second writer with another reentrance id is refused with LockHeld; one with the same id takes
over at once and the old one is fenced.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.errors import Fenced, InvalidUsage, LockHeld, RuntimeShutdown
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.location import resolve
from persist.lock.dynamodb import DynamoLock
from persist.lock.s3 import S3Lock
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.s3

#: Small thresholds so a short test compacts, retires, collects and trims.
OPTIONS = persist.Options(
    inline_threshold=256,
    rollup_every=4,
    gc_grace_seconds=0.0,
    compaction=CompactionPolicy(final_rows=4096, inline_flush_bytes=1024),
)

#: (lock kind, commit mode) -> the persist part of storage_options ("TABLE" is replaced by the
#: test's DynamoDB table). The DynamoDB lock is selected the way users select it: by naming a
#: table.
CONFIGS: dict[str, dict[str, Any]] = {
    "s3lock-native": {"lock": "s3"},
    "s3lock-dynamocommit": {"lock": "s3", "conditional_put": "dynamodb",
                            "dynamodb_table": "TABLE"},
    "dynamolock-native": {"dynamodb_table": "TABLE"},
    "dynamolock-dynamocommit": {"dynamodb_table": "TABLE", "conditional_put": "dynamodb"},
}
PARAMS = [pytest.param(name, id=name,
                       marks=[pytest.mark.dynamodb] if "dynamo" in name else [])
          for name in CONFIGS]

Row = tuple[tuple[str, int], int, int]


def storage_options(aws_options: dict[str, Any], config: str, table: str) -> dict[str, Any]:
    """The full storage_options of ``config`` against the moto server."""
    extra = {k: (table if v == "TABLE" else v) for k, v in CONFIGS[config].items()}
    return {**aws_options, **extra}


def updates_at(t: int) -> list[Row]:
    """What the test writes at time ``t``: a keyed row replacing the one of ``t-5``, and every
    fourth time a bulk of rows large enough to be stored as its own data blob."""
    rows: list[Row] = [((f"k{t % 5}", t), t, 1)]
    if t >= 5:
        rows.append(((f"k{t % 5}", t - 5), t, -1))
    if t % 4 == 0:
        rows.extend(((f"bulk{t}-{i:03d}", i), t, 1) for i in range(40))
    return rows


def expected(written: Iterable[Row], as_of: int) -> list[Row]:
    """The consolidated contents as of ``as_of``, as ``snapshot(as_of).to_python()`` gives them."""
    acc: collections.Counter[tuple[str, int]] = collections.Counter()
    for kv, t, d in written:
        if t <= as_of:
            acc[kv] += d
    return sorted((kv, as_of, d) for kv, d in acc.items() if d != 0)


def drain(listener: persist.Listener, upper: int, timeout: float = PATIENCE) -> list[Row]:
    """Reads ``listener`` until its progress reaches ``upper``; returns the updates delivered."""
    got: list[Row] = []
    deadline = time.monotonic() + timeout
    while listener.frontier < upper:
        assert time.monotonic() < deadline, f"listener stuck at {listener.frontier} < {upper}"
        for ev in listener.poll(0.5):
            if isinstance(ev, persist.ListenUpdates):
                b = ev.batch.to_pydict()
                got.extend(((k, v), t, d) for k, v, t, d in
                           zip(b["key"], b["value"], b["time"], b["diff"], strict=True))
                assert all(ev.lower <= t < ev.upper for _, t, _ in got[-ev.batch.num_rows:])
    return got


def stored_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    """Every object key under ``prefix/`` (relative to it), straight from the server."""
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                 Prefix=f"{prefix}/"):
        out.extend(o["Key"][len(prefix) + 1:] for o in page.get("Contents", ()))
    return out


def blob_keys(client: persist.Client) -> set[str]:
    """The data blobs the client's current state references."""
    return {p.blob_key for c in client.state.collections.values() for p in c.parts
            if p.blob_key is not None}


def maintain_until_idle(client: persist.Client, rounds: int = 50) -> None:
    """Runs ``client.maintain()`` until it finds nothing to do.

    NB: ``maintain()`` plans against the published state while the background maintenance
    thread may be committing the same compaction; the loser's commit is refused with
    InvalidUsage ("replaces parts that are gone"). The background thread treats that as
    "plan again", and so does this helper.
    """
    for _ in range(rounds):
        try:
            if not client.maintain():
                return
        except InvalidUsage as e:
            if "gone" not in str(e):
                raise
    pytest.fail("maintenance never ran out of work")


def wait_until(pred: Any, timeout: float = PATIENCE, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("config", PARAMS)
def test_open_s3_end_to_end(aws_options: dict[str, Any], bucket: str, dynamodb_table: str,
                            s3_client: Any, config: str) -> None:
    opts = storage_options(aws_options, config, dynamodb_table)
    url = f"s3://{bucket}/e2e"
    lock = resolve(url, storage_options=opts).lock()
    assert isinstance(lock, S3Lock if config.startswith("s3lock") else DynamoLock)

    writer = persist.open(url, reentrance_id="svc", storage_options=opts, options=OPTIONS,
                          lease_seconds=5)
    replica = persist.open(url, read_only=True, storage_options=opts, options=OPTIONS,
                           poll_interval=(0.005, 0.05))
    try:
        w, r = writer.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        held = lock.current()
        assert held is not None
        assert held.holder == "svc"
        assert not held.released
        _, rr = replica.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert (rr.since, rr.upper) == (0, 0)

        written: list[Row] = []
        ever_referenced: set[str] = set()
        futures = []
        w.append(updates_at(0), 1).result()
        written += updates_at(0)
        wlisten = r.listen(0)
        rlisten = rr.listen(0)
        uppers_seen = [rr.upper]
        T = 20
        for t in range(1, T):
            # write + seal as two commands queued without waiting (group commit), or one
            # atomic append waited for (one commit, one part each: work for compaction)
            if t % 3 == 0:
                futures += [w.write(updates_at(t)), w.seal(t + 1)]
            else:
                w.append(updates_at(t), t + 1).result()
            ever_referenced.update(blob_keys(writer))
            written += updates_at(t)
            if t % 5 == 0:
                uppers_seen.append(rr.upper)
        for f in futures:
            f.result()
        assert (r.since, r.upper) == (0, T)
        for as_of in (0, 3, 9, T - 1):
            assert r.snapshot(as_of).to_python() == expected(written, as_of)

        # The replica follows: its upper advanced, and it reads exactly what the writer reads.
        assert rr.snapshot(T - 1, timeout=PATIENCE).to_python() == expected(written, T - 1)
        uppers_seen.append(rr.upper)
        assert uppers_seen == sorted(uppers_seen)
        assert uppers_seen[-1] == T
        for as_of in range(T):
            assert rr.snapshot(as_of).to_arrow().equals(r.snapshot(as_of).to_arrow())

        # listen, on the writer and on the replica: every update after 0, once, in time order
        after_zero = sorted(u for u in written if u[1] > 0)
        assert sorted(drain(wlisten, T)) == after_zero
        assert sorted(drain(rlisten, T)) == after_zero
        rlisten.close()  # a replica cannot hold back the writer's compaction

        # compaction (it also ran in the background all along) and GC
        w.allow_compaction(T - 4).result()
        maintain_until_idle(writer)
        c = writer.state.collections["c"]
        assert (r.since, r.upper) == (T - 4, T)
        assert any(p.consolidated for p in c.parts), "nothing was compacted"
        assert len(c.parts) <= 6
        assert writer.state.retired == ()
        referenced = blob_keys(writer)
        assert referenced, "the bulk rows should live in data blobs"
        on_server = stored_keys(s3_client, bucket, "e2e")
        data_on_server = {k for k in on_server if k.startswith(layout.DATA_PREFIX)}
        assert referenced <= data_on_server
        retired = ever_referenced - referenced
        assert retired, "compaction retired no data blob"
        assert not retired & data_on_server, "GC left retired data blobs behind"
        logs = [layout.seq_of(k) for k in on_server if k.startswith(layout.LOG_PREFIX)]
        rollups = [layout.seq_of(k) for k in on_server if k.startswith(layout.ROLLUP_PREFIX)]
        assert rollups, "no rollup was written"
        assert 1 not in logs, "the metadata log should have been trimmed behind a rollup"
        assert max(logs + rollups) == writer.state.seq
        for as_of in range(T - 4, T):
            assert r.snapshot(as_of).to_python() == expected(written, as_of)
        # the writer's listener held compaction back for itself, and goes on
        more = [w.append(updates_at(t), t + 1) for t in range(T, T + 4)]
        for f in more:
            f.result()
        for t in range(T, T + 4):
            written += updates_at(t)
        assert sorted(drain(wlisten, T + 4)) == sorted(u for u in written if u[1] >= T)
        wlisten.close()

        # the replica follows across compaction, GC and the trimmed log
        assert rr.snapshot(T + 3, timeout=PATIENCE).to_python() == expected(written, T + 3)
        wait_until(lambda: replica.state.seq == writer.state.seq, what="replica to catch up")
        assert rr.since == r.since
        for as_of in range(r.since, r.upper):
            assert rr.snapshot(as_of).to_arrow().equals(r.snapshot(as_of).to_arrow())
        final = {as_of: r.snapshot(as_of).to_arrow() for as_of in range(r.since, r.upper)}
    finally:
        replica.stop()
        writer.stop()

    # released on stop: another id opens at once, and sees the same definite contents
    with persist.open(url, reentrance_id="other", storage_options=opts) as again:
        _, r2 = again.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert (r2.since, r2.upper) == (T - 4, T + 4)
        for as_of, table in final.items():
            assert r2.snapshot(as_of).to_arrow().equals(table)
    rec = lock.current()
    assert rec is not None
    assert rec.released
    assert rec.holder == "other"


@pytest.mark.parametrize("config", PARAMS)
def test_second_writer_refused_same_id_takes_over(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, config: str
) -> None:
    opts = storage_options(aws_options, config, dynamodb_table)
    url = f"s3://{bucket}/lock"
    lost: list[Fenced] = []
    blue = persist.open(url, reentrance_id="blue", storage_options=opts, lease_seconds=30,
                        on_lock_lost=lost.append)
    blue2: persist.Client | None = None
    try:
        wb, _ = blue.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        wb.append([(("a", 1), 0, 1)], 1).result()
        start = time.monotonic()
        with pytest.raises(LockHeld, match="blue"):
            persist.open(url, reentrance_id="green", storage_options=opts)
        with pytest.raises(LockHeld, match="blue"):
            persist.open(url, reentrance_id="green", storage_options=opts, lock_timeout=0.5)
        assert time.monotonic() - start < 25  # never the holder's 30 s lease
        assert blue.lock_lost is None

        # the same reentrance id takes over at once; the old holder is fenced
        blue2 = persist.open(url, reentrance_id="blue", storage_options=opts)
        w2, r2 = blue2.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        with pytest.raises((Fenced, RuntimeShutdown)) as info:
            wb.append([(("b", 2), 1, 1)], 2).result(timeout=PATIENCE)
        err = info.value
        assert isinstance(err, Fenced) or isinstance(err.__cause__, Fenced)
        assert isinstance(blue.lock_lost, Fenced)
        assert lost
        assert isinstance(lost[0], Fenced)
        with pytest.raises(RuntimeShutdown):
            wb.append([(("c", 3), 1, 1)], 2).result(timeout=PATIENCE)
        w2.append([(("d", 4), 1, 1)], 2).result()
        assert r2.snapshot(1).to_python() == [(("a", 1), 1, 1), (("d", 4), 1, 1)]
    finally:
        blue.stop()
        if blue2 is not None:
            blue2.stop()
    # the fenced holder did not release its successor's lock on stop
    rec = resolve(url, storage_options=opts).lock().current()
    assert rec is not None
    assert rec.holder == "blue"
    assert rec.generation == 2
    assert rec.released


def test_missing_bucket_fails_open_with_missing_resource(aws_options: dict[str, Any]) -> None:
    with pytest.raises(persist.MissingResource, match="no-such-bucket"):
        persist.open("s3://no-such-bucket-here/p", reentrance_id="w", storage_options=aws_options)
    assert issubclass(persist.MissingResource, persist.Determinate)


def test_s3_locks_are_exported_lazily() -> None:
    import persist.lock

    assert persist.lock.S3Lock is S3Lock
    assert persist.lock.DynamoLock is DynamoLock
    assert "S3Lock" not in persist.lock.__all__  # `import *` must not need boto3
