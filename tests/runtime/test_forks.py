"""Forks: ``Client.fork`` in one location, ``persist.fork`` across locations of one store.

A fork's contents as of every time up to its ``as_of`` are its source's, it is made in one
commit without writing a data blob, and fork and source then evolve independently (writes,
seals, compaction, schema evolution). Shared blobs are deleted only once nothing reads them:
here, through the state's references; across locations, through pins the source's GC honours.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import forks, layout
from persist.blob.file import FileBlob
from persist.errors import InvalidUsage, UnknownCollection
from persist.indexed.format import meta
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import verify
from persist.indexed.state import pins, refs

# NB: small parts are blobs here (inline 0) unless a test says otherwise, and GC runs with no
# grace, so every shared blob meets the GC right away. The commit deadline is long enough for a
# busy machine (it also bounds how long an unread pin lives: twice the deadline); the one test
# of a late commit shortens it for its destination only.
OPTIONS = persist.Options(inline_threshold=0, gc_grace_seconds=0.0,
                          commit_deadline_seconds=2.0, leak_grace_seconds=None,
                          background_compaction=False,
                          compaction=CompactionPolicy(fanin=2))


class Item(msgspec.Struct, frozen=True):
    n: int


class Item2(msgspec.Struct, frozen=True):
    n: int
    note: str | None = None


def fill(client: persist.Client, name: str, times: range) -> None:
    w, _ = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
    for t in times:
        w.append([((f"k{t % 3}", t), t, 1), ((f"k{(t + 1) % 3}", t - 1), t, -1)],
                 upper=t + 1).result()


def contents(read: persist.ReadHandle, t: int) -> Counter[tuple[Any, Any]]:
    return Counter({kv: d for (kv, _, d) in read.snapshot(t).to_python()})


def data_keys(path: Path) -> set[str]:
    return set(FileBlob(path).list_keys(layout.DATA_PREFIX))


def _live(client: persist.Client, name: str) -> set[str]:
    """The blob keys of ``name``'s parts in ``client``'s current state."""
    return {p.blob_key for p in client.state.collections[name].parts if p.blob_key}


def collect(client: persist.Client, rounds: int = 3) -> None:
    for _ in range(rounds):
        client.maintain()


def test_fork_reads_as_its_source_and_writes_no_blob(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(loc, options=OPTIONS) as client:
        fill(client, "e", range(6))
        collect(client)  # merged parts span several times: a fork cuts those
        _, src = client.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        want = {t: contents(src, t) for t in range(6)}
        before, seq = data_keys(loc), client.state.seq
        assert client.fork("e", into="e2", as_of=3).result() == seq + 1  # one commit
        assert data_keys(loc) == before  # no data blob written
        _, fork = client.create_or_load("e2", key_type=pa.string(), value_type=pa.int64())
        assert (fork.since, fork.upper) == (src.since, 4)
        for t in range(4):
            assert contents(fork, t) == want[t]
        c = client.state.collections["e2"]
        assert meta.collection_version(c) == meta.REFS_FORMAT_VERSION
        # parts whose rows reach past 3 are cut there; the rest are plain references
        assert any(layout.parse_ref(p.blob_key or "")[2] == 3 for p in c.parts)
        assert all(p.max_time <= 3 for p in c.parts)
        assert c.lineage is not msgspec.UNSET
        assert c.lineage.source == "e"
        # the default: as of the latest sealed time
        client.fork("e", into="latest").result()
        _, latest = client.create_or_load("latest", key_type=pa.string(),
                                          value_type=pa.int64())
        assert latest.upper == 6
        assert contents(latest, 5) == want[5]


def test_inline_parts_are_cut_by_their_bytes(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=persist.Options(inline_threshold=1 << 20)) as c:
        w, src = c.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        # one inline part spanning times 0..4
        w.append([((f"k{t}", t), t, 1) for t in range(5)], upper=5).result()
        c.fork("e", into="f", as_of=2).result()
        _, fork = c.create_or_load("f", key_type=pa.string(), value_type=pa.int64())
        (part,) = c.state.collections["f"].parts
        assert part.inline is not None
        assert (part.rows, part.max_time) == (3, 2)
        assert contents(fork, 2) == contents(src, 2)


def test_fork_and_source_evolve_independently(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(loc, options=OPTIONS) as client:
        w, src = client.create_or_load("e", key_type=pa.string(), value_type=Item)
        for t in range(4):
            w.append([((f"k{t}", Item(t)), t, 1)], upper=t + 1).result()
        snap2 = contents(src, 2)
        client.fork("e", into="f", as_of=2).result()
        fw, fr = client.create_or_load("f", key_type=pa.string(), value_type=Item)
        fw.append([(("only-in-fork", Item(9)), 3, 1)], upper=5).result()
        w.append([(("only-in-source", Item(8)), 4, 1)], upper=6).result()
        # a schema evolution of the fork leaves the source's schema alone
        assert client.evolve_schema("f", value_type=Item2).result() == 1
        fw2, fr2 = client.create_or_load("f", key_type=pa.string(), value_type=Item2)
        fw2.append([(("evolved", Item2(7, "x")), 5, 1)], upper=6).result()
        assert client.state.collections["e"].schemas is msgspec.UNSET
        assert contents(fr, 2) == snap2  # before compaction: the fork as of 2 is the source's
        # both compact their own parts, forwarding their own times
        w.allow_compaction(5).result()
        fw2.allow_compaction(5).result()
        collect(client)
        got_fork = contents(fr2, 5)
        got_src = contents(src, 5)
        assert ("only-in-source", Item(8)) in got_src
        assert ("only-in-fork", Item2(9)) in got_fork
        assert ("only-in-fork", Item(9)) not in got_src
        assert ("only-in-source", Item2(8)) not in got_fork
        assert ("evolved", Item2(7, "x")) in got_fork
        assert {k for (k, _) in got_fork} == {"k0", "k1", "k2", "only-in-fork", "evolved"}
    report = verify(FileBlob(loc))
    assert report.problems == []
    assert report.leaked == []


def test_shared_blobs_live_until_nothing_reads_them(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(loc, options=OPTIONS) as client:
        w, _ = client.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        w.append([((f"k{t}", t), t, 1) for t in range(5)], upper=5).result()  # one part
        client.fork("e", into="f").result()
        client.fork("f", into="g").result()  # a fork of a fork
        (shared,) = {refs.blob_of(p)[1] for p in client.state.collections["g"].parts}  # type: ignore[index]
        # the source merges its part away (a fork's single part is not merged): the forks
        # still read it, so it is neither retired nor deleted
        w.append([((f"n{i}", 5), 5, 1) for i in range(5)], upper=6).result()  # same level
        w.allow_compaction(5).result()
        collect(client)
        assert all(refs.blob_of(p)[1] != shared for p in client.state.collections["e"].parts)  # type: ignore[index]
        assert shared in data_keys(loc)
        assert shared not in {r.key for r in client.state.retired}
        for name in ("f", "g"):
            fw, fr = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
            fw.append([((f"{name}{i}", 1), 5, 1) for i in range(5)], upper=6).result()
            fw.allow_compaction(5).result()
            collect(client)
            assert (shared in data_keys(loc)) == (name == "f")  # g still reads it after f
            assert len(contents(fr, 5)) == 10
        # every reader let go: retired and deleted, nothing leaked
        live = refs.referenced(client.state.collections.values())
        assert data_keys(loc) == live
        assert not client.state.retired
    assert verify(FileBlob(loc)).problems == []


def test_bad_forks_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=OPTIONS) as client:
        fill(client, "e", range(4))
        client.create_or_load("taken", key_type=pa.string(), value_type=pa.int64())
        w, _ = client.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(2).result()
        before = client.state
        with pytest.raises(InvalidUsage, match="exists already"):
            client.fork("e", into="taken").result()
        with pytest.raises(UnknownCollection):
            client.fork("missing", into="x").result()
        with pytest.raises(InvalidUsage, match="outside"):
            client.fork("e", into="x", as_of=1).result()  # below since
        with pytest.raises(InvalidUsage, match="outside"):
            client.fork("e", into="x", as_of=4).result()  # not sealed
        with pytest.raises(InvalidUsage, match="non-empty"):
            client.fork("e", into="")
        assert client.state.seq == before.seq


def test_fork_across_locations_pins_the_source(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    src = persist.open(a, options=OPTIONS)
    try:
        fill(src, "e", range(5))
        _, sr = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        want = contents(sr, 3)
        before = data_keys(a)
        # NB: through a destination writer with this test's options: the pin records its
        # commit deadline, and the source releases it only after twice that
        with persist.open(b, options=OPTIONS) as dst:
            persist.fork(str(a), "e", str(b), into="copy", as_of=3, client=dst)
        assert data_keys(a) == before
        assert not (b / "data").exists()
        (pin,) = pins.listing(FileBlob(a))
        with persist.open(b, options=OPTIONS) as dst:
            _, fr = dst.create_or_load("copy", key_type=pa.string(), value_type=pa.int64())
            assert contents(fr, 3) == want
            assert set(pin.keys) == refs.foreign(dst.state.collections.values())[
                FileBlob(a).locator()[1]]  # type: ignore[index]
            # the source merges everything away and collects: the pinned blobs stay
            w, _ = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
            w.allow_compaction(4).result()
            collect(src)
            assert set(pin.keys) <= data_keys(a)
            assert {r.key for r in src.state.retired} >= set(pin.keys)
            assert contents(fr, 3) == want
            # the fork lets go of them: the source's GC releases the pin and deletes them
            fw, _ = dst.create_or_load("copy", key_type=pa.string(), value_type=pa.int64())
            fw.append([(("b-only", 1), 4, 1)], upper=5).result()
            fw.allow_compaction(4).result()
            collect(dst)
            assert not refs.foreign(dst.state.collections.values())
        deadline = time.monotonic() + 60
        while pins.listing(FileBlob(a)) and time.monotonic() < deadline:
            src.maintain()
            time.sleep(0.05)
        src.maintain()
        assert not pins.listing(FileBlob(a))
        assert not set(pin.keys) & data_keys(a)
        assert not src.state.retired
    finally:
        src.stop()
    assert verify(FileBlob(a)).problems == []
    assert verify(FileBlob(b)).problems == []


def test_fork_across_locations_through_an_open_writer_and_back(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with persist.open(a, options=OPTIONS) as src, persist.open(b, options=OPTIONS) as dst:
        fill(src, "e", range(3))
        persist.fork(str(a), "e", str(b), into="e", client=dst)
        # and back again: the source reads its own blobs through a reference
        persist.fork(str(b), "e", str(a), into="returned", client=src)
        _, back = src.create_or_load("returned", key_type=pa.string(), value_type=pa.int64())
        _, orig = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        assert contents(back, 2) == contents(orig, 2)
        with pytest.raises(InvalidUsage, match="exists already"):
            persist.fork(str(a), "e", str(b), into="e", client=dst)
        with pytest.raises(InvalidUsage, match="one store"):
            persist.fork(str(a), "e", "mem://elsewhere", into="x")
    assert len(pins.listing(FileBlob(a))) == 2  # one per fork that read a's blobs


def test_fork_plans_again_when_the_source_retires_what_it_pinned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create-then-verify step: a compaction and GC of the source between the fork's plan
    and its pin retire what it planned on; the verification sees it, and the fork plans
    again on the newer state instead of referencing blobs about to be deleted."""
    a, b = tmp_path / "a", tmp_path / "b"
    with persist.open(a, options=OPTIONS) as src:
        fill(src, "e", range(4))
        _, sr = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        want = contents(sr, 3)
        real = pins.create
        calls = []

        def racing_create(blob: Any, **kw: Any) -> pins.Pin:
            if not calls:  # the first pin only: the source compacts right before it
                w, _ = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
                w.allow_compaction(3).result()
                collect(src)
            calls.append(kw["keys"])
            return real(blob, **kw)

        monkeypatch.setattr(pins, "create", racing_create)
        persist.fork(str(a), "e", str(b), into="e")
        assert len(calls) == 2  # planned again once
        assert not set(calls[0]) & data_keys(a)  # what it first planned on is gone
        with persist.open(b, options=OPTIONS) as dst:
            _, fr = dst.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
            assert contents(fr, 3) == want
        assert len(pins.listing(FileBlob(a))) == 1  # the first attempt's pin was removed


