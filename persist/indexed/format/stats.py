"""Per-field statistics of a part: what a filtered read needs to skip parts and record batches.

For every field of a part's ``key`` and ``value`` (struct fields flattened by dotted path:
``key``, ``value.amount``, ``value.address.city``; see :func:`path_key`) a part records its
null count and, for fields with an order, a lower and an upper bound of its non-null values.
Kept inside :class:`persist.indexed.format.meta.PartMeta` (its optional ``stats`` field), so a reader
decides what to fetch from the metadata it already holds.

**Bounds, not values.** ``lo <= every non-null value <= hi`` in the field's order; a bound may
be looser than the true minimum or maximum, never tighter, and a missing one (None) is
unknown. That is what lets them be trimmed to a byte budget:

- strings and binaries are compared bytewise (UTF-8 byte order is code point order, which is
  Arrow's and Python's string order); ``lo`` is a prefix of the true minimum (a prefix is
  never greater), ``hi`` the true maximum if it is short enough, else its prefix with the last
  byte below 0xFF incremented (greater than every string with that prefix), or unknown when
  the prefix is all 0xFF;
- a decimal's bounds are its unscaled integers; one beyond msgpack's integer range is clamped
  outward (``lo`` down, ``hi`` up) or, where no bound in range exists, unknown;
- floats: NaN is not a bound. ``nans`` counts NaN values (a filter treats NaN as greater than
  every number, see :mod:`persist.indexed.read.filter`), and ``-0.0`` equals ``0.0`` in bounds as
  in comparisons;
- lists (and every type without a sensible order) have a null count only; a struct node has
  its own null count (a row whose struct, or a struct above it, is null counts as null for
  every field below it, as a filter reads it).

The representation (:func:`physical`): integers, bools (0/1), dates (days), timestamps (the
stored integer in the column's unit) and decimals (unscaled) as ``int``, floats as ``float``,
strings and binaries as ``bytes``; a filter's literal is turned into the same form to be
compared.

**Budget** (``Options.stats_bytes``, default 1 KiB of encoded msgpack per part). Part-level
entries come first, key fields before value fields, depth first; a field whose bounds do not
fit keeps its null count; once nothing fits the rest are unknown. Then, for a part of several
Arrow record batches, per-batch bounds of as many ordered fields as fit (key fields first:
compaction output is sorted by key, so each batch of a merged part covers a narrow key range)
let a read decode only the batches that may match. Inline parts carry no stats (see
:func:`persist.indexed.format.write.new_part`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

#: The default stats budget of a part: encoded bytes of its :class:`PartStats`.
STATS_BYTES = 1024
#: The largest stats budget ``Options.stats_bytes`` accepts (every rollup holds every part's).
MAX_STATS_BYTES = 64 << 10
#: Strings and binaries keep at most this many bytes of a part-level bound.
PART_PREFIX_BYTES = 32
#: ... and of a per-batch bound.
BATCH_PREFIX_BYTES = 16

#: A bound in its stored form (see the module docstring).
Phys: TypeAlias = int | float | bytes
_INT_MIN = -(1 << 63)
_UINT_MAX = (1 << 64) - 1


def path_key(segments: Sequence[str]) -> str:
    """The stats name of a field: its path segments (``("value", "amount")``) joined by ``.``,
    a ``.`` or ``\\`` inside a segment escaped with ``\\`` so that two fields never share a
    name (a field literally named ``a.b`` is ``a\\.b``)."""
    return ".".join(s.replace("\\", "\\\\").replace(".", "\\.") for s in segments)


def orderable(t: pa.DataType) -> bool:
    """True for the leaf types that have bounds: integers, floats, decimals, bools, strings,
    binaries, dates and timestamps. Lists, structs and null have null counts only."""
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_boolean(t) or _is_bytes(t) or pa.types.is_date32(t)
                or pa.types.is_timestamp(t))


def _is_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def physical(s: pa.Scalar) -> Phys | None:
    """A valid scalar of an :func:`orderable` type in the form bounds are stored and compared
    in (see the module docstring); None for a null scalar.

    NB: the exact stored value: a timestamp's integer in its own unit (``as_py`` would round
    nanoseconds into a ``datetime``), a decimal's unscaled integer (exact at any precision).
    """
    if not s.is_valid:
        return None
    t = s.type
    if pa.types.is_floating(t):
        return float(s.as_py())
    if pa.types.is_boolean(t):
        return int(bool(s.as_py()))
    if pa.types.is_integer(t):
        return int(s.as_py())
    if pa.types.is_decimal(t):
        d = s.as_py()
        return int(d.scaleb(t.scale))
    if pa.types.is_date32(t):
        return int(s.cast(pa.int32()).as_py())
    if pa.types.is_timestamp(t):
        return int(s.cast(pa.int64()).as_py())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return bytes(s.as_py().encode())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes(s.as_py())
    raise TypeError(f"{t} has no bounds")


# -- the stored form --------------------------------------------------------------------------


class LeafStats(msgspec.Struct, frozen=True, array_like=True):
    """One field of a part: ``path`` (:func:`path_key`), its null count, its NaN count (0 for
    other than floats), and bounds of its non-null, non-NaN values (None: unknown).

    Invariant: ``lo <= v <= hi`` for every such value ``v`` (see the module docstring).
    """

    path: str
    nulls: int
    nans: int = 0
    lo: int | float | bytes | None = None
    hi: int | float | bytes | None = None


class BatchStats(msgspec.Struct, frozen=True, array_like=True):
    """Bounds of one field per Arrow record batch of the part (``lo[i]``/``hi[i]`` for batch
    ``i``; None: unknown), under the same invariant as :class:`LeafStats`, NaN excluded."""

    path: str
    lo: tuple[int | float | bytes | None, ...]
    hi: tuple[int | float | bytes | None, ...]


class Tail(msgspec.Struct, frozen=True, array_like=True):
    """The checksum of a Parquet part's *tail*: its bytes from ``offset`` (the end of the
    last column chunk's pages) to the end of the file, which are its bloom filters, page
    index, footer (row-group and column statistics, page offsets), footer length and magic.

    What another engine's Parquet reader trusts before it reads a page, and what no Parquet
    page checksum covers: a flipped bit in a column's statistics makes a reader skip row
    groups it should read (:mod:`persist.distributed.native` checks the tail before handing
    the file to one, :func:`persist.indexed.read.tail.verify_tail`).

    Invariant: ``crc == crc32c(file[offset:])`` and ``offset < len(file)``.
    """

    offset: int
    crc: int


class Groups(msgspec.Struct, frozen=True, array_like=True):
    """Where a Parquet part's row groups lie and the crc32c of each: what lets a reader fetch
    only some row groups (a byte range per run of them) and still verify every byte it
    decodes, which the whole file's ``PartMeta.checksum`` cannot do without reading it all.

    Row group ``i`` is the bytes ``[offsets[i], offsets[i + 1])`` of the file (its column
    chunks with their page headers and pages, which persist's writer lays out one after the
    other), ``offsets[-1]`` is where the :class:`Tail` starts, and ``crcs[i]`` is the crc32c of
    row group ``i``'s bytes. A ranged read verifies the tail (its footer says where each
    column chunk is) and each row group it fetches, and decodes from those bytes alone
    (:meth:`persist.indexed.read.parts.PartReader.read_groups`).

    Invariant: ``len(offsets) == len(crcs) + 1``, ``offsets`` increasing,
    ``crcs[i] == crc32c(file[offsets[i]:offsets[i + 1]])``.
    """

    offsets: tuple[int, ...]
    crcs: tuple[int, ...]


class Marks(msgspec.Struct, frozen=True, array_like=True):
    """The rows a *marked* base part hides (a marks step of compaction, DESIGN.md §8): the
    part's rows are its blob's rows minus the ``count`` rows at the positions stored in the
    marks blob at ``key`` (sorted little-endian int64 positions in the blob's row order,
    ``nbytes`` bytes with crc32c ``crc``; spelled as a ``blob_key``, a reference in a fork
    across locations). ``delta`` is the id of the consolidated delta part the marks were
    computed with: every row of the blob whose key that delta's rows may hold is marked
    (what lets a read take the part and the delta as one settled base, ``scan.layers``).

    Here because ``PartMeta`` is at its 15-field limit. Unlike ``tail`` and ``groups``, an
    older persist must not ignore it (it would read the hidden rows): a record holding a
    marked part is metadata format 8 (``meta.MARKS_FORMAT_VERSION``), refused by older
    readers.

    Invariant: ``nbytes == 8 * count``; positions strictly increasing, each below the
    part's ``rows``.
    """

    key: str
    nbytes: int
    crc: int
    count: int
    delta: str


class PartStats(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A part's stats (stored in ``PartMeta.stats``): per-field entries, and, when the part has
    several record batches, each batch's row count and per-batch bounds of some fields. A
    field with no entry is unknown.

    Also, for a Parquet part written since the tail checksum was introduced, its
    :class:`Tail` (outside the stats budget: 10-20 bytes). It lives here because ``PartMeta``
    is at its 15-field limit (a 16th changes every part's stored bytes); ``omit_defaults``
    keeps every part without one byte for byte what it was, and an older persist ignores the
    field (it never hands files to another engine by it). A part with a tail and no field
    entries (stats budget 0) has ``leaves == ()``: every field unknown, as with no stats.
    :class:`Groups` (a part of several row groups written since they were recorded) rides
    here the same way, for the same reasons; an older persist ignores it and reads the part
    whole, as it always did.
    """

    leaves: tuple[LeafStats, ...] = ()
    #: Rows of each Arrow record batch of the part's IPC stream, in order (empty: no batch
    #: stats).
    batch_rows: tuple[int, ...] = ()
    batches: tuple[BatchStats, ...] = ()
    #: The Parquet file's tail checksum (None: not recorded; a part of formats 1-3, or one
    #: written before it was).
    tail: Tail | None = None
    #: Its row groups' byte ranges and checksums (None: not recorded; one row group, a part
    #: Spark wrote, or one written before they were). Outside the stats budget, as ``tail``.
    groups: Groups | None = None
    #: The rows the part hides (:class:`Marks`; None: none, every part but a marked base
    #: part). NB: not a stat: a reader must apply it (format 8).
    marks: Marks | None = None


