"""Engine behaviour: types, bad input, corruption of every stored object, compaction, GC,
metadata that does not grow with history."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from persist import layout
from persist.blob.base import Blob, ReadOnlyView
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import (
    ChecksumMismatch,
    Corruption,
    Fenced,
    InvalidUsage,
    ReadOnly,
    SchemaMismatch,
    UnknownCollection,
)
from persist.indexed.engine import Options
from persist.indexed.format import columnar, meta
from persist.indexed.format.evolve import Types
from persist.indexed.maintenance import gc
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.parts import PartReader
from tests.support.engine import Engine


def fresh(blob: Blob | None = None, epoch: int = 1, **opts: object) -> Engine:
    ix = Engine.open(blob or MemoryBlob(uuid.uuid4().hex), epoch=epoch, writer=f"w{epoch}",
                 options=Options(**opts))  # type: ignore[arg-type]
    ix.fence()
    return ix


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


# -- types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kt", "vt", "k", "v"),
    [
        (pa.string(), pa.int64(), "a", 1),
        (pa.binary(), pa.binary(), b"\x00k", b"v"),
        (pa.int64(), pa.float64(), 7, 2.5),
        (pa.string(), Point, "p", Point(1, 2)),
    ],
)
def test_types_roundtrip(kt: object, vt: object, k: object, v: object) -> None:
    ix = fresh()
    ix.register("c", kt, vt)
    ix.write({"c": [((k, v), 0, 3)]})
    ix.seal("c", 1)
    assert ix.snapshot("c", 0).to_python() == [((k, v), 0, 3)]


@pytest.mark.parametrize(("typ", "value"), [(pa.uint64(), 2**64 - 1), (pa.uint64(), 7),
                                           (pa.int64(), -3), (pa.int64(), 2**63 - 1)])
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_constant_times_equals_repeat(typ: pa.DataType, value: int, n: int) -> None:
    got = columnar.constant_times(value, n, typ)
    got.validate(full=True)
    assert got.equals(pa.repeat(pa.scalar(value, typ), n))


def test_constant_times_share_one_buffer_and_never_mix_values() -> None:
    made = [(v, n, columnar.constant_times(v, n)) for v, n in
            [(5, 10), (5, 3), (5, 1 << 20), (6, 4), (5, 2), (5, (1 << 21) + 1), (5, 7)]]
    for v, n, arr in made:  # every earlier array is intact after the later calls
        arr.validate(full=True)
        assert arr.equals(pa.repeat(pa.scalar(v, pa.uint64()), n))
        assert arr.buffers()[1].size == 8 * n  # a slice: IPC writes no more than n values
    small, smaller = made[0][2], made[1][2]
    assert small.buffers()[1].address == smaller.buffers()[1].address


def test_reregistering_with_other_types_is_refused() -> None:
    ix = fresh()
    ix.register("c", pa.string(), pa.int64())
    ix.register("c", pa.string(), pa.int64())  # same types: fine
    with pytest.raises(SchemaMismatch, match="registered as"):
        ix.register("c", pa.string(), pa.string())
    with pytest.raises(SchemaMismatch):
        ix.register("c", pa.string(), Point)


def test_arrow_input_is_cast_vectorized_and_checked() -> None:
    ix = fresh()
    ix.register("c", pa.string(), pa.int64())
    t = pa.table({"key": ["a", "b"], "value": pa.array([1, 2], pa.int32()),
                  "time": pa.array([0, 1], pa.int64()), "diff": [1, 1]})
    ix.write({"c": t})
    ix.seal("c", 2)
    assert ix.snapshot("c", 1).to_python() == [(("a", 1), 1, 1), (("b", 2), 1, 1)]
    with pytest.raises(SchemaMismatch, match="lacks columns"):
        ix.write({"c": pa.table({"key": ["a"]})})
    with pytest.raises(InvalidUsage, match="negative time"):
        ix.write({"c": t.set_column(2, "time", pa.array([-1, 3], pa.int64()))})
    # only widening within a kind is cast: pyarrow would parse "1" or truncate 1.5 silently
    for other in (pa.array(["1", "2"]), pa.array([1.0, 2.5]), pa.array([True, False])):
        with pytest.raises(SchemaMismatch, match=r"'value' of type .* is not int64"):
            ix.write({"c": t.set_column(1, "value", other)})
    with pytest.raises(SchemaMismatch, match="does not cast"):  # a uint64 beyond int64
        ix.write({"c": t.set_column(3, "diff", pa.array([2**64 - 1, 1], pa.uint64()))})


# -- bad input: typed errors that change nothing ------------------------------------------


def test_bad_input_changes_nothing() -> None:
    ix = fresh()
    ix.register("c", pa.string(), pa.int64())
    ix.write({"c": [(("a", 1), 5, 1)]})
    ix.seal("c", 6)
    ix.allow_compaction("c", 2)
    before = ix.state
    cases: list[tuple[type[Exception], str, object]] = [
        (InvalidUsage, "below its upper", lambda: ix.write({"c": [(("a", 1), 5, 1)]})),
        (InvalidUsage, "backwards", lambda: ix.seal("c", 4)),
        (InvalidUsage, "backwards", lambda: ix.allow_compaction("c", 1)),
        (InvalidUsage, "beyond its upper", lambda: ix.allow_compaction("c", 7)),
        (InvalidUsage, "below its since", lambda: ix.snapshot("c", 1)),
        (InvalidUsage, "not below its upper", lambda: ix.snapshot("c", 6)),
        (UnknownCollection, "unknown collection 'nope'", lambda: ix.seal("nope", 1)),
        (UnknownCollection, "unknown", lambda: ix.snapshot("nope", 0)),
        (SchemaMismatch, "iterable", lambda: ix.write({"c": 42})),
        (SchemaMismatch, r"\(\(key, value\), time, diff\)", lambda: ix.write({"c": [(1, 2)]})),
        (InvalidUsage, "not an integer", lambda: ix.write({"c": [(("a", 1), -1, 1)]})),
        (InvalidUsage, "not an integer", lambda: ix.seal("c", 2**64)),
        # a multi-collection write with one bad part lands nothing
        (UnknownCollection, "unknown", lambda: ix.write({"c": [(("z", 1), 9, 1)], "x": []})),
    ]
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()  # type: ignore[operator]
        assert ix.state is before
    assert Engine.open(ix.store).state == before


def test_read_only_cannot_write() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    fresh(blob).register("c", pa.string(), pa.int64())
    ro = Engine.open(blob.read_only())
    with pytest.raises(ReadOnly):
        ro.seal("c", 1)
    with pytest.raises(ReadOnly):
        ro.fence()


# -- fencing -----------------------------------------------------------------------------


def test_newer_epoch_fences_older_writer() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    old = fresh(blob, epoch=1)
    old.register("c", pa.string(), pa.int64())
    old.write({"c": [(("acked", 1), 0, 1)]})
    new = fresh(blob, epoch=2)
    with pytest.raises(Fenced, match="generation 2"):
        old.write({"c": [(("late", 1), 1, 1)]})
    new.seal("c", 2)
    assert new.snapshot("c", 1).to_python() == [(("acked", 1), 1, 1)]
    # An older epoch can never claim the log back.
    with pytest.raises(Fenced):
        fresh(blob, epoch=1)


# -- corruption of every stored object kind ----------------------------------------------


def _location_with_everything(root: Path) -> FileBlob:
    blob = FileBlob(root)
    ix = fresh(blob, inline_threshold=100, rollup_every=2)
    ix.register("c", pa.string(), pa.int64())
    for t in range(6):
        ix.write({"c": [((f"k{i}", i), t, 1) for i in range(40)]})
        ix.seal("c", t + 1)
    ix.maintain()
    ix.seal("c", 7)  # log entries after the newest rollup: read on every open
    ix.seal("c", 8)
    return blob


@pytest.mark.parametrize("kind", ["log", "rollup", "data"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_corruption_is_detected_never_decoded(tmp_path: Path, kind: str, damage: str) -> None:
    blob = _location_with_everything(tmp_path)
    prefix = {"log": layout.LOG_PREFIX, "rollup": layout.ROLLUP_PREFIX, "data": layout.DATA_PREFIX}
    keys = blob.list_keys(prefix[kind])
    if kind == "log":
        rollup = layout.seq_of(blob.list_keys(layout.ROLLUP_PREFIX)[-1])
        keys = [k for k in keys if layout.seq_of(k) > rollup]
    elif kind == "data":
        state = Engine.open(blob.read_only()).state
        live = {p.blob_key for p in state.collections["c"].parts}
        keys = [k for k in keys if k in live]
    assert keys
    victim = keys[-1]
    # NB: a valid value of another key of the same kind (a data part is a plain Parquet
    # file, which under a metadata key is not even an envelope: see the test below)
    other = next(k for k in [*blob.list_keys(prefix[kind]), *blob.list_keys(layout.META_PREFIX)]
                 if k != victim)
    raw = blob._get(victim) or b""
    if damage == "flip":
        b = bytearray(raw)
        b[len(b) // 2] ^= 0x01
        blob._set(victim, bytes(b))
    elif damage == "truncate":
        blob._set(victim, raw[: len(raw) - 7])
    else:
        blob._set(victim, blob._get(other) or b"")  # a valid value of another key
    def read() -> None:
        Engine.open(blob.read_only()).snapshot("c", 5).to_arrow()

    with pytest.raises(Corruption, match=victim.split("/")[-1]) as err:
        read()
    if damage != "truncate":
        assert isinstance(err.value, ChecksumMismatch)


def test_a_value_of_another_kind_is_detected(tmp_path: Path) -> None:
    """A data part (a plain Parquet file) swapped under a metadata key, and a metadata record
    under a data part's key: both are Corruption, never decoded."""
    blob = _location_with_everything(tmp_path)
    state = Engine.open(blob.read_only()).state
    part = next(p.blob_key for p in state.collections["c"].parts if p.blob_key)
    assert part is not None
    log = blob.list_keys(layout.LOG_PREFIX)[-1]
    raw_part, raw_log = blob._get(part) or b"", blob._get(log) or b""
    blob._set(log, raw_part)
    with pytest.raises(Corruption, match="bad magic"):
        Engine.open(blob.read_only())
    blob._set(log, raw_log)
    blob._set(part, raw_log)
    with pytest.raises(ChecksumMismatch, match=part.split("/")[-1]):
        Engine.open(blob.read_only()).snapshot("c", 5).to_arrow()