def _prepare(a: Path, b: Path, into: str, as_of: int, within: float) -> forks.Prepared:
    """Steps 1 of a fork of ``e`` from file location ``a`` into ``b`` (planned, pinned,
    verified), promising a commit within ``within`` seconds."""
    here, there = FileBlob(a).locator(), FileBlob(b).locator()
    assert here is not None
    assert there is not None
    prepared = forks.prepare(FileBlob(a), here[1], there[1], "e", into=into, as_of=as_of,
                             commit_within=within)
    assert prepared is not None
    return prepared


def test_prepare_then_a_late_commit_is_refused(tmp_path: Path) -> None:
    """A fork whose commit comes later than the destination's commit deadline after its pins
    is refused (so the source's GC, which releases an unread pin only after twice that
    deadline, can never delete what a fork commit will still reference)."""
    a, b = tmp_path / "a", tmp_path / "b"
    hasty = dataclasses.replace(OPTIONS, commit_deadline_seconds=0.2)
    with persist.open(a, options=OPTIONS) as src, persist.open(b, options=hasty) as dst:
        fill(src, "e", range(2))
        prepared = _prepare(a, b, "late", 1, hasty.commit_deadline_seconds)
        assert pins.listing(FileBlob(a))[0].commit_within == hasty.commit_deadline_seconds
        time.sleep(hasty.commit_deadline_seconds * 1.5)
        with pytest.raises(persist.CommitDeadline):
            dst.register_fork(prepared.planned, into="late",
                              pinned_at=prepared.started).result()
        assert "late" not in dst.collections


