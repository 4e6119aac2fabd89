"""Key-range splits of a snapshot: disjoint key ranges that parallel consolidated reads own.

Consolidation (summing diffs per ``(key, value)``) needs every update of a key in one place.
Hash buckets (what persist planned before) give that, but every task must then decode
every part: ``n`` tasks read the collection ``n`` times. A split by key *range* lets each task
decode only the record batches that may hold its keys: every blob part persist writes is sorted
by key (``PartMeta.ordered``: part format 4, and compaction output, which is also cut into
bounded, key-disjoint parts), and its per-batch key bounds (:mod:`persist.indexed.format.stats`)
say which batches a range needs. Three steps, all pure:

* :func:`plan` (driver, metadata only): ``n`` or fewer ordered, disjoint :class:`KeyRange`\\ s
  covering every key, with boundaries chosen from the parts' key stats so that each range is
  expected to hold about as many rows, and no more ranges than keep what they decode together
  within :data:`MAX_AMPLIFICATION` (1.5) times the bytes stored.
* :func:`part_in` and :func:`batches_in` (task): which parts and record batches may hold keys
  of a range; only those are decoded.
* :func:`rows_in` / :func:`mask` (task): the exact rows whose key is in the range, vectorized.

**The key order.** Ranges are intervals of one total order on keys, the order Arrow sorts in
(``sort_indices``' default, which is how compaction sorts its output):

    non-null, non-NaN values in their natural order  <  NaN  <  null

Floats: ``-0.0`` and ``0.0`` are one point of the order (they compare equal, so both fall in
the same range; they stay two records, consolidation tells them apart within the range), and
every NaN payload is the one NaN. Strings and binaries compare bytewise (UTF-8 byte order is
code point order); a boundary may be any byte string, valid UTF-8 or not (a truncated stats
prefix), since string keys are compared as their bytes. Dates, timestamps and decimals compare
as their stored integers (days, the column's unit, unscaled), as stats store them.

A :class:`KeyRange` is ``[lo, hi)``: ``lo`` None is unbounded below, ``hi`` None unbounded
above. Boundaries are never NaN or null, so NaN and null keys always belong to the last range
(``hi`` None), and to no other. Membership is decided only by the row filter, ``lo <= key <
hi`` in that order, so a key lands in exactly one range of a plan whatever the stats say:
stats only decide what is decoded, and they are conservative (a bound may be looser than the
data, never tighter; a truncated string bound rounds outward), so a skipped batch never holds a
row of the range.

**Why the order agrees with consolidation.** Rows that consolidate together have equal keys by
Arrow's grouping (NaN with NaN, null with null, ``-0.0`` apart from ``0.0``); equal keys are
one point of the order above, so every group lies in one range: consolidating each range and
concatenating the results is consolidating the whole.

**Schema evolution.** A primitive key only ever widens (int32 -> int64, float32 -> float64,
string -> large_string, decimal precision): every value keeps its stored form, so the key
stats of a part written under any schema version apply to the current key type unchanged.

**Supported key types** (:func:`splittable`): integers, bools, float32/64, strings and
binaries (also large, and Python-object keys stored as msgpack ``binary``: their byte order),
date32, timestamps and decimals. Records (structs, lists) and the rest have no such order here:
:func:`plan` returns None and the caller reads them in one task.

**Null and NaN keys.** Stats count them per part, not per batch. In a sorted part they sit at
its ends (a sort puts nulls at one end and NaN at one end of the numbers: Arrow's, which
compaction uses, puts both last), so the last range reads the batches holding its first and
last ``nulls + nans`` rows besides its own; in an unsorted part any batch may hold one, and the
last range reads all of them. A float key with a NaN anywhere in a part also has no per-batch
upper bounds (:mod:`persist.indexed.format.stats`); for a sorted part they are recovered from the
next batch's lower bound (sorted keys never decrease across batches).
"""

from __future__ import annotations

import bisect
import decimal
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import InvalidUsage
from persist.indexed.format import stats
from persist.indexed.format.meta import PartMeta
from persist.indexed.format.stats import Phys
from persist.indexed.read.prune import BatchSource

#: The stats name of the key.
_KEY = stats.path_key(("key",))
#: At most this many candidate boundaries are weighed (evenly subsampled beyond it).
MAX_CANDIDATES = 4096
#: The tasks of a plan decode at most this many times the bytes stored, together
#: (:func:`plan`): parallel consolidation never relies on every task reading every part.
MAX_AMPLIFICATION = 1.5
#: Candidates x pieces weighed per numpy step (bounds the temporaries to a few MB).
_BLOCK_CELLS = 1 << 20

