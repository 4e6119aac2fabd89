"""Restore: a new commit that puts the collections back as they were at an earlier seq (an undo,
frontiers moving backwards), while the blobs that state reads still exist."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import InvalidUsage
from persist.indexed.maintenance import restore
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import verify
from persist.indexed.state import refs

#: GC keeps retired blobs for a while (a restore takes them back); compaction only on demand.
KEEP = persist.Options(inline_threshold=0, gc_grace_seconds=300.0, background_compaction=False,
                       compaction=CompactionPolicy(fanin=2))


def snapshots(client: persist.Client, name: str) -> dict[int, list[object]]:
    _, r = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
    return {t: r.snapshot(t).to_python() for t in range(r.since, r.upper)}


def test_restore_puts_the_state_back_and_takes_its_blobs_back_from_gc(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(loc, options=KEEP) as client:
        w, _r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        client.tag("c", "before", as_of=2).result()
        seq, old = client.state.seq, client.state.collections["c"]
        want = snapshots(client, "c")
        # after seq: more writes, a new collection, a fork, compaction retiring old parts
        for t in range(4, 7):
            w.append([((f"k{t}", t), t, 1), ((f"k{t - 4}", t - 4), t, -1)], upper=t + 1).result()
        client.untag("c", "before").result()
        w.allow_compaction(6).result()
        client.create_or_load("later", key_type=pa.string(), value_type=pa.int64())
        client.fork("c", into="fork").result()
        client.maintain()
        client.maintain()
        retired = {x.key for x in client.state.retired}
        assert retired & refs.referenced([old])  # the restore needs some retired blobs back
        plan = client.restore(seq)
        assert plan.backwards
        assert plan.unretired > 0
        c = client.state.collections["c"]
        assert (c.since, c.upper, c.holds, c.parts) == (old.since, old.upper, old.holds,
                                                         old.parts)
        assert refs.restored_at(c) == client.state.seq
        assert client.collections == ["c"]  # registered after seq: gone
        assert snapshots(client, "c") == want
        assert not {x.key for x in client.state.retired} & refs.referenced([c])
        # writes go on from the restored upper
        w2, r2 = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w2.append([(("after", 1), 4, 1)], upper=5).result()
        assert ("after", 1) in {kv for kv, _, _ in r2.snapshot(4).to_python()}
        # a new collection gets a fresh id: a dropped one's blobs are never reused
        client.create_or_load("later", key_type=pa.string(), value_type=pa.int64())
        assert client.state.collections["later"].id > max(
            x.id for x in client.state.collections.values() if x.name != "later")
    report = verify(FileBlob(loc))
    assert report.problems == []
    assert report.leaked == []


def test_listeners_of_a_rewound_collection_fail(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=KEEP) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1)], upper=1).result()
        seq = client.state.seq
        listener = r.listen(0, poll=0.05)
        w.append([(("b", 1), 1, 1)], upper=2).result()
        assert listener.poll(5.0)  # delivered up to 2
        client.restore(seq)
        w.append([(("c", 1), 1, 1)], upper=3).result()  # a new history past the old upper
        with pytest.raises(InvalidUsage, match="restored"):
            listener.poll(5.0)


def test_seqs_that_cannot_be_restored_are_refused_saying_why(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    eager = persist.Options(inline_threshold=0, gc_grace_seconds=0.0, rollup_every=64,
                            background_compaction=False, compaction=CompactionPolicy(fanin=2))
    with persist.open(loc, options=eager) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        early = client.state.seq
        w.allow_compaction(3).result()
        client.maintain()
        client.maintain()  # merged, retired and deleted at once (no grace)
        with pytest.raises(InvalidUsage, match="garbage collected"):
            client.restore(early)
        report = verify(FileBlob(loc))
        assert any(lo <= early <= hi for lo, hi in report.blobs_gone)
        assert report.restorable[-1][1] == client.state.seq
        # the log is trimmed once a newer rollup is a grace period old
        client.set_options(dataclasses.replace(eager, rollup_every=2)).result()
        for t in range(4, 8):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
            client.maintain()
        oldest = restore.oldest(FileBlob(loc))
        assert oldest is not None
        assert oldest > 1
        seq = client.state.seq
        with pytest.raises(InvalidUsage, match="no longer restorable: log entry"):
            client.restore(1)
        with pytest.raises(InvalidUsage, match="not before the current seq"):
            client.restore(seq)
        assert client.state.seq == seq  # nothing committed
    report = verify(FileBlob(loc))
    assert all(lo >= oldest for lo, _ in report.restorable + report.blobs_gone)
    assert all(layout.seq_of(k) >= oldest for k in FileBlob(loc).list_keys(layout.LOG_PREFIX))
