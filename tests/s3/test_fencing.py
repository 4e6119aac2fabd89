"""Fencing and lock races on s3:// locations, with real processes against the moto server.

**Fencing** (``test_paused_writer_is_fenced``): a writer subprocess (``fencing_writer.py``)
holding the lock with a 1 s lease appends and reports each acknowledgement on stdout. The test
SIGSTOPs it past its lease; a second writer (another reentrance id, a long ``lock_timeout``)
waits the lease out, acquires, fences and commits; then the first is SIGCONTed. Its next commit
must fail with ``Fenced``, and no acknowledged write of either may be lost. Half the trials
delay the paused writer's heartbeat verdict, so the loss is caught by the storage CAS of its next
commit itself (the Fenced names the successor's commit; when the fenced commit was a maintenance
round's, the appends behind it fail with ``RuntimeShutdown`` caused by it); in the others the
heartbeat may notice first (then the commit fails with ``RuntimeShutdown`` caused by ``Fenced``).
Trials rotate over both locks and both commit primitives, two at a time. ``PERSIST_FENCING_TRIALS`` sets the count
(CI: 10).

**Race** (``test_contending_writers_never_overlap``): N contender processes take the lock in
turns, append a little, release; the test SIGSTOPs contenders (mostly the current holder) at
random for longer than a lease takes to lapse, so others take over and the paused ones are
fenced on resuming. It runs on two locations at once (S3 lock with native commits; DynamoDB lock
with DynamoDB-decided commits). Afterwards the committed history must show one holder at a
time: along the log, epochs (lock generations) never decrease, each epoch belongs to one writer
and starts with that writer's fence, no two acquisitions got one generation, every acknowledged
append sits at the seq it was acknowledged with under its writer's epoch, and the final snapshot
holds every acknowledged row and no row whose append definitely failed.
``PERSIST_RACE_SECONDS`` sets how long they contend (CI: 8 s).

``tests/s3/test_races.py`` already races one-shot lock acquisitions and raw conditional creates
(exactly one winner per round); these tests cover what happens over time with the runtime:
leases lapsing, takeovers, and the fence in the log.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.s3 import S3Blob
from persist.indexed.format import meta
from persist.indexed.format.meta import Commit
from tests.s3.test_runtime_s3 import CONFIGS, storage_options
from tests.support.patience import PATIENCE

pytestmark = [pytest.mark.s3, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("PERSIST_FENCING_TRIALS", "10"))
#: The configurations fencing trials rotate over (names from test_runtime_s3.CONFIGS, comma
#: separated, or "all", the default: both locks with both commit primitives).
_WANTED = os.environ.get("PERSIST_FENCING_CONFIGS", "all")
FENCING_CONFIGS = list(CONFIGS) if _WANTED == "all" else _WANTED.split(",")
assert set(FENCING_CONFIGS) <= set(CONFIGS), f"PERSIST_FENCING_CONFIGS: unknown {_WANTED!r}"
RACE_SECONDS = float(os.environ.get("PERSIST_RACE_SECONDS", "8"))
LEASE = 1.0
#: A lease lapses for others after lease x skew of observation: kept short so a trial takes
#: seconds. (The DynamoDB-decided commit has no timing at all.)
TIMING = {"max_clock_skew_rate": 1.25}
LAPSE = LEASE * TIMING["max_clock_skew_rate"]

Event = dict[str, Any]


class Child:
    """A ``fencing_writer`` subprocess whose stdout events are read by a background thread."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._err = open(log, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.s3.fencing_writer", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        #: Events in arrival order; None once stdout closed.
        self.events: queue.Queue[Event | None] = queue.Queue()
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        self.stopped = False

    def _read(self, out: IO[bytes]) -> None:
        for line in out:
            self.events.put(json.loads(line))
        self.events.put(None)

    def command(self, line: str) -> None:
        """Sends one line to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def next(self, timeout: float) -> Event:
        """The next event, failing the test if none comes in ``timeout`` seconds."""
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from the child in {timeout}s\n{self.tail()}") from None
        if ev is None:
            self.events.put(None)
            raise AssertionError(f"the child exited ({self.proc.poll()})\n{self.tail()}")
        return ev

    def until(self, pred: Any, timeout: float, into: list[Event]) -> Event:
        """Collects events into ``into`` until one satisfies ``pred``; returns that one."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.01, deadline - time.monotonic()))
            into.append(ev)
            if pred(ev):
                return ev

    def signal(self, sig: signal.Signals) -> None:
        """SIGSTOP / SIGCONT the child."""
        self.proc.send_signal(sig)
        self.stopped = sig == signal.SIGSTOP

    def tail(self) -> str:
        """The end of the child's stderr."""
        self._err.flush()
        return self.log.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        """Resumes, ends and reaps the child."""
        if self.stopped:
            self.signal(signal.SIGCONT)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def read_log(blob: S3Blob) -> list[Commit]:
    """Every commit of the metadata log, in order (these tests never trim it)."""
    commits = []
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None, key
        commits.append(meta.decode_commit(key, data))
    return commits