# -- compaction and metadata scale ----------------------------------------------------------


def test_compaction_keeps_parts_logarithmic_and_reads_definite() -> None:
    # NB: part_target_bytes pinned too: merges cut into small parts (the tiny-parts knob set)
    # make as many parts as the data needs, not a logarithmic number.
    ix = fresh(compaction=CompactionPolicy(final_rows=1 << 19, part_target_bytes=64 << 20))
    ix.register("c", pa.int64(), pa.int64())
    answers = {}
    for t in range(1000):
        ix.write({"c": [((t % 37, t % 5), t, 1), ((t % 11, 0), t, -1)]})
        ix.seal("c", t + 1)
        ix.maintain()
        if t % 250 == 249:
            answers[t] = ix.snapshot("c", t).to_arrow()
    parts = ix.state.collections["c"].parts
    assert len(parts) <= 12, len(parts)
    for t, table in answers.items():
        assert ix.snapshot("c", t).to_arrow().equals(table)
    ix.allow_compaction("c", 800)
    ix.maintain()
    for t, table in answers.items():
        if t >= 800:
            assert ix.snapshot("c", t).to_arrow().equals(table)


def test_commit_size_does_not_grow_with_history_or_collections() -> None:
    """Each commit stores only what changed: its bytes stay flat after 1,000 seals and with
    500 collections (time is measured by the benchmark suite, not here)."""
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = fresh(blob)
    ix.register("c", pa.int64(), pa.int64())

    def last_commit_size() -> int:
        return len(blob.get(layout.log_key(ix.state.seq, meta.log_from(ix.state))) or b"")

    ix.write({"c": [((1, 1), 0, 1)]})
    ix.seal("c", 1)
    first = last_commit_size()
    assert first > 0
    for t in range(1, 1000):
        ix.seal("c", t + 1)
    assert last_commit_size() <= first + 8
    for i in range(500):
        ix.register(f"other{i}", pa.int64(), pa.int64())
    ix.seal("c", 2000)
    assert last_commit_size() <= first + 8
    # and a reopen replays a bounded suffix of the log thanks to rollups
    ix.maybe_rollup()
    reopened = Engine.open(blob.read_only())
    assert reopened.state == ix.state