_Kind: TypeAlias = Literal["int", "bool", "float", "bytes", "date", "timestamp", "decimal"]
_Floats = npt.NDArray[np.float64]
#: Kinds whose stats lower bounds are exact minima (ints are never clamped within their
#: type's range; floats, dates and timestamps are stored exactly), which lets a sorted part's
#: batch upper bounds be recovered from the next batch's lower bound.
_EXACT_LO: frozenset[_Kind] = frozenset({"int", "bool", "float", "date", "timestamp"})


@dataclass(frozen=True)
class KeyRange:
    """The keys ``lo <= key < hi`` in the order of the module docstring, bounds in the stats'
    physical form (:func:`persist.indexed.format.stats.physical`: ``int`` for integers, bools,
    dates, timestamps and decimals, ``float`` for floats, ``bytes`` for strings and binaries).

    ``lo`` None: no lower bound. ``hi`` None: no upper bound, and the range also holds every
    NaN and null key. Picklable (Spark ships it to tasks).

    Raises:
        InvalidUsage: (on construction) a NaN bound, or ``lo >= hi``.
    """

    lo: Phys | None = None
    hi: Phys | None = None

    def __post_init__(self) -> None:
        for b in (self.lo, self.hi):
            if isinstance(b, float) and b != b:
                raise InvalidUsage("a key range bound cannot be NaN (NaN sorts above every "
                                   "value: it belongs to the last range)")
        if self.lo is not None and self.hi is not None and not _lt(self.lo, self.hi):
            raise InvalidUsage(f"empty key range [{self.lo!r}, {self.hi!r})")

    @property
    def whole(self) -> bool:
        """True for the range of every key (``[None, None)``)."""
        return self.lo is None and self.hi is None

    def overlaps(self, lo: Phys | None, hi: Phys | None) -> bool:
        """Whether non-null, non-NaN values bounded by ``lo <= v <= hi`` (None: unknown) may
        lie in this range. Stats bounds are conservative, so False proves none does."""
        if self.hi is not None and lo is not None and not _lt(lo, self.hi):
            return False
        return not (self.lo is not None and hi is not None and _lt(hi, self.lo))


def _lt(a: Phys, b: Phys) -> bool:
    """``a < b`` for two bounds of one key type (bytes with bytes, numbers with numbers)."""
    return bool(a < b)  # type: ignore[operator]


# -- key types ------------------------------------------------------------------------------


def _kind(t: pa.DataType) -> _Kind | None:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return "float"
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return "bytes"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_decimal(t):
        return "decimal"
    return None


def splittable(key_type: pa.DataType) -> bool:
    """True if keys of ``key_type`` can be split by range (see the module docstring)."""
    return _kind(key_type) is not None


def _fits(v: Phys | None, kind: _Kind) -> Phys | None:
    """``v`` if it is a bound of ``kind``'s physical form, else None (unknown)."""
    if v is None:
        return None
    if kind == "bytes":
        return v if isinstance(v, bytes) else None
    if kind == "float":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            f = float(v)
            return None if f != f else f
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# -- what a part's stats say about its key ----------------------------------------------------


@dataclass(frozen=True)
class _KeyStats:
    """The key stats of one part, checked and in the physical form of the key's kind."""

    #: Part-level bounds of non-null, non-NaN keys (None: unknown).
    lo: Phys | None
    hi: Phys | None
    #: Null plus NaN keys; None: unknown (no part-level entry for the key).
    special: int | None
    #: Per record batch: rows and bounds (upper bounds recovered for sorted parts), or None.
    batch_rows: tuple[int, ...] | None
    batches: list[tuple[Phys | None, Phys | None]] | None


def _key_stats(p: PartMeta, kind: _Kind) -> _KeyStats:
    s = p.stats
    if not isinstance(s, stats.PartStats):
        return _KeyStats(None, None, None, None, None)
    leaf = next((x for x in s.leaves if x.path == _KEY), None)
    lo = hi = None
    special: int | None = None
    if leaf is not None:
        lo, hi = _fits(leaf.lo, kind), _fits(leaf.hi, kind)
        special = leaf.nulls + leaf.nans
    per: list[tuple[Phys | None, Phys | None]] | None = None
    rows: tuple[int, ...] | None = None
    entry = next((b for b in s.batches if b.path == _KEY), None)
    # NB: batch stats that do not add up to the part cannot be placed on its rows (the
    # pruner reads such a part whole for the same reason).
    if (entry is not None and s.batch_rows and sum(s.batch_rows) == p.rows
            and len(entry.lo) == len(entry.hi) == len(s.batch_rows)):
        rows = s.batch_rows
        per = [(_fits(a, kind), _fits(b, kind)) for a, b in zip(entry.lo, entry.hi, strict=True)]
        if p.ordered and kind in _EXACT_LO:
            per = _recover_uppers(per)
    return _KeyStats(lo, hi, special, rows, per)