def check_history(commits: list[Commit]) -> dict[int, str]:
    """Checks that the log shows one writer at a time; returns epoch -> writer.

    Seqs run 1..n without a gap; epochs never decrease; each epoch belongs to one writer and
    its first commit is that writer's fence (no ops).
    """
    assert [c.seq for c in commits] == list(range(1, len(commits) + 1))
    owner: dict[int, str] = {}
    prev = 0
    for c in commits:
        assert c.epoch >= prev, f"seq {c.seq}: epoch {c.epoch} after {prev}"
        if c.epoch != prev:
            assert c.ops == (), f"seq {c.seq}: epoch {c.epoch} does not start with a fence"
            assert c.epoch not in owner
            owner[c.epoch] = c.writer
        assert owner[c.epoch] == c.writer, (
            f"seq {c.seq}: {c.writer!r} committed in epoch {c.epoch} of {owner[c.epoch]!r}")
        prev = c.epoch
    return owner


def final_keys(url: str, opts: dict[str, Any]) -> set[str]:
    """The row keys of the final snapshot, read by a fresh replica (each row must have diff 1
    and its own key)."""
    with persist.open(url, read_only=True, storage_options=opts) as replica:
        _, r = replica.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        if r.upper == 0:
            return set()
        rows = r.snapshot(r.upper - 1).to_python()
    assert all(d == 1 for _, _, d in rows)
    keys = {k for (k, _), _, _ in rows}
    assert len(keys) == len(rows)
    return keys


@dataclass
class Outcome:
    """What a writer was told about its appends."""

    acked: dict[str, int] = field(default_factory=dict)  # key -> seq
    failed: set[str] = field(default_factory=set)  # definitely not applied

    def add(self, ev: Event) -> None:
        if ev["ev"] == "ack":
            self.acked[ev["key"]] = ev["seq"]
        elif ev["ev"] == "failed":
            self.failed.add(ev["key"])


# -- fencing -------------------------------------------------------------------------------------


