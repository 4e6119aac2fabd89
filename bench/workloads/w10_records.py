"""W10 records: updates whose value is a record, written, read, queried and consolidated.

The data: ``--w10-rows`` updates (``--w10-chunk-rows`` per append, times increasing as in W1)
of a 10-field record: ``key`` int64 and ``value`` a struct of a string, a decimal128(18, 2), a
timestamp[us, UTC], a date32, a float64, an int32, a bool, a list<int64> and a nested struct of
two fields, about 10% nulls in every nullable field (:data:`VALUE_TYPE`). Generated from a
seed with numpy/pyarrow (:func:`make_records`, no per-row Python); persist stores it as a
collection with ``key_type=pa.int64()`` and ``value_type=VALUE_TYPE``.

1. **Write and raw read** (``--repeats`` rounds, systems rotated, one untimed warm-up round
   first as in W1): persist (``WriteHandle.append(table, upper=...)`` acknowledged), the floor
   (zstd Arrow IPC files, fsync'd), Parquet (``pq.write_table`` per append, zstd, file and
   directory fsync'd like the floor's) and delta-rs (``write_deltalake``, no fsync); then one
   raw read through a fresh handle (persist: a read-only replica, ``snapshot().batches()``;
   floor: its files memory-mapped; ``pq.read_table`` of the directory; ``DeltaTable``).
2. **Queries** on the last round's persist collection, after ``Client.maintain()`` compacted
   it (with ``CompactionPolicy.final_rows`` raised above the collection's size for that step,
   since parts of ``final_rows`` rows or more are otherwise never merged): a point lookup on
   the key (``persist.col("key") == k``) and a range filter (``persist.col("value.amount") >
   x``, ~1% of rows) through ``snapshot(as_of, filter=...)`` of a fresh read-only replica,
   against ``pq.read_table(path, filters=...)`` on the same rows sorted by key (row groups as
   large as persist's parts, at most pyarrow's default), and a full scan of each. The lookup
   through an already open replica, and Parquet's lookup on the files as appended, are
   context rows.
3. **Consolidation**: ``columnar.consolidate`` of ``--w10-consolidate-rows`` rows with the
   record value against the same keys, times and diffs with one int64 value (keys repeat:
   draws from 70% as many keys), on distinct rows and with retractions (the grouping path).
   ``bench/records_consolidate.py`` runs this step alone.
4. **Python objects**: ``--w10-python-rows`` of the same records as instances of
   :class:`Record` (the ``msgspec.Struct`` persist maps to :data:`VALUE_TYPE`), appended to
   one collection as ``((key, Record), time, diff)`` tuples and, as an Arrow table, to
   another; then a snapshot of the Structs' collection read with ``to_python()`` and with
   ``to_arrow()``, each round on a fresh snapshot. Reported per round as ratios (the targets:
   at most 4x each).
5. **Spark** (needs pyspark >= 4.0 and Java, else skipped with the reason): the same lookup,
   range filter and full scan through ``spark.read.format("persist")`` (``mode=raw``) and
   through ``spark.read.parquet`` of the key-sorted file, in one ``local[2]`` session with
   ``spark.sql.python.filterPushdown.enabled=true``, each materialized by the ``noop`` sink.

pyiceberg is not measured here (the issue compares persist with the floor, Parquet and
delta-rs).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import statistics
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Annotated, Any, ClassVar, cast

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import persist
from bench.common import (
    KEY_SPACE,
    MiB,
    du,
    fresh_dir,
    fsync_dir,
    remove,
    rotate,
    settle,
    timed,
    timed_full_read,
)
from bench.results import WorkloadResult
from bench.systems.base import System
from bench.systems.persist import NAME, PersistSystem
from bench.workloads.context import Context

WID = "W10"
TITLE = "records"

#: The fraction of nulls in every nullable field.
NULLS = 0.1
AMOUNT_TYPE = pa.decimal128(18, 2)
#: The record: nine fields, every one nullable; ``inner`` is a nested struct of two.
VALUE_TYPE = pa.struct([
    pa.field("name", pa.string()),
    pa.field("amount", AMOUNT_TYPE),
    pa.field("at", pa.timestamp("us", tz="UTC")),
    pa.field("day", pa.date32()),
    pa.field("score", pa.float64()),
    pa.field("rank", pa.int32()),
    pa.field("active", pa.bool_()),
    pa.field("tags", pa.list_(pa.int64())),
    pa.field("inner", pa.struct([pa.field("count", pa.int64()), pa.field("flag", pa.bool_())])),
])
RECORD_SCHEMA = pa.schema([
    pa.field("key", pa.int64()),
    pa.field("value", VALUE_TYPE),
    pa.field("time", pa.int64()),
    pa.field("diff", pa.int64()),
])
#: ``value.amount`` in cents is drawn uniformly from ``[AMOUNT_LO, AMOUNT_HI)``.
AMOUNT_LO, AMOUNT_HI = -10**8, 10**10
#: The range filter keeps amounts above this quantile of the distribution (~1% of rows).
RANGE_QUANTILE = 0.99
_EPOCH_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
_YEAR_US = 366 * 86_400 * 1_000_000

#: The peers W10 writes to (the floor and delta-rs through their adapters; Parquet is W10's).
STORES = ("persist", "floor", "delta")
PARQUET = "parquet"
#: Where the key-sorted Parquet files are written (under the scratch directory).
SORTED_DIR = "w10-parquet-sorted"
#: Row groups of the second key-sorted Parquet file: as many rows as a record batch of a
#: persist part (the unit its per-batch stats let a filtered read skip).
FINE_ROW_GROUP = 1 << 16

WRITE, WRITE_MIB = "write records/s", "write MiB/s (Arrow bytes)"
READ, READ_MIB = "raw read records/s", "raw read MiB/s"
LOOKUP = "point lookup (ms)"
SCAN = "full scan (ms)"
SPEEDUP = "point lookup speed-up over a full scan"
CONS, CONS_R = "consolidate record / int64", "consolidate with retractions, record / int64"
PY_APPEND = "Python objects: append Structs / Arrow table"
PY_READ = "Python objects: to_python() / to_arrow()"


class Inner(msgspec.Struct, frozen=True):
    """``VALUE_TYPE``'s nested struct as a Struct."""

    count: int | None
    flag: bool | None