def test_the_pins_bound_holds_whatever_the_two_deadlines(tmp_path: Path) -> None:
    """A source and a destination with different commit deadlines: the pin records the bound
    the forker commits within, so a source with a short deadline (a short release grace)
    keeps what a patient destination's fork will read until twice that bound, not its own;
    and a destination whose deadline grew after the pins were made still commits within the
    bound they promised."""
    a, b = tmp_path / "a", tmp_path / "b"
    hasty = dataclasses.replace(OPTIONS, commit_deadline_seconds=0.2)  # releases after 0.4 s
    patient = dataclasses.replace(OPTIONS, commit_deadline_seconds=3.0)
    with persist.open(a, options=hasty) as src, persist.open(b, options=patient) as dst:
        fill(src, "e", range(4))
        _, sr = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        want = contents(sr, 2)
        prepared = _prepare(a, b, "slow", 2, patient.commit_deadline_seconds)
        pinned = set(prepared.pins[0][1].keys)
        # the source merges the pinned blobs away and collects for well past its own grace
        w, _ = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(3).result()
        until = time.monotonic() + 4 * hasty.commit_deadline_seconds + 0.5
        give_up = time.monotonic() + 60
        while time.monotonic() < until or pinned & _live(src, "e"):
            assert time.monotonic() < give_up, "the source never merged the pinned parts away"
            # NB: a merge must be sent within half of the 0.2 s deadline; on a loaded machine
            # it may not be, which is the documented "try again" (the next round plans it
            # anew). The loop runs until a merge did land.
            with contextlib.suppress(persist.CommitDeadline):
                src.maintain()
            time.sleep(0.05)
        assert not pinned & _live(src, "e")  # merged away: only the pins keep them
        assert pinned <= data_keys(a)
        assert len(pins.listing(FileBlob(a))) == 1
        seq = dst.register_fork(prepared.planned, into="slow", pinned_at=prepared.started,
                                within=prepared.commit_within).result()
        assert seq == dst.state.seq
        _, fr = dst.create_or_load("slow", key_type=pa.string(), value_type=pa.int64())
        assert contents(fr, 2) == want
        # a bound shorter than the destination's deadline is the one that counts
        again = _prepare(a, b, "late", 3, 0.1)
        time.sleep(0.3)
        with pytest.raises(persist.CommitDeadline, match="promised the source"):
            dst.register_fork(again.planned, into="late", pinned_at=again.started,
                              within=again.commit_within).result()
        assert "late" not in dst.collections
        with pytest.raises(persist.InvalidUsage, match="within"):
            dst.register_fork(again.planned, into="late", pinned_at=again.started, within=-1)


