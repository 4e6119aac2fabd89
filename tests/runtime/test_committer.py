"""``persist.distributed.Committer``, the exactly-once commit protocol, in one process: a token
makes a replay a no-op; an unknown outcome (real injected storage faults) is settled from the
log; a kept writer is reused, and replaced when it lost its lock; a declined or failed commit
discards its staged parts. And the staged parts themselves: bound to their location,
collection and types, checksummed, their inline payload validated (issue 21, #19 and #21)."""

from __future__ import annotations

import asyncio
import pickle
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import aio, distributed, layout
from persist.blob.envelope import MAGIC
from persist.blob.unreliable import BLOB_OPS, FaultPlan, Faults, UnreliableBlob
from persist.distributed import Committer, StagedPart, Stager, Token
from persist.errors import (
    ChecksumMismatch,
    Corruption,
    Determinate,
    IncompatibleFormat,
    InvalidUsage,
    LockHeld,
    PersistError,
    SchemaMismatch,
)
from persist.indexed.engine import Indexed
from persist.location import resolve
from persist.runtime.client import Client
from persist.runtime.runtime import Runtime


def _table(keys: range, t: int = 0, value: int = 1) -> pa.Table:
    n = len(keys)
    return pa.table({"key": [f"k{i}" for i in keys], "value": pa.array([value] * n, pa.int64()),
                     "time": pa.array([t] * n, pa.uint64()),
                     "diff": pa.array([1] * n, pa.int64())})


def _location(tmp_path: Path, name: str = "loc", *, value_type: Any = None) -> str:
    url = f"file://{tmp_path}/{name}"
    with persist.open(url) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=value_type or pa.int64())
    return url


def _contents(url: str, as_of: int) -> dict[tuple[Any, Any], int]:
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        return {kv: d for kv, _, d in r.snapshot(as_of).to_python()}


def _data_blobs(url: str) -> set[str]:
    """The names of the staged parts' blobs of the location at ``url``. NB: staged ones only:
    the writer's own parts (the token collection's rows) are blobs too under a knob set with
    a small inline threshold, and they are not what these tests count."""
    root = Path(url.removeprefix("file://")) / "data"
    return {p.name for p in root.rglob("*")
            if p.is_file() and p.name.startswith(layout.STAGED_PART_PREFIX)}


def test_a_token_lands_once_and_a_replay_is_discarded(tmp_path: Path) -> None:
    url = _location(tmp_path)
    stager = Stager.start(url, "c", job="test", inline_bytes=0)
    with Committer(url, reentrance_id="loader") as committer:
        first = [stager.stage(_table(range(100)))]
        assert committer.commit({"c": first}, seals={"c": 1}, token=Token("load", 1))
        again = [stager.stage(_table(range(100)))]  # a retried job stages its data again
        assert again[0].part.blob_key is not None
        assert not committer.commit({"c": again}, seals={"c": 1}, token=Token("load", 1))
    assert again[0].part.id not in {b for b in _data_blobs(url)}  # discarded
    assert first[0].part.blob_key is not None
    assert first[0].part.blob_key.rsplit("/", 1)[-1] in _data_blobs(url)
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(100)}
    with persist.open(url, read_only=True) as client:
        assert client.token("load") == 1
    stager.release([*first, *again])


def test_a_plan_declines_merges_and_is_refused_when_it_clashes(tmp_path: Path) -> None:
    url = _location(tmp_path)
    stager = Stager.start(url, "c", job="test", inline_bytes=0)
    committer = Committer(url, reentrance_id="loader")
    declined = [stager.stage(_table(range(10)))]
    assert not committer.commit({"c": declined}, plan=lambda client: None)
    assert not _data_blobs(url)  # the declined part's blob is gone
    clash = [stager.stage(_table(range(10)))]
    with pytest.raises(InvalidUsage, match="clashes"):
        committer.commit({"c": clash}, seals={"c": 1}, plan=lambda client: {"seals": {"c": 2}})
    assert not _data_blobs(url)
    made: list[StagedPart] = []

    def more(client: Client) -> dict[str, Any]:
        assert client.info("c").upper == 0  # called on the open writer, under its lock
        made.append(stager.stage(_table(range(10, 20))))
        return {"parts": {"c": made[-1:]}}

    assert committer.commit({"c": [stager.stage(_table(range(10)))]}, seals={"c": 1}, plan=more)
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(20)}
    with pytest.raises(InvalidUsage, match="may return"):
        committer.commit(plan=lambda client: {"tokens": {}})


