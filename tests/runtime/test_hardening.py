"""Regression tests for what a new user and a hostile environment broke: bad input that got
through, a mistyped location that opened silently, and blobs that failed commits left behind.

Each test names the finding it guards. All of them failed on the code before their fix.
"""

from __future__ import annotations

import gc as pygc
import time
import uuid
from pathlib import Path

import msgspec
import prometheus_client
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import (
    Fenced,
    InvalidUsage,
    MissingResource,
    RuntimeShutdown,
    SchemaMismatch,
)
from persist.indexed.engine import Indexed, Options
from persist.indexed.format import meta
from persist.indexed.maintenance.verify import verify
from persist.indexed.state.machine import Machine
from persist.location import resolve
from tests.support.patience import PATIENCE

KV = {"key_type": pa.int64(), "value_type": pa.int64()}


def _reopens(loc: Path) -> None:
    """The location still opens, as a writer and as a replica (nothing bricked it)."""
    with persist.open(loc, reentrance_id="check") as writer:
        writer.create_or_load("after", **KV)
    with persist.open(loc, read_only=True) as replica:
        assert "after" in replica.collections


@pytest.mark.parametrize("name", [123, None, b"c", "", ("c",)])
def test_a_bad_collection_name_is_refused_and_bricks_nothing(tmp_path: Path, name: object) -> None:
    """Finding 1: create_or_load(123, ...) was committed; the entry could not be decoded, so
    every later open of the location failed with Corruption."""
    loc = tmp_path / "loc"
    with persist.open(loc, reentrance_id="a") as client:
        with pytest.raises(InvalidUsage, match="name"):
            client.create_or_load(name, **KV)  # type: ignore[arg-type]
        # the same through apply, which names collections as mapping keys
        with pytest.raises(InvalidUsage):
            client.apply(seals={name: 1}).result()  # type: ignore[dict-item]
        seq = client.state.seq
    assert Indexed.open(FileBlob(loc).read_only()).state.seq == seq  # nothing committed
    _reopens(loc)


@pytest.mark.parametrize("call", [
    lambda w: w.seal(1.5),
    lambda w: w.seal(True),
    lambda w: w.seal("3"),
    lambda w: w.seal(2**64),
    lambda w: w.allow_compaction(None),
    lambda w: w.hold("h", 0.5),
])
def test_malformed_frontiers_are_refused_before_staging(tmp_path: Path, call: object) -> None:
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", **KV)
        w.seal(1).result()
        seq = client.state.seq
        with pytest.raises(InvalidUsage):
            call(w).result()  # type: ignore[operator]
        assert client.state.seq == seq
        assert r.upper == 1


def test_a_commit_that_would_not_decode_is_never_written(tmp_path: Path) -> None:
    """The last line of defence: whatever bug builds a malformed record, the conditional create
    of the log entry never happens, and the location stays readable."""
    loc = tmp_path / "loc"
    with persist.open(loc, reentrance_id="a") as client:
        client.create_or_load("c", **KV)
        seq = client.state.seq
    machine = Machine(FileBlob(loc))
    state = machine.load()
    bad = meta.Commit(seq=seq + 1, epoch=state.epoch, writer="a", wall_ms=0,
                      ops=(meta.Seal(name=7, upper=1),))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="would not decode"):
        machine.commit(bad, meta.log_from(state))
    assert FileBlob(loc).get(layout.log_key(seq + 1, meta.log_from(state))) is None
    with pytest.raises(msgspec.DecodeError):  # what every open would have hit
        msgspec.msgpack.decode(meta.encode(bad), type=meta.Commit)
    _reopens(loc)


@pytest.mark.parametrize("diff", [1.5, 1.0, True, None, "1", 2**63])
def test_a_diff_that_is_not_an_int64_is_refused(tmp_path: Path, diff: object) -> None:
    """Finding 4: a float diff of 1.5 was stored as 1 (pyarrow truncates without a word)."""
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", **KV)
        with pytest.raises(SchemaMismatch, match="diff"):
            w.append([((1, 1), 0, diff)], upper=1).result()
        assert r.upper == 0
        w.append([((1, 1), 0, 2)], upper=1).result()
        assert r.snapshot(0).to_python() == [((1, 1), 0, 2)]


def test_a_fractional_diff_column_is_refused_too(tmp_path: Path) -> None:
    table = pa.table({"key": [1], "value": [1], "time": pa.array([0], pa.uint64()),
                      "diff": [1.5]})
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, _ = client.create_or_load("c", **KV)
        with pytest.raises(SchemaMismatch, match="diff"):
            w.append(table, upper=1).result()