def marks_of(stats: PartStats | msgspec.UnsetType) -> Marks | None:
    """The marks of a part with these stats (None: unmarked)."""
    return None if isinstance(stats, msgspec.UnsetType) else stats.marks


_ENC = msgspec.msgpack.Encoder()


# -- what a filter reads ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """What is known of one field over some rows (a part or one of its batches): ``rows``
    rows, ``nulls`` of them null, ``nans`` NaN, the rest within ``[lo, hi]``. None: unknown.
    """

    rows: int
    nulls: int | None
    nans: int | None
    lo: Phys | None
    hi: Phys | None


def part_bounds(stats: PartStats, rows: int) -> dict[str, Bounds]:
    """The part-level :class:`Bounds` of every field ``stats`` has an entry for."""
    return {s.path: Bounds(rows, s.nulls, s.nans, s.lo, s.hi) for s in stats.leaves}


def batch_bounds(stats: PartStats) -> list[dict[str, Bounds]]:
    """Per record batch (``stats.batch_rows``), the :class:`Bounds` the batch stats give
    (null and NaN counts unknown). Empty when the part has no batch stats."""
    out: list[dict[str, Bounds]] = [{} for _ in stats.batch_rows]
    for b in stats.batches:
        for i, (lo, hi) in enumerate(zip(b.lo, b.hi, strict=True)):
            if i < len(out):
                out[i][b.path] = Bounds(stats.batch_rows[i], None, None, lo, hi)
    return out


# -- computing them ---------------------------------------------------------------------------


def _fields(col: pa.ChunkedArray, segments: tuple[str, ...]
            ) -> Iterator[tuple[tuple[str, ...], pa.ChunkedArray]]:
    """Every field of ``col`` depth first, itself first: ``(segments, values)`` with a struct's
    nulls folded into its fields (``pc.struct_field``), as a filter reads them."""
    yield segments, col
    t = col.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            name = t.field(i).name
            yield from _fields(pc.struct_field(col, [i]), (*segments, name))


def _lower(v: Phys | None, prefix: int) -> Phys | None:
    if isinstance(v, bytes):
        return v[:prefix]
    if isinstance(v, int) and not isinstance(v, bool):
        if v < _INT_MIN:
            return None
        return min(v, _UINT_MAX)
    return v


def _upper(v: Phys | None, prefix: int) -> Phys | None:
    if isinstance(v, bytes):
        if len(v) <= prefix:
            return v
        head = v[:prefix].rstrip(b"\xff")
        if not head:
            return None  # every byte 0xFF: no short string is above it
        return head[:-1] + bytes([head[-1] + 1])
    if isinstance(v, int) and not isinstance(v, bool):
        if v > _UINT_MAX:
            return None
        return max(v, _INT_MIN)
    return v


def _min_max(col: pa.ChunkedArray | pa.Array) -> tuple[Phys | None, Phys | None]:
    mm = pc.min_max(col)
    lo, hi = physical(mm["min"]), physical(mm["max"])
    if isinstance(lo, float) and lo != lo:  # all NaN: min_max skips NaN unless nothing else
        return None, None
    return lo, hi


def compute(table: pa.Table, batch_rows: Sequence[int], budget: int = STATS_BYTES
            ) -> PartStats | None:
    """The stats of a part holding ``table`` (columns ``key, value, time, diff``), written as
    record batches of ``batch_rows`` rows, in at most ``budget`` encoded bytes (see the module
    docstring for what comes first). None if not even one entry fits.

    Cost: one pass over each ordered field (on 1 M rows of an int64 key and a four-field
    struct value with a 13-byte string, ~13 ms, against ~100 ms to encode the part).
    """
    if budget <= 0 or not len(table):
        return None
    rows = tuple(batch_rows)
    several = len(rows) > 1
    used = 11  # the PartStats map header, its "leaves" key and array header
    leaves: list[LeafStats] = []
    #: Fields with bounds, in order, and their per-batch bounds when already computed.
    ordered: list[tuple[str, pa.ChunkedArray, int, list[tuple[Phys | None, Phys | None]] | None]]
    ordered = []
    for name in ("key", "value"):
        for segments, col in _fields(table.column(name), (name,)):
            path = path_key(segments)
            nulls = col.null_count
            t = col.type
            entry = LeafStats(path, nulls)
            if orderable(t) and nulls < len(col):
                nans = 0
                if pa.types.is_floating(t):
                    nans = int(pc.sum(pc.is_nan(col)).as_py() or 0)
                per: list[tuple[Phys | None, Phys | None]] | None = None
                if several and _is_bytes(t):
                    # NB: comparing strings is the one costly pass (~9 ms per million): per
                    # batch, the part's bounds follow from the batches' for free.
                    per = _per_batch(col, rows)
                    lo, hi = _fold(per)
                else:
                    lo, hi = _min_max(col)
                full = LeafStats(path, nulls, nans, _lower(lo, PART_PREFIX_BYTES),
                                 _upper(hi, PART_PREFIX_BYTES))
                size = len(_ENC.encode(full))
                if used + size <= budget:
                    leaves.append(full)
                    used += size
                    ordered.append((path, col, nans, per))
                    continue
                entry = LeafStats(path, nulls, nans)
            size = len(_ENC.encode(entry))
            if used + size > budget:
                break
            leaves.append(entry)
            used += size
        else:
            continue
        break
    if not leaves:
        return None
    batches: list[BatchStats] = []
    if several and ordered:
        size = len(_ENC.encode(rows)) + 24
        if used + size <= budget:
            used += size
            for path, col, nans, per in ordered:
                width = BATCH_PREFIX_BYTES + 2 if _is_bytes(col.type) else 9
                if used + len(path) + 4 + 2 * len(rows) * width > budget:
                    break
                b = _batch_stats(path, per if per is not None else _per_batch(col, rows),
                                 nan=nans > 0)
                size = len(_ENC.encode(b))
                if used + size > budget:
                    break
                batches.append(b)
                used += size
    if not batches:
        rows = ()
    out = PartStats(leaves=tuple(leaves), batch_rows=rows, batches=tuple(batches))
    # NB: the sizes above are estimates of the framing; the budget is a promise.
    while len(_ENC.encode(out)) > budget:
        if out.batches:
            rest = out.batches[:-1]
            out = PartStats(leaves=out.leaves, batch_rows=out.batch_rows if rest else (),
                            batches=rest)
        elif len(out.leaves) > 1:
            out = PartStats(leaves=out.leaves[:-1])
        else:
            return None
    return out


def _per_batch(col: pa.ChunkedArray, rows: Sequence[int]
               ) -> list[tuple[Phys | None, Phys | None]]:
    out = []
    at = 0
    for n in rows:
        out.append(_min_max(col.slice(at, n)))
        at += n
    return out


def _fold(per: list[tuple[Phys | None, Phys | None]]) -> tuple[Phys | None, Phys | None]:
    los = [lo for lo, _ in per if lo is not None]
    his = [hi for _, hi in per if hi is not None]
    return (min(los) if los else None,
            max(his) if his else None)


def _batch_stats(path: str, per: list[tuple[Phys | None, Phys | None]], *, nan: bool
                 ) -> BatchStats:
    # NB: a float field with NaNs somewhere: each batch's upper bound is unknown (NaN is above
    # every number, and finding which batches hold one would cost a pass per batch).
    return BatchStats(path, tuple(_lower(lo, BATCH_PREFIX_BYTES) for lo, _ in per),
                      tuple(None if nan else _upper(hi, BATCH_PREFIX_BYTES) for _, hi in per))


__all__ = ["BATCH_PREFIX_BYTES", "MAX_STATS_BYTES", "PART_PREFIX_BYTES", "STATS_BYTES",
           "BatchStats", "Bounds", "Groups", "LeafStats", "Marks", "PartStats", "Phys", "Tail",
           "batch_bounds", "compute", "marks_of", "orderable", "part_bounds", "path_key", "physical"]
