"""Writers and replicas in separate processes, as deployed: following, handover, GC, read-only.

Writers report every acknowledged write (``ack t`` once ``append(...).result()`` returned), so
the tests can check that no acknowledged write is lost; replicas report everything they
listened to and every snapshot they checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from persist.lock.file import FileLock
from tests.replica.conftest import Proc
from tests.replica.helpers import acks as _acks
from tests.replica.helpers import check_listened as _check_listened
from tests.replica.helpers import check_snapshots as _check_snapshots
from tests.replica.helpers import file_tree
from tests.support.patience import PATIENCE

Spawn = Callable[..., Proc]


def test_writer_and_two_replicas_listen_to_every_update_once(loc: str, spawn: Spawn) -> None:
    until = 300
    writer = spawn("writer", "--url", loc, "--rid", "w", "--until", str(until),
                   "--interval", "0.002", "--notify", "--pause-at", "5")
    writer.wait_for("paused")
    pushed = spawn("listener", "--url", loc, "--until", str(until), "--notify")
    polling = spawn("listener", "--url", loc, "--until", str(until))
    # NB: the writer goes on only once the pushed listener is connected: on a busy machine
    # it could otherwise acknowledge all 300 times before the listener's first push
    for p in (pushed, polling):
        p.wait_for("ready")
    writer.send("go")
    results = [p.wait_for("done") for p in (pushed, polling)]
    writer.wait_for("stopped")
    acked = _acks(writer)
    assert acked == set(range(until))
    for done in results:
        _check_listened(done, until, acked)
    assert results[0]["stats"]["push"]["pushes"] > 0


@pytest.mark.parametrize("handover", ["same-id", "other-id", "kill-restart"])
def test_blue_green_handover_under_continuous_reads_and_writes(
    loc: str, spawn: Spawn, handover: str
) -> None:
    blue_rid, green_rid = ("svc", "svc") if handover != "other-id" else ("blue", "green")
    blue = spawn("writer", "--url", loc, "--rid", blue_rid, "--interval", "0.002", "--notify")
    blue.wait_for("ack", pred=lambda e: e["t"] >= 5)
    # two replicas, one pushed and one polling, each listening and snapshotting throughout
    replicas = [spawn("listener", "--url", loc, "--snapshots", *extra)
                for extra in (["--notify"], [])]
    for p in replicas:
        p.wait_for("ready")
    blue.wait_for("ack", pred=lambda e: e["t"] >= 100)
    if handover == "kill-restart":
        blue.kill()  # a crash: whatever blue acknowledged must survive
    green = spawn("writer", "--url", loc, "--rid", green_rid, "--count", "150",
                  "--interval", "0.002", "--notify", "--lock-timeout", str(PATIENCE))
    if handover == "other-id":
        green.wait_for("opening")
        blue.send("stop")  # the procedure: green waits for the lock, blue stops and releases it
    opened = green.wait_for("open")
    if handover == "same-id":
        fenced = blue.wait_for("fenced")  # blue's next commit lost to green's fence
        assert fenced["error"] in ("Fenced", "RuntimeShutdown")
    elif handover == "other-id":
        blue.wait_for("stopped")
    until = green.wait_for("done")["upper"]
    acked_blue, acked_green = _acks(blue), _acks(green)
    assert acked_green == set(range(opened["upper"], until))
    assert max(acked_blue) < opened["upper"], "green started below what blue acknowledged"
    acked = acked_blue | acked_green
    for p in replicas:
        p.send(f"until {until}")
    for p in replicas:
        done = p.wait_for("done")
        _check_listened(done, until, acked)
        _check_snapshots(done["snapshots"])


def test_replica_reads_while_the_writer_compacts_and_gcs_aggressively(
    loc: str, spawn: Spawn
) -> None:
    until, churn = 400, 10
    # a polling replica (default options: it assumes 300 s of grace where the writer gives 0)
    # lags the writer and keeps reading parts GC just deleted; a pushed one listens.
    # NB: both read as of 0 first, which the writer compacts away from t = 258 on. Started
    # beside the writer, a replica lost that race under load (the listener's first snapshot
    # came at t = 264; on a machine at load 4-13 a reader read as of 0 after since passed
    # 150): so the writer seals time 0 and waits, and goes on only once both have read it.
    writer = spawn("writer", "--url", loc, "--rid", "w", "--until", str(until), "--aggressive",
                   "--churn", str(churn), "--since-lag", "250", "--interval", "0.003",
                   "--notify", "--pause-at", "1")
    writer.wait_for("paused")
    polling = spawn("reader", "--url", loc, "--until", str(until), "--churn", str(churn))
    pushed = spawn("listener", "--url", loc, "--until", str(until), "--churn", str(churn),
                   "--snapshots", "--notify")
    polling.wait_for("ready")
    pushed.wait_for("ready")
    writer.send("go")
    writer.wait_for("stopped")
    # consolidated reads never fail because GC removed a blob, and never return wrong data
    _check_snapshots(polling.wait_for("done")["snapshots"])
    done = pushed.wait_for("done")
    _check_snapshots(done["snapshots"])
    _check_listened(done, until, _acks(writer), churn=churn)
    # GC did run: the data blobs now on disk are far fewer than the parts ever written
    data = sum(len(files) for _, _, files in os.walk(os.path.join(loc, "data")))
    assert data < until // 4


def test_replica_cannot_write_and_never_takes_the_lock(loc: str, spawn: Spawn) -> None:
    writer = spawn("writer", "--url", loc, "--rid", "w", "--until", "20")
    writer.wait_for("stopped")
    lock, tree = FileLock(loc).current(), file_tree(loc)
    done = spawn("replica_probe", "--url", loc).wait_for("done")
    assert done["refused"] == ["write", "append", "seal", "allow_compaction", "apply"]
    assert done["unknown"] == ["register"]
    assert (done["upper"], done["rows"]) == (20, 20)
    assert FileLock(loc).current() == lock
    assert file_tree(loc) == tree, "a replica changed the location"

    # and against a live writer: the lock's holder and generation stay, the writer goes on
    live = spawn("writer", "--url", loc, "--rid", "w2", "--interval", "0.005")
    live.wait_for("ack", pred=lambda e: e["t"] >= 25)
    held = FileLock(loc).current()
    assert held is not None
    spawn("replica_probe", "--url", loc).wait_for("done")
    now = FileLock(loc).current()
    assert now is not None
    assert (now.holder, now.generation, now.released) == (held.holder, held.generation, False)
    first = max(_acks(live))
    live.wait_for("ack", pred=lambda e: e["t"] >= first + 5)
    live.send("stop")
    live.wait_for("stopped")
