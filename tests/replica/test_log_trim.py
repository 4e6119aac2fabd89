"""``Machine.refresh``/``load`` on a replica while the writer trims the metadata log."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from persist import layout
from persist.blob.base import BlobRead
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.state.machine import Machine
from persist.runtime.replica import CountingRead, Follower
from tests.replica.helpers import eventually
from tests.support.engine import Engine


@pytest.fixture
def blob() -> MemoryBlob:
    return MemoryBlob()


def _writer(blob: MemoryBlob) -> Engine:
    ix = Engine.open(blob, epoch=1, writer="w", options=Options(gc_grace_seconds=0, rollup_every=2))
    ix.fence()
    ix.register("c", pa.string(), pa.int64())
    return ix


def _commit_and_trim(ix: Engine, n: int) -> None:
    for _ in range(n):
        t = ix.state.collections["c"].upper
        ix.write({"c": [(("k", 1), t, 1)]})
        ix.seal("c", t + 1)
        ix.maybe_rollup()
        ix.trim_metadata()


def test_a_missing_next_entry_is_trusted_only_until_verified(blob: MemoryBlob) -> None:
    ix = _writer(blob)
    counted = CountingRead(blob.read_only())
    m = Machine(counted, gc_grace_seconds=300)  # assumes more grace than the writer gives
    stale = m.load()
    _commit_and_trim(ix, 6)
    assert blob.get(layout.log_key(stale.seq + 1, meta.log_from(ix.state))) is None  # trimmed past the replica
    before = counted.counts
    assert m.refresh(stale).seq == stale.seq  # within the trust window: one GET, no LIST
    after = counted.counts
    assert (after["get_meta"] - before["get_meta"], after["list"] - before["list"]) == (1, 0)
    assert m.refresh(stale, verify=True) == ix.state
    assert m.refresh(stale, expect_seq=stale.seq + 1) == ix.state  # a push for a vanished seq


def test_a_reader_that_assumes_the_writers_grace_catches_up_by_itself(blob: MemoryBlob) -> None:
    ix = _writer(blob)
    m = Machine(blob.read_only(), gc_grace_seconds=0)
    stale = m.load()
    _commit_and_trim(ix, 6)
    assert m.refresh(stale) == ix.state


def test_refresh_follows_an_untrimmed_log_with_gets_only(blob: MemoryBlob) -> None:
    ix = Engine.open(blob, epoch=1, writer="w")
    ix.fence()
    counted = CountingRead(blob.read_only())
    m = Machine(counted)
    state = m.load()
    ix.register("c", pa.string(), pa.int64())
    ix.seal("c", 5)
    before = counted.counts
    assert m.refresh(state) == ix.state  # two new entries, then the miss that ends the chain
    after = counted.counts
    assert (after["get_meta"] - before["get_meta"], after["list"] - before["list"]) == (3, 0)
    # told by a push how far the log goes, it skips the confirming miss: one GET per commit
    state = ix.state
    ix.seal("c", 6)
    ix.seal("c", 7)
    before = counted.counts
    assert m.refresh(state, expect_seq=ix.state.seq) == ix.state
    after = counted.counts
    assert (after["get_meta"] - before["get_meta"], after["list"] - before["list"]) == (2, 0)


class _TrimsDuringLoad(BlobRead):
    """Runs the writer (commit, rollup, trim) right after the reader listed the rollups."""

    def __init__(self, inner: MemoryBlob, ix: Engine, times: int) -> None:
        self._inner = inner
        self._ix = ix
        self._times = times

    def _get(self, key: str) -> bytes | memoryview | None:
        return self._inner._get(key)

    def _list(self, prefix: str) -> list[str]:
        keys = self._inner._list(prefix)
        if prefix == layout.ROLLUP_PREFIX and self._times > 0:
            self._times -= 1
            _commit_and_trim(self._ix, 3)
        return keys


def test_load_retries_when_the_log_is_trimmed_under_it(blob: MemoryBlob) -> None:
    ix = _writer(blob)
    _commit_and_trim(ix, 3)
    m = Machine(_TrimsDuringLoad(blob, ix, times=2))
    assert m.load() == ix.state


def test_a_misconfigured_follower_catches_up_within_its_verify_interval(
    blob: MemoryBlob,
) -> None:
    ix = _writer(blob)
    replica = Engine.open(blob.read_only())  # default options: assumes 300 s of grace
    follower = Follower(replica, min_poll=0.01, max_poll=0.05, verify_interval=(0.2, 0.5, 0.5))
    try:
        _commit_and_trim(ix, 10)
        eventually(lambda: follower.published.state == ix.state,
                   what="the follower reloading past the trimmed log")
        assert follower.verifies >= 1
    finally:
        follower.stop()


def test_replicas_follow_a_sharded_log_through_trims_on_a_file_store(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Format 7 on a file store (shards of 4 entries here): a replica that follows every
    commit, and one that is left behind while whole shards are trimmed and their directories
    removed, both reach the writer's state, through the switch to the sharded log."""
    monkeypatch.setattr(layout, "LOG_SHARD", 4)
    store = FileBlob(tmp_path / "loc", fsync=False)
    ix = Engine.open(store, epoch=1, writer="w", options=Options(gc_grace_seconds=0,
                                                                 rollup_every=3))
    follower_m = Machine(store.read_only(), gc_grace_seconds=0)
    behind_m = Machine(store.read_only(), gc_grace_seconds=0)
    following = follower_m.load()
    behind = behind_m.load()
    assert following.seq == behind.seq == 0
    ix.fence()  # the switch: seq 1 at its flat key, every later entry under a shard
    assert meta.log_from(ix.state) == 2
    ix.register("c", pa.string(), pa.int64())
    for _ in range(8):
        _commit_and_trim(ix, 5)
        following = follower_m.refresh(following)
        assert following == ix.state
    assert behind_m.refresh(behind, verify=True) == ix.state
    # what the trims left: the newest entries in the newest shards; no empty shard behind
    log_dir = tmp_path / "loc" / layout.LOG_PREFIX
    shards = [p for p in log_dir.iterdir() if p.is_dir()]
    upcoming = layout.log_key(ix.state.seq + 1, 2).split("/")[2]  # may be empty: not yet whole
    assert shards
    assert all(any(p.iterdir()) for p in shards if p.name != upcoming)
    assert store.get(layout.log_key(1)) is None  # the switch, trimmed: behind had to reload
    assert len(shards) <= 3
    assert Machine(store.read_only()).load() == ix.state
    assert Machine(store).load() == ix.state  # a writer's load: one LIST after the rollup
