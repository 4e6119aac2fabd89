"""Tags and named consumer holds with leases: in the writer's process (``Client.tag``,
``Client.hold``), from other processes (``persist.distributed.ConsumerHold``, with a writer
running elsewhere or none), lapses the writer commits, and bad input refused."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.distributed import ConsumerHold, describe
from persist.errors import HoldLapsed, InvalidUsage, UnknownCollection, UnknownHold
from persist.indexed.maintenance.compact import CompactionPolicy

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = persist.Options(gc_grace_seconds=0.0, background_compaction=False,
                          compaction=CompactionPolicy(fanin=2))
#: Generous: the writer's maintenance thread finds a lapse or a request within about a
#: second when idle; a loaded machine may take many.
PATIENCE = 60.0


def fill(client: persist.Client, times: range, name: str = "c"
         ) -> tuple[persist.WriteHandle, persist.ReadHandle]:
    w, r = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
    for t in times:
        w.append([((f"k{t}", t), t, 1), ((f"k{t - 1}", t - 1), t, -1)], upper=t + 1).result()
    return w, r


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_tags_pin_a_time_whatever_since_says(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=OPTIONS) as client:
        w, r = fill(client, range(6))
        snap2 = r.snapshot(2).to_python()
        client.tag("c", "q3-close", as_of=2).result()
        client.tag("c", "q3-close", as_of=2).result()  # again: nothing changes
        assert r.tags == {"q3-close": 2}
        assert r.tag("q3-close") == 2
        w.allow_compaction(5).result()
        client.maintain()
        client.maintain()
        assert r.since == 2  # held back by the tag
        assert r.snapshot(r.tag("q3-close")).to_python() == snap2
        assert client.info("c").tag("q3-close") == 2
        kinds = {h.name: (h.kind, h.frontier, h.lease_seconds) for h in client.holds("c")}
        assert kinds == {"q3-close": ("tag", 2, None)}
        client.untag("c", "q3-close").result()
        assert r.tags == {}
        assert r.since == 5
        with pytest.raises(UnknownHold):
            r.tag("q3-close")
        with pytest.raises(UnknownHold):
            client.untag("c", "q3-close").result()


def test_bad_tags_and_holds_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=OPTIONS) as client:
        w, _r = fill(client, range(6))
        w.allow_compaction(3).result()
        client.tag("c", "t", as_of=4).result()
        client.hold("c", "h", 4, lease=60)
        seq = client.state.seq
        with pytest.raises(InvalidUsage, match="below its since"):
            client.tag("c", "old", as_of=2).result()
        with pytest.raises(InvalidUsage, match="not below its upper"):
            client.tag("c", "future", as_of=6).result()
        with pytest.raises(InvalidUsage, match="never moves"):
            client.tag("c", "t", as_of=5).result()
        with pytest.raises(InvalidUsage, match="already has a hold"):
            client.tag("c", "h", as_of=5).result()
        with pytest.raises(UnknownCollection):
            client.tag("missing", "t", as_of=0).result()
        with pytest.raises(UnknownCollection):
            client.hold("missing", "h", 0, lease=60)
        for lease in (0, -1, datetime.timedelta(0), datetime.timedelta(seconds=-5)):
            with pytest.raises(InvalidUsage, match="lease"):
                client.hold("c", "h2", 4, lease=lease)
        with pytest.raises(InvalidUsage, match="lease"):
            client.hold("c", "h2", 4, lease="1h")  # type: ignore[arg-type]
        with pytest.raises(InvalidUsage, match="below its since"):
            client.hold("c", "h2", 2, lease=60)
        with pytest.raises(InvalidUsage, match="already has a tag"):
            client.hold("c", "t", 4, lease=60)
        with pytest.raises(InvalidUsage, match="named tag"):
            w.hold("t", 5).result()  # a plain hold cannot move a tag
        assert client.state.seq == seq
        assert w.holds == {"t": 4, "h": 4}


def test_a_live_hold_keeps_since_and_its_handle_advances_and_renews(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=OPTIONS) as client:
        w, r = fill(client, range(6))
        snap1 = r.snapshot(1).to_python()
        h = client.hold("c", "billing-export", 1, lease=datetime.timedelta(hours=6))
        w.allow_compaction(5).result()
        client.maintain()
        assert r.since == 1
        assert r.snapshot(1).to_python() == snap1
        assert h.frontier == 1
        assert not h.lapsed
        assert h.info.lease_seconds == 6 * 3600
        renewed = h.info.renewed_at
        assert renewed is not None
        time.sleep(0.01)
        h.renew().result()
        assert h.info.renewed_at is not None
        assert h.info.renewed_at > renewed
        h.advance(3).result()
        assert (h.frontier, r.since) == (3, 3)
        with pytest.raises(InvalidUsage, match="backwards"):
            h.advance(2).result()
        h.release().result()
        h.release().result()  # idempotent
        assert r.since == 5
        assert client.holds("c") == []
        with pytest.raises(HoldLapsed, match="no longer exists"):
            h.advance(5).result()


def test_the_writer_lapses_a_hold_not_renewed_in_time(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", options=OPTIONS) as client:
        w, r = fill(client, range(6))
        h = client.hold("c", "slow", 1, lease=0.3)
        w.allow_compaction(5).result()
        wait_until(lambda: h.lapsed, "the writer to commit the lapse")
        (info,) = client.holds("c")
        assert (info.lapsed, info.frontier, info.expires_at) == (True, 1, None)
        assert r.since == 5
        assert w.holds == {}
        with pytest.raises(HoldLapsed, match="lapsed at 1"):
            h.advance(5).result()
        with pytest.raises(HoldLapsed):
            h.renew().result()
        client.hold("c", "slow", 5, lease=60)  # taken again, where since allows
        assert not h.lapsed
        assert h.frontier == 5


def test_consumer_hold_with_no_writer_commits_under_the_lock(tmp_path: Path) -> None:
    url = str(tmp_path / "loc")
    with persist.open(url, options=OPTIONS) as client:
        fill(client, range(4))
    h = ConsumerHold.take(url, "c", "export", 1, lease=60)
    assert describe(url, "c").hold("export").frontier == 1  # type: ignore[union-attr]
    h.advance(2)
    h.renew()
    assert describe(url, "c").holds == {"export": 2}
    with persist.open(url, options=OPTIONS) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(3).result()
    with pytest.raises(InvalidUsage, match="below its since"):
        ConsumerHold.take(url, "c", "late", 0, lease=60)
    h.release()
    assert describe(url, "c").holds == {}


def test_consumer_hold_while_a_writer_runs_is_served_by_the_writer(tmp_path: Path) -> None:
    url = str(tmp_path / "loc")
    with persist.open(url, options=OPTIONS) as client:
        w, r = fill(client, range(6))
        h = ConsumerHold.take(url, "c", "export", 2, lease=60)  # the lock is held: a request
        assert w.holds == {"export": 2}
        h.advance(3, wait=False)
        wait_until(lambda: w.holds == {"export": 3}, "the writer to serve the advance")
        h.check()
        w.allow_compaction(5).result()
        assert r.since == 3
        with pytest.raises(InvalidUsage, match="backwards"):
            h.advance(1)
        with pytest.raises(UnknownCollection):
            ConsumerHold.take(url, "missing", "x", 0, lease=60)
        h.release()
        assert w.holds == {}
        assert r.since == 5


def test_a_paused_consumer_gets_hold_lapsed_and_never_a_wrong_read(tmp_path: Path) -> None:
    """The consumer (another process) takes a hold with a short lease and is SIGSTOPped; the
    writer commits the lapse, since moves past the hold and compaction merges history. Resumed,
    the consumer's advance fails with HoldLapsed, and its read as of the old hold is refused."""
    url = str(tmp_path / "loc")
    with persist.open(url, options=OPTIONS) as client:
        w, r = fill(client, range(6))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.runtime.hold_consumer", url, "c", "paused", "2",
             "0.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT)
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            assert json.loads(proc.stdout.readline()) == {"held": 2}
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until(lambda: [h.lapsed for h in client.holds("c")] == [True],
                       "the writer to lapse the paused consumer's hold")
            w.allow_compaction(5).result()
            client.maintain()
            client.maintain()
            assert r.since == 5
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            out = json.loads(proc.stdout.readline())
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=30)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    assert out["advance"] == "HoldLapsed", out
    assert "lapsed" in out["message"]
    assert out["read"] == "InvalidUsage"
    assert "rows" not in out