def test_gc_deletes_retired_blobs_only_after_grace(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    ix = fresh(blob, inline_threshold=0, gc_grace_seconds=3600.0)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(8):
        ix.write({"c": [((t, t), t, 1)]})
        ix.seal("c", t + 1)
    before = set(blob.list_keys(layout.DATA_PREFIX))
    ix.maintain()
    retired = {r.key for r in ix.state.retired}
    assert retired
    assert retired <= before
    assert set(blob.list_keys(layout.DATA_PREFIX)) >= before  # still there: within grace
    assert gc.leaked(blob, ix.state) == []
    ix.collect_garbage(now_ms=ix.state.wall_ms + 3_600_001)
    assert not ix.state.retired
    remaining = set(blob.list_keys(layout.DATA_PREFIX))
    assert not (remaining & retired)
    assert remaining == gc.referenced(ix.state)
    assert Engine.open(blob.read_only()).snapshot("c", 7).to_python() == [
        ((t, t), 7, 1) for t in range(8)
    ]


def test_leaked_blobs_are_listed(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    ix = fresh(blob)
    ix.register("c", pa.int64(), pa.int64())
    blob.set(f"{layout.DATA_PREFIX}1/orphan", b"x")
    assert gc.leaked(blob, ix.state) == [f"{layout.DATA_PREFIX}1/orphan"]


def test_updates_between_refuses_ranges_compacted_away() -> None:
    ix = fresh()
    ix.register("c", pa.int64(), pa.int64())
    for t in range(5):
        ix.write({"c": [((t, t), t, 1)]})
    ix.seal("c", 5)
    ix.allow_compaction("c", 3)
    with pytest.raises(InvalidUsage, match="no longer exact"):
        list(ix.updates_between("c", 2, 5))
    got = pa.concat_tables(ix.updates_between("c", 4, 5))
    assert got.column("time").to_pylist() == [4]


# -- loading: writers scan the log, readers probe it -----------------------------------------


class _Watched(ReadOnlyView):
    """A read-only view that records LIST prefixes and can run a hook before one GET."""

    def __init__(self, inner: Blob) -> None:
        super().__init__(inner)
        self.listed: list[str] = []
        self.before_get: dict[str, Callable[[], None]] = {}

    def _list(self, prefix: str) -> list[str]:
        self.listed.append(prefix)
        return super()._list(prefix)

    def _get(self, key: str) -> bytes | memoryview | None:
        hook = self.before_get.pop(key, None)
        if hook is not None:
            hook()
        return super()._get(key)


def _history(blob: Blob, commits: int, **opts: object) -> Engine:
    ix = fresh(blob, **opts)
    ix.register("c", pa.string(), pa.int64())
    for t in range(commits):
        ix.write({"c": [((f"k{t}", t), t, 1)]})
        ix.seal("c", t + 1)
    return ix


def test_reader_load_probes_instead_of_listing_the_log() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    writer = _history(blob, 40, rollup_every=16)
    writer.maybe_rollup()
    writer.seal("c", 41)  # entries after the newest rollup
    view = _Watched(blob)
    reader = Engine.open(view)
    assert reader.state == writer.state
    assert layout.LOG_PREFIX not in view.listed  # cost: entries since the rollup, not the log


def test_writer_load_finds_a_gap_a_probe_would_read_as_the_end() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    writer = _history(blob, 10, rollup_every=10_000)
    seq = writer.state.seq
    blob.delete(layout.log_key(seq - 2, meta.log_from(writer.state)))  # storage lost an entry in the middle
    with pytest.raises(Corruption, match="gap"):
        Engine.open(blob, epoch=2, writer="w2")
    # a reader cannot tell that hole from the end of the log (as when following it), and reads
    # the definite prefix before it
    assert Engine.open(blob.read_only()).state.seq == seq - 3


def test_reader_load_survives_a_trim_past_a_newer_rollup_while_probing() -> None:
    # GC grace 0: the trust window is empty, so the probe is verified by LISTing the rollups.
    blob = MemoryBlob(uuid.uuid4().hex)
    writer = _history(blob, 20, rollup_every=10_000, gc_grace_seconds=0.0)
    writer.machine.write_rollup(writer.state)
    first = writer.state.seq
    for t in range(20, 30):
        writer.write({"c": [((f"k{t}", t), t, 1)]})
    view = _Watched(blob)

    def rollup_and_trim() -> None:
        # between the reader's LIST of rollups and its probe: a newer rollup, and the log
        # trimmed up to it (what GC does once that rollup is a grace period old)
        writer.machine.write_rollup(writer.state)
        for seq in range(first + 1, writer.state.seq + 1):
            blob.delete(layout.log_key(seq, meta.log_from(writer.state)))

    view.before_get[layout.log_key(first + 1, meta.log_from(writer.state))] = rollup_and_trim
    reader = Engine.open(view, options=Options(gc_grace_seconds=0.0))
    assert reader.state == writer.state


def test_part_cache_is_bounded_by_decoded_bytes() -> None:
    blob = MemoryBlob(uuid.uuid4().hex)
    ix = fresh(blob, inline_threshold=0)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(6):
        ix.write({"c": [((t * 10_000 + i, i), t, 1) for i in range(10_000)]})
    ix.seal("c", 6)
    c = ix.state.collections["c"]
    schema = Types.of(c).schema
    decoded = [PartReader(blob, cache_bytes=0).read(p, schema) for p in c.parts]
    budget = 4 * max(t.nbytes for t in decoded)  # room for about four decoded parts
    reader = PartReader(blob, cache_bytes=budget)
    for p in c.parts:
        assert reader.read(p, schema).equals(decoded[c.parts.index(p)])
        cached = sum(t.nbytes for t, _, _ in reader._cache.values())
        assert reader._cached == cached <= budget
    assert len(reader._cache) < len(c.parts)  # it evicted


def test_int64_times_are_checked_and_kept_exactly() -> None:
    """int64 times (the common input) are viewed as uint64, not cast: sliced and multi-chunk
    columns keep their values, nulls and negative times are still refused."""
    ix = fresh()
    ix.register("c", pa.int64(), pa.int64())
    whole = pa.table({"key": list(range(10)), "value": list(range(10)),
                      "time": pa.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], pa.int64()),
                      "diff": [1] * 10})
    parts = pa.concat_tables([whole.slice(2, 3), whole.slice(7, 3)])  # offsets, two chunks
    assert parts.column("time").num_chunks == 2
    ix.write({"c": parts})
    (part,) = ix.state.collections["c"].parts
    assert (part.min_time, part.max_time) == (1, 6)  # times [4, 1, 5] and [6, 5, 3]
    ix.seal("c", 10)
    got = sorted(ix.snapshot("c", 9).to_python(), key=lambda u: u[0])
    assert got == [((k, k), 9, 1) for k in (2, 3, 4, 7, 8, 9)]
    before = ix.state
    with pytest.raises(SchemaMismatch, match="'time' has nulls"):
        ix.write({"c": whole.set_column(2, "time", pa.array([10, None] * 5, pa.int64()))})
    with pytest.raises(InvalidUsage, match="negative time -2"):
        ix.write({"c": pa.concat_tables([whole.slice(0, 1),
                                         whole.slice(1, 1).set_column(
                                             2, "time", pa.array([-2], pa.int64()))])})
    # one chunk, sliced (the path of a small append): only the slice's own times count
    signed = whole.set_column(2, "time", pa.array([-7, 12, 11, 10, -8] * 2, pa.int64()))
    with pytest.raises(InvalidUsage, match="negative time -8"):
        ix.write({"c": signed.slice(1, 4)})
    assert ix.state == before
    ix.write({"c": signed.slice(1, 3)})
    last = ix.state.collections["c"].parts[-1]
    assert (last.min_time, last.max_time) == (10, 12)  # times [12, 11, 10], viewed exactly
    ix.seal("c", 13)
    got = sorted(u for u in ix.snapshot("c", 12).to_python() if u[0][0] in (1, 2, 3))
    assert got == [((1, 1), 12, 1), ((2, 2), 12, 2), ((3, 3), 12, 2)]