class _Faulty:
    """Opens writers of ``url`` over a fault-injecting store (the real file store underneath,
    faults off until :meth:`arm`)."""

    def __init__(self, url: str, rid: str) -> None:
        self.url, self.rid = url, rid
        self.blobs: list[UnreliableBlob] = []

    def open(self) -> Client:
        loc = resolve(self.url)
        blob = UnreliableBlob(loc.blob, plan=FaultPlan(7, ops=BLOB_OPS, name="blob"))
        self.blobs.append(blob)
        lock = loc.lock()
        lease = lock.acquire(self.rid, timeout=10)
        ix = Indexed.open(blob, epoch=lease.generation, writer=self.rid)
        ix.fence()
        return Client(self.url, ix, runtime=Runtime(ix, lock=lock, lease=lease))

    def arm(self, faults: Faults) -> None:
        """The next metadata commit of the newest writer suffers ``faults``."""
        self.blobs[-1].set_faults({"set_if_absent": faults})


def _faulty_commit(tmp_path: Path, faults: Faults, *, token: bool) -> tuple[str, Any]:
    """Commits 50 staged rows through a committer whose data commit suffers ``faults``;
    returns the location and what the commit returned (or raised)."""
    url = _location(tmp_path)
    faulty = _Faulty(url, "loader")
    committer = Committer(url, reentrance_id="loader", opener=faulty.open)
    # NB: a first token commit registers the token collection (a commit of its own), so the
    # fault below hits the commit of the data itself
    assert committer.commit(seals={"c": 0}, token=Token("load", 0))
    stager = Stager.start(url, "c", job="test", inline_bytes=0)
    staged = [stager.stage(_table(range(50)))]

    def plan(client: Client) -> dict[str, Any]:
        faulty.arm(faults)
        return {}

    try:
        outcome: Any = committer.commit({"c": staged}, seals={"c": 1}, plan=plan,
                                        token=Token("load", 1) if token else None)
    except PersistError as e:
        outcome = e
    assert sum(b.plan.injected[f"set_if_absent.{kind}"] for b in faulty.blobs
               for kind in ("indeterminate", "lost")) == 1
    assert len(faulty.blobs) == 3  # reopened once, to read what happened
    return url, outcome


@pytest.mark.parametrize("token", [True, False], ids=["by-token", "by-parts"])
def test_an_unknown_outcome_that_landed_is_settled_from_the_log(tmp_path: Path,
                                                                token: bool) -> None:
    # the commit is written, and its answer lost: the writer goes fail-stop
    url, outcome = _faulty_commit(tmp_path, Faults(indeterminate=1.0), token=token)
    assert outcome is True
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(50)}
    assert len(_data_blobs(url)) == 1  # kept: it landed


@pytest.mark.parametrize("token", [True, False], ids=["by-token", "by-parts"])
def test_an_unknown_outcome_that_did_not_land_is_a_determinate_failure(tmp_path: Path,
                                                                       token: bool) -> None:
    # the request never reached the store
    url, outcome = _faulty_commit(tmp_path, Faults(lost=1.0), token=token)
    assert isinstance(outcome, Determinate)
    assert "did not land" in str(outcome)
    with persist.open(url, read_only=True) as client:
        assert client.info("c").upper == 0
        assert client.token("load") == 0
    assert not _data_blobs(url)  # discarded: it definitely did not land
    # the job runs again, and lands once
    again = [Stager.start(url, "c", job="again").stage(_table(range(50)))]
    assert Committer(url, reentrance_id="loader").commit({"c": again}, seals={"c": 1},
                                                          token=Token("load", 1))
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(50)}


def test_a_kept_writer_is_reused_then_replaced_after_losing_its_lock(tmp_path: Path) -> None:
    url = _location(tmp_path)
    stager = Stager.start(url, "c", job="test")
    writers = distributed.Writers()
    committer = Committer(url, reentrance_id="sink", keep_writer=60, writers=writers)
    try:
        assert committer.commit({"c": [stager.stage(_table(range(10), 0))]}, seals={"c": 1},
                                token=Token("s", 0))
        kept = writers.take(committer.key)
        assert kept is not None
        writers.keep(committer.key, kept, 60)
        with pytest.raises(LockHeld):  # the kept writer holds the lock
            persist.open(url, reentrance_id="other", lock_timeout=0).stop()
        assert committer.commit({"c": [stager.stage(_table(range(10, 20), 1))]},
                                seals={"c": 2}, token=Token("s", 1))
        again = writers.take(committer.key)
        assert again is kept  # the same writer: no new open
        writers.keep(committer.key, again, 60)
        # a restarted process under the same id takes the lock over (fencing the kept one,
        # which does not know yet) and commits
        with persist.open(url, reentrance_id="sink") as other:
            w, _ = other.create_or_load("side", key_type=pa.string(), value_type=pa.int64())
            w.append([(("x", 1), 0, 1)], upper=1).result()
        assert committer.commit({"c": [stager.stage(_table(range(20, 30), 2))]},
                                seals={"c": 3}, token=Token("s", 2))
        assert not committer.commit({"c": [stager.stage(_table(range(20, 30), 2))]},
                                    seals={"c": 3}, token=Token("s", 2))  # a replay
        replaced = writers.take(committer.key)
        assert replaced is not None
        assert replaced is not kept
        assert kept.stopped
        writers.keep(committer.key, replaced, 60)
    finally:
        committer.close()
    assert writers.idle() == []
    with persist.open(url, reentrance_id="other", lock_timeout=0) as client:  # released
        assert client.token("s") == 2
        assert client.info("side").upper == 1
    assert _contents(url, 2) == {(f"k{i}", 1): 1 for i in range(30)}
    stager.release()


