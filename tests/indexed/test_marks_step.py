"""Compaction's marks step (DESIGN.md §8): ready runs on a big base become one consolidated
delta part plus per-base-part marks (the base rows they supersede, hidden in place), committed
in one ``ReplaceParts``. Model-checked: at every as-of time in ``[since, upper)``, through a
client's snapshot (ordered), ``read_task`` of key-range tasks and raw tasks, the rows are
exactly the model's, with marks steps taken as the since advances (marks accumulate, the delta
is re-made) and without them. Also: the delta pairs with the marked base (a read sums
nothing), damaged or missing marks are typed errors naming the part, GC keeps the data blob a
marked part shares with the part it replaced, and a crash between writing the marks and
committing them loses nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, given, settings

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import ChecksumMismatch, IncompatibleFormat, PartMissing
from persist.indexed.format import meta
from persist.indexed.maintenance import compact, gc
from persist.indexed.maintenance.verify import verify
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import read_task
from tests.indexed.test_base import engine
from tests.indexed.test_read_base import histories, model, rows_of, table
from tests.support.patience import PATIENCE

ROOT = Path(__file__).resolve().parents[2]

I64 = pa.int64()
# NB: a step for every run (delta_ratio high): the tests below count on successive steps
MARKS = {"marks_rows": 1, "delta_ratio": 1 << 30}
#: The default delta_ratio: a step waits until the runs hold half the delta's rows.
GROWING = {"marks_rows": 1}
NO_MARKS = {"marks_rows": 1 << 40}


def _raw_sum(tables: list[pa.Table]) -> Counter[tuple[Any, Any, int, int]]:
    sums: Counter[tuple[Any, Any, int]] = Counter()
    for t in tables:
        for (k, v, tm, d), n in rows_of(t).items():
            sums[(k, v, tm)] += d * n
    return Counter({(k, v, tm, d): 1 for (k, v, tm), d in sums.items() if d})


def _load(compaction: dict[str, int], base: list[Any], batches: list[Any], since: int) -> Any:
    ix = engine(inline_threshold=0, batch_rows=64, compaction=compaction)
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
        if t <= since:
            # NB: the since advances batch by batch: each takes a marks step of its own
            ix.allow_compaction("c", t)
            while ix.maintain():
                pass
    return ix


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=histories(), since=st.integers(1, 3), n=st.integers(1, 4),
       marks=st.sampled_from([True, True, True, False]), growing=st.booleans(),
       lo=st.one_of(st.none(), st.integers(-300, 300)))
def test_reads_with_marks_steps_equal_the_model(h: tuple[list[Any], list[Any]], since: int,
                                                 n: int, marks: bool, growing: bool,
                                                 lo: int | None) -> None:
    base, batches = h
    assume(len(base) >= 100)  # a base for the runs to mark
    since = min(since, len(batches))
    # growing: the default delta_ratio, so some runs wait beside the marked base and its delta
    ix = _load((GROWING if growing else MARKS) if marks else NO_MARKS, base, batches, since)
    c = ix.state.collections["c"]
    marked = [p for p in c.parts if p.marks is not None]
    event(f"marks {marks}: marked parts {min(len(marked), 3)}")
    if not marks:
        assert not marked
    upper = len(batches) + 1
    for as_of in range(since, upper):
        want = model(base, batches, as_of, None)
        scan = ix.info("c").snapshot(as_of)
        lay = scan.layers
        if lay.delta is not None:
            event("delta paired")
            assert lay.delta in lay.base
        assert rows_of(ix.snapshot("c", as_of).to_arrow()) == want
        tasks = scan.tasks(consolidated=True, n=n)
        got = [t for task in tasks for t in read_task(ix.reader, task)]
        assert sum((rows_of(t) for t in got), Counter()) == want
        raw = [t for task in scan.tasks() for t in read_task(ix.reader, task)]
        assert _raw_sum(raw) == want
        if lo is not None:
            # a filter: parts and record batches pruned by stats, marks applied to the
            # batches read (positions in the blob's rows)
            f = persist.col("key") > lo
            want_f = model(base, batches, as_of, lo)
            fresh = PartReader(ix.blob)
            assert rows_of(ix.snapshot("c", as_of, filter=f, reader=fresh).to_arrow()) == want_f
            fscan = ix.info("c").snapshot(as_of, filter=f)
            got = [t for task in fscan.tasks(consolidated=True, n=n)
                   for t in read_task(PartReader(ix.blob), task)]
            assert sum((rows_of(t) for t in got), Counter()) == want_f
            raw = [t for task in fscan.tasks() for t in read_task(PartReader(ix.blob), task)]
            assert _raw_sum(raw) == want_f


def _stage(compaction: dict[str, int] = MARKS, blob: Any = None) -> Any:
    """A base of 3,001 rows, then a run of updates, ready (since at its time)."""
    ix = engine(blob, inline_threshold=0, batch_rows=64, compaction=compaction)
    ix.register("c", I64, I64)
    ix.write({"c": table([(k, k % 3, 1) for k in range(3000)] + [(None, 1, 2)], 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    ix.write({"c": table([(7, 1, -1), (8, 9, 1), (5000, 0, 1), (None, 1, -2), (None, 2, 1)],
                         1)})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    return ix


def test_a_marks_step_pairs_the_delta_with_the_base_and_a_read_sums_nothing() -> None:
    ix = _stage()
    before = rows_of(ix.snapshot("c", 1).to_arrow())
    old = {p.id: p for p in ix.state.collections["c"].parts}
    assert ix.maintain() == 1  # one commit: the marks step, then nothing planned
    c = ix.state.collections["c"]
    marked = [p for p in c.parts if p.marks is not None]
    assert len(marked) == len([p for p in old.values() if p.consolidated])
    # a marked part shares its data blob with the base part it replaced
    assert {p.blob_key for p in marked} <= {p.blob_key for p in old.values()}
    assert sum(p.marks.count for p in marked) == 3  # keys 7, 8 and the null key's row
    lay = ix.info("c").snapshot(1).layers
    assert lay.settled
    assert lay.delta is not None
    assert lay.delta.rows == 4
    assert lay.delta.consolidated
    assert rows_of(ix.snapshot("c", 1).to_arrow()) == before
    assert meta.required_version(ix.state) == meta.MARKS_FORMAT_VERSION == 8
    assert compact.plan(c, ix.options.compaction) == ()
    # a second step: marks accumulate (kept blobs where nothing changed), the delta re-made
    ix.write({"c": table([(9, 0, -1), (8, 9, -1), (6000, 1, 1)], 2)})
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    want = rows_of(ix.snapshot("c", 2).to_arrow())
    assert ix.maintain() == 1
    c2 = ix.state.collections["c"]
    assert sum(p.marks.count for p in c2.parts if p.marks is not None) == 4
    lay = ix.info("c").snapshot(2).layers
    assert lay.settled
    assert lay.delta is not None
    assert lay.delta.id != marked[0].marks.delta
    assert rows_of(ix.snapshot("c", 2).to_arrow()) == want
    kept = {p.marks.key for p in c2.parts if p.marks is not None and p.marks.count}
    assert kept & {p.marks.key for p in marked if p.marks.count}  # an unchanged marks blob


def test_a_big_run_still_takes_the_full_merge_which_drops_the_marks() -> None:
    ix = _stage()
    ix.maintain()
    want = rows_of(ix.snapshot("c", 1).to_arrow())
    ix.write({"c": table([(k, 7, 1) for k in range(0, 3000, 2)], 2)})  # half the base
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    while ix.maintain():
        pass
    c = ix.state.collections["c"]
    assert not any(p.marks is not None for p in c.parts)
    _base, runs = compact.layout(c, 2)
    assert not runs
    want_2 = want.copy()
    got = rows_of(ix.snapshot("c", 2).to_arrow())
    assert sum(got.values()) == sum(want_2.values()) + 1500


def _marks_blob(ix: Any) -> tuple[Any, str]:
    p = next(p for p in ix.state.collections["c"].parts if p.marks is not None
             and p.marks.count)
    return p, p.marks.key


def test_damaged_marks_are_a_checksum_mismatch_naming_the_part_and_missing_ones_typed() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = _stage(blob=blob)
    ix.maintain()
    p, key = _marks_blob(ix)
    good = bytes(blob.get_plain(key, p.marks.crc))
    for bad in (good[:-1], bytes([good[0] ^ 1]) + good[1:]):
        blob.set_plain(key, bad)
        fresh = engine(blob, inline_threshold=0, batch_rows=64)  # no cached marks
        with pytest.raises(ChecksumMismatch, match=p.id):
            fresh.snapshot("c", 1).to_arrow()
        with pytest.raises(ChecksumMismatch, match=p.id):
            list(read_task(fresh.reader, fresh.info("c").snapshot(1).task()))
    blob.delete(key)
    fresh = engine(blob, inline_threshold=0, batch_rows=64)
    with pytest.raises(PartMissing, match=p.id):
        list(read_task(fresh.reader, fresh.info("c").snapshot(1).task()))


def test_gc_keeps_the_data_blob_a_marked_part_shares_and_retires_marks_with_their_part() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = _stage(blob=blob)
    old = ix.state.collections["c"].parts
    ix.maintain()
    ix.collect_garbage(now_ms=1 << 62)
    want = rows_of(ix.snapshot("c", 1).to_arrow())
    stored = set(blob.list_keys(layout.DATA_PREFIX))
    for p in ix.state.collections["c"].parts:  # every blob a live part reads is still there
        assert p.blob_key in stored
        assert p.marks is None or not p.marks.count or p.marks.key in stored
    assert rows_of(ix.snapshot("c", 1, reader=PartReader(blob)).to_arrow()) == want
    retired_before = {p.blob_key for p in old} - {p.blob_key for p in
                                                   ix.state.collections["c"].parts}
    assert retired_before  # the run's blob only
    # a second step replaces a marks blob: the old one goes with its part
    _, key = _marks_blob(ix)
    ix.write({"c": table([(1, 1, -1)], 2)})
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    ix.maintain()
    ix.collect_garbage(now_ms=1 << 62)
    live = {p.marks.key for p in ix.state.collections["c"].parts if p.marks is not None}
    assert key not in live
    assert key not in blob.list_keys(layout.DATA_PREFIX)
    got = rows_of(ix.snapshot("c", 2, reader=PartReader(blob)).to_arrow())
    assert sum(got.values()) == sum(want.values()) - 1


_CHILD = """
import sys
from persist.blob.file import FileBlob
from tests.indexed.test_base import engine
ix = engine(FileBlob(sys.argv[1]), inline_threshold=0, batch_rows=64,
            compaction={"marks_rows": 1})