def test_group_commit_part_times_follow_the_writes_kept() -> None:
    """A group's part carries the time range of the writes it kept: the range found when each
    write was staged, rolled back with a write a failed command staged (the savepoint)."""
    from persist.indexed.engine import Txn

    ix = fresh()
    ix.register("c", pa.int64(), pa.int64())

    def rows(*times: int) -> pa.Table:
        n = len(times)
        return ix.normalize("c", pa.table({"key": list(range(n)), "value": [0] * n,
                                           "time": pa.array(times, pa.int64()),
                                           "diff": [1] * n}))

    txn = Txn(ix.state)

    def refused() -> None:  # a command that fails after staging a write
        with txn.atomically():
            txn.stage_write("c", rows(100, 200))
            raise InvalidUsage("refused")

    txn.stage_write("c", rows(7, 5))
    with pytest.raises(InvalidUsage):
        refused()
    txn.stage_write("c", rows(9, 6))
    assert txn.write_times["c"] == [(5, 7), (6, 9)]
    ix.commit(txn)
    (part,) = ix.state.collections["c"].parts
    assert (part.rows, part.min_time, part.max_time) == (4, 5, 9)


@pytest.mark.parametrize("diffs", [
    [1] * 7, [-1, -3, -2], [2, -5, 0, 7, -1], [0, 0], [2**63 - 1] * 3, [-(2**63)] * 3,
    [2**63 - 1, -(2**63), 5, -5],
])
def test_diff_sums_are_exact_short_or_long(diffs: list[int]) -> None:
    """A part's inserted and retracted counts are exact and capped at 2**64 - 1 whether the
    diffs are summed in Python (a short column, the small-append path) or by compute calls (a
    long one), for sliced multi-chunk columns too."""
    from persist.indexed.format.write import diff_sums

    def expect(ds: list[int]) -> tuple[int, int]:
        pos, neg = sum(d for d in ds if d > 0), -sum(d for d in ds if d < 0)
        return min(pos, 2**64 - 1), min(neg, 2**64 - 1)

    def table(ds: list[int]) -> pa.Table:
        col = pa.array([0, *ds, 0], pa.int64())
        # a sliced column in two chunks, as a group commit's concatenation has
        half = len(ds) // 2
        return pa.table({"diff": pa.chunked_array([col.slice(1, half),
                                                   col.slice(1 + half, len(ds) - half)])})

    short = table(diffs)
    long = table(diffs * (4097 // len(diffs) + 1))
    assert columnar.small_ints(short.column("diff"), pa.int64(), "q") is not None
    assert columnar.small_ints(long.column("diff"), pa.int64(), "q") is None
    assert diff_sums(short) == expect(diffs)
    assert diff_sums(long) == expect(diffs * (4097 // len(diffs) + 1))


def _nbytes_cases() -> dict[str, pa.Table]:
    ints = pa.table({"key": pa.array(range(1000), pa.int64()),
                     "time": pa.array(range(1000), pa.uint64())})
    nulls = pa.table({"a": pa.array([1, None, 3] * 50, pa.int64()),
                      "b": pa.array([True, False, None] * 50),
                      "d": pa.array([1, None] * 75, pa.decimal128(10, 2)),
                      "ts": pa.array([1, None, 2] * 50, pa.timestamp("us", tz="UTC"))})
    return {
        "fixed-width": ints,
        "a slice of a longer table": ints.slice(317, 100),
        "a group commit's chunks, sliced": pa.concat_tables(
            [ints.slice(0, 100), ints.slice(500, 7), ints.slice(990)]),
        "nullable columns": nulls,
        "strings": pa.table({"s": ["a", "bb", None], "k": [1, 2, 3]}),
        "a list": pa.table({"l": [[1, 2], [], None]}),
        "a struct": pa.table({"r": [{"x": 1}, None]}),
        "a dictionary": pa.table({"d": pa.array(["x", "yy", "x"]).dictionary_encode()}),
        "an extension type": pa.table({"u": pa.ExtensionArray.from_storage(
            pa.uuid(), pa.array([b"0123456789abcdef", None], pa.binary(16)))}),
        "empty": ints.slice(0, 0),
    }


@pytest.mark.parametrize("case", list(_nbytes_cases()))
def test_arrow_nbytes_is_the_tables_own_count(case: str) -> None:
    """The size the commit path decides by (inline or not, compressed or not) is
    ``Table.nbytes``, found without visiting the buffers where the columns are fixed-width
    (sliced, chunked, or nullable in one chunk), and the other types by ``nbytes`` itself."""
    table = _nbytes_cases()[case]
    assert columnar.arrow_nbytes(table) == table.nbytes


def test_arrow_nbytes_of_nulls_across_chunks_is_within_a_byte_per_chunk() -> None:
    """Each chunk's validity bitmap (and a boolean column's values) rounds up to a byte of its
    own, which a count from the row total does not see: within a byte per chunk and column."""
    one = pa.table({"a": pa.array([1, None, 3] * 50, pa.int64()),
                    "b": pa.array([True, False, None] * 50)})
    table = pa.concat_tables([one, one.slice(3, 17), one.slice(101, 5)])
    chunks = table.column(0).num_chunks
    assert columnar.arrow_nbytes(table) != table.nbytes  # the case is one that rounds
    assert abs(columnar.arrow_nbytes(table) - table.nbytes) <= chunks * table.num_columns


def _ids_in_child(q: Any) -> None:
    from persist import layout

    q.put([layout.random_id() for _ in range(50)])


def test_random_ids_are_distinct_across_threads_and_forks() -> None:
    """Part ids (``layout.random_id``) are 32 lowercase hex digits drawn in batches from
    ``os.urandom``: distinct across threads drawing at once, and a forked child never hands
    out the ids its parent had drawn but not yet used."""
    import multiprocessing as mp
    import re
    import threading

    from persist import layout

    layout.random_id()  # the pool now holds ids the child would inherit
    seen: list[str] = []

    def draw() -> None:
        seen.extend(layout.random_id() for _ in range(400))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_ids_in_child, args=(q,))
    child.start()
    theirs = q.get(timeout=30)
    child.join(30)
    mine = [layout.random_id() for _ in range(50)]
    every = seen + theirs + mine
    assert len(set(every)) == len(every) == 1700
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in every)