def _recover_uppers(per: list[tuple[Phys | None, Phys | None]]
                    ) -> list[tuple[Phys | None, Phys | None]]:
    """Per-batch bounds of a sorted part with each upper bound tightened to the smallest
    lower bound of a later batch.

    NB: in a part sorted by key, every non-null, non-NaN key of batch ``i`` is at most every
    such key of a later batch (wherever NaNs and nulls were placed), and for these kinds a
    batch's lower bound is its exact minimum. This is what restores the upper bounds stats
    drop for a float key with a NaN (all of them unknown) on every batch but the last.
    """
    out = list(per)
    nxt: Phys | None = None
    for i in range(len(out) - 1, -1, -1):
        lo, hi = out[i]
        if nxt is not None and (hi is None or _lt(nxt, hi)):
            out[i] = (lo, nxt)
        if lo is not None and (nxt is None or _lt(lo, nxt)):
            nxt = lo
    return out


def part_in(part: PartMeta, key_range: KeyRange, key_type: pa.DataType) -> bool:
    """Whether ``part`` may hold a key in ``key_range`` (False: its stats prove it holds none,
    so a task of that range need not fetch it). No stats: True.

    Raises:
        InvalidUsage: ``key_type`` is not :func:`splittable`.
    """
    return _part_in(part, _key_stats(part, _check_kind(key_type)), key_range)


def _part_in(part: PartMeta, ks: _KeyStats, key_range: KeyRange) -> bool:
    if key_range.whole or not part.rows:
        return bool(part.rows)
    if key_range.hi is None and ks.special != 0:
        return True  # the last range holds NaN and null keys: maybe some here
    if ks.special is None:
        return True  # no part-level entry: nothing is known
    return key_range.overlaps(ks.lo, ks.hi)


def batches_in(part: PartMeta, key_range: KeyRange, key_type: pa.DataType
               ) -> list[bool] | None:
    """Per record batch of ``part`` (in order, as ``PartReader.read_batches`` takes them),
    whether it may hold a key in ``key_range``; None if the part has no per-batch key stats
    (decode it whole). Every entry is False when :func:`part_in` is.

    For a sorted part (``PartMeta.ordered``) a batch's keys lie between its bounds and the next
    batches', so a plan's ranges split its batches with at most one boundary batch decoded by
    two neighbouring ranges (two when a string bound was truncated).

    Raises:
        InvalidUsage: ``key_type`` is not :func:`splittable`.
    """
    return _batches_in(part, _key_stats(part, _check_kind(key_type)), key_range)


def _batches_in(part: PartMeta, ks: _KeyStats, key_range: KeyRange) -> list[bool] | None:
    if ks.batches is None:
        return None
    if key_range.whole:
        return [True] * len(ks.batches)
    if key_range.hi is None and ks.special != 0:
        # NB: the last range holds NaN and null keys, whose counts are per part.
        if ks.special is None or not part.ordered or ks.batch_rows is None:
            return [True] * len(ks.batches)  # unsorted: any batch may hold one
        ends = _ends(ks.batch_rows, ks.special)
        return [e or key_range.overlaps(lo, hi)
                for e, (lo, hi) in zip(ends, ks.batches, strict=True)]
    if ks.special is not None and not key_range.overlaps(ks.lo, ks.hi):
        return [False] * len(ks.batches)
    return [key_range.overlaps(lo, hi) for lo, hi in ks.batches]


def _ends(batch_rows: tuple[int, ...], special: int) -> list[bool]:
    """The batches holding one of the first or last ``special`` rows of a part.

    NB: where a sort puts NaN and null keys, each at one end: Arrow's (NaN after every
    number, nulls after NaN) puts both in the last rows, a nulls-first sort puts the nulls in
    the first. Either way the ``special`` NaN and null keys of a sorted part lie in its first
    or last ``special`` rows, so only the batches there may hold one.
    """
    total = sum(batch_rows)
    out, at = [], 0
    for n in batch_rows:
        out.append(n > 0 and (at < special or at + n > total - special))
        at += n
    return out


def _check_kind(key_type: pa.DataType) -> _Kind:
    kind = _kind(key_type)
    if kind is None:
        raise InvalidUsage(f"keys of type {key_type} cannot be split by range (records and "
                           f"types without an order: read them in one task)")
    return kind


# -- the row filter -------------------------------------------------------------------------


