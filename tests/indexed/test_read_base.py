"""The read plan over a compacted base (DESIGN.md §11a): a consolidated read passes the base
rows whose key no run holds and sums only the rest with the runs. Model-checked: at every as-of
time in ``[since, upper)``, through a client's snapshot (ordered) and ``read_task`` of the key-
range tasks, with and without a filter, the rows are exactly the model's, and exactly what the
same read returns with the base fast path off (every part summed).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import hypothesis.strategies as st
import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings

import persist
from persist.indexed.format import columnar
from persist.indexed.format.meta import PartMeta
from persist.indexed.read import scan as scan_mod
from persist.indexed.read import split
from persist.indexed.read.scan import Layers, read_task
from tests.indexed.test_base import engine

I64 = pa.int64()


def table(rows: list[tuple[int | None, int, int]], t: int) -> pa.Table:
    return pa.table({"key": pa.array([k for k, _, _ in rows], I64),
                     "value": pa.array([v for _, v, _ in rows], I64),
                     "time": pa.array([t] * len(rows), pa.uint64()),
                     "diff": pa.array([d for _, _, d in rows], I64)})


def rows_of(t: pa.Table) -> Counter[tuple[Any, Any, int, int]]:
    return Counter(zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                       t.column("time").to_pylist(), t.column("diff").to_pylist(),
                       strict=True))


def no_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part a run from here on (the read sums every row: the plan before the base)."""
    monkeypatch.setattr(scan_mod, "layers",
                        lambda parts, as_of, view: Layers((), tuple(p for p in parts if p.rows)))


_key = st.one_of(st.integers(-300, 300), st.none())


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[int | None, int, int]],
                                        list[list[tuple[int | None, int, int]]]]:
    """A base load (time 0) and a few batches of updates on top: retractions of base rows
    (cancelling them exactly, or in part), new keys, new values of existing keys, null keys."""
    n = draw(st.integers(0, 1200))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    keys = rng.integers(-400, 400, n).tolist()
    base: list[tuple[int | None, int, int]] = [
        (None if i % 97 == 5 else k, int(v), 1)
        for i, (k, v) in enumerate(zip(keys, rng.integers(0, 4, n).tolist(), strict=True))]
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        b: list[tuple[int | None, int, int]] = []
        for _ in range(draw(st.integers(0, 40))):
            kind = draw(st.sampled_from(["retract", "new", "other", "any"]))
            if kind == "retract" and base:
                k, v, _ = base[draw(st.integers(0, len(base) - 1))]
                b.append((k, v, -draw(st.integers(1, 2))))
            elif kind == "new":
                b.append((draw(st.integers(500, 600)), draw(st.integers(0, 3)), 1))
            elif kind == "other" and base:
                k, _, _ = base[draw(st.integers(0, len(base) - 1))]
                b.append((k, draw(st.integers(4, 6)), draw(st.sampled_from([1, -1, 2]))))
            else:
                b.append((draw(_key), draw(st.integers(0, 6)), draw(st.integers(-2, 2))))
        batches.append(b)
    return base, batches


def model(base: list[Any], batches: list[Any], as_of: int, lo: int | None
          ) -> Counter[tuple[Any, Any, int, int]]:
    sums: Counter[tuple[Any, Any]] = Counter()
    for t, rows in enumerate([base, *batches]):
        if t > as_of:
            break
        for k, v, d in rows:
            sums[(k, v)] += d
    return Counter({(k, v, as_of, d): 1 for (k, v), d in sums.items()
                    if d and (lo is None or (k is not None and k > lo))})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=histories(), lo=st.one_of(st.none(), st.integers(-100, 100)),
       n=st.integers(1, 4))