def test_committer_arguments_are_checked() -> None:
    with pytest.raises(InvalidUsage, match="reentrance_id"):
        Committer("mem://x", reentrance_id="")
    with pytest.raises(InvalidUsage, match="keep_writer"):
        Committer("mem://x", reentrance_id="a", keep_writer=-1)
    with pytest.raises(InvalidUsage, match="token must be"):
        Committer("mem://x", reentrance_id="a").commit(token=("a", 1))  # type: ignore[arg-type]


# -- staged parts: bound, checksummed, validated (issue 21, #19 and #21) ----------------------


def test_a_part_staged_elsewhere_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """#19: an inline part staged for a same-named collection with other types at another
    location used to be accepted, and every later read of the collection then failed with
    Corruption."""
    here = _location(tmp_path, "here")
    there = _location(tmp_path, "there", value_type=pa.string())
    foreign = Stager.start(there, "c", job="elsewhere").stage(
        [(("k", "a string"), 0, 1)])
    assert foreign.part.inline is not None
    same_types = Stager.start(_location(tmp_path, "twin"), "c", job="twin").stage(
        [(("k", 5), 0, 1)])
    with persist.open(here) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1)], upper=1).result()
        before = client.state
        with pytest.raises(InvalidUsage, match="not at this location"):
            client.apply(parts={"c": [foreign]}, seals={"c": 2})
        with pytest.raises(InvalidUsage, match="not at this location"):
            client.apply(parts={"c": [same_types]}, seals={"c": 2})
        # the same part claiming to be from here: its types still give it away
        spoofed = msgspec.structs.replace(foreign, location=here)
        with pytest.raises(SchemaMismatch, match="staged for 'c' with key string and value "
                                                 "string"):
            client.apply(parts={"c": [spoofed]}, seals={"c": 2})
        # and without the binding (a bare part): its payload does not decode as the types
        with pytest.raises(Corruption, match="schema"):
            client.apply(parts={"c": [foreign.part]}, seals={"c": 2})
        renamed = msgspec.structs.replace(spoofed, collection_id=99)
        with pytest.raises(InvalidUsage, match="id 99"):
            client.apply(parts={"c": [renamed]}, seals={"c": 2})
        assert client.state is before  # nothing was submitted
        assert r.snapshot(0).to_python() == [(("a", 1), 0, 1)]
    # every reader still reads it
    assert persist.distributed.describe(here, "c").upper == 1
    task = persist.distributed.describe(here, "c").snapshot(0).tasks()[0]
    assert sum(len(t) for t in persist.distributed.read_task(task)) == 1
    assert _contents(here, 0) == {("a", 1): 1}


def test_a_part_is_committed_through_another_spelling_of_its_location(tmp_path: Path) -> None:
    url = _location(tmp_path)
    path = url.removeprefix("file://")
    staged = Stager.start(path + "/", "c", job="test").stage([(("a", 1), 0, 1)])
    with persist.open(url) as client:
        assert client.apply(parts={"c": [staged]}, seals={"c": 1}).result() is not None


def test_an_inline_payload_that_is_not_what_its_metadata_says_is_refused(
        tmp_path: Path) -> None:
    url = _location(tmp_path)
    stager = Stager.start(url, "c", job="test")
    one = stager.stage(_table(range(3)))
    other = stager.stage(_table(range(5)))
    lying = [
        ("rows", msgspec.structs.replace(one, part=msgspec.structs.replace(
            one.part, inline=other.part.inline, nbytes=other.part.nbytes))),
        ("bytes", msgspec.structs.replace(one, part=msgspec.structs.replace(
            one.part, nbytes=one.part.nbytes + 1))),
        ("times", msgspec.structs.replace(one, part=msgspec.structs.replace(
            one.part, max_time=7))),
        ("undecodable", msgspec.structs.replace(one, part=msgspec.structs.replace(
            one.part, inline=b"\0" * one.part.nbytes))),
    ]
    with persist.open(url) as client:
        for why, part in lying:
            with pytest.raises(Corruption, match="inline part"):
                client.apply(parts={"c": [part]}, seals={"c": 1})
            assert client.info("c").upper == 0, why
        assert client.apply(parts={"c": [one]}, seals={"c": 1}).result() is not None
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(3)}