def test_async_fork_and_tag(tmp_path: Path) -> None:
    async def main() -> None:
        async with await persist.aio.open(tmp_path / "loc", options=OPTIONS) as client:
            w, r = await client.create_or_load("e", key_type=pa.string(),
                                               value_type=pa.int64())
            for t in range(3):
                await w.append([((f"k{t}", t), t, 1)], upper=t + 1)
            await client.fork("e", into="f", as_of=1)
            assert await client.tag("e", "t1", as_of=1) > 0
            _, f = await client.create_or_load("f", key_type=pa.string(), value_type=pa.int64())
            assert (f.upper, await f.snapshot(1).to_python()) == (
                2, await r.snapshot(1).to_python())
            await client.untag("e", "t1")
            with pytest.raises(InvalidUsage, match="exists already"):
                await client.fork("e", into="f")

    asyncio.run(main())


def test_a_format_1_pin_still_reads_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    """A pin stored before the bound travelled in it (format 1, no ``commit_within_ms``) still
    decodes, with no bound of its own (the source's grace applies); a pin of a format newer
    than this persist knows is refused, so a GC deletes nothing it cannot judge."""
    blob = FileBlob(tmp_path / "loc")
    v1 = {"version": 1, "id": "old", "location": "/elsewhere", "keys": ["data/1/x"],
          "holder": "h:1", "note": "fork of 'e' into 'e'", "created_ms": 1}
    blob.set_if_absent(layout.pin_key("old"), msgspec.msgpack.encode(v1))
    old = pins.read(blob, layout.pin_key("old"))
    assert old is not None
    assert (old.version, old.keys, old.commit_within) == (1, ("data/1/x",), None)
    newer = {**v1, "id": "new", "version": pins.PIN_FORMAT_VERSION + 1}
    blob.set_if_absent(layout.pin_key("new"), msgspec.msgpack.encode(newer))
    with pytest.raises(persist.IncompatibleFormat):
        pins.read(blob, layout.pin_key("new"))