def _scalar(v: Phys, t: pa.DataType, kind: _Kind) -> pa.Scalar:
    """Bound ``v`` as a scalar comparable with a key column of ``t`` (``bytes`` kinds: with
    the column as its binary form, see :func:`_comparable`)."""
    try:
        if kind == "bytes":
            large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            return pa.scalar(bytes(v), pa.large_binary() if large else pa.binary())  # type: ignore[arg-type]
        if kind == "float":
            return pa.scalar(float(v), t)
        if kind == "bool":
            return pa.scalar(bool(v), t)
        if kind == "date":
            return pa.scalar(v, pa.int32()).cast(t)
        if kind == "timestamp":
            return pa.scalar(v, pa.int64()).cast(t)
        if kind == "decimal":
            assert isinstance(v, int)
            # NB: built from its digits: Decimal arithmetic would round at its context's 28
            # digits, and a decimal128(38) bound has up to 38.
            sign = 1 if v < 0 else 0
            digits = tuple(int(d) for d in str(abs(v)))
            return pa.scalar(decimal.Decimal((sign, digits, -t.scale)), t)
        return pa.scalar(v, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise InvalidUsage(f"key range bound {v!r} is not a value of {t}: {e}") from e


def _comparable(col: pa.ChunkedArray | pa.Array, kind: _Kind
                ) -> pa.ChunkedArray | pa.Array:
    if kind == "bytes":
        # NB: strings as their bytes (the same buffers): a truncated UTF-8 bound is no string,
        # and UTF-8 byte order is code point order anyway.
        if pa.types.is_string(col.type):
            return col.cast(pa.binary())
        if pa.types.is_large_string(col.type):
            return col.cast(pa.large_binary())
    return col


def mask(col: pa.ChunkedArray | pa.Array, key_range: KeyRange) -> pa.Array | pa.ChunkedArray:
    """A boolean mask (no nulls) of the keys in ``col`` that lie in ``key_range``: ``lo <= key
    < hi`` in the order of the module docstring, NaN and null keys in the last range only.
    Vectorized.

    Raises:
        InvalidUsage: ``col``'s type is not :func:`splittable`, or a bound is not a value of it.
    """
    kind = _check_kind(col.type)
    if key_range.whole:
        return pa.array(np.ones(len(col), dtype=bool))
    keys = _comparable(col, kind)
    below_hi = None
    if key_range.hi is not None:
        # NB: NaN < hi is false and null < hi null (filled false): neither is below any bound.
        below_hi = pc.fill_null(pc.less(keys, _scalar(key_range.hi, col.type, kind)), False)
    if key_range.lo is None:
        assert below_hi is not None
        return below_hi
    # NB: "not below lo" rather than ">= lo": NaN >= lo is false and null >= lo null, but
    # both sort above every bound.
    at_or_above_lo = pc.invert(pc.fill_null(
        pc.less(keys, _scalar(key_range.lo, col.type, kind)), False))
    if below_hi is None:
        return at_or_above_lo
    return pc.and_(at_or_above_lo, below_hi)


def rows_in(table: pa.Table, key_range: KeyRange) -> pa.Table:
    """The rows of ``table`` (a part's columns, ``key`` among them) whose key is in
    ``key_range`` (:func:`mask`), in their order.

    Raises:
        InvalidUsage: as :func:`mask`.
    """
    if key_range.whole:
        return table
    return table.filter(mask(table.column("key"), key_range))


def load(reader: BatchSource, part: PartMeta, schema: pa.Schema, key_range: KeyRange
         ) -> tuple[pa.Table, int]:
    """``part``'s rows whose key is in ``key_range``, decoding only the batches that may hold
    one (``schema``: the part's own, as written; migrate after). Also returns how many of its
    rows were decoded (0: the part was not fetched at all).

    Raises:
        PartMissing, Corruption, IncompatibleFormat, ExternalError: as ``PartReader.read``.
        InvalidUsage: the key type is not :func:`splittable`.
    """
    key_type = schema.field("key").type
    if not part_in(part, key_range, key_type):
        return schema.empty_table(), 0
    keep = batches_in(part, key_range, key_type)
    s = part.stats
    if keep is None or all(keep) or not isinstance(s, stats.PartStats):
        return rows_in(reader.read(part, schema), key_range), part.rows
    if not any(keep):
        return schema.empty_table(), 0
    t = reader.read_batches(part, schema, keep, s.batch_rows)
    return rows_in(t, key_range), len(t)


# -- planning -------------------------------------------------------------------------------


def plan(parts: Sequence[PartMeta], n: int, key_type: pa.DataType) -> list[KeyRange] | None:
    """At most ``n`` ordered, disjoint key ranges covering every key, for tasks that each
    consolidate the rows of one: the first unbounded below, the last unbounded above (and
    holding NaN and null keys), each ``hi`` the next ``lo``; as many as keep the bytes all of
    them decode within :data:`MAX_AMPLIFICATION` times the bytes stored.

    Boundaries are lower bounds of record batches (else whole parts) taken from the key stats
    of sorted parts (of any part when none is sorted): a range starting at a sorted batch's
    first key leaves every earlier batch of that part to the ranges before it. They are chosen
    so that each range expects about as many rows, estimated from every part's per-batch
    (else part-level) key bounds with rows spread evenly between a bound pair (strings by
    their leading bytes past a common prefix), null and NaN keys counted in the last range.
    Parts without key stats are read by every range and do not move the boundaries.

    **The decode bound.** Every range decodes the batches that may hold its keys, so a batch
    that straddles a boundary is decoded twice, and a part without usable stats (an unsorted
    part of an older persist, an inline part) by every range. The plan counts what each
    choice of ranges decodes (:func:`decoded_bytes`, each batch weighed by its share of its
    part's bytes) and keeps the most ranges, up to ``n``, whose total stays within
    :data:`MAX_AMPLIFICATION` times the bytes of ``parts``. Sorted parts whose keys overlap
    (appends of random keys) allow about half as many ranges as they have batches each;
    key-disjoint parts (compaction output) as many as they have batches.

    Returns:
        None when the key type is not :func:`splittable` (records). Otherwise one range or
        more (``[KeyRange()]`` when ``n == 1`` or when no split keeps the bound); fewer than
        ``n`` also when the stats cannot tell more apart (duplicates dropped).

    Raises:
        InvalidUsage: ``n < 1``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidUsage(f"a key-range split needs n >= 1 ranges, not {n!r}")
    kind = _kind(key_type)
    if kind is None:
        return None
    whole = [KeyRange()]
    if n == 1:
        return whole
    live = [p for p in parts if p.rows]
    pieces: list[tuple[Phys | None, Phys | None, float]] = []
    sorted_cands: list[Phys] = []
    other_cands: list[Phys] = []
    special = 0.0
    known = [(p, _key_stats(p, kind)) for p in live]
    for p, ks in known:
        if ks.special is None and ks.batches is None:
            continue  # nothing known: read by every range, no weight anywhere
        nonfinite = min(ks.special or 0, p.rows)
        special += nonfinite
        share = (p.rows - nonfinite) / p.rows
        cands = sorted_cands if p.ordered else other_cands
        if ks.batches is not None and ks.batch_rows is not None:
            for (lo, hi), r in zip(ks.batches, ks.batch_rows, strict=True):
                pieces.append((lo, hi, r * share))
                if lo is not None:
                    cands.append(lo)
        elif ks.lo is not None or ks.hi is not None:
            pieces.append((ks.lo, ks.hi, p.rows - nonfinite))
            if ks.lo is not None:
                cands.append(ks.lo)
    candidates = sorted(set(sorted_cands or other_cands))
    if not candidates or not pieces:
        return whole
    if len(candidates) > MAX_CANDIDATES:
        at = np.linspace(0, len(candidates) - 1, MAX_CANDIDATES).round().astype(np.int64)
        candidates = [candidates[i] for i in np.unique(at)]
    cdf = _below(pieces, candidates, kind)
    total = float(sum(w for _, _, w in pieces)) + special
    budget = MAX_AMPLIFICATION * sum(p.nbytes for p in live)

    def within(m: int) -> list[Phys] | None:
        bounds = _boundaries(cdf, candidates, total, m)
        return bounds if _decoded(known, bounds) <= budget else None

    # NB: what the ranges decode grows with their number (each boundary straddles batches),
    # so the most ranges within the bound are found by bisection: O(log n) plans weighed.
    best: list[Phys] = []
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        bounds = within(mid)
        if bounds is not None:
            best, lo = bounds, mid
        else:
            hi = mid - 1
    if not best:
        return whole
    edges: list[Phys | None] = [None, *best, None]
    return [KeyRange(a, b) for a, b in itertools.pairwise(edges)]


def _boundaries(cdf: _Floats, candidates: list[Phys], total: float, m: int) -> list[Phys]:
    """Up to ``m - 1`` ascending boundaries from ``candidates`` that cut the expected rows
    (``cdf``: below each candidate; ``total`` in all) into ``m`` about equal shares."""
    chosen: list[Phys] = []
    last = 0.0
    for k in range(1, m):
        target = k * total / m
        i = int(np.searchsorted(cdf, target))
        if i > 0 and (i == len(cdf) or target - cdf[i - 1] <= cdf[i] - target):
            i -= 1
        below = float(cdf[i])
        # NB: a boundary with nothing below it, nothing above it, or nothing between it and
        # the previous one would make an empty range: fewer ranges instead.
        if below <= last or below >= total or (chosen and not _lt(chosen[-1], candidates[i])):
            continue
        chosen.append(candidates[i])
        last = below
    return chosen


def decoded_bytes(parts: Sequence[PartMeta], ranges: Sequence[KeyRange],
                  key_type: pa.DataType) -> int:
    """What tasks reading ``ranges`` (a plan of :func:`plan`) decode of ``parts`` together,
    each part's batches weighed by their share of its rows times its bytes: the estimate the
    plan bounds.

    Raises:
        InvalidUsage: ``key_type`` is not :func:`splittable`, or ``ranges`` is not a plan
            (ordered, contiguous, from unbounded to unbounded).
    """
    kind = _check_kind(key_type)
    bounds = [r.lo for r in ranges[1:]]
    edges = [None, *bounds, None]
    if not ranges or [KeyRange(a, b) for a, b in itertools.pairwise(edges)] != list(ranges):
        raise InvalidUsage(f"not the ranges of a plan: {list(ranges)}")
    known = [(p, _key_stats(p, kind)) for p in parts if p.rows]
    return int(_decoded(known, [b for b in bounds if b is not None]))


def _decoded(parts: Sequence[tuple[PartMeta, _KeyStats]], bounds: list[Phys]) -> float:
    """The bytes the ranges cut at ``bounds`` decode of ``parts`` together, each range
    deciding exactly as :func:`part_in` and :func:`batches_in` do (so as a task reads).

    NB: by bisection on the bounds per batch, not by asking each range: a plan for a
    thousand tasks over a thousand parts is weighed in milliseconds per choice.
    """
    m = len(bounds) + 1
    out = 0.0
    for p, ks in parts:
        per_row = p.nbytes / p.rows
        out += per_row * (p.rows if m == 1 else _decoded_rows(p, ks, bounds))
    return out


def _decoded_rows(p: PartMeta, ks: _KeyStats, bounds: list[Phys]) -> int:
    """The rows of ``p`` decoded by the ``len(bounds) + 1`` ranges cut at ``bounds`` (two or
    more ranges), summed over the ranges."""
    m = len(bounds) + 1
    last = m - 1

    def span(lo: Phys | None, hi: Phys | None) -> tuple[int, int]:
        # NB: KeyRange.overlaps: an unknown bound overlaps everything on its side.
        a = 0 if lo is None else bisect.bisect_right(bounds, lo)
        b = last if hi is None else bisect.bisect_right(bounds, hi)
        return a, b

    # the ranges that read the part at all (part_in)
    if ks.special is None:
        a, b, extra = 0, last, False
    else:
        a, b = span(ks.lo, ks.hi)
        extra = ks.special != 0 and b < last  # the last range reads it for its NaN/nulls
    if ks.batches is None or ks.batch_rows is None:
        return p.rows * ((b - a + 1) + int(extra))
    ends = (_ends(ks.batch_rows, ks.special) if ks.special and p.ordered else None)
    special_reads_all = ks.special is None or (ks.special != 0 and ends is None)
    total = 0
    for i, ((lo, hi), rows) in enumerate(zip(ks.batches, ks.batch_rows, strict=True)):
        bi, bj = span(lo, hi)
        lo_r, hi_r = max(a, bi), min(b, bj)
        count = max(0, hi_r - lo_r + 1)
        # the last range (holding NaN and null keys) decides by its own rule (batches_in)
        last_reads = (ks.special != 0 and (special_reads_all or (ends is not None and ends[i])
                                           or bj >= last))
        if ks.special != 0:  # then the last range reads the part (part_in)
            in_overlap = lo_r <= last <= hi_r
            if last_reads and not in_overlap:
                count += 1
            elif not last_reads and in_overlap:
                count -= 1
        total += rows * count
    return total
def _below(pieces: list[tuple[Phys | None, Phys | None, float]], candidates: list[Phys],
           kind: _Kind) -> _Floats:
    """For each candidate boundary (ascending), the rows expected below it: each piece's
    weight spread evenly over ``[lo, hi]`` in a numeric projection of the keys (an unknown
    bound is the smallest or largest one seen). Non-decreasing."""
    known = [b for lo, hi, _ in pieces for b in (lo, hi) if b is not None]
    proj = _projection([*known, *candidates], kind)
    xs = proj(candidates)
    floor, ceil = float(np.min(xs)), float(np.max(xs))
    if known:
        kx = proj(known)
        floor, ceil = min(floor, float(kx.min())), max(ceil, float(kx.max()))
    lo_known = [lo is not None for lo, _, _ in pieces]
    hi_known = [hi is not None for _, hi, _ in pieces]
    los = np.full(len(pieces), floor)
    his = np.full(len(pieces), ceil)
    if any(lo_known):
        los[np.array(lo_known)] = proj([lo for lo, _, _ in pieces if lo is not None])
    if any(hi_known):
        his[np.array(hi_known)] = proj([hi for _, hi, _ in pieces if hi is not None])
    his = np.maximum(his, los)
    ws = np.array([w for _, _, w in pieces])
    width = his - los
    point = width <= 0
    safe = np.where(point, 1.0, width)
    out = np.empty(len(xs))
    step = max(1, _BLOCK_CELLS // max(1, len(pieces)))
    for at in range(0, len(xs), step):
        x = xs[at:at + step, None]
        # NB: a subnormal width overflows the quotient to inf, which the clip makes 1.
        with np.errstate(over="ignore"):
            frac = np.clip((x - los[None, :]) / safe[None, :], 0.0, 1.0)
        # NB: a piece of one value lies wholly at or above a boundary equal to it.
        frac = np.where(point[None, :], (x > los[None, :]).astype(np.float64), frac)
        out[at:at + step] = frac @ ws
    return np.maximum.accumulate(out)


def _projection(values: list[Phys], kind: _Kind) -> Callable[[Sequence[Phys]], _Floats]:
    """A monotone map from bounds to floats, for estimating only (ties allowed)."""
    if kind != "bytes":
        def numbers(vs: Sequence[Phys]) -> _Floats:
            # NB: clipped so that widths stay finite with infinite float keys.
            return np.clip(np.array([float(v) for v in vs], dtype=np.float64),
                           -1e300, 1e300)
        return numbers
    bs = [v for v in values if isinstance(v, bytes)]
    prefix = _common_prefix(bs)

    def strings(vs: Sequence[Phys]) -> _Floats:
        # NB: the 7 bytes after the prefix every bound shares: keys like "user_000123" are
        # then told apart by their digits, not by "user_00".
        out = [float(int.from_bytes(bytes(v)[prefix:prefix + 7].ljust(7, b"\0"), "big"))  # type: ignore[arg-type]
               for v in vs]
        return np.array(out, dtype=np.float64)
    return strings


def _common_prefix(bs: list[bytes]) -> int:
    if not bs:
        return 0
    lo, hi = min(bs), max(bs)
    i = 0
    while i < min(len(lo), len(hi)) and lo[i] == hi[i]:
        i += 1
    return i




__all__ = ["MAX_AMPLIFICATION", "MAX_CANDIDATES", "KeyRange", "base", "batches_in",
           "decoded_bytes", "disjoint", "load", "mask", "paired", "part_in", "plan", "rows_in",
           "settled",
           "splittable"]


# -- reads that need no consolidation ---------------------------------------------------------


def disjoint(parts: Sequence[PartMeta], key_type: pa.DataType) -> bool:
    """Whether the parts' key stats prove that no key lies in two of ``parts``.

    Exact and conservative: every part's part-level key bounds must be known (a part without
    stats, or with a key whose bounds the budget dropped, proves nothing), the parts' bound
    intervals ``[lo, hi]`` must be strictly ordered (``hi`` of one below ``lo`` of the next:
    equal bounds on both sides, ``-0.0`` against ``0.0`` included, are not disjoint), and at
    most one part may hold NaN or null keys (which no bound covers). Stats bounds are loose
    outward, never tighter (a truncated string bound rounds outward), so a proof from them
    holds for the rows. One part (or none) is disjoint trivially; keys without an order
    (records) are disjoint only then.
    """
    live = [p for p in parts if p.rows]
    if len(live) <= 1:
        return True
    kind = _kind(key_type)
    if kind is None:
        return False
    spans: list[tuple[Phys, Phys]] = []
    special = 0
    for p in live:
        ks = _key_stats(p, kind)
        if ks.special is None or ks.lo is None or ks.hi is None:
            return False
        if ks.special:
            special += 1
        spans.append((ks.lo, ks.hi))
    if special > 1:
        return False
    spans.sort(key=lambda s: s[0])
    return all(_lt(a[1], b[0]) for a, b in itertools.pairwise(spans))


def settled(parts: Sequence[PartMeta], as_of: int, key_type: pa.DataType) -> bool:
    """Whether the parts' rows, times forwarded to ``as_of``, already are the consolidated
    contents as of ``as_of`` (every ``(key, value)`` once, no zero diff): a read may skip
    summing them.

    True when every part is consolidated (compaction output: one row per ``(key, value,
    time)``, zero sums dropped), holds a single time at or before ``as_of``
    (``min_time == max_time <= as_of``: one row per ``(key, value)``), and the parts are
    key-disjoint (:func:`disjoint`), so no ``(key, value)`` lies in two of them. The parts
    must all be read as the schema version they were written with (the caller's to check: a
    migration may make two records equal).
    """
    return all(p.consolidated and p.min_time == p.max_time <= as_of for p in parts if p.rows) \
        and disjoint(parts, key_type)


def base(parts: Sequence[PartMeta], as_of: int, key_type: pa.DataType) -> tuple[PartMeta, ...]:
    """The *base* of ``parts`` for a read as of ``as_of``: parts that are :func:`settled` among
    themselves, so that their rows, times forwarded to ``as_of``, are their consolidated
    contents already. Every other part with rows is a *run* on top of the base.

    Taken greedily, the largest part first (ties by id): a part qualifies when it is
    consolidated, holds a single time at or before ``as_of``, has known part-level key stats
    and is no marks step's delta (which :func:`paired` may join to the base); it joins the base when its key bounds are strictly apart from every part taken
    (:func:`disjoint`'s rule: equal bounds on both sides are not apart) and, if it holds NaN
    or null keys, no part taken holds any (a part whose keys are all NaN or null has no
    bounds and conflicts only with such parts). Keys without an order (records) have a base
    only when one part is all there is. Pure and deterministic: a planner and every task that
    computes it over the same parts agree. The caller keeps out parts that must not be read
    as they are stored (a part of another schema version: a migration may make two records
    equal). What the base is for: DESIGN.md §11a, the read plan.
    """
    live = [p for p in parts if p.rows]
    # NB: a marks step's delta is never taken here (paired() decides whether it joins): its
    # key bounds overlap the marked parts' (their stats bound their blobs' rows), so a delta
    # larger than each of them, taken first, left them all out as runs, and the read summed
    # the whole base
    deltas = {p.marks.delta for p in live if p.marks is not None}
    cands = [p for p in live if p.consolidated and p.min_time == p.max_time <= as_of
             and p.id not in deltas]
    kind = _kind(key_type)
    if kind is None:
        return tuple(cands) if len(live) == 1 and len(cands) == 1 else ()
    los: list[Phys] = []  # the taken parts' bounds, ascending by lo (disjoint: so are his)
    his: list[Phys] = []
    special = False
    taken: list[PartMeta] = []
    for p in sorted(cands, key=lambda p: (-p.rows, p.id)):
        ks = _key_stats(p, kind)
        if ks.special is None or (ks.special and special):
            continue
        if ks.lo is None or ks.hi is None:
            if ks.lo is None and ks.hi is None and ks.special == p.rows:
                taken.append(p)  # only NaN and null keys: apart from every bounded part
                special = True
            continue
        i = bisect.bisect_left(los, ks.lo)
        if i > 0 and not _lt(his[i - 1], ks.lo):
            continue
        if i < len(los) and not _lt(ks.hi, los[i]):
            continue
        los.insert(i, ks.lo)
        his.insert(i, ks.hi)
        special = special or bool(ks.special)
        taken.append(p)
    ids = {p.id for p in taken}
    return tuple(p for p in parts if p.id in ids)


def paired(base_parts: Sequence[PartMeta], parts: Sequence[PartMeta], as_of: int,
           key_type: pa.DataType) -> PartMeta | None:
    """The *delta* of ``parts`` that joins the base ``base_parts`` (:func:`base` of them), or
    None: a part that is consolidated at one time at or before ``as_of``, that a base part's
    marks name (``Marks.delta``: every row of that part whose key the delta may hold is
    marked, so the part's rows, its marks applied, share no key with it), and whose key
    bounds are strictly apart (:func:`disjoint`) from every base part whose marks do not name
    it. The base parts minus their marks and the delta then hold every ``(key, value)`` at
    most once: they are settled together, and a read passes them without summing
    (DESIGN.md §8, the marks step). Conservative like :func:`disjoint`: without the proof the
    delta is a run, applied as any run is, which is exact too.
    """
    named: dict[str, int] = {}
    for p in base_parts:
        m = p.marks
        if m is not None:
            named[m.delta] = named.get(m.delta, 0) + 1
    if not named:
        return None
    base_ids = {p.id for p in base_parts}
    for d in parts:
        if (d.id not in named or d.id in base_ids or not d.rows or not d.consolidated
                or not d.min_time == d.max_time <= as_of):
            continue
        others = [p for p in base_parts if p.marks is None or p.marks.delta != d.id]
        if disjoint([*others, d], key_type) if others else _kind(key_type) is not None:
            return d
    return None