def test_the_async_client_takes_holds_reads_tags_and_restores(tmp_path: Path) -> None:
    """``persist.aio`` has the same surface for holds, tags and restore as the sync client:
    taken, advanced, renewed and released without blocking the event loop, with the same
    errors and the same effect on since."""
    import asyncio

    async def main() -> None:
        async with await persist.aio.open(tmp_path / "loc", options=OPTIONS) as client:
            w, r = await client.create_or_load("c", key_type=pa.string(),
                                               value_type=pa.int64())
            for t in range(6):
                await w.append([((f"k{t}", t), t, 1)], upper=t + 1)
            snap1 = await r.snapshot(1).to_python()
            h = await client.hold("c", "billing-export", 1,
                                  lease=datetime.timedelta(hours=6))
            assert isinstance(h, persist.aio.AsyncHoldHandle)
            await w.allow_compaction(5)
            assert (r.since, h.frontier, h.lapsed) == (1, 1, False)
            assert await r.snapshot(1).to_python() == snap1
            assert [i.name for i in client.holds("c")] == ["billing-export"]
            assert await h.renew() > 0
            await h.advance(3)
            assert (h.frontier, r.since) == (3, 3)
            with pytest.raises(InvalidUsage, match="backwards"):
                await h.advance(2)
            await h.release()
            assert r.since == 5
            with pytest.raises(HoldLapsed, match="no longer exists"):
                await h.advance(5)
            with pytest.raises(UnknownCollection):
                await client.hold("nope", "x", 0, lease=60)

            await w.hold("reader", 5)
            assert w.holds == {"reader": 5}
            await w.hold("reader", None)
            assert w.holds == {}

            await client.tag("c", "q3-close", as_of=5)
            assert r.tags == {"q3-close": 5}
            assert r.tag("q3-close") == 5
            with pytest.raises(UnknownHold):
                r.tag("q4-close")

            before = client.sync.state.seq
            await w.append([(("late", 9), 6, 1)], upper=7)
            plan = await client.restore(before)
            assert r.upper == 6
            assert plan.op is not None
            with pytest.raises(InvalidUsage):
                await client.restore(10**9)

    asyncio.run(main())