class Record(msgspec.Struct, frozen=True):
    """W10's record as a ``msgspec.Struct``: persist stores it as :data:`VALUE_TYPE`."""

    name: str | None
    amount: Annotated[Decimal | None, persist.decimal(18, 2)]
    at: datetime.datetime | None
    day: datetime.date | None
    score: float | None
    rank: Annotated[int | None, persist.arrow(pa.int32())]
    active: bool | None
    tags: list[int | None] | None
    inner: Inner | None


def as_structs(table: pa.Table) -> list[tuple[tuple[int, Record | None], int, int]]:
    """``table``'s rows (:data:`RECORD_SCHEMA`) as ``((key, Record), time, diff)`` tuples."""
    def record(d: dict[str, Any] | None) -> Record | None:
        if d is None:
            return None
        inner = d["inner"]
        return Record(**{**d, "inner": None if inner is None else Inner(**inner)})

    return [((k, record(v)), t, d) for k, v, t, d in zip(
        *(table.column(c).to_pylist() for c in ("key", "value", "time", "diff")), strict=True)]

Bools = npt.NDArray[np.bool_]


# -- data -----------------------------------------------------------------------------------------


def _valid(rng: np.random.Generator, n: int) -> Bools:
    return rng.random(n) >= NULLS


def _decimal(cents: npt.NDArray[np.int64], valid: Bools) -> pa.Array:
    """decimal128 ``cents / 100`` from its buffers: each value is a little-endian 128-bit
    two's-complement integer, here the int64 and its sign extension."""
    n = len(cents)
    words = np.empty((n, 2), dtype=np.int64)
    words[:, 0] = cents
    words[:, 1] = cents >> 63
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(AMOUNT_TYPE, n, [bitmap, pa.py_buffer(words)],
                                 null_count=int(n - np.count_nonzero(valid)))


def record_values(rng: np.random.Generator, n: int) -> pa.StructArray:
    """``n`` records of :data:`VALUE_TYPE` drawn from ``rng``, ~10% nulls in every field."""
    ints = pa.array(rng.integers(0, 50_000, n))
    names = pc.binary_join_element_wise("name", pc.cast(ints, pa.string()), "-")
    names = pc.if_else(pa.array(_valid(rng, n)), names, pa.scalar(None, pa.string()))
    amount = _decimal(rng.integers(AMOUNT_LO, AMOUNT_HI, n), _valid(rng, n))
    at = pa.array(_EPOCH_US + rng.integers(0, _YEAR_US, n), type=pa.timestamp("us", tz="UTC"),
                  mask=~_valid(rng, n))
    day = pa.array(rng.integers(18_000, 20_000, n).astype(np.int32), type=pa.date32(),
                   mask=~_valid(rng, n))
    score = pa.array(rng.normal(size=n), mask=~_valid(rng, n))
    rank = pa.array(rng.integers(0, 1000, n).astype(np.int32), mask=~_valid(rng, n))
    active = pa.array(rng.random(n) < 0.5, mask=~_valid(rng, n))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(rng.integers(0, 5, n), out=offsets[1:])
    items = pa.array(rng.integers(0, 1 << 20, int(offsets[-1])))
    tags = pa.ListArray.from_arrays(pa.array(offsets), items, type=VALUE_TYPE.field("tags").type,
                                    mask=pa.array(~_valid(rng, n)))
    inner_type = VALUE_TYPE.field("inner").type
    inner = pa.StructArray.from_arrays(
        [pa.array(rng.integers(0, 10, n), mask=~_valid(rng, n)), pa.array(rng.random(n) < 0.5)],
        fields=list(inner_type), mask=pa.array(~_valid(rng, n)))
    return pa.StructArray.from_arrays(
        [names, amount, at, day, score, rank, active, tags, inner], fields=list(VALUE_TYPE))