@pytest.mark.parametrize("as_of", ["0", 0.0, None, -1, True])
def test_listen_and_snapshot_refuse_a_time_that_is_not_one(tmp_path: Path, as_of: object) -> None:
    """Finding 9: listen("0") raised a raw TypeError, then 'Exception ignored in
    Listener.__del__' (which filterwarnings=error turns into a failure here)."""
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", **KV)
        w.append([((1, 1), 0, 1)], upper=2).result()
        with pytest.raises(InvalidUsage, match="as_of"):
            r.listen(as_of)  # type: ignore[arg-type]
        with pytest.raises(InvalidUsage, match="as_of"):
            r.snapshot(as_of, timeout=0.1)  # type: ignore[arg-type]
        pygc.collect()  # a half-built Listener's __del__ must not raise


def test_a_read_only_open_of_nothing_is_an_error(tmp_path: Path) -> None:
    """Finding 7: a replica on a missing directory (a typo) opened an empty location and said
    'unknown collection ...; known: []' later."""
    missing = tmp_path / "typo"
    with pytest.raises(MissingResource, match="no persist location"):
        persist.open(missing, read_only=True)
    with pytest.raises(MissingResource, match="no persist location"):
        persist.open(f"mem://{uuid.uuid4().hex}", read_only=True)
    assert not missing.exists()
    with persist.open(missing, read_only=True, missing_ok=True) as replica:  # asked for
        assert replica.collections == []
    with pytest.raises(InvalidUsage, match="missing_ok"):
        persist.open(missing, missing_ok=True)


def test_a_location_that_is_a_file_says_so(tmp_path: Path) -> None:
    """Finding 7: a writer on a file path failed with 'opening lock mutex ...: File exists'."""
    f = tmp_path / "file"
    f.write_text("not a location")
    for kw in ({"reentrance_id": "a"}, {"read_only": True}):
        with pytest.raises(InvalidUsage, match="not a directory"):
            persist.open(f, **kw)  # type: ignore[arg-type]
    assert f.read_text() == "not a location"


def test_a_fenced_write_leaves_no_blob_behind(tmp_path: Path) -> None:
    """Finding 8: a writer fenced while committing a 200k-row write left its data blob behind,
    listed as leaked by `persist verify`, reclaimed by nothing."""
    loc = tmp_path / "loc"
    old = persist.open(loc, reentrance_id="svc")
    w_old, _ = old.create_or_load("c", **KV)
    new = persist.open(loc, reentrance_id="svc")  # takes over at once; the old one is fenced
    try:
        n = 200_000
        table = pa.table({"key": pa.array(range(n), pa.int64()),
                          "value": pa.array(range(n), pa.int64()),
                          "time": pa.array([0] * n, pa.uint64()),
                          "diff": pa.array([1] * n, pa.int64())})
        with pytest.raises((Fenced, RuntimeShutdown)):
            w_old.append(table, upper=1).result()
        report = verify(resolve(loc).read_half(), url=str(loc))
        assert report.problems == []
        assert report.leaked == []
        assert FileBlob(loc).list_keys(layout.DATA_PREFIX) == []
    finally:
        old.stop()
        new.stop()