def test_staged_part_bytes_are_checked_before_they_are_decoded(tmp_path: Path) -> None:
    """#21: every single-bit flip and every truncation of an encoded staged part is a typed
    error; none decodes into another part."""
    url = _location(tmp_path)
    staged = Stager.start(url, "c", job="test").stage(_table(range(20)))
    data = staged.to_bytes()
    assert StagedPart.from_bytes(data) == staged
    assert pickle.loads(pickle.dumps(staged)) == staged
    for i in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[i] ^= 1 << bit
            with pytest.raises((Corruption, IncompatibleFormat)):
                StagedPart.from_bytes(bytes(damaged))
    for n in range(len(data)):
        with pytest.raises(Corruption):
            StagedPart.from_bytes(data[:n])
    with pytest.raises(InvalidUsage, match="is bytes"):
        StagedPart.from_bytes("x")  # type: ignore[arg-type]
    # pickle carries the same checked bytes: damage inside them is caught the same way
    pickled = pickle.dumps(staged)
    at = pickled.index(MAGIC) + 40
    damaged = bytearray(pickled)
    damaged[at] ^= 0x10
    with pytest.raises(ChecksumMismatch):
        pickle.loads(bytes(damaged))


def test_a_newer_staged_part_is_refused(tmp_path: Path) -> None:
    url = _location(tmp_path)
    staged = Stager.start(url, "c", job="test").stage(_table(range(2)))
    newer = msgspec.structs.replace(staged, version=staged.version + 1)
    with pytest.raises(IncompatibleFormat, match="stage and commit with the same persist"):
        StagedPart.from_bytes(newer.to_bytes())


def test_async_apply_takes_parts_holds_and_tokens(tmp_path: Path) -> None:
    url = _location(tmp_path)
    stager = Stager.start(url, "c", job="test")
    staged = [stager.stage(_table(range(4)))]

    async def main() -> tuple[int | None, int | None, dict[str, int]]:
        async with await aio.open(url, reentrance_id=f"a-{uuid.uuid4().hex}") as client:
            first = await client.apply(parts={"c": staged}, seals={"c": 1},
                                       holds={"c": {"reader": 0}}, token=Token("t", 1))
            replay = await client.apply(parts={"c": staged}, seals={"c": 1},
                                        token=Token("t", 1))
            return first, replay, dict(client.sync.info("c").holds)

    first, replay, holds = asyncio.run(main())
    assert first is not None
    assert replay is None
    assert holds == {"reader": 0}
    assert _contents(url, 0) == {(f"k{i}", 1): 1 for i in range(4)}


def test_an_overwrite_retracts_the_old_contents_range_by_range(tmp_path: Path) -> None:
    """``Overwrite`` (the engine's overwrite as retraction): the collection as of the
    overwrite's time holds the new rows only, history before it is unchanged, and the old
    contents were read one key range at a time."""
    url = str(tmp_path)
    options = persist.Options(inline_threshold=0, batch_rows=8, background_compaction=False)
    with persist.open(url, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{(i * 7 + t) % 50:03d}", i % 3), t, 1 if i % 4 else -1)
                      for i in range(60)], upper=t + 1).result()
        before = r.snapshot(3).to_python()
    stager = Stager.start(url, "c", job="overwrite", inline_bytes=0)
    new = [stager.stage([(("x", 1), 4, 1), (("y", 2), 4, 3)])]
    over = distributed.Overwrite("c", 4, stager, schema_version=0, rows_per_range=25)
    with Committer(url, reentrance_id="over") as committer:
        assert committer.commit({"c": new}, seals={"c": 5}, plan=over)
    stager.release([*new, *over.staged])
    assert len(over.staged) > 3  # range by range
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert r.upper == 5
        assert r.snapshot(4).to_python() == [(("x", 1), 4, 1), (("y", 2), 4, 3)]
        assert r.snapshot(3).to_python() == before
    # another write moved the upper meanwhile: refused, nothing written
    late = distributed.Overwrite("c", 4, stager, schema_version=0)
    with Committer(url, reentrance_id="over") as committer, \
            pytest.raises(persist.InvalidUsage, match="moved the upper to 5"):
        committer.commit({"c": []}, seals={"c": 6}, plan=late)
    assert late.staged == []