def _trial(k: int, child: Child, late: bool, aws_options: dict[str, Any], bucket: str,
           table: str, rng: random.Random) -> str:
    """One fencing trial on a fresh prefix; returns ``"<config>:<how A learned it>"``."""
    config = FENCING_CONFIGS[k % len(FENCING_CONFIGS)]
    opts = {**storage_options(aws_options, config, table), **TIMING}
    prefix = f"fence-{k:03d}"
    url = f"s3://{bucket}/{prefix}"
    child.command(json.dumps({"url": url, "options": opts, "id": "a", "lease": LEASE,
                              "tag": f"a{k}", "pipeline": rng.choice((1, 2, 4)),
                              "late_heartbeat": late}))
    events: list[Event] = []
    opened = child.until(lambda ev: ev["ev"] == "opened", PATIENCE, events)
    acks = rng.randint(1, 6)
    child.until(lambda ev: ev["ev"] == "ack" and ev["i"] >= acks - 1, PATIENCE, events)
    time.sleep(rng.uniform(0, 0.05))  # pause at a random point of the commit cycle
    child.signal(signal.SIGSTOP)
    b = Outcome()
    try:
        second = persist.open(url, reentrance_id="b", lock_timeout=60, lease_seconds=LEASE,
                              storage_options=opts)
    except BaseException:
        child.signal(signal.SIGCONT)
        raise
    try:
        fence = second.state
        assert (fence.writer, fence.epoch) == ("b", opened["gen"] + 1)
        w, r = second.create_or_load("c", key_type=pa.string(), value_type=pa.int64())

        def append(j: int) -> None:
            key = f"b{k}-{j}"
            b.acked[key] = w.append([((key, j), r.upper, 1)], r.upper + 1).result()

        for j in range(3):
            append(j)
        child.signal(signal.SIGCONT)
        append(3)  # racing the resumed writer, undisturbed by it
        child.until(lambda ev: ev["ev"] == "closed", PATIENCE, events)
        append(4)
    finally:
        if child.stopped:
            child.signal(signal.SIGCONT)
        second.stop()

    a = Outcome()
    for ev in events:
        a.add(ev)
    lost = [ev for ev in events if ev["ev"] == "lost" and ev["first"]]
    assert len(lost) == 1, events
    how = lost[0]["error"] if lost[0]["cause"] is None else f"{lost[0]['error']}<{lost[0]['cause']}"
    if late:
        # The storage CAS caught it: the Fenced names the successor's commit, not a lost lease.
        # NB: the fenced commit may be a maintenance round's rather than an append's; then the
        # first append failing reports RuntimeShutdown caused by that Fenced.
        assert how in ("Fenced", "RuntimeShutdown<Fenced"), f"trial {k} ({config}): {lost[0]}"
        assert not lost[0]["fenced_by"].startswith("writer lock"), (
            f"trial {k} ({config}): the heartbeat, not the commit, was fenced: {lost[0]}")
    else:
        assert how in ("Fenced", "RuntimeShutdown<Fenced"), f"trial {k} ({config}): {lost[0]}"
    assert events[-1]["lock_lost"] == "Fenced", events[-1]

    # the committed history: A's commits under A's epoch, then B's fence, then only B's
    commits = read_log(S3Blob(bucket, prefix, storage_options=aws_options))
    owner = check_history(commits)
    assert owner == {opened["gen"]: "a", fence.epoch: "b"}, owner
    assert commits[fence.seq - 1].writer == "b"
    assert commits[fence.seq - 1].ops == ()
    assert all(c.writer == "b" for c in commits[fence.seq - 1:])
    for out, who in ((a, "a"), (b, "b")):
        for key, seq in out.acked.items():
            assert commits[seq - 1].writer == who, f"{key} acked at seq {seq}, not {who}'s"
    # nothing acknowledged is lost; nothing that definitely failed is there
    keys = final_keys(url, opts)
    assert set(a.acked) | set(b.acked) <= keys
    assert not (a.failed & keys)
    assert all(key.startswith((f"a{k}-", f"b{k}-")) for key in keys)
    return f"{config}:{how}"


def test_paused_writer_is_fenced(aws_options: dict[str, Any], bucket: str, dynamodb_table: str,
                                 tmp_path: Path) -> None:
    seed = int(os.environ.get("PERSIST_FENCING_SEED", "4"))
    # Two writer processes, one per heartbeat mode (the patch cannot be undone), each running
    # every other trial; the two trials in flight at a time use separate prefixes.
    children = {late: Child(["trials"], tmp_path / f"writer-late-{late}.log")
                for late in (True, False)}
    outcomes: dict[str, int] = {}

    def run(late: bool) -> list[str]:
        rng = random.Random(seed * 2 + late)
        done = []
        for k in range(TRIALS):
            if (k % 2 == 0) != late:
                continue
            try:
                done.append(_trial(k, children[late], late, aws_options, bucket,
                                   dynamodb_table, rng))
            except AssertionError as e:
                config = FENCING_CONFIGS[k % len(FENCING_CONFIGS)]
                raise AssertionError(f"trial {k} ({config}, late heartbeat {late}, "
                                     f"{len(done)} passed before it): {e}") from e
        return done

    try:
        with ThreadPoolExecutor(2) as pool:
            for got in pool.map(run, (True, False)):
                for how in got:
                    outcomes[how] = outcomes.get(how, 0) + 1
    finally:
        for c in children.values():
            c.close()
    assert sum(outcomes.values()) == TRIALS
    print(f"\nfencing: {TRIALS} trials, outcomes {sorted(outcomes.items())}")


# -- race ----------------------------------------------------------------------------------------