def _sample(name: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(name, {})
    return 0.0 if value is None else float(value)


def test_maintenance_reclaims_leaked_blobs_after_their_grace(tmp_path: Path) -> None:
    """A blob a crashed writer wrote but never committed is deleted by the next writer's
    maintenance once it stayed unreferenced for the grace, never before; referenced parts and
    parts staged for a later apply are never touched."""
    loc = tmp_path / "loc"
    # NB: a deadline a loaded machine's append meets (it took 0.2 s before, and an append
    # can take longer than that at load 13); the grace is the least it allows, twice that
    opts = Options(inline_threshold=0, commit_deadline_seconds=1.0, leak_grace_seconds=2.0)
    blob = FileBlob(loc)
    with persist.open(loc, reentrance_id="a", options=opts) as client:
        w, r = client.create_or_load("c", **KV)
        w.append([((1, 1), 0, 1)], upper=1).result()
        cid = client.state.collections["c"].id
        leaked = layout.data_key(cid, uuid.uuid4().hex)
        staged = layout.data_key(cid, layout.STAGED_PART_PREFIX + uuid.uuid4().hex)
        before = _sample("persist_leaked_blobs_reclaimed_total")
        planted = time.monotonic()
        blob.set(leaked, b"an abandoned part")
        blob.set(staged, b"a part a Spark task staged")
        # NB: sweeps run at most twice per grace, from the background thread or an explicit
        # maintain(); the blob must not go before a grace passed since it appeared. (That it
        # goes within about two graces is a matter of speed, which a loaded machine does not
        # give; the sweeper's own tests check it with their clock, tests/runtime/
        # test_staging_lease.py.)
        while blob.get(leaked) is not None and time.monotonic() - planted < PATIENCE:
            client.maintain()
            time.sleep(0.02)
        gone = time.monotonic() - planted
        assert blob.get(leaked) is None
        assert gone >= 2.0
        assert blob.get(staged) is not None
        assert r.snapshot(0).to_python() == [((1, 1), 0, 1)]  # referenced parts untouched
        assert _sample("persist_leaked_blobs_reclaimed_total") == before + 1
    report = verify(resolve(loc).read_half(), url=str(loc))
    assert report.problems == []
    assert report.leaked == [staged]


def test_leak_grace_must_outlast_the_commit_deadline() -> None:
    with pytest.raises(InvalidUsage, match="leak_grace_seconds"):
        Options(commit_deadline_seconds=60.0, leak_grace_seconds=100.0)
    assert Options(leak_grace_seconds=None).leak_grace_seconds is None


class Event(msgspec.Struct):
    """A value type stored as msgpack (``persist.msgpack(Event)``)."""

    amount: int


@pytest.mark.parametrize(("key", "value"), [
    (1.5, 1), (True, 1), ("1", 1), (1, 2.5), (1, "1"), (1, b"1"),
])
def test_keys_and_values_that_do_not_fit_are_refused(tmp_path: Path, key: object,
                                                     value: object) -> None:
    """pyarrow converts silently (1.5 into int64 is 1, True into float64 1.0); persist refuses."""
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", **KV)
        with pytest.raises(SchemaMismatch, match="does not fit"):
            w.append([((key, value), 0, 1)], upper=1).result()
        assert r.upper == 0


def test_python_typed_values_are_checked_when_written_not_when_read(tmp_path: Path) -> None:
    """A value that does not fit its msgspec type used to be stored, and every read of the
    collection then failed with msgspec's own ValidationError."""
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=persist.msgpack(Event))
        for bad in (42, Event("x"), {"amount": "x"}):  # type: ignore[arg-type]
            with pytest.raises(SchemaMismatch, match="does not encode as"):
                w.append([((1, bad), 0, 1)], upper=1).result()
        w.append([((1, Event(5)), 0, 1)], upper=1).result()
        assert r.snapshot(0).to_python() == [((1, Event(5)), 0, 1)]


def test_arrow_columns_are_cast_only_within_a_kind(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("c", **KV)
        base = {"key": pa.array([1], pa.int32()), "value": [1],
                "time": pa.array([0], pa.uint64()), "diff": [1]}
        for name, col in (("key", pa.array([True])), ("value", pa.array(["1"])),
                          ("value", pa.array([1.0]))):
            with pytest.raises(SchemaMismatch, match=f"'{name}' of type"):
                w.append(pa.table({**base, name: col}), upper=1).result()
        w.append(pa.table(base), upper=1).result()  # int32 -> int64 widens
        assert r.snapshot(0).to_python() == [((1, 1), 0, 1)]


def test_async_wait_for_upper_waits_and_async_snapshots_check_at_the_call(
    tmp_path: Path,
) -> None:
    """wait_for_upper(timeout=None) raised InvalidUsage at once instead of waiting, and an
    AsyncSnapshot outside [since, upper) was accepted until awaited."""
    import asyncio
    import threading

    async def main() -> None:
        client = await persist.aio.open(tmp_path / "loc", reentrance_id="a")
        try:
            w, r = await client.create_or_load("c", **KV)
            with pytest.raises(InvalidUsage, match="not below its upper"):
                r.snapshot(0)
            timer = threading.Timer(0.2, lambda: w.sync.append([((1, 1), 0, 1)], upper=3))
            timer.start()
            assert await r.wait_for_upper(1) == 3  # no timeout: waits for the seal
            timer.join()
            assert await r.snapshot(2).to_python() == [((1, 1), 2, 1)]
            with pytest.raises(persist.Timeout):
                await r.wait_for_upper(5, timeout=0.05)
        finally:
            await client.stop()

    asyncio.run(main())
