"""A location with many collections: a commit and a maintenance round do work that follows the
collections they change, not the location's size (issue 29; DESIGN.md §8, the work index).
Counted, never timed: blob bytes written per commit, and collections a round re-planned."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from persist.blob.base import Blob
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format.columnar import Codec
from persist.indexed.maintenance import compact, pending
from persist.location import Location, open_writer
from persist.lock.memory import MemoryLock
from persist.runtime import commands as cmd
from persist.runtime.client import Client
from persist.runtime.runtime import Runtime
from tests.support.recording import RecordingBlob

#: Pinned: parts of 100 rows ride in the commit record (the bytes compared are the commit's
#: own, under every knob set), and no rollup (the whole state, by format) falls in a window.
OPTIONS = Options(inline_threshold=64 << 10, rollup_every=1_000_000, group_commit=True,
                  background_compaction=False)
MANY = 2000


def _open(blob: Blob, name: str) -> tuple[Client, Runtime]:
    """A writer with maintenance rounds only when the test runs them (``client.maintain()``)."""
    loc = Location(f"mem://{name}", blob, lambda: MemoryLock(name))
    w = open_writer(loc, "w", lock_timeout=5.0, options=OPTIONS)
    runtime = Runtime(w.engine, lock=w.lock, lease=w.lease, maintenance=False)
    return Client(loc.url, w.engine, runtime=runtime), runtime


def _rows(t: int) -> list[Any]:
    return [((f"k{j}", j), t, 1) for j in range(100)]


def _location(n: int) -> tuple[Client, Runtime, RecordingBlob]:
    """A writer of a location with ``n`` collections, each with one part of 100 rows."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    client, runtime = _open(blob, name)
    k, v = Codec.of(pa.string(), "key"), Codec.of(pa.int64(), "value")
    names = [f"c{i:05d}" for i in range(n)]
    for f in [runtime.submit(cmd.Register(x, k, v)) for x in names]:
        f.result()
    for b in range(0, n, 500):
        batch = names[b:b + 500]
        client.apply(writes={x: _rows(0) for x in batch}, seals={x: 1 for x in batch}).result()
    return client, runtime, blob


def _appends(client: Client, blob: RecordingBlob, n: int) -> list[int]:
    """The bytes each of ``n`` appends to collection c00000 wrote."""
    w, r = client.create_or_load("c00000", key_type=pa.string(), value_type=pa.int64())
    out = []
    for _ in range(n):
        before = blob.bytes_written()
        t = r.upper
        w.append(_rows(t), upper=t + 1).result()
        out.append(blob.bytes_written() - before)
    return out


def test_a_commit_writes_the_same_bytes_with_one_collection_or_many() -> None:
    one, _, one_blob = _location(1)
    many, _, many_blob = _location(MANY)
    try:
        small, big = _appends(one, one_blob, 10), _appends(many, many_blob, 10)
        state_bytes = many_blob.bytes_written()  # what setting up the many wrote, for scale
    finally:
        one.stop()
        many.stop()
    # the same record, but for its seq (an int of a byte or two more) and a part id
    for s, b in zip(small, big, strict=True):
        assert abs(b - s) <= 8, (small, big)
    assert sum(big) * 100 < state_bytes


def test_a_maintenance_round_visits_only_what_changed() -> None:
    client, runtime, _ = _location(MANY)
    try:
        work = runtime.ix.work
        client.maintain()
        assert work.visited >= MANY  # a new writer looks at every collection once
        w, r = client.create_or_load("c00007", key_type=pa.string(), value_type=pa.int64())
        for _ in range(20):
            before = work.visited
            t = r.upper
            w.append(_rows(t), upper=t + 1).result()
            client.maintain()
            client.maintain()
            # the collection appended to, once per commit that changed it (the append, and the
            # merges of it that cascaded), never the other 1,999
            assert work.visited - before <= 1 + 4
        # a new collection is one more to look at, not the location again
        before = work.visited
        w2, _ = client.create_or_load("new", key_type=pa.string(), value_type=pa.int64())
        w2.append(_rows(0), upper=1).result()
        client.maintain()
        assert work.visited - before <= 2
    finally:
        client.stop()


def test_a_hold_lapses_by_its_due_time_among_many() -> None:
    client, runtime, _ = _location(MANY)
    try:
        work = runtime.ix.work
        client.maintain()
        h = client.hold("c01234", "consumer", 1, lease=0.2)
        client.maintain()  # the hold's collection is looked at once, its lapse not yet due
        assert not h.lapsed
        before = work.visited
        time.sleep(0.3)
        client.maintain()
        assert h.lapsed
        assert work.visited - before <= 2  # the lapse's commit changed that one collection
        assert [x.lapsed for x in client.holds("c01234")] == [True]
    finally:
        client.stop()


def test_background_rounds_look_at_a_loaded_location_a_budget_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a load marks every collection, a background round visits those commits changed
    and at most ``VISIT_BUDGET`` of the others, and asks for the next round while some are
    left; the collection being appended to is planned in the first. An explicit round
    (``Client.maintain``) visits them all."""
    monkeypatch.setattr(pending, "VISIT_BUDGET", 300)
    client, runtime, _ = _location(MANY)
    try:
        ix = runtime.ix
        ix.work = pending.WorkIndex()  # as a writer's open starts: everything marked
        hot = f"c{MANY - 1:05d}"  # last in the map's order: the backlog's last visit
        w, r = client.create_or_load(hot, key_type=pa.string(), value_type=pa.int64())
        for _ in range(8):
            t = r.upper
            w.append(_rows(t), upper=t + 1).result()
        want = compact.plan(ix.state.collections[hot], ix.options.compaction)
        before = ix.work.visited
        assert runtime.maintain_once(background=True)  # more to look at: "did something"
        assert ix.work.visited - before <= 300 + 1
        assert ix.work.behind
        planned = dict(ix.work.compactions(ix.state))
        assert (hot in planned) == bool(want)
        rounds = 1
        while ix.work.behind:
            runtime.maintain_once(background=True)
            rounds += 1
        assert rounds == -(-MANY // 300)
        assert ix.work.visited - before >= MANY
        ix.work = pending.WorkIndex()
        client.maintain()
        assert not ix.work.behind  # one explicit round went through them all
        assert ix.work.visited >= MANY
    finally:
        client.stop()
