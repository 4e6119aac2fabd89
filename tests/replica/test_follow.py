"""A replica in the same process as its writer: following, definiteness, read-only-ness."""

from __future__ import annotations

import os
from typing import Any

import pytest

import persist
from persist import layout
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.format.meta import Seal
from persist.lock.file import FileLock
from persist.runtime.replica import Follower
from tests.replica.helpers import append_times, events, eventually, file_tree, listened_rows
from tests.replica.workers import aggressive_options, key, updates_at

# NB: pins background compaction on (the knob matrix turns it off): tests below wait for a
# merge, or for GC of merged parts, to happen in the writer's background
BLOBS = Options(inline_threshold=0, background_compaction=True)


def test_replica_follows_upper_and_since(loc: str) -> None:
    with persist.open(loc) as writer, persist.open(loc, read_only=True) as replica:
        w, _r = events(writer)
        _, rr = events(replica)
        append_times(w, 0, 10)
        w.allow_compaction(4).result()
        eventually(lambda: (rr.upper, rr.since) == (10, 4), what="replica frontiers")
        append_times(w, 10, 12)
        eventually(lambda: rr.upper == 12, what="replica upper")
        assert replica.state.seq == writer.state.seq
        assert replica.stats["polls"] > 0


def test_replica_snapshots_equal_the_writers_at_every_as_of(loc: str) -> None:
    with persist.open(loc, options=BLOBS) as writer, \
            persist.open(loc, read_only=True) as replica:
        w, r = events(writer)
        _, rr = events(replica)
        append_times(w, 0, 40, churn=7)
        w.allow_compaction(25).result()
        # compaction runs in the writer's maintenance thread; wait until it merged something
        eventually(lambda: any(p.consolidated for p in writer.state.collections["events"].parts),
                   what="a compaction")
        eventually(lambda: replica.state.seq == writer.state.seq, what="replica caught up")
        assert rr.since == r.since == 25
        for as_of in range(r.since, r.upper):
            mine = rr.snapshot(as_of).to_arrow()
            assert mine.equals(r.snapshot(as_of).to_arrow()), as_of
            assert mine.column("key").to_pylist() == [key(t) for t in range(as_of - 6, as_of + 1)]


def test_replica_listen_is_exactly_once_across_restart_and_handover(loc: str) -> None:
    with persist.open(loc, read_only=True, missing_ok=True, poll_interval=(0.002, 0.05)) as replica:
        blue = persist.open(loc, reentrance_id="svc")
        w, _ = events(blue)
        append_times(w, 0, 10)
        _, rr = events(replica)
        listener = rr.listen(0)
        append_times(w, 10, 20)
        blue.stop()  # a clean restart of the writer
        blue2 = persist.open(loc, reentrance_id="svc")
        w2, r2 = events(blue2)
        append_times(w2, r2.upper, 30)
        # green takes over with the same reentrance id while blue2 is open: blue2 is fenced
        green = persist.open(loc, reentrance_id="svc")
        wg, rg = events(green)
        # NB: blue2 learns it was fenced from its next commit: this append's, or a background
        # compaction's that ran first (which stops the runtime, failing the append with
        # RuntimeShutdown caused by Fenced). Seen once in a full run.
        with pytest.raises((persist.Fenced, persist.RuntimeShutdown)) as fenced:
            w2.append(updates_at(30, 0), upper=31).result()
        assert isinstance(fenced.value, persist.Fenced) or \
            isinstance(fenced.value.__cause__, persist.Fenced)
        append_times(wg, rg.upper, 45)
        rows = listened_rows(listener, 45)
        assert rows == [(key(t), t, 1) for t in range(1, 45)]
        listener.close()
        blue2.stop()
        green.stop()


