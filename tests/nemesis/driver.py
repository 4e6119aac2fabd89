"""The nemesis: seeded random traffic through persist's public API, with faults, recorded.

Several worker threads pick operations at random (each from its own ``random.Random`` derived
from the run's seed) against one location:

* writes, bursts of writes submitted together (group commit), multi-collection
  ``client.apply(writes=..., seals=..., sinces=...)``, appends, seals, ``allow_compaction``,
  some deliberately invalid (below upper, seal backwards, since beyond upper);
* snapshots at random valid times by the writer and by replicas (``persist.open(read_only=
  True)`` and replicas over an unreliable store), replica snapshots that wait for a time the
  writer just sealed, and listeners on background threads;
* restarts (stop, reopen), takeovers (reopen under the same reentrance id while the old writer
  is still open; the old one is then sent a write and a seal, which must fail), intruders
  (another reentrance id, which must get LockHeld), and storage and lock outages.

Writers and replicas are opened either with ``persist.open`` or through the test-only seam
:func:`open_writer_with` / :func:`open_replica_with`, which builds the same ``Indexed`` /
``Runtime`` / ``Client`` stack over an :class:`~persist.blob.unreliable.UnreliableBlob` and an
:class:`~persist.lock.unreliable.UnreliableLock`. All unreliable handles of a run share one
fault plan per kind, so an outage takes the "service" down for every handle at once.

Knobs (``tests/knobs.py``): every open uses ``Config.knobs`` applied on top of ``OPTIONS``
(and, for a file location, that set's ``map_min_bytes``). With ``Config.agitate`` an *agitator*
thread picks a random knob set (seeded) every 100 ms for the whole run and applies it to the
live writer with ``Client.set_options``; later opens (restarts, takeovers, replicas) use the
newest set, storage options included, which is how what cannot change live still changes.
Options are behaviour-preserving, so the validator needs to know nothing about them.

Everything is recorded in a :class:`~tests.nemesis.history.History`; after the run a clean
writer seals every collection past every write, reads the final state, and
:func:`tests.nemesis.validate.validate` checks the history against it.

NB: the seed fixes every worker's sequence of choices and the fault dice, not the thread
interleaving; a failing seed replays the same workload and usually the same failure.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

import persist
from persist.blob.base import Blob, BlobRead
from persist.blob.unreliable import BLOB_OPS, FaultPlan, Faults, UnreliableBlob
from persist.errors import Determinate, Fenced, LockHeld, PersistError, RuntimeShutdown
from persist.indexed.engine import Indexed, Options
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import delete_leaked, verify
from persist.location import resolve
from persist.lock.base import WriterLock
from persist.lock.unreliable import LOCK_OPS, UnreliableLock
from persist.runtime.client import Client, ListenUpdates, ReadHandle, WriteHandle
from persist.runtime.replica import open_replica
from persist.runtime.runtime import Runtime
from tests import knobs
from tests.knobs import KnobSet
from tests.nemesis.history import (
    FrontierRecord,
    History,
    ListenRecord,
    OpenRecord,
    SnapshotRecord,
    Update,
    WriteRecord,
    contents_hash,
)
from tests.nemesis.validate import FinalCollection, validate
from tests.support.patience import PATIENCE

log = logging.getLogger("persist.nemesis")

RID = "nemesis-writer"
NAMES = ("c0", "c1", "c2")
KEY_TYPE, VALUE_TYPE = pa.string(), pa.int64()

#: Small thresholds so a short run exercises blob parts, compaction, rollups, GC and trimming.
#: NB: built with no knob set active (this module is imported while the session's set is): a
#: run's set goes on top of these (``KnobSet.apply``), so "default" means exactly these.
with knobs.using(None):
    OPTIONS = Options(
        inline_threshold=1000,
        rollup_every=6,
        gc_grace_seconds=0.25,
        compaction=CompactionPolicy(final_rows=4096, inline_flush_bytes=8192),
        # NB: short enough that op_verify_live's sweep (VERIFY_GRACE) runs against it, long enough
        # that a loaded CI machine rarely trips it (a tripped commit is a definite failure).
        commit_deadline_seconds=1.0,
    )
#: Short, so a lapsed lease is taken over within a second (``op_lapse``).
LEASE_SECONDS = 0.5

BLOB_FAULTS: dict[str, Faults] = {
    "get": Faults(fail=0.003, delay=0.02, max_delay=0.002),
    "list": Faults(fail=0.005, delay=0.02, max_delay=0.002),
    "set": Faults(fail=0.01, indeterminate=0.003, lost=0.002, delay=0.03, max_delay=0.003),
    "set_if_absent": Faults(fail=0.01, indeterminate=0.003, lost=0.002, delay=0.03,
                            max_delay=0.003),
    "delete": Faults(fail=0.02, indeterminate=0.01, lost=0.005),
}
LOCK_FAULTS: dict[str, Faults] = {
    "read": Faults(fail=0.01, delay=0.02, max_delay=0.002),
    "cas": Faults(fail=0.01, indeterminate=0.01, lost=0.01),
}
NO_FAULTS: dict[str, Faults] = {}

MAX_LISTENERS = 4
#: How long ``op_verify_live`` lets a leaked blob sit before deleting it (the CLI's --grace):
#: more than the writers' commit deadline plus a commit's latency, as the CLI requires.
VERIFY_GRACE = 3.0
MAX_REPLICAS = 3


@dataclass(frozen=True)
class Config:
    url: str
    seed: int
    ops: int
    threads: int = 3
    faults: bool = True
    #: Keep each snapshot's contents for readable failure messages (memory grows with ops).
    keep_contents: bool = True
    #: A safety net for CI: stop issuing operations after this long (the report says so).
    max_seconds: float = 90.0
    #: The knob set (tests/knobs.py) applied on top of OPTIONS; None: the session's.
    knobs: str | None = None
    #: Flip knob sets on the live writer every ``agitate_interval`` seconds.
    agitate: bool = False
    agitate_interval: float = 0.1


@dataclass
class Writer:
    gen: int
    mode: str
    rid: str
    client: Client
    handles: dict[str, tuple[WriteHandle, ReadHandle]]

    @property
    def name(self) -> str:
        return f"writer-{self.gen}"


@dataclass
class Replica:
    name: str
    client: Client
    handles: dict[str, tuple[WriteHandle, ReadHandle]]


@dataclass
class Report:
    seed: int
    url: str
    ops: int
    seconds: float
    problems: list[str]
    counts: dict[str, int]
    injected: dict[str, int]
    notes: list[str] = field(default_factory=list)
    knobs: str = "default"
    #: Knob sets applied to a live writer by the agitator (``set_options`` acknowledged).
    flips: int = 0

    def summary(self) -> str:
        writes = self.counts.get("write.acked", 0)
        return (f"nemesis seed={self.seed} url={self.url} knobs={self.knobs}: {self.ops} ops in "
                f"{self.seconds:.1f}s, {self.flips} knob flips, "
                f"{writes} writes acked, faults injected {sum(self.injected.values())} "
                f"({dict(sorted(self.injected.items()))}), counts {dict(sorted(self.counts.items()))}")


# -- the test-only seam: persist.open's stack over a given blob and lock --------------------


def open_writer_with(
    url: str, blob: Blob, lock: WriterLock, *, reentrance_id: str, options: Options
) -> Client:
    """Opens a writer exactly as ``persist.open`` does, but over ``blob`` and ``lock``."""
    lease = lock.acquire(reentrance_id)
    try:
        ix = Indexed.open(blob, epoch=lease.generation, writer=reentrance_id, options=options)
        ix.fence()
    except BaseException:
        with contextlib.suppress(PersistError):
            lock.release(lease)
        raise
    return Client(url, ix, runtime=Runtime(ix, lock=lock, lease=lease))


def open_replica_with(url: str, blob: BlobRead, *, options: Options) -> Client:
    """Opens a read-only replica exactly as ``persist.open(read_only=True)`` does."""
    ix, follower = open_replica(blob, options=options, poll_interval=(0.002, 0.05))
    return Client(url, ix, follower=follower)


def _rows(updates: list[Update]) -> list[tuple[tuple[str, int], int, int]]:
    return [((k, v), t, d) for k, v, t, d in updates]


class Nemesis:
    """One run against one location. ``run()`` returns the Report."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.h = History(cfg.seed)
        self.loc = resolve(cfg.url, lease_seconds=LEASE_SECONDS)
        self.blob_plan = FaultPlan(cfg.seed, BLOB_FAULTS if cfg.faults else NO_FAULTS,
                                   ops=BLOB_OPS, name="nemesis-blob")
        self.lock_plan = FaultPlan(cfg.seed + 1, LOCK_FAULTS if cfg.faults else NO_FAULTS,
                                   ops=LOCK_OPS, name="nemesis-lock")
        self._slot = threading.Lock()
        self._mutex = threading.Lock()
        self._obs = threading.Lock()
        self._gens = itertools.count(0)
        self._wids = itertools.count(1)
        self._replica_ids = itertools.count(1)
        self.writer: Writer | None = None
        self.replicas: list[Replica] = []
        self.listeners: list[threading.Thread] = []
        self.acked: dict[str, list[tuple[str, int]]] = {n: [] for n in NAMES}
        self._left = cfg.ops
        self._done = 0
        self._stop = threading.Event()
        self._verifier: threading.Thread | None = None
        #: Blob key -> time.monotonic() when a live sweep deleted it (to explain a problem).
        self._swept: dict[str, float] = {}
        self._failure: BaseException | None = None
        self._deadline = 0.0
        active = knobs.active()
        self.knobs: KnobSet = (knobs.KNOB_SETS[cfg.knobs] if cfg.knobs is not None
                               else active if active is not None else knobs.KNOB_SETS["default"])
        #: The set the next open uses: the run's, then whatever the agitator flipped to last.
        self._current = self.knobs
        self.flips = 0

    # -- knobs ----------------------------------------------------------------------------------

    def _options(self) -> Options:
        return self._current.apply(OPTIONS)

    def _storage_options(self) -> dict[str, Any]:
        return self._current.storage_options(self.cfg.url)

    def _fresh_blob(self) -> Blob:
        """The location's store as an open under the current set would make it (a file
        location's map threshold is chosen when it is opened)."""
        return resolve(self.cfg.url, storage_options=self._storage_options(),
                       lease_seconds=LEASE_SECONDS).blob

    def _agitate(self) -> None:
        """Every ``agitate_interval``, a random knob set onto the live writer."""
        rng = random.Random(f"{self.cfg.seed}/agitator")
        sets = list(knobs.KNOB_SETS.values())
        while not self._stop.wait(self.cfg.agitate_interval):
            ks = rng.choice(sets)
            self._current = ks
            w = self.writer
            if w is None:
                continue
            try:
                w.client.set_options(ks.apply(OPTIONS)).result(timeout=30)
            except (PersistError, concurrent.futures.TimeoutError) as e:
                # a writer that stopped itself, or was replaced: the next one opens with ks
                self.h.count(f"knobs.flip_failed.{type(e).__name__}")
                continue
            self.flips += 1
            self.h.count(f"knobs.set.{ks.name}")

    # -- running ----------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        self._deadline = started + self.cfg.max_seconds
        with self._slot:
            self.writer = self._open_writer("plain")
        workers = [threading.Thread(target=self._worker, args=(i,), name=f"nemesis-{i}")
                   for i in range(self.cfg.threads)]
        agitator = None
        if self.cfg.agitate:
            agitator = threading.Thread(target=self._agitate, name="nemesis-agitator",
                                        daemon=True)
            agitator.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        self._stop.set()
        if agitator is not None:
            agitator.join(60)
        for t in list(self.listeners):
            t.join(10)
        self._close_all()
        if self._failure is not None:
            raise self._failure
        if self._done < self.cfg.ops:
            self.h.note(f"time budget hit: ran {self._done} of {self.cfg.ops} ops")
        final = self._final_state()
        problems = validate(self.h, final)
        problems.extend(n for n in self.h.notes if n.startswith("PROBLEM"))
        # The storage itself after all that: every checksum, every part, the metadata.
        checked = verify(resolve(self.cfg.url).read_half(), url=self.cfg.url)
        problems.extend(f"verify: {p}" for p in checked.problems)
        self.h.count("verify.leaked_blobs", len(checked.leaked))
        injected = dict(self.blob_plan.injected)
        injected.update({f"lock.{k}": n for k, n in self.lock_plan.injected.items()})
        self._count_outcomes()
        return Report(self.cfg.seed, self.cfg.url, self._done, time.monotonic() - started,
                      problems, dict(self.h.counts), injected, list(self.h.notes),
                      knobs=self.knobs.name + ("+agitator" if self.cfg.agitate else ""),
                      flips=self.flips)

    def _take(self) -> bool:
        with self._mutex:
            if self._left <= 0 or self._stop.is_set() or time.monotonic() > self._deadline:
                return False
            self._left -= 1
            self._done += 1
            return True

    def _worker(self, i: int) -> None:
        rng = random.Random(f"{self.cfg.seed}/{i}")
        ops: list[tuple[Callable[[random.Random], None], float]] = [
            (self.op_write, 24), (self.op_burst, 8), (self.op_apply, 10), (self.op_append, 8),
            (self.op_seal, 10), (self.op_since, 4), (self.op_snapshot, 10),
            (self.op_replica_snapshot, 6), (self.op_replica_wait, 2), (self.op_listen, 2),
            (self.op_observe, 4), (self.op_restart, 0.8), (self.op_takeover, 0.8),
            (self.op_intruder, 0.4), (self.op_outage, 1.2 if self.cfg.faults else 0),
            (self.op_lapse, 0.05 if self.cfg.faults else 0), (self.op_verify_live, 0.15),
            (self.op_replica_open, 1), (self.op_replica_close, 0.5), (self.op_maintain, 0.3),
        ]
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        try:
            while self._take():
                op = rng.choices(fns, weights)[0]
                self.h.count(f"op.{op.__name__[3:]}")
                began = time.perf_counter()
                op(rng)
                self.h.count(f"ms.{op.__name__[3:]}", int((time.perf_counter() - began) * 1000))
        except BaseException as e:  # a harness bug or a liveness failure: stop the run
            log.exception("nemesis worker %d failed", i)
            self._failure = self._failure or e
            self._stop.set()

    # -- writers ------------------------------------------------------------------------------

    def _open_writer(self, mode: str, rid: str | None = None) -> Writer:
        """Opens the next writer (slot lock held), retrying through outages. ``rid`` defaults
        to the current writer's reentrance id (a restart or takeover of the same service)."""
        rid = rid or (self.writer.rid if self.writer is not None else RID)
        gen = next(self._gens)
        began = time.monotonic()
        for attempt in itertools.count():
            rec = OpenRecord(gen, mode, self.h.stamp())
            self.h.add(rec)
            client: Client | None = None
            try:
                if mode == "plain":
                    client = persist.open(self.cfg.url, reentrance_id=rid,
                                          options=self._options(),
                                          storage_options=self._storage_options(),
                                          lease_seconds=LEASE_SECONDS)
                else:
                    blob = UnreliableBlob(self._fresh_blob(), plan=self.blob_plan)
                    lock = UnreliableLock(self.loc.lock(), plan=self.lock_plan)
                    client = open_writer_with(self.cfg.url, blob, lock, reentrance_id=rid,
                                              options=self._options())
                handles = {n: client.create_or_load(n, key_type=KEY_TYPE, value_type=VALUE_TYPE)
                           for n in NAMES}
            except PersistError as e:
                rec.error = type(e)
                self.h.error("open", e)
                if client is not None:
                    client.stop()
                # NB: past the run's time budget, give up sooner, but never on the first
                # failures: a loaded machine may have used the budget up before this reopen.
                now = time.monotonic()
                if attempt > 2000 or (now > self._deadline + 30 and now - began > 30):
                    recent = [f"{r.error.__name__}: {r.message}" for r in self.h.errors[-50:]
                              if r.op == "open"][-5:]
                    raise AssertionError(f"could not reopen the writer after {attempt} attempts:"
                                         f" {e}; the last errors: {recent}") from e
                time.sleep(0.002)
                continue
            rec.completed = self.h.stamp()
            self.h.count(f"open.{mode}")
            return Writer(gen, mode, rid, client, handles)
        raise AssertionError("unreachable")

    def _next_mode(self, rng: random.Random) -> str:
        return "plain" if not self.cfg.faults or rng.random() < 0.3 else "unreliable"

    def _recover(self, gen: int, rng: random.Random) -> None:
        """Replaces writer ``gen`` after it stopped itself (fail-stop), unless already done."""
        with self._slot:
            w = self.writer
            if w is None or w.gen != gen:
                return
            w.client.stop()
            self.writer = self._open_writer(self._next_mode(rng))
            self.h.count("writer.recovered")

    def _writer(self) -> Writer:
        w = self.writer
        assert w is not None
        return w

    def _after_failure(self, w: Writer, e: BaseException, rng: random.Random) -> None:
        if isinstance(e, (RuntimeShutdown, Fenced)) or w.client.lock_lost is not None:
            self._recover(w.gen, rng)

    # -- building writes ----------------------------------------------------------------------

    def _write_time(self, rng: random.Random, w: Writer, name: str) -> int:
        upper = w.client.state.collections[name].upper
        if upper > 0 and rng.random() < 0.03:
            return max(0, upper - 1 - rng.randint(0, 3))  # below upper: must be refused
        return upper + rng.choice((0, 0, 0, 1, 1, 2, 3, 7))

    def _updates(self, rng: random.Random, wid: int, name: str, t: int) -> list[Update]:
        ups: list[Update] = [(f"m{wid}", wid, t, 1)]
        n = rng.choice((0, 1, 1, 2, 3, 5)) if rng.random() > 0.05 else rng.randint(30, 120)
        ups.extend((f"r{wid}.{i}", wid, t + rng.choice((0, 0, 1, 2)), rng.choice((1, 1, 2, -1)))
                   for i in range(n))
        with self._mutex:
            known = self.acked[name]
            if known and rng.random() < 0.3:
                k, v = rng.choice(known)
                ups.append((k, v, t + rng.randint(0, 2), -1))
        return ups

    def _record(self, w: Writer, kind: str, updates: dict[str, list[Update]],
                seals: dict[str, int] | None = None,
                sinces: dict[str, int] | None = None) -> WriteRecord:
        rec = WriteRecord(next(self._wids), w.gen, kind, updates, dict(seals or {}),
                          dict(sinces or {}), self.h.stamp())
        self.h.add(rec)
        return rec

    def _submit(self, rec: WriteRecord, call: Callable[[], concurrent.futures.Future[Any]]
                ) -> concurrent.futures.Future[Any] | None:
        try:
            fut = call()
        except PersistError as e:  # refused synchronously (normalization)
            rec.completed, rec.error, rec.message = self.h.stamp(), type(e), str(e)[:300]
            self.h.error(rec.kind, e)
            return None
        self.h.track(rec, fut)
        return fut

    def _await(self, w: Writer, pending: list[tuple[WriteRecord, concurrent.futures.Future[Any]]],
               rng: random.Random) -> None:
        futs = [f for _, f in pending]
        _, not_done = concurrent.futures.wait(futs, timeout=60)
        if not_done:
            raise AssertionError(f"liveness: {len(not_done)} futures unresolved after 60s")
        trouble: BaseException | None = None
        for rec, f in pending:
            e = f.exception()
            if e is None:
                self.h.count("write.acked" if rec.updates else "frontier.acked")
                with self._mutex:
                    for name, ups in rec.updates.items():
                        known = self.acked[name]
                        known.extend((k, v) for k, v, _, _ in ups if k.startswith("r"))
                        del known[:-300]
                continue
            self.h.error(rec.kind, e)
            if isinstance(e, (RuntimeShutdown, Fenced)):
                trouble = e
        if trouble is not None or w.client.lock_lost is not None:
            self._after_failure(w, trouble or RuntimeShutdown("lock lost"), rng)
        self._observe_writer(w, list({n for r, _ in pending
                                      for n in (*r.updates, *r.seals, *r.sinces)}))

    # -- write operations ---------------------------------------------------------------------

    def op_write(self, rng: random.Random) -> None:
        w = self._writer()
        name = rng.choice(NAMES)
        rec = self._record(w, "write", {name: []})
        rec.updates[name] = self._updates(rng, rec.wid, name, self._write_time(rng, w, name))
        fut = self._submit(rec, lambda: w.handles[name][0].write(_rows(rec.updates[name])))
        if fut is not None:
            self._await(w, [(rec, fut)], rng)

    def op_burst(self, rng: random.Random) -> None:
        """Several writes submitted back to back: the runtime commits them as one group."""
        w = self._writer()
        pending = []
        for _ in range(rng.randint(2, 8)):
            name = rng.choice(NAMES)
            rec = self._record(w, "burst", {name: []})
            rec.updates[name] = self._updates(rng, rec.wid, name, self._write_time(rng, w, name))
            fut = self._submit(rec, lambda r=rec, n=name: w.handles[n][0].write(
                _rows(r.updates[n])))
            if fut is not None:
                pending.append((rec, fut))
        self._await(w, pending, rng)

    def op_apply(self, rng: random.Random) -> None:
        """One atomic command over several collections: writes, seals and sinces."""
        w = self._writer()
        names = rng.sample(NAMES, rng.randint(2, 3))
        rec = self._record(w, "apply", {})
        state = w.client.state
        for i, name in enumerate(names):
            if i == 0 or rng.random() < 0.7:
                rec.updates[name] = self._updates(rng, rec.wid, name,
                                                  self._write_time(rng, w, name))
        for name in names:
            if rng.random() < 0.4:
                upper = state.collections[name].upper
                rec.seals[name] = upper + rng.randint(0, 3)
        if rng.random() < 0.2:
            name = rng.choice(names)
            c = state.collections[name]
            rec.sinces[name] = rng.randint(c.since, c.upper)
        fut = self._submit(rec, lambda: w.client.apply(
            writes={n: _rows(u) for n, u in rec.updates.items()} or None,
            seals=rec.seals or None, sinces=rec.sinces or None))
        if fut is not None:
            self._await(w, [(rec, fut)], rng)

    def op_append(self, rng: random.Random) -> None:
        w = self._writer()
        name = rng.choice(NAMES)
        t = self._write_time(rng, w, name)
        rec = self._record(w, "append", {name: []})
        rec.updates[name] = self._updates(rng, rec.wid, name, t)
        rec.seals[name] = max(u[2] for u in rec.updates[name]) + rng.randint(1, 3)
        fut = self._submit(rec, lambda: w.handles[name][0].append(
            _rows(rec.updates[name]), rec.seals[name]))
        if fut is not None:
            self._await(w, [(rec, fut)], rng)

    def op_seal(self, rng: random.Random) -> None:
        w = self._writer()
        name = rng.choice(NAMES)
        upper = w.client.state.collections[name].upper
        u = upper - 1 if upper > 0 and rng.random() < 0.03 else upper + rng.randint(0, 4)
        rec = self._record(w, "seal", {}, seals={name: u})
        fut = self._submit(rec, lambda: w.handles[name][0].seal(u))
        if fut is not None:
            self._await(w, [(rec, fut)], rng)

    def op_since(self, rng: random.Random) -> None:
        w = self._writer()
        name = rng.choice(NAMES)
        c = w.client.state.collections[name]
        s = c.upper + 1 if rng.random() < 0.03 else rng.randint(c.since, c.upper)
        rec = self._record(w, "since", {}, sinces={name: s})
        fut = self._submit(rec, lambda: w.handles[name][0].allow_compaction(s))
        if fut is not None:
            self._await(w, [(rec, fut)], rng)

    def op_maintain(self, rng: random.Random) -> None:
        """An explicit ``Client.maintain()`` (compaction, GC, rollup) racing the background
        round; with background compaction off (a knob) it is the only thing that merges."""
        w = self._writer()
        try:
            w.client.maintain()
        except PersistError as e:
            self.h.error("maintain", e)
            return
        self.h.count("maintain.ok")

    # -- reads ------------------------------------------------------------------------------

    def _observe(self, observer: str, kind: str, gen: int, client: Client,
                 names: list[str]) -> None:
        # NB: stamp and read under one lock, so one observer's observations are ordered by
        # stamp exactly as they were by the state they read.
        with self._obs:
            stamp = self.h.stamp()
            state = client.state
        for name in names:
            c = state.collections.get(name)
            if c is not None:
                self.h.add(FrontierRecord(observer, kind, gen, name, c.since, c.upper, stamp))

    def _observe_writer(self, w: Writer, names: list[str]) -> None:
        self._observe(w.name, "writer", w.gen, w.client, names)

    def _snapshot(self, reader: str, gen: int, rh: ReadHandle, as_of: int,
                  timeout: float | None = None) -> None:
        try:
            table = rh.snapshot(as_of, timeout=timeout).to_arrow()
        except PersistError as e:
            self.h.error("snapshot", e)
            self.h.count(f"snapshot.failed.{type(e).__name__}")
            return
        keys = table.column("key").to_pylist()
        values = table.column("value").to_pylist()
        diffs = table.column("diff").to_pylist()
        rows = list(zip(keys, values, diffs, strict=True))
        contents = ({(k, v): d for k, v, d in rows} if self.cfg.keep_contents else None)
        self.h.add(SnapshotRecord(reader, gen, rh.name, as_of, self.h.stamp(), len(rows),
                                  contents_hash(rows), contents))
        self.h.count("snapshot.ok")

    def op_snapshot(self, rng: random.Random) -> None:
        w = self._writer()
        name = rng.choice(NAMES)
        c = w.client.state.collections[name]
        self._observe_writer(w, [name])
        if c.upper > c.since:
            self._snapshot(w.name, w.gen, w.handles[name][1], rng.randint(c.since, c.upper - 1))

    def _replica(self, rng: random.Random) -> Replica | None:
        with self._mutex:
            return rng.choice(self.replicas) if self.replicas else None

    def op_replica_snapshot(self, rng: random.Random) -> None:
        r = self._replica(rng)
        if r is None:
            self.op_replica_open(rng)
            return
        name = rng.choice(NAMES)
        c = r.client.state.collections[name]
        self._observe(r.name, "replica", -1, r.client, [name])
        if c.upper > c.since:
            self._snapshot(r.name, -1, r.handles[name][1], rng.randint(c.since, c.upper - 1))

    def op_replica_wait(self, rng: random.Random) -> None:
        """A replica asked for a time the writer has just sealed: it must catch up and agree."""
        r = self._replica(rng)
        if r is None:
            return
        name = rng.choice(NAMES)
        wc = self._writer().client.state.collections[name]
        rc = r.client.state.collections[name]
        if wc.upper > max(wc.since, rc.since):
            self._snapshot(r.name, -1, r.handles[name][1], wc.upper - 1, timeout=3.0)

    def op_observe(self, rng: random.Random) -> None:
        w = self._writer()
        self._observe_writer(w, list(NAMES))
        r = self._replica(rng)
        if r is not None:
            self._observe(r.name, "replica", -1, r.client, list(NAMES))

    def op_listen(self, rng: random.Random) -> None:
        with self._mutex:
            self.listeners = [t for t in self.listeners if t.is_alive()]
            if len(self.listeners) >= MAX_LISTENERS:
                return
        use_replica = rng.random() < 0.4
        r = self._replica(rng) if use_replica else None
        w = self._writer()
        name = rng.choice(NAMES)
        client, handles, reader = ((r.client, r.handles, r.name) if r is not None
                                   else (w.client, w.handles, w.name))
        c = client.state.collections[name]
        as_of = rng.randint(c.since, c.upper) if c.upper > c.since else c.since
        t = threading.Thread(target=self._listen, daemon=True,
                             args=(reader, handles[name][1], as_of, rng.uniform(0.1, 0.8)))
        with self._mutex:
            self.listeners.append(t)
        t.start()
        self.h.count("listen.started")

    def _listen(self, reader: str, rh: ReadHandle, as_of: int, duration: float) -> None:
        lr = ListenRecord(reader, rh.name, as_of)
        try:
            listener = rh.listen(as_of)
        except PersistError as e:
            self.h.error("listen", e)
            return
        self.h.add(lr)
        deadline = time.monotonic() + duration
        retries = 0
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    events = listener.poll(0.02)
                except Determinate as e:
                    # NB: Determinate promises "safe to retry": keep listening, and the
                    # validator checks nothing was delivered twice or skipped.
                    self.h.error("listen", e)
                    retries += 1
                    if retries > 20:
                        return
                    continue
                for ev in events:
                    if isinstance(ev, ListenUpdates):
                        b = ev.batch
                        rows = list(zip(b.column("key").to_pylist(),
                                        b.column("value").to_pylist(),
                                        b.column("time").to_pylist(),
                                        b.column("diff").to_pylist(), strict=True))
                        lr.events.append(("updates", ev.lower, ev.upper, rows))
                    else:
                        lr.events.append(("progress", ev.upper, ev.upper, []))
        except PersistError as e:
            lr.error = type(e)
            self.h.error("listen", e)
        except Exception as e:  # recorded: the validator flags anything untyped
            lr.error = type(e)
            self.h.error("listen", e)
        finally:
            listener.close()
            self.h.count("listen.events", len(lr.events))

    def op_verify_live(self, rng: random.Random) -> None:
        """``persist verify --delete-leaked`` against the live location, on a background
        thread: it must find no problem while writers commit, compact and collect garbage
        under it, and must delete nothing a writer commits (the final read and verify would
        find the hole)."""
        with self._mutex:
            if self._verifier is not None and self._verifier.is_alive():
                return
            self._verifier = threading.Thread(target=self._verify_live, daemon=True,
                                              args=(rng.random() < 0.5,))
            self.listeners.append(self._verifier)
        self._verifier.start()

    def _verify_live(self, delete: bool) -> None:
        loc = resolve(self.cfg.url)
        try:
            report = verify(loc.read_half(), url=loc.url)
            if delete and report.leaked:
                deleted = delete_leaked(loc.blob, report.leaked, VERIFY_GRACE, lambda _: None)
                self.h.count("verify.live_deleted", len(deleted))
                now = time.monotonic()
                self._swept.update((k, now) for k in deleted)
        except PersistError as e:  # storage faults do not reach it (a clean handle), but...
            self.h.error("verify", e)
            return
        self.h.count("verify.live")
        for p in report.problems:
            swept = self._swept.get(p.split(":", 1)[0])
            why = "" if swept is None else \
                f" (a live sweep deleted it {time.monotonic() - swept:.1f}s ago)"
            self.h.note(f"PROBLEM: live verify: {p}{why}")

    # -- processes: restarts, takeovers, intruders, replicas ---------------------------------

    def op_restart(self, rng: random.Random) -> None:
        """Graceful: stop the writer (it commits what is queued), open a new one."""
        with self._slot:
            old = self._writer()
            old.client.stop()
            self.writer = self._open_writer(self._next_mode(rng))
        self.h.count("writer.restarted")

    def op_takeover(self, rng: random.Random) -> None:
        """A second writer under the same reentrance id while the first is still open: the
        first is fenced, and a write and a seal sent to it afterwards must fail."""
        with self._slot:
            old = self._writer()
            self.writer = self._open_writer(self._next_mode(rng))
        name = rng.choice(NAMES)
        upper = old.client.state.collections[name].upper
        pending = []
        rec = self._record(old, "probe-write", {name: []})
        rec.updates[name] = self._updates(rng, rec.wid, name, upper)
        fut = self._submit(rec, lambda: old.handles[name][0].write(_rows(rec.updates[name])))
        if fut is not None:
            pending.append((rec, fut))
        seal = self._record(old, "probe-seal", {}, seals={name: upper + 1})
        fut = self._submit(seal, lambda: old.handles[name][0].seal(upper + 1))
        if fut is not None:
            pending.append((seal, fut))
        concurrent.futures.wait([f for _, f in pending], timeout=60)
        for r, f in pending:
            if f.exception() is None:
                self.h.note(f"takeover probe {r.kind} {r.wid} was acknowledged")  # validator
            else:
                self.h.error(r.kind, f.exception())  # type: ignore[arg-type]
        old.client.stop()
        self.h.count("writer.takeover")

    def op_intruder(self, rng: random.Random) -> None:
        """Another reentrance id must not get the lock while the writer holds it."""
        with self._slot:
            gen = next(self._gens)
            rec = OpenRecord(gen, "intruder", self.h.stamp())
            try:
                intruder = persist.open(self.cfg.url, reentrance_id=f"intruder-{gen}",
                                        options=self._options(),
                                        storage_options=self._storage_options(),
                                        lease_seconds=LEASE_SECONDS)
            except LockHeld as e:
                rec.error = type(e)
                self.h.count("intruder.refused")
                return
            except PersistError as e:
                rec.error = type(e)
                self.h.error("intruder", e)
                return
            finally:
                self.h.add(rec)
            rec.completed = self.h.stamp()
            # Only possible when the writer's lease lapsed (no heartbeat for two leases); the
            # intruder fenced it, so the nemesis recovers it like any fenced writer.
            self.h.note("an intruder took the lock over a writer whose lease had lapsed")
            self.h.count("intruder.succeeded")
            intruder.stop()

    def op_lapse(self, rng: random.Random) -> None:
        """The lock service is unreachable for the writer long enough that its lease lapses;
        a successor under another reentrance id takes over. The old writer must be fenced
        (every later command fails); nothing it acknowledged may be lost."""
        with self._slot:
            old = self._writer()
            if old.mode != "unreliable":
                return  # only writers on the unreliable lock can be cut off from it
            self.lock_plan.start_outage()
            try:
                time.sleep(LEASE_SECONDS * 2 + 0.15)  # the lease times the max skew rate
                successor = self._open_writer("plain", rid=f"successor-{next(self._gens)}")
            finally:
                self.lock_plan.end_outage()
            self.writer = successor
        rec = self._record(old, "probe-write", {rng.choice(NAMES): []})
        name = next(iter(rec.updates))
        rec.updates[name] = self._updates(rng, rec.wid, name,
                                          old.client.state.collections[name].upper)
        fut = self._submit(rec, lambda: old.handles[name][0].write(_rows(rec.updates[name])))
        if fut is not None:
            concurrent.futures.wait([fut], timeout=60)
            if fut.exception() is not None:
                self.h.error(rec.kind, fut.exception())  # type: ignore[arg-type]
        old.client.stop()
        self.h.count("writer.lapsed")

    def op_outage(self, rng: random.Random) -> None:
        """Storage (and sometimes the lock service) down for a few milliseconds."""
        lock_too = rng.random() < 0.3
        self.blob_plan.start_outage()
        if lock_too:
            self.lock_plan.start_outage()
        try:
            time.sleep(rng.uniform(0.002, 0.03))
        finally:
            self.blob_plan.end_outage()
            if lock_too:
                self.lock_plan.end_outage()
        self.h.count("outage")

    def op_replica_open(self, rng: random.Random) -> None:
        with self._mutex:
            if len(self.replicas) >= MAX_REPLICAS:
                return
        name = f"replica-{next(self._replica_ids)}"
        try:
            if self.cfg.faults and rng.random() < 0.5:
                blob = UnreliableBlob(self._fresh_blob(), plan=self.blob_plan)
                client = open_replica_with(self.cfg.url, blob.read_only(),
                                           options=self._options())
            else:
                client = persist.open(self.cfg.url, read_only=True, options=self._options(),
                                      storage_options=self._storage_options(),
                                      poll_interval=(0.002, 0.05))
            handles = {n: client.create_or_load(n, key_type=KEY_TYPE, value_type=VALUE_TYPE)
                       for n in NAMES}
        except PersistError as e:
            self.h.error("replica.open", e)
            return
        with self._mutex:
            self.replicas.append(Replica(name, client, handles))
        self.h.count("replica.opened")

    def op_replica_close(self, rng: random.Random) -> None:
        with self._mutex:
            if not self.replicas:
                return
            r = self.replicas.pop(rng.randrange(len(self.replicas)))
        r.client.stop()

    # -- the end ------------------------------------------------------------------------------

    def _close_all(self) -> None:
        for r in self.replicas:
            r.client.stop()
        if self.writer is not None:
            self.writer.client.stop()

    def _final_state(self) -> dict[str, FinalCollection]:
        """Seals every collection past every write with a clean writer and reads it all."""
        max_time = max((u[2] for w in self.h.writes for ups in w.updates.values() for u in ups),
                       default=0)
        final: dict[str, FinalCollection] = {}
        rid = self.writer.rid if self.writer is not None else RID
        # NB: the last writer may have stopped itself without releasing the lock: same id.
        with persist.open(self.cfg.url, reentrance_id=rid, options=self._options(),
                          storage_options=self._storage_options()) as client, \
                persist.open(self.cfg.url, read_only=True) as replica:
            for name in NAMES:
                wh, rh = client.create_or_load(name, key_type=KEY_TYPE, value_type=VALUE_TYPE)
                since, upper = rh.since, rh.upper
                end = max(upper + 1, max_time + 1)
                wh.seal(end).result()
                table = rh.snapshot(end - 1).to_arrow()
                contents = dict(zip(zip(table.column("key").to_pylist(),
                                        table.column("value").to_pylist(), strict=True),
                                    table.column("diff").to_pylist(), strict=True))
                _, rr = replica.create_or_load(name, key_type=KEY_TYPE, value_type=VALUE_TYPE)
                again = rr.snapshot(end - 1, timeout=PATIENCE).to_arrow()
                if not again.equals(table):
                    self.h.note(f"PROBLEM: a fresh replica's final snapshot of {name} differs")
                final[name] = FinalCollection(since, upper, end - 1, contents)
        return final

    def _count_outcomes(self) -> None:
        for w in self.h.writes:
            if w.error is not None:
                self.h.count(f"write.failed.{w.error.__name__}")