CONTENDERS = 4
#: Both locks and both commit primitives, contended at the same time.
RACE_CONFIGS = ("s3lock-native", "dynamolock-dynamocommit")


class Contenders:
    """The contender processes of a race, their events, and who seems to hold a lock."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children
        self.events: list[list[Event]] = [[] for _ in children]
        self.done = [False] * len(children)

    def pump(self) -> None:
        """Moves every event that arrived into ``events``."""
        for i, child in enumerate(self.children):
            while not self.done[i]:
                try:
                    ev = child.events.get_nowait()
                except queue.Empty:
                    break
                if ev is None:
                    self.done[i] = True
                else:
                    self.events[i].append(ev)

    def holders(self) -> list[int]:
        """Contenders whose last event at some location says they hold its lock."""
        out = []
        for i, evs in enumerate(self.events):
            last: dict[str, str] = {}
            for ev in evs:
                if "loc" in ev:
                    last[ev["loc"]] = ev["ev"]
            if not self.done[i] and any(e in ("opened", "ack") for e in last.values()):
                out.append(i)
        return out


def _nemesis(race: Contenders, until: float, rng: random.Random) -> list[float]:
    """Until ``until``, pauses mostly a current holder (else anyone) for longer than a lease
    takes to lapse, then resumes it. Returns the pauses."""
    pauses: list[float] = []
    while time.monotonic() < until:
        time.sleep(rng.uniform(0.1, 0.5))
        race.pump()
        holders = race.holders()
        victim = rng.choice(holders if holders and rng.random() < 0.8
                            else range(len(race.children)))
        pause = rng.uniform(LAPSE + 0.2, LAPSE + 1.0)
        race.children[victim].signal(signal.SIGSTOP)
        time.sleep(pause)
        race.children[victim].signal(signal.SIGCONT)
        pauses.append(pause)
    return pauses


def _check_race(name: str, url: str, prefix: str, opts: dict[str, Any],
                aws_options: dict[str, Any], bucket: str,
                events: dict[str, list[Event]]) -> dict[str, int]:
    """Checks one location's history against what its contenders were told; returns counts."""
    commits = read_log(S3Blob(bucket, prefix, storage_options=aws_options))
    owner = check_history(commits)
    by_seq = {c.seq: c for c in commits}
    acked: set[str] = set()
    failed: set[str] = set()
    generations: list[int] = []
    counts = {"fenced": 0, "open_fenced": 0}
    for me, evs in events.items():
        gen = 0
        for ev in evs:
            if ev.get("loc") != name:
                continue
            if ev["ev"] == "opened":
                gen = ev["gen"]
                generations.append(gen)
                # the lock generation is the epoch of this holder's fence, at the seq it reported
                assert owner[gen] == me
                assert by_seq[ev["seq"]].epoch == gen
                assert by_seq[ev["seq"]].ops == ()
            elif ev["ev"] == "ack":
                c = by_seq[ev["seq"]]
                assert (c.writer, c.epoch) == (me, gen), f"{me} was told {ev}; log has {c}"
                acked.add(ev["key"])
            elif ev["ev"] == "failed":
                failed.add(ev["key"])
            elif ev["ev"] == "lost" and ev["first"]:
                assert "Fenced" in (ev["error"], ev["cause"]), ev
                counts["fenced"] += 1
            elif ev["ev"] == "open_fenced":
                counts["open_fenced"] += 1
            elif ev["ev"] == "closed" and ev["lock_lost"] is not None:
                assert ev["lock_lost"] == "Fenced", ev
    # no two acquisitions got one generation (each committed its fence: checked above)
    assert len(generations) == len(set(generations))
    keys = final_keys(url, opts)
    assert acked <= keys
    assert not (failed & keys)
    counts.update(commits=len(commits), holds=len(owner), acked=len(acked), failed=len(failed))
    return counts