def test_replica_listener_fails_clearly_when_since_passes_it(loc: str) -> None:
    with persist.open(loc) as writer, persist.open(loc, read_only=True) as replica:
        w, _ = events(writer)
        append_times(w, 0, 10)
        _, rr = events(replica)
        eventually(lambda: rr.upper == 10)
        listener = rr.listen(5)
        assert listened_rows(listener, 10) == [(key(t), t, 1) for t in range(6, 10)]
        append_times(w, 10, 20)
        w.allow_compaction(15).result()  # past the listener's frontier (10)
        eventually(lambda: rr.since == 15)
        with pytest.raises(persist.InvalidUsage, match="advanced since to 15"):
            listener.poll(1.0)
        with pytest.raises(persist.InvalidUsage):  # and it stays failed: no silent end
            next(listener)


def test_replica_cannot_write_and_changes_nothing(loc: str) -> None:
    with persist.open(loc) as writer:
        w, _ = events(writer)
        append_times(w, 0, 5)
    lock_before = FileLock(loc).current()
    tree = file_tree(loc)
    with persist.open(loc, read_only=True) as replica:
        assert replica.read_only
        wr, rr = events(replica)
        assert len(rr.snapshot(4).to_python()) == 5
        for call in (lambda: wr.write(updates_at(5, 0)), lambda: wr.seal(6),
                     lambda: wr.append(updates_at(5, 0), upper=6),
                     lambda: wr.allow_compaction(1),
                     lambda: replica.apply(seals={"events": 6})):
            with pytest.raises(persist.ReadOnly):
                call()
        # not even the engine underneath can: it holds only the read half of the store
        with pytest.raises(persist.ReadOnly):
            replica._ix.commit_ops([Seal(name="events", upper=6)])
        assert not hasattr(replica._ix.store, "set")
    assert FileLock(loc).current() == lock_before
    assert file_tree(loc) == tree


def _freeze_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas opened after this never poll on their own, nor when a reader waits."""
    monkeypatch.setattr(Follower, "poke", lambda self: None)


def _stale_replica(loc: str, writer: persist.Client, upto: int) -> tuple[persist.Client, Any]:
    replica = persist.open(loc, read_only=True, poll_interval=(60, 60))
    _, rr = events(replica)
    replica._sync()
    assert rr.upper == upto
    return replica, rr


def test_listener_retries_on_a_newer_state_when_gc_removed_a_part(
    loc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _freeze_follower(monkeypatch)
    with persist.open(loc, options=aggressive_options()) as writer:
        w, _r = events(writer)
        append_times(w, 0, 3)
        replica, rr = _stale_replica(loc, writer, 3)
        with replica:
            listener = rr.listen(0)
            old_parts = {p.blob_key or "" for p in replica.state.collections["events"].parts}
            append_times(w, 3, 12)  # compaction merges the old parts, GC deletes them at once
            eventually(lambda: not any(os.path.exists(os.path.join(loc, k)) for k in old_parts),
                       what="GC of the parts the replica's state references")
            assert rr.upper == 3  # still the stale state
            rows = listened_rows(listener, 12)
            assert rows == [(key(t), t, 1) for t in range(1, 12)]
            assert replica.stats["verifies"] >= 1


def test_snapshot_retries_when_gc_removed_a_part_and_trimmed_the_log(
    loc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _freeze_follower(monkeypatch)
    with persist.open(loc, options=aggressive_options()) as writer:
        w, _r = events(writer)
        append_times(w, 0, 3)
        replica, rr = _stale_replica(loc, writer, 3)
        with replica:
            seq = replica.state.seq
            append_times(w, 3, 20)
            # the writer's grace is 0, the replica assumes 300 s: the log entry after the
            # replica's state is trimmed, so only a verified refresh can catch up
            entry = layout.log_key(seq + 1, meta.log_from(writer.state))
            eventually(lambda: not os.path.exists(os.path.join(loc, *entry.split("/"))),
                       what="log trim")
            eventually(lambda: not any(
                os.path.exists(os.path.join(loc, p.blob_key or ""))
                for p in replica.state.collections["events"].parts), what="part GC")
            snap = rr.snapshot(2)
            assert [k for (k, _), _, _ in snap.to_python()] == [key(t) for t in range(3)]
            assert rr.upper == 20