ix.maintain()
"""


def test_a_crash_between_writing_the_marks_and_committing_loses_nothing(
        tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    ix = _stage(blob=blob, compaction=NO_MARKS)
    want = rows_of(ix.snapshot("c", 1).to_arrow())
    parts = ix.state.collections["c"].parts
    before = set(blob.list_keys(layout.DATA_PREFIX))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PERSIST_CRASH_AT="compact.marks_written")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, timeout=PATIENCE * 120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    written = set(blob.list_keys(layout.DATA_PREFIX)) - before
    assert any(k.endswith(compact.MARKS_SUFFIX) for k in written)  # it got that far
    again = engine(FileBlob(tmp_path), inline_threshold=0, batch_rows=64, compaction=MARKS)
    assert again.state.collections["c"].parts == parts  # nothing committed
    assert rows_of(again.snapshot("c", 1).to_arrow()) == want
    again.maintain()
    assert any(p.marks is not None for p in again.state.collections["c"].parts)
    assert rows_of(again.snapshot("c", 1).to_arrow()) == want
    # what the crashed step wrote is referenced by nothing: the leaked-blob sweep's to delete
    assert not written & gc.referenced(again.state)
    report = verify(FileBlob(tmp_path).read_only())
    assert report.problems == []
    assert written <= set(report.leaked)


def test_an_older_persist_refuses_a_marked_state(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = _stage(blob=blob)
    ix.maintain()
    data = meta.encode(ix.state)
    assert meta.version_of("k", data) == 8
    monkeypatch.setattr(meta, "FORMAT_VERSION", 7)
    with pytest.raises(IncompatibleFormat, match="format version 8"):
        meta.decode_state(layout.rollup_key(ix.state.seq), data)
    with pytest.raises(IncompatibleFormat, match="format version 8"):
        engine(blob)
    unmarked = msgspec.structs.replace(ix.state, collections={})
    assert meta.version_of("k", meta.encode(unmarked)) < 8


def _client_stage(tmp_path: Path) -> Any:
    import persist
    from persist.indexed.maintenance.compact import CompactionPolicy

    opts = persist.Options(inline_threshold=0, batch_rows=64, background_compaction=False,
                           gc_grace_seconds=0, compaction=CompactionPolicy(
                               part_target_bytes=8 << 10, marks_rows=1))
    client = persist.open(tmp_path, reentrance_id="w", options=opts)
    w, r = client.create_or_load("c", key_type=I64, value_type=I64)
    w.append([((k, k % 3), 0, 1) for k in range(2000)], upper=1).result()
    w.allow_compaction(0).result()
    while client.maintain():
        pass
    w.append([((7, 1), 1, -1), ((8, 9), 1, 1), ((5000, 0), 1, 1)], upper=2).result()
    w.allow_compaction(1).result()
    while client.maintain():
        pass
    assert any(p.marks is not None and p.marks.count
               for p in client.state.collections["c"].parts)
    return client, w, r


def _contents(r: Any, as_of: int) -> Counter[tuple[Any, Any, int]]:
    return Counter((k, v, d) for (k, v), _, d in r.snapshot(as_of).to_python())


def test_a_distributed_compaction_of_a_marked_collection_drops_the_marks(
        tmp_path: Path) -> None:
    from persist import distributed

    client, _, r = _client_stage(tmp_path)
    want = _contents(r, 1)
    assert distributed.compact_distributed(str(tmp_path), "c", client=client) is not None
    c = client.state.collections["c"]
    assert not any(p.marks is not None for p in c.parts)
    assert _contents(r, 1) == want
    client.maintain()
    client.stop()
    assert verify(FileBlob(tmp_path).read_only()).problems == []


def test_a_fork_of_a_marked_collection_reads_its_marks_and_keeps_the_blobs(
        tmp_path: Path) -> None:
    client, w, r = _client_stage(tmp_path)
    want = _contents(r, 1)
    client.fork("c", as_of=1, into="f")
    _, fr = client.create_or_load("f", key_type=I64, value_type=I64)
    assert _contents(fr, 1) == want
    # the source merges its marks away and collects: the fork still reads the marked blobs
    w.append([((k, 7), 2, 1) for k in range(0, 2000, 2)], upper=3).result()
    w.allow_compaction(2).result()
    while client.maintain():
        pass
    assert not any(p.marks is not None for p in client.state.collections["c"].parts)
    assert any(p.marks is not None for p in client.state.collections["f"].parts)
    assert _contents(fr, 1) == want
    client.stop()
    assert verify(FileBlob(tmp_path).read_only()).problems == []


def test_a_staged_or_applied_part_with_marks_is_refused(tmp_path: Path) -> None:
    from persist import distributed
    from persist.errors import Corruption, InvalidUsage
    from persist.indexed.format.stats import Marks, PartStats
    from persist.indexed.format.transfer import StagedPart

    client, _, r = _client_stage(tmp_path)
    want = _contents(r, 1)
    marked = next(p for p in client.state.collections["c"].parts if p.marks is not None)
    with pytest.raises(InvalidUsage, match="marks"):
        client.apply(parts={"c": [msgspec.structs.replace(marked, id="forged")]})
    stager = distributed.Stager.start(str(tmp_path), "c")
    staged = stager.stage([((1, 1), r.upper, 1)])
    forged = msgspec.structs.replace(staged, part=msgspec.structs.replace(
        staged.part, stats=PartStats(marks=Marks("", 0, 0, 0, "x"))))
    with pytest.raises(Corruption, match="marks"):
        client.apply(parts={"c": [forged]})
    with pytest.raises(Corruption, match="marks"):
        StagedPart.from_bytes(forged.to_bytes())
    assert _contents(r, 1) == want
    stager.release()
    client.stop()


def test_discarding_an_uncommitted_marks_step_keeps_the_shared_data_blobs() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = _stage(blob=blob)
    want = rows_of(ix.snapshot("c", 1).to_arrow())
    [(name, parts)] = ix.plan_compaction(ix.state)
    c = ix.state.collections[name]
    assert compact.marking(c, parts, ix.options.compaction)
    op = ix.run_compaction(ix.state, name, parts)
    new = compact.written(op)
    delta = next(p for p in op.added if p.marks is None)
    assert delta.blob_key in new
    assert {p.marks.key for p in op.added if p.marks is not None and p.marks.count} <= set(new)
    assert not {p.blob_key for p in op.added if p.marks is not None} & set(new)  # shared
    ix._discard(op)
    assert not set(new) & set(blob.list_keys(layout.DATA_PREFIX))
    assert rows_of(ix.snapshot("c", 1, reader=PartReader(blob)).to_arrow()) == want


def test_background_compaction_takes_the_marks_step_on_its_own(tmp_path: Path) -> None:
    import persist
    from persist.indexed.maintenance.compact import CompactionPolicy
    from tests.support.patience import eventually

    opts = persist.Options(inline_threshold=0, batch_rows=64, background_compaction=True,
                           compaction=CompactionPolicy(part_target_bytes=8 << 10,
                                                       marks_rows=1, rewrite_share=1.0))
    with persist.open(tmp_path, reentrance_id="w", options=opts) as client:
        w, r = client.create_or_load("c", key_type=I64, value_type=I64)
        w.append([((k, k % 3), 0, 1) for k in range(2000)], upper=1).result()
        w.allow_compaction(0).result()

        def parts() -> tuple[Any, ...]:
            return tuple(client.state.collections["c"].parts)

        eventually(lambda: len(compact.layout(client.state.collections["c"], 0)[0]) > 1
                   and not compact.layout(client.state.collections["c"], 0)[1],
                   "the bulk load merged into a base")
        w.append([((7, 1), 1, -1), ((8, 9), 1, 1), ((5000, 0), 1, 1)], upper=2).result()
        want = _contents(r, 1)
        w.allow_compaction(1).result()
        eventually(lambda: any(p.marks is not None for p in parts()), "a marks step")
        eventually(lambda: client.info("c").snapshot(1).layers.settled, "the delta paired")
        assert _contents(r, 1) == want


def test_a_step_waits_until_the_runs_hold_half_the_delta() -> None:
    """``delta_ratio`` (default 2): a step re-makes the delta whole, so the next one waits for
    runs of half the delta's rows; meanwhile a read applies the waiting run by key, exactly."""
    ix = _stage(compaction=GROWING)
    ix.maintain()
    c = ix.state.collections["c"]
    (delta,) = [p for p in c.parts
                if any(b.marks is not None and b.marks.delta == p.id for b in c.parts)]
    policy = compact.CompactionPolicy(**GROWING)
    ix.write({"c": table([(9, 9, 1)], 2)})  # one row: far below half the delta
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    assert compact.plan(ix.state.collections["c"], policy) == ()
    assert not ix.maintain()
    want = rows_of(ix.snapshot("c", 2).to_arrow())
    assert want[(9, 9, 2, 1)] == 1
    # runs of half the delta's rows: the next step takes them and the delta
    ix.write({"c": table([(20_000 + k, 0, 1) for k in range(delta.rows // 2)], 3)})
    ix.seal("c", 4)
    ix.allow_compaction("c", 3)
    step = compact.plan(ix.state.collections["c"], policy)
    assert delta.id in {p.id for p in step}
    assert compact.marking(ix.state.collections["c"], step, policy)
    assert ix.maintain()
    assert rows_of(ix.snapshot("c", 3).to_arrow()) == Counter(
        {**{(k, v, 3, d): n for (k, v, _, d), n in want.items()},
         **{(20_000 + k, 0, 3, 1): 1 for k in range(delta.rows // 2)}})


def test_the_delta_ratio_is_checked() -> None:
    with pytest.raises(persist.InvalidUsage, match="delta_ratio"):
        compact.CompactionPolicy(delta_ratio=0)


def test_the_delta_stays_a_run_however_large() -> None:
    """A delta larger than every base part (here: base parts of ~1 KiB, a run of new keys
    across the whole key range) stays a run in compaction's layout: the marked parts are
    the base, so the next run does not set off a merge of the whole base; and a read takes
    the marked parts as its base and pairs the delta with them (it summed every row)."""
    ix = engine(inline_threshold=0, batch_rows=64,
                compaction={**MARKS, "part_target_bytes": 1 << 10, "final_rows": 1 << 20})
    ix.register("c", I64, I64)
    ix.write({"c": table([(k, 0, 1) for k in range(0, 4000, 2)], 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    # new keys across the whole range, 10% of the base's rows
    ix.write({"c": table([(k, 1, 1) for k in range(1, 4000, 20)], 1)})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    assert ix.maintain()
    c = ix.state.collections["c"]
    marked = {p.id for p in c.parts if p.marks is not None}
    (delta,) = {p.marks.delta for p in c.parts if p.marks is not None}
    biggest = max((p for p in c.parts if p.id in marked), key=lambda p: p.rows)
    assert next(p for p in c.parts if p.id == delta).rows > biggest.rows
    base, runs = compact.layout(c, 1)
    assert {p.id for p in base} == marked
    assert delta in {p.id for p in runs}
    policy = compact.CompactionPolicy(**MARKS, part_target_bytes=1 << 10, final_rows=1 << 20)
    assert compact.plan(c, policy) == ()  # nothing waits: no merge of the whole base
    # the read pairs it with the marked base too: nothing to sum
    lay = ix.info("c").snapshot(1).layers
    assert lay.delta is not None
    assert lay.delta.id == delta
    assert lay.settled
    assert {p.id for p in lay.base} == marked | {delta}