def make_records(seed: int, rows: int, *, time_lo: int, time_hi: int) -> pa.Table:
    """``rows`` updates of :data:`RECORD_SCHEMA`: random int64 keys (as W1's), random records,
    times spread over ``[time_lo, time_hi)``, diff 1. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, KEY_SPACE, rows, dtype=np.int64)
    values = record_values(rng, rows)
    times = np.linspace(time_lo, time_hi - 1, rows).astype(np.int64)
    return pa.Table.from_arrays(
        [pa.array(keys), values, pa.array(times), pa.array(np.ones(rows, dtype=np.int64))],
        schema=RECORD_SCHEMA)


def consolidate_inputs(rows: int, seed: int = 7) -> tuple[pa.Table, pa.Table]:
    """Two parts in the stored form (``time`` uint64) with the same keys, times and diffs: one
    with an int64 value, one with a record value. Keys repeat (``rows`` draws from 70% as many
    keys) and times are 0-3, as in a compaction of updates."""
    rng = np.random.default_rng(seed)
    keys = pa.array(rng.integers(0, max(int(rows * 0.7), 1), rows))
    times = pa.array(rng.integers(0, 4, rows).astype(np.uint64))
    diffs = pa.array(np.ones(rows, dtype=np.int64))
    plain = pa.table({"key": keys, "value": pa.array(rng.integers(0, 1 << 40, rows)),
                      "time": times, "diff": diffs})
    rec = pa.table({"key": keys, "value": record_values(rng, rows), "time": times,
                    "diff": diffs})
    return plain, rec


def with_retractions(t: pa.Table) -> pa.Table:
    """``t`` with a retraction (diff -1) of a quarter of its rows inserted in the middle: the
    input then needs summing, which takes consolidation's grouping path."""
    neg = t.set_column(3, t.schema.field(3), pa.array(-np.ones(len(t), dtype=np.int64)))
    half = len(t) // 2
    return pa.concat_tables([t.slice(0, half), neg.slice(0, half // 2),
                             t.slice(half)]).combine_chunks()


def range_threshold() -> Decimal:
    """The ``value.amount`` above which ~1% of the (non-null) amounts lie."""
    cents = int(AMOUNT_LO + RANGE_QUANTILE * (AMOUNT_HI - AMOUNT_LO))
    return Decimal(cents).scaleb(-2)


# -- Parquet, the store W10 adds -------------------------------------------------------------


class ParquetStore(System):
    """One zstd Parquet file per append (``pq.write_table``), fsync'd with its directory like
    the floor's files; reads are ``pq.read_table`` of the directory."""

    name: ClassVar[str] = PARQUET
    guarantee: ClassVar[str] = "durable (file and directory fsync'd)"

    def __init__(self, root: Path, *, schema: pa.Schema = RECORD_SCHEMA) -> None:
        super().__init__(root, schema=schema)
        self.dir = root / "table"
        self._n = 0

    def create(self) -> None:
        self.dir.mkdir(parents=True)
        fsync_dir(self.root)

    def append(self, table: pa.Table, upper: int) -> Any:
        write_parquet(self.dir / f"{self._n:09d}.parquet", table)
        fsync_dir(self.dir)
        self._n += 1
        return self._n

    def read(self, version: Any = None) -> pa.Table:
        return pq.read_table(self.dir)


def write_parquet(path: Path, table: pa.Table, **kwargs: Any) -> None:
    """``table`` as a new zstd Parquet file at ``path``, fsync'd (not its directory)."""
    with open(path, "xb") as f:
        pq.write_table(table, f, compression="zstd", **kwargs)
        f.flush()
        os.fsync(f.fileno())


# -- persist queries --------------------------------------------------------------------------


def key_is(k: int) -> persist.Filter:
    """``persist.col("key") == k``."""
    return persist.col("key") == k


def amount_above(x: Decimal) -> persist.Filter:
    """``persist.col("value.amount") > x``."""
    return persist.col("value.amount") > x


def _snapshot_rows(read: persist.ReadHandle, flt: persist.Filter | None
                   ) -> tuple[pa.Table, Any]:
    snap = read.snapshot(read.upper - 1, filter=flt)
    tables = list(snap.batches())
    return (pa.concat_tables(tables) if tables else snap.schema.empty_table()), snap.pruning


def persist_query(url: str, flt: persist.Filter | None) -> tuple[pa.Table, Any]:
    """The raw rows matching ``flt`` (None: every row) as of the latest time, through a
    freshly opened read-only replica (opening is part of the cost, as for every read), and
    what pruning read and skipped (``ClientSnapshot.pruning``; None without a filter)."""
    client = persist.open(url, read_only=True)
    try:
        _, read = client.create_or_load(NAME, key_type=pa.int64(), value_type=VALUE_TYPE)
        return _snapshot_rows(read, flt)
    finally:
        client.stop()


def _pruned(counts: Any) -> str:
    return ("no pruning counts" if counts is None else
            f"{counts.parts_read} parts read, {counts.parts_pruned} pruned; "
            f"{counts.batches_read} record batches decoded, {counts.batches_skipped} skipped")


def compact_for_queries(s: PersistSystem, rows: int) -> tuple[float, int, list[int]]:
    """Compacts the collection with ``Client.maintain()``, then stops the writer. For that
    step ``final_rows`` is raised above ``rows`` (the appended parts are merged at all) and
    ``fanin`` is 2 (any two of them are merged, not only four of one level).

    Returns:
        (seconds the maintain() calls took, parts before, rows of each part after).
    """
    client = s.client
    assert client is not None
    _, read = client.create_or_load(NAME, key_type=pa.int64(), value_type=VALUE_TYPE)

    def parts() -> tuple[Any, ...]:
        return tuple(read.snapshot(read.upper - 1).parts)

    before = len(parts())
    opts = client.options
    client.set_options(replace(opts, compaction=replace(opts.compaction, final_rows=rows + 1,
                                                        fanin=2))).result()
    with timed() as t:
        # NB: until no appended (unconsolidated) part is left, at most 5 rounds: with
        # final_rows raised, compaction's own (consolidated) output could be planned again
        # and again, which would only measure rewriting it.
        for _ in range(5):
            if not client.maintain() or all(p.consolidated for p in parts()):
                break
    client.set_options(opts).result()
    after = [p.rows for p in parts()]
    s.close()
    return t.seconds, before, after


# -- the workload ------------------------------------------------------------------------------


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    rows, chunk = a.w10_rows, a.w10_chunk_rows
    n = (rows + chunk - 1) // chunk
    res = WorkloadResult(
        WID, f"{TITLE}: {rows:,} updates of a 10-field record ({n} appends), queries, "
        f"consolidation", params={"rows": rows, "chunk_rows": chunk, "repeats": ctx.repeats,
                                  "lookups": a.w10_lookups,
                                  "consolidate_rows": a.w10_consolidate_rows,
                                  "value_type": str(VALUE_TYPE)})
    res.extra.append(PARQUET)
    res.columns[PARQUET] = "parquet (pyarrow)"
    res.skip("iceberg", "not measured in W10 (the floor, Parquet and delta-rs are its peers)")
    stores = [s for s in STORES if s in ctx.systems] + [PARQUET]
    ctx.log(f"W10: generating {rows:,} records")
    chunks = [make_records(10_000 + i, min(chunk, rows - i * chunk), time_lo=i * chunk,
                           time_hi=min((i + 1) * chunk, rows)) for i in range(n)]
    nbytes = sum(c.nbytes for c in chunks)
    res.params["arrow_mib"] = round(nbytes / MiB, 1)
    kept: dict[str, System] = {}
    try:
        _write_read(ctx, res, stores, chunks, kept)
        if "persist" in kept and PARQUET in kept:
            sorted_pq = _queries(ctx, res, kept, chunks, rows)
            del chunks
            _consolidate(ctx, res)
            _python_objects(ctx, res)
            _spark(ctx, res, cast(PersistSystem, kept["persist"]), sorted_pq, rows)
        else:
            why = "persist not selected (--systems): no queries, no consolidation"
            res.notes.append(why)
    finally:
        for s in kept.values():
            ctx.dispose(s)
        remove(ctx.work / SORTED_DIR)
    res.notes.append("write: acknowledged appends of the same Arrow tables (persist: durable "
                     "and sealed; floor and Parquet: file and directory fsync'd; delta-rs: no "
                     "fsync); one untimed warm-up round per store first")
    res.notes.append("raw read = every stored row through a freshly opened handle (persist: a "
                     "read-only replica, snapshot().batches())")
    return [res]


def _new(ctx: Context, name: str, tag: str) -> System:
    if name == PARQUET:
        root = fresh_dir(ctx.work, f"{tag}-{name}")
        s: System = ParquetStore(root)
        s.create()
        return s
    return ctx.new_system(name, tag, schema=RECORD_SCHEMA)


def _write_read(ctx: Context, res: WorkloadResult, stores: list[str], chunks: list[pa.Table],
                kept: dict[str, System]) -> None:
    total = sum(len(c) for c in chunks)
    nbytes = sum(c.nbytes for c in chunks)
    uppers = [int(c.column("time")[-1].as_py()) + 1 for c in chunks]

    def write(s: System) -> None:
        for c, upper in zip(chunks, uppers, strict=True):
            s.append(c, upper=upper)

    # NB: one untimed round first, as in W1 (the process's first full-size write and read
    # pay its memory pool's growth).
    for name in stores:
        ctx.log(f"W10 warm-up (not measured): {name}")
        s = _new(ctx, name, "w10-warmup")
        try:
            write(s)
            s.read()
        finally:
            ctx.dispose(s)
    for r in range(ctx.repeats):
        last = r == ctx.repeats - 1
        for name in rotate(stores, r):
            ctx.log(f"W10 round {r + 1}/{ctx.repeats}: {name}")
            s = _new(ctx, name, f"w10-r{r}")
            keep = False
            try:
                settle()
                with timed() as t:
                    write(s)
                res.add(WRITE, "rec/s", "higher", name, total / t.seconds)
                res.add(WRITE_MIB, "MiB/s", "higher", name, nbytes / MiB / t.seconds)
                seconds = timed_full_read(s, total, f"W10: {name}")
                res.add(READ, "rec/s", "higher", name, total / seconds)
                res.add(READ_MIB, "MiB/s", "higher", name, nbytes / MiB / seconds)
                res.add("stored MiB", "MiB", "lower", name, du(s.root) / MiB)
                keep = last and name in ("persist", PARQUET)
                if keep:
                    kept[name] = s
            finally:
                if not keep:
                    ctx.dispose(s)


def _ms(f: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Milliseconds ``f(*args, **kwargs)`` took (GC paused)."""
    with timed() as t:
        f(*args, **kwargs)
    return t.seconds * 1e3


def _queries(ctx: Context, res: WorkloadResult, kept: dict[str, System],
             chunks: list[pa.Table], rows: int) -> Path:
    """Compacts the kept persist collection, writes the key-sorted Parquet file, measures the
    lookups; returns the sorted file (for Spark)."""
    a = ctx.args
    ps = cast(PersistSystem, kept["persist"])
    appended = cast(ParquetStore, kept[PARQUET]).dir
    ctx.log("W10: compacting the persist collection (Client.maintain())")
    seconds, before, sizes = compact_for_queries(ps, rows)
    res.add("maintain() before queries (s)", "s", None, "persist", seconds)
    res.add("parts (persist) / row groups (Parquet) queried", "n", None, "persist", len(sizes))
    group_rows = max(1, min(int(statistics.median(sizes)) if sizes else rows, 1 << 20))
    full = pa.concat_tables(chunks)
    rng = np.random.default_rng(10_010)
    keys = [int(full.column("key")[int(i)].as_py())
            for i in rng.integers(0, len(full), a.w10_lookups)]
    ctx.log(f"W10: writing the key-sorted Parquet file ({group_rows:,} rows per row group)")
    sorted_dir = fresh_dir(ctx.work, SORTED_DIR)
    sorted_pq, fine_pq = sorted_dir / "sorted.parquet", sorted_dir / "fine.parquet"
    by_key = full.sort_by("key")
    del full
    write_parquet(sorted_pq, by_key, row_group_size=group_rows)
    # NB: persist skips record batches of a part too (per-batch stats); the same rows with
    # row groups of that size show what Parquet's pushdown makes of the same granularity.
    write_parquet(fine_pq, by_key, row_group_size=FINE_ROW_GROUP)
    del by_key
    res.add("parts (persist) / row groups (Parquet) queried", "n", None, PARQUET,
            pq.ParquetFile(sorted_pq).num_row_groups)
    res.notes.append(
        f"queries: persist after Client.maintain() with final_rows raised above {rows:,} rows "
        f"and fanin 2 "
        f"({before} parts before, {len(sizes)} after, {min(sizes, default=0):,}-"
        f"{max(sizes, default=0):,} rows each); Parquet: the same rows sorted by key in one "
        f"file, row groups of {group_rows:,} rows (persist's median part, at most pyarrow's "
        f"default), and again with row groups of {FINE_ROW_GROUP:,} rows (a persist part's "
        f"record batch); each query opens afresh (persist: a read-only replica)")
    x = range_threshold()
    url = ps.url
    # NB: every query must find the same rows through both engines (checked once, outside
    # the timings).
    pruned = ""
    for k in keys:
        want = pq.read_table(sorted_pq, filters=ds.field("key") == k).num_rows
        got, counts = persist_query(url, key_is(k))
        if got.num_rows != want:
            raise AssertionError(f"W10: persist lookup of key {k} gave {got.num_rows} rows, "
                                 f"Parquet {want}")
        pruned = pruned or _pruned(counts)
    want_range = pq.read_table(sorted_pq, filters=ds.field("value", "amount") > x).num_rows
    got, counts = persist_query(url, amount_above(x))
    if got.num_rows != want_range:
        raise AssertionError(f"W10: persist range filter gave {got.num_rows} rows, Parquet "
                             f"{want_range}")
    del got
    res.notes.append(f"range filter: value.amount > {x} ({want_range:,} of {rows:,} rows; "
                     f"persist: {_pruned(counts)}); point lookups: {len(keys)} keys per round, "
                     f"median of them (persist, the first: {pruned})")

    def pq_lookups(path: Path) -> float:
        return statistics.median(_ms(pq.read_table, path, filters=ds.field("key") == k)
                                 for k in keys)

    def persist_lookups() -> float:
        return statistics.median(_ms(persist_query, url, key_is(k)) for k in keys)

    cases: list[tuple[str, str, Callable[[], float]]] = [
        (PARQUET, LOOKUP, lambda: pq_lookups(sorted_pq)),
        (PARQUET, "point lookup, Parquet as appended (ms)", lambda: pq_lookups(appended)),
        (PARQUET, f"point lookup, Parquet row groups of {FINE_ROW_GROUP:,} rows (ms)",
         lambda: pq_lookups(fine_pq)),
        (PARQUET, SCAN, lambda: _ms(pq.read_table, sorted_pq)),
        (PARQUET, f"range value.amount > {x} (ms)",
         lambda: _ms(pq.read_table, sorted_pq, filters=ds.field("value", "amount") > x)),
        ("persist", SCAN, lambda: _ms(persist_query, url, None)),
        ("persist", LOOKUP, persist_lookups),
        ("persist", "point lookup, open replica (ms)", lambda: _open_lookups(url, keys)),
        ("persist", f"range value.amount > {x} (ms)",
         lambda: _ms(persist_query, url, amount_above(x))),
    ]
    for r in range(ctx.repeats):
        for column, metric, f in rotate(cases, r):
            ctx.log(f"W10 queries round {r + 1}/{ctx.repeats}: {column}, {metric}")
            settle()
            res.add(metric, "ms", "lower", column, f())
    for column in ("persist", PARQUET):
        m = res.metrics.get(LOOKUP)
        scan = res.metrics[SCAN].samples.get(column, [])
        look = m.samples.get(column, []) if m else []
        for s_ms, l_ms in zip(scan, look, strict=False):
            res.add(SPEEDUP, "x", "higher", column, s_ms / l_ms)
    return sorted_pq


def _open_lookups(url: str, keys: list[int]) -> float:
    """Median ms of the point lookups through one replica opened beforehand (not timed)."""
    client = persist.open(url, read_only=True)
    try:
        _, read = client.create_or_load(NAME, key_type=pa.int64(), value_type=VALUE_TYPE)
        return statistics.median(_ms(_snapshot_rows, read, key_is(k)) for k in keys)
    finally:
        client.stop()


def _consolidate(ctx: Context, res: WorkloadResult) -> None:
    """``columnar.consolidate`` of a record part against the same rows with an int64 value."""
    from persist.indexed.format import columnar

    n = ctx.args.w10_consolidate_rows
    ctx.log(f"W10: consolidating {n:,} rows (record vs int64 value)")
    plain, rec = consolidate_inputs(n)
    inputs = {"int64": plain, "record": rec, "int64 retractions": with_retractions(plain),
              "record retractions": with_retractions(rec)}
    for t in inputs.values():  # first calls (imports, kernels) outside the timings
        columnar.consolidate(t.slice(0, 1000))
    ms: dict[str, list[float]] = {k: [] for k in inputs}
    for r in range(ctx.repeats):
        for label in rotate(list(inputs), r):
            settle()
            with timed() as t:
                columnar.consolidate(inputs[label])
            ms[label].append(t.seconds * 1e3)
            res.add(f"consolidate {n:,} rows, {label.replace(' retractions', '')} value"
                    + (" with retractions" if "retractions" in label else "") + " (ms)",
                    "ms", "lower", "persist", t.seconds * 1e3)
    for r in range(ctx.repeats):
        res.add(CONS, "x", "lower", "persist", ms["record"][r] / ms["int64"][r])
        res.add(CONS_R, "x", "lower", "persist",
                ms["record retractions"][r] / ms["int64 retractions"][r])
    res.notes.append(f"consolidate: persist.indexed.format.columnar.consolidate of {n:,} rows, keys "
                     f"drawn from {int(n * 0.7):,}, times 0-3; 'with retractions' adds a "
                     f"retraction of a quarter of the rows (the grouping path); the ratios are "
                     f"per round")


def _python_objects(ctx: Context, res: WorkloadResult) -> None:
    """Appends of Structs against the same rows as an Arrow table, and ``to_python()`` against
    ``to_arrow()`` (see the module docstring, step 4)."""
    n = ctx.args.w10_python_rows
    ctx.log(f"W10: {n:,} records as msgspec Structs (generating them, not timed)")
    table = make_records(20_010, n, time_lo=0, time_hi=1)
    rows = as_structs(table)
    root = fresh_dir(ctx.work, "w10-python")
    seconds: dict[str, list[float]] = {k: [] for k in ("arrow", "structs", "to_arrow",
                                                       "to_python")}
    try:
        with persist.open(str(root / "location")) as client:
            # NB: the first append and read of each kind (lazy imports, plans) not timed
            for label, kind, data in (("warm-a", VALUE_TYPE, table.slice(0, 1000)),
                                      ("warm-s", Record, rows[:1000])):
                w, r = client.create_or_load(label, key_type=pa.int64(), value_type=kind)
                w.append(data, upper=1).result()
                r.snapshot(0).to_python()
            for i in range(ctx.repeats):
                for label in rotate(["arrow", "structs"], i):
                    kind = VALUE_TYPE if label == "arrow" else Record
                    w, _ = client.create_or_load(f"{label}-{i}", key_type=pa.int64(),
                                                 value_type=kind)
                    data: Any = table if label == "arrow" else rows
                    settle()
                    with timed() as t:
                        w.append(data, upper=1).result()
                    seconds[label].append(t.seconds)
                _, read = client.create_or_load(f"structs-{i}", key_type=pa.int64(),
                                                value_type=Record)
                for label in rotate(["to_arrow", "to_python"], i):
                    snap = read.snapshot(0)
                    settle()
                    with timed() as t:
                        got = snap.to_arrow() if label == "to_arrow" else snap.to_python()
                    seconds[label].append(t.seconds)
                    if len(got) != n:
                        raise AssertionError(f"W10: {label} gave {len(got)} rows, not {n}")
    finally:
        remove(root)
    for label, metric in (("arrow", "append an Arrow table (s)"),
                          ("structs", "append msgspec Structs (s)"),
                          ("to_arrow", "to_arrow() (s)"), ("to_python", "to_python() (s)")):
        for x in seconds[label]:
            res.add(f"Python objects, {n:,} records: {metric}", "s", "lower", "persist", x)
    for i in range(ctx.repeats):
        res.add(PY_APPEND, "x", "lower", "persist", seconds["structs"][i] / seconds["arrow"][i])
        res.add(PY_READ, "x", "lower", "persist",
                seconds["to_python"][i] / seconds["to_arrow"][i])
    res.notes.append(f"Python objects: {n:,} records as W10.Record (msgspec.Struct), appended "
                     f"as ((key, Record), time, diff) tuples against the same rows as an Arrow "
                     f"table (each into a fresh collection, durable and sealed); then "
                     f"to_python() against to_arrow() of fresh snapshots of the Structs' "
                     f"collection; ratios per round")


def _spark(ctx: Context, res: WorkloadResult, ps: PersistSystem, sorted_pq: Path,
           rows: int) -> None:
    from bench.workloads import w9_spark

    why = w9_spark.unavailable()
    if why is not None:
        res.notes.append(f"Spark rows skipped: {why}")
        return
    ctx.log("W10: starting Spark")
    with contextlib.ExitStack() as stack:
        try:
            # NB: the session turns spark.sql.python.filterPushdown.enabled on
            spark = stack.enter_context(w9_spark.spark_session(fast_start=bool(ctx.args.quick)))
        except RuntimeError as e:
            res.notes.append(f"Spark rows skipped: {e}")
            return
        _spark_queries(ctx, res, spark, f"file://{ps.url}", sorted_pq, rows)


def _spark_queries(ctx: Context, res: WorkloadResult, spark: Any, url: str, sorted_pq: Path,
                   rows: int) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSourceReader

    from operators.source import PersistBatchReader

    rng = np.random.default_rng(10_011)
    keys = [int(k) for k in pq.read_table(sorted_pq, columns=["key"]).column("key").take(
        pa.array(rng.integers(0, rows, ctx.repeats))).to_pylist()]
    x = range_threshold()

    def persist_df(pushdown: str = "true") -> Any:
        # NB: filterPushdown=true: its default, auto, pushes nothing on a pyspark without
        # DataSourceReader.pushLimit (<= 4.3 keeps a pushed read plan for later scans of the
        # same DataFrame); every query here loads the collection afresh, as docs/spark.md asks.
        return (spark.read.format("persist").option("collection", NAME).option("mode", "raw")
                .option("filterPushdown", pushdown).load(url))

    def parquet_df() -> Any:
        return spark.read.parquet(str(sorted_pq))

    def lookup(df: Any, k: int) -> Any:
        return df.filter(F.col("key") == F.lit(k))

    def above(df: Any) -> Any:
        return df.filter(F.col("value.amount") > F.lit(x))

    for k in keys[:1]:
        p, q = lookup(persist_df(), k).count(), lookup(parquet_df(), k).count()
        if p != q:
            raise AssertionError(f"W10 Spark: persist lookup of {k} gave {p} rows, Parquet {q}")
    p, q = above(persist_df()).count(), above(parquet_df()).count()
    if p != q:
        raise AssertionError(f"W10 Spark: persist range filter gave {p} rows, Parquet {q}")

    def noop_ms(df: Any) -> float:
        with timed() as t:
            df.write.format("noop").mode("overwrite").save()
        return t.seconds * 1e3

    # (column, metric, the DataFrame to materialize in round r)
    cases: list[tuple[str, str, Callable[[int], Any]]] = []
    for column, make in (("persist", persist_df), (PARQUET, parquet_df)):
        cases += [
            (column, "Spark: " + LOOKUP, partial(_lookup_df, make, lookup, keys)),
            (column, f"Spark: range value.amount > {x} (ms)", partial(_apply_df, make, above)),
            (column, "Spark: " + SCAN, partial(_apply_df, make, None)),
        ]
    cases.append(("persist", "Spark: point lookup, filterPushdown=auto (ms)",
                  partial(_lookup_df, partial(persist_df, "auto"), lookup, keys)))
    for _, _, df_of in cases:  # JIT, codegen, the Python workers
        noop_ms(df_of(0))
    for r in range(ctx.repeats):
        for column, metric, df_of in rotate(cases, r):
            ctx.log(f"W10 Spark round {r + 1}/{ctx.repeats}: {column}, {metric}")
            df = df_of(r)
            settle()
            res.add(metric, "ms", "lower", column, noop_ms(df))
    for column in ("persist", PARQUET):
        scan = res.metrics["Spark: " + SCAN].samples.get(column, [])
        look = res.metrics["Spark: " + LOOKUP].samples.get(column, [])
        for s_ms, l_ms in zip(scan, look, strict=False):
            res.add("Spark: " + SPEEDUP, "x", "higher", column, s_ms / l_ms)
    # NB: DataSourceReader has a default pushFilters (it pushes nothing): look for an override.
    own = PersistBatchReader.pushFilters is not DataSourceReader.pushFilters
    pushed = "implements" if own else "does not implement"
    res.notes.append(
        f"Spark: spark.read.format('persist') (mode=raw, filterPushdown=true, loaded afresh for "
        f"each query) vs spark.read.parquet of the key-sorted file, filters in DataFrame.filter, "
        f"the noop sink materializing every column, one warm-up of each case, {ctx.repeats} "
        f"round(s); the persist source {pushed} pushFilters "
        f"(spark.sql.python.filterPushdown.enabled=true); 'filterPushdown=auto' is the source's "
        f"default, which pushes nothing on a pyspark without DataSourceReader.pushLimit "
        f"(this one: {'has' if hasattr(DataSourceReader, 'pushLimit') else 'has not'})")


def _lookup_df(make: Callable[[], Any], lookup: Callable[[Any, int], Any], keys: list[int],
               r: int) -> Any:
    return lookup(make(), keys[r % len(keys)])


def _apply_df(make: Callable[[], Any], f: Callable[[Any], Any] | None, r: int) -> Any:
    return make() if f is None else f(make())