def test_contending_writers_never_overlap(aws_options: dict[str, Any], bucket: str,
                                          dynamodb_table: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("PERSIST_RACE_SEED", "7"))
    rng = random.Random(seed)
    locations: list[dict[str, Any]] = [{"name": name, "url": f"s3://{bucket}/race-{name}",
                  "options": {**storage_options(aws_options, name, dynamodb_table), **TIMING}}
                 for name in RACE_CONFIGS]
    children = [
        Child(["contend", json.dumps({"locations": locations, "id": f"p{i}", "lease": LEASE,
                                      "seed": seed * 100 + i})], tmp_path / f"p{i}.log")
        for i in range(CONTENDERS)
    ]
    race = Contenders(children)
    try:
        for child in children:
            assert child.next(timeout=PATIENCE)["ev"] == "ready"
        for child in children:
            child.command("go")
        pauses = _nemesis(race, time.monotonic() + RACE_SECONDS, rng)
        for child in children:
            child.command("stop")
        for child in children:
            assert child.proc.wait(timeout=PATIENCE) == 0, child.tail()
            child._reader.join(10)
        race.pump()
    finally:
        for child in children:
            child.close()
    events = {f"p{i}": evs for i, evs in enumerate(race.events)}
    assert all(evs[-1]["ev"] == "done" for evs in events.values())
    report = []
    for loc in locations:
        counts = _check_race(loc["name"], loc["url"], loc["url"].split("/", 3)[3],
                             loc["options"], aws_options, bucket, events)
        assert counts["holds"] > CONTENDERS, f"too little contention at {loc['name']}: {counts}"
        report.append(f"{loc['name']} {counts}")
    print(f"\nrace: {CONTENDERS} contenders, {len(pauses)} pauses; " + "; ".join(report))


# -- the DynamoDB-decided create under pauses --------------------------------------------------


@pytest.mark.dynamodb
@pytest.mark.parametrize("pause_at", ["temp-put", "claim", "copy", "copy-after-recreate"])
def test_dynamodb_commit_paused_holder_cannot_overwrite_successor(
    aws_options: dict[str, Any], bucket: str, dynamodb_table: str, pause_at: str
) -> None:
    """A creator paused (SIGSTOP, GC, a request stuck in the network) at each step of the
    DynamoDB-decided create, for as long as it takes another creator to finish: exactly one of
    them is told it won, and the winner's bytes stay once the paused one resumes.

    ``temp-put`` / ``claim``: paused before its decision; the other creates the key and wins.
    ``copy``: paused after winning the decision; the other loses at once and its read rolls the
    winner's value forward. ``copy-after-recreate``: as ``copy``, but the key is then deleted and
    created again before the paused copy is sent: the copy finds its source gone and writes
    nothing (the failure of the previous protocol, where the late request was a PUT of the
    stale value)."""
    opts = {**aws_options, "conditional_put": "dynamodb", "dynamodb_table": dynamodb_table}
    a = S3Blob(bucket, "gap", storage_options=opts)
    b = S3Blob(bucket, "gap", storage_options=opts)
    assert a.commit is not None
    client, method = {"temp-put": (a.client, "put_object"),
                      "claim": (a.commit.client, "put_item")}.get(
        pause_at, (a.client, "copy_object"))
    send = getattr(client, method)
    paused, resume = threading.Event(), threading.Event()

    def paused_send(**kw: Any) -> Any:
        # the process stops right before this request reaches the server
        if not paused.is_set():
            paused.set()
            assert resume.wait(30)
        return send(**kw)

    setattr(client, method, paused_send)
    key = "meta/log/1"
    outcome: dict[str, bool] = {}
    t = threading.Thread(target=lambda: outcome.update(a=a.set_if_absent(key, b"A")))
    t.start()
    try:
        assert paused.wait(10)
        outcome["b"] = b.set_if_absent(key, b"B")  # never waits for the paused one
        decided_by_a = pause_at.startswith("copy")
        assert outcome["b"] is not decided_by_a
        assert b.get(key) == (b"A" if decided_by_a else b"B")  # rolled forward if A's
        if pause_at == "copy-after-recreate":
            b.delete(key)
            assert b.get(key) is None
            assert b.set_if_absent(key, b"B") is True
    finally:
        resume.set()
        t.join(30)
    assert not t.is_alive()
    assert outcome["a"] is (pause_at == "copy" or pause_at == "copy-after-recreate")
    expected = b"A" if pause_at == "copy" else b"B"
    plain = S3Blob(bucket, "gap", storage_options=aws_options)  # reads the object only
    assert plain.get(key) == expected
    assert b.get(key) == expected
    assert a.set_if_absent(key, b"C") is False
    assert a.list_keys("_pending/") == []  # no temporary object left behind