def test_reads_over_a_base_equal_the_model_and_the_full_sum(
        h: tuple[list[Any], list[Any]], lo: int | None, n: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, batches = h
    ix = engine(inline_threshold=0, batch_rows=64)
    ix.register("c", I64, I64)
    ix.write({"c": table(base, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    for t, b in enumerate(batches, start=1):
        if b:
            ix.write({"c": table(b, t)})
        ix.seal("c", t + 1)
    f = None if lo is None else persist.col("key") > lo
    upper = len(batches) + 1
    for as_of in range(upper):
        want = model(base, batches, as_of, lo)
        scan = ix.info("c").snapshot(as_of, filter=f)
        lay = scan.layers
        event(f"base parts {min(len(lay.base), 3)}, runs {min(len(lay.runs), 2)}")
        if as_of == 0 and len(scan.kept) > 1:
            assert lay.settled
            assert lay.base
        assert {p.id for p in lay.base} | {p.id for p in lay.runs} == {p.id for p in scan.kept}
        snap = ix.snapshot("c", as_of, filter=f).to_arrow()
        assert rows_of(snap) == want
        keys = snap.column("key").to_pylist()
        assert keys == sorted(keys, key=lambda k: (k is None, k or 0))  # ordered
        tasks = scan.tasks(consolidated=True, n=n)
        got = [t for task in tasks for t in read_task(ix.reader, task)]
        assert sum((rows_of(t) for t in got), Counter()) == want
        for task in tasks:  # a task's split is the scan's rule on its own parts
            assert task.layers == scan_mod.layers(task.parts, as_of, task.view)
        no_base(monkeypatch)
        old = ix.snapshot("c", as_of, filter=f).to_arrow()
        assert not ix.info("c").snapshot(as_of).layers.base
        monkeypatch.undo()
        assert old.equals(snap)


def test_a_retraction_that_cancels_a_base_row_drops_it_and_only_touched_keys_are_summed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ix = engine(inline_threshold=0)
    ix.register("c", I64, I64)
    ix.write({"c": table([(k, k % 3, 1) for k in range(3000)] + [(None, 1, 2)], 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    ix.write({"c": table([(7, 1, -1), (8, 9, 1), (5000, 0, 1), (None, 1, -2), (None, 2, 1)],
                         1)})
    ix.seal("c", 2)
    lay = ix.info("c").snapshot(1).layers
    assert len(lay.base) > 1
    assert len(lay.runs) == 1
    assert lay.base_rows == 3001
    summed: list[int] = []
    real = columnar.contents_at

    def counted(t: pa.Table, as_of: int) -> pa.Table:
        summed.append(len(t))
        return real(t, as_of)

    monkeypatch.setattr(columnar, "contents_at", counted)
    out = rows_of(ix.snapshot("c", 1).to_arrow())
    # the base rows of keys 7, 8 and null, and the run's five rows: nothing else is summed
    assert summed == [3 + 5]
    assert (7, 1, 1, 1) not in out
    assert (None, 1, 1, 2) not in out
    assert {(8, 2, 1, 1), (8, 9, 1, 1), (5000, 0, 1, 1), (None, 2, 1, 1)} <= set(out)
    assert sum(out.values()) == 3001 - 1 + 1 + 1 - 1 + 1


def test_the_base_is_taken_largest_first_and_disjoint() -> None:
    ix = engine(inline_threshold=0)
    ix.register("c", I64, I64)
    ix.write({"c": table([(k, 0, 1) for k in range(0, 100)], 0)})
    ix.write({"c": table([(k, 1, 1) for k in range(50, 60)], 0)})  # overlaps the first
    ix.write({"c": table([(k, 2, 1) for k in range(200, 210)], 0)})
    ix.seal("c", 1)
    parts = ix.state.collections["c"].parts
    assert not any(p.consolidated for p in parts)  # appends: runs, whatever their keys
    assert split.base(parts, 0, I64) == ()
    fake = tuple(_consolidated(p) for p in parts)
    b = split.base(fake, 0, I64)
    assert [p.rows for p in b] == [100, 10]
    assert b[1].id == fake[2].id
    assert split.base(fake, 0, pa.struct([("a", I64)])) == ()  # no order: one part only
    assert split.base(fake[:1], 0, pa.struct([("a", I64)])) == fake[:1]


def _consolidated(p: PartMeta) -> PartMeta:
    return msgspec.structs.replace(p, consolidated=True, id=p.id or uuid.uuid4().hex)
