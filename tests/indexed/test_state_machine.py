"""Model-based test of the engine against a plain-dict model (hypothesis stateful testing).

Random writes (some below upper), seals (some backwards), allow_compactions (some invalid),
snapshots at random times, reopening the location, compaction and GC. Invariants: every
snapshot equals the model's consolidated contents; every refused operation raises the right
type and changes nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import InvalidUsage, UnknownCollection
from persist.indexed.engine import Options
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.support.engine import Engine

NAMES = ("a", "b")
KEYS = st.sampled_from(["x", "y", "z", ""])
VALUES = st.integers(min_value=-2, max_value=2)

OPTIONS = Options(
    inline_threshold=256,  # small: exercise blob parts as well as inline ones
    rollup_every=3,
    gc_grace_seconds=0.0,
    compaction=CompactionPolicy(final_rows=64, inline_flush_bytes=512),
)


class Model:
    def __init__(self) -> None:
        self.updates: list[tuple[str, int, int, int]] = []
        self.since = 0
        self.upper = 0

    def contents(self, as_of: int) -> Counter[tuple[str, int]]:
        out: Counter[tuple[str, int]] = Counter()
        for k, v, t, d in self.updates:
            if t <= as_of:
                out[(k, v)] += d
        return Counter({kv: d for kv, d in out.items() if d != 0})


class EngineMachine(RuleBasedStateMachine):
    blob_factory = staticmethod(lambda: MemoryBlob(f"sm-{uuid.uuid4().hex}"))

    def __init__(self) -> None:
        super().__init__()
        self.blob = self.blob_factory()
        self.epoch = 1
        self.ix = self._open()
        self.models = {n: Model() for n in NAMES}
        for n in NAMES:
            self.ix.register(n, pa.string(), pa.int64())

    @initialize(rows=st.lists(st.tuples(st.sampled_from(NAMES), KEYS, VALUES, st.integers(0, 2)),
                              max_size=10), seal_to=st.integers(0, 3))
    def seed(self, rows: list[tuple[str, str, int, int]], seal_to: int) -> None:
        updates: dict[str, list[tuple[tuple[str, int], int, int]]] = {}
        for name, k, v, t in rows:
            updates.setdefault(name, []).append(((k, v), t, 1))
            self.models[name].updates.append((k, v, t, 1))
        if updates:
            self.ix.write(updates)
        for name in NAMES:
            self.ix.seal(name, seal_to)
            self.models[name].upper = seal_to

    def _open(self) -> Engine:
        ix = Engine.open(self.blob, epoch=self.epoch, writer=f"w{self.epoch}", options=OPTIONS)
        ix.fence()
        return ix

    def _frontiers(self, name: str) -> tuple[int, int]:
        c = self.ix.state.collections[name]
        return c.since, c.upper

    @rule(
        name=st.sampled_from(NAMES),
        rows=st.lists(st.tuples(KEYS, VALUES, st.integers(0, 6), st.integers(-2, 2)), max_size=8),
    )
    def write(self, name: str, rows: list[tuple[str, int, int, int]]) -> None:
        m = self.models[name]
        # times relative to upper, occasionally below it
        rows = [(k, v, max(0, m.upper + dt - 1), d) for k, v, dt, d in rows]
        before = self.ix.state
        updates = [((k, v), t, d) for k, v, t, d in rows]
        if any(t < m.upper for _, _, t, _ in rows):
            with pytest.raises(InvalidUsage):
                self.ix.write({name: updates})
            assert self.ix.state is before
        else:
            self.ix.write({name: updates})
            m.updates.extend(rows)
            event("write accepted")

    @rule(rows=st.lists(st.tuples(st.sampled_from(NAMES), KEYS, VALUES, st.integers(0, 3)),
                        min_size=1, max_size=6))
    def write_multi(self, rows: list[tuple[str, str, int, int]]) -> None:
        """A multi-collection write lands all or nothing."""
        by_name: dict[str, list[tuple[str, int, int, int]]] = {}
        for name, k, v, dt in rows:
            t = self.models[name].upper + dt - 1
            by_name.setdefault(name, []).append((k, v, max(t, 0), 1))
        bad = any(t < self.models[n].upper for n, rs in by_name.items() for _, _, t, _ in rs)
        updates = {n: [((k, v), t, d) for k, v, t, d in rs] for n, rs in by_name.items()}
        before = self.ix.state
        if bad:
            with pytest.raises(InvalidUsage):
                self.ix.write(updates)
            assert self.ix.state is before
        else:
            self.ix.write(updates)
            for n, rs in by_name.items():
                self.models[n].updates.extend(rs)

    @rule(name=st.sampled_from(NAMES), delta=st.integers(-1, 4))
    def seal(self, name: str, delta: int) -> None:
        m = self.models[name]
        target = max(0, m.upper + delta)
        if target < m.upper:
            with pytest.raises(InvalidUsage, match="backwards"):
                self.ix.seal(name, target)
        else:
            self.ix.seal(name, target)
            m.upper = target
        assert self._frontiers(name) == (m.since, m.upper)

    @rule(name=st.sampled_from(NAMES), delta=st.integers(-2, 3))
    def allow_compaction(self, name: str, delta: int) -> None:
        m = self.models[name]
        target = max(0, m.since + delta)
        if target < m.since or target > m.upper:
            with pytest.raises(InvalidUsage):
                self.ix.allow_compaction(name, target)
        else:
            self.ix.allow_compaction(name, target)
            m.since = target
        assert self._frontiers(name) == (m.since, m.upper)

    @rule(name=st.sampled_from(NAMES), pick=st.integers(0, 1000))
    def snapshot(self, name: str, pick: int) -> None:
        m = self.models[name]
        if m.upper <= m.since:
            return
        as_of = m.since + pick % (m.upper - m.since)
        snap = self.ix.snapshot(name, as_of)
        got = Counter({(k, v): d for ((k, v), _t, d) in snap.to_python()})
        assert got == m.contents(as_of)
        event(f"snapshot compared ({'nonempty' if got else 'empty'})")
        raw: Counter[tuple[str, int]] = Counter()
        for batch in snap.batches():
            for k, v, t, d in zip(*(batch.column(c).to_pylist()
                                    for c in ("key", "value", "time", "diff")), strict=True):
                assert t == as_of
                raw[(k, v)] += d
        assert Counter({kv: d for kv, d in raw.items() if d}) == m.contents(as_of)

    @rule(name=st.sampled_from(NAMES), below=st.booleans(), by=st.integers(1, 3))
    def snapshot_out_of_range(self, name: str, below: bool, by: int) -> None:
        m = self.models[name]
        as_of = m.since - by if below else m.upper + by - 1
        if as_of < 0:
            return
        with pytest.raises(InvalidUsage, match="since" if below else "upper"):
            self.ix.snapshot(name, as_of)

    @rule(name=st.sampled_from(NAMES), lo_off=st.integers(0, 4), width=st.integers(0, 4))
    def updates_between(self, name: str, lo_off: int, width: int) -> None:
        m = self.models[name]
        lo = m.since + 1 + lo_off
        hi = min(lo + width, m.upper)
        if hi <= lo:
            return
        got: Counter[tuple[str, int, int]] = Counter()
        for t in self.ix.updates_between(name, lo, hi):
            for k, v, tt, d in zip(*(t.column(c).to_pylist()
                                     for c in ("key", "value", "time", "diff")), strict=True):
                got[(k, v, tt)] += d
        want: Counter[tuple[str, int, int]] = Counter()
        for k, v, t, d in m.updates:
            if lo <= t < hi:
                want[(k, v, t)] += d
        strip = lambda c: Counter({x: d for x, d in c.items() if d})  # noqa: E731
        assert strip(got) == strip(want)

    @rule()
    def maintain(self) -> None:
        if self.ix.maintain():
            event("maintenance committed")

    @rule()
    def reopen(self) -> None:
        """A restart: a new writer (next generation) opens the same storage."""
        self.epoch += 1
        self.ix = self._open()

    @rule()
    def reopen_read_only(self) -> None:
        ro = Engine.open(self.blob.read_only(), options=OPTIONS)
        assert ro.state == self.ix.state

    @rule(name=st.text(min_size=1, max_size=3))
    def unknown_collection(self, name: str) -> None:
        if name in NAMES:
            return
        with pytest.raises(UnknownCollection):
            self.ix.seal(name, 1)

    @invariant()
    def frontiers_match(self) -> None:
        for n in NAMES:
            assert self._frontiers(n) == (self.models[n].since, self.models[n].upper)

    @invariant()
    def parts_stay_few(self) -> None:
        for c in self.ix.state.collections.values():
            assert len(c.parts) <= 64


TestEngineMemory = EngineMachine.TestCase
TestEngineMemory.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class FileEngineMachine(EngineMachine):
    @staticmethod
    def blob_factory() -> FileBlob:  # type: ignore[override]
        return FileBlob(tempfile.mkdtemp(prefix="persist-sm-"))

    def teardown(self) -> None:
        assert isinstance(self.blob, FileBlob)
        shutil.rmtree(self.blob.root, ignore_errors=True)


TestEngineFile = FileEngineMachine.TestCase
TestEngineFile.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
