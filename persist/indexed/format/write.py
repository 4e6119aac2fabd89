"""The write side of parts: encoding updates into one immutable part, inline or in a blob.

Every part persist stores is made here, whoever makes it: a commit of user writes
(:mod:`persist.indexed.engine`), a compaction merge (:mod:`persist.indexed.maintenance.compact`), or a part
staged by a distributed writer (the Spark sink, whose tasks therefore sort what they stage on
the executors). Its counterpart for reading is :mod:`persist.indexed.read.parts` (the part
reader).

A small part rides inline in the metadata as an Arrow IPC stream, as it always has. Every blob
part is written in part format 4 (:mod:`persist.indexed.format.parquet`): sorted by ``(key,
value, time)`` (:mod:`persist.indexed.format.sorting`), a plain Parquet file whose crc32c the
part's metadata keeps.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os

import crc32c
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import Blob
from persist.errors import InvalidUsage, PersistError
from persist.indexed.format import columnar, evolve, parquet, records, sorting, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta

#: A table whose Arrow data is more than this many times the inline threshold is not tried
#: inline: no part compresses that well (and encoding 1 M rows as a stream only to throw the
#: stream away cost as much as writing the part).
INLINE_PROBE_FACTOR = 16
#: ``new_parts`` cuts an append into key-disjoint parts written in parallel when each gets at
#: least this many rows (see there).
PARALLEL_ROWS = 1 << 18
#: ... into at most this many (the threads that write them).
PARALLEL_PARTS = max(1, min(2, os.cpu_count() or 1))

log = logging.getLogger(__name__)
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def new_part(
    blob: Blob, c: CollectionMeta, table: pa.Table, *, inline_threshold: int, consolidated: bool,
    staged: bool = False, lease_id: str | None = None, stats_bytes: int = stats.STATS_BYTES,
    full: bool = False,
    batch_rows: int = columnar.BATCH_ROWS,
    schema_id: int | None = None,
    ordered: bool = False,
    times: tuple[int, int] | None = None,
) -> PartMeta:
    """Encodes ``table`` as a part of ``c``: inline when small, else in a fresh blob, sorted,
    as a Parquet file (part format 4).

    Args:
        blob: where a part larger than ``inline_threshold`` encoded bytes is stored, under a new
            unique key of :func:`persist.layout.data_key` (never overwritten).
        c: the collection the part belongs to.
        table: updates already normalized to ``c``'s schema (``key, value, time, diff``).
        inline_threshold: parts encoding to at most this many bytes are returned inline (the
            caller puts them inside its metadata commit) and nothing is written.
        consolidated: whether ``table`` is sorted by (key, value, time) with no repeats (else
            a blob part is sorted here).
        staged: the part is staged by another process for a later ``Client.apply(parts=...)``
            (its id starts with :data:`persist.layout.STAGED_PART_PREFIX`, which keeps the
            writer's automatic leaked-blob sweep away from it).
        lease_id: staged under this staging lease (:mod:`persist.indexed.state.lease`; implies
            ``staged``): the sweep leaves the part alone while the lease lives. The caller
            renews the lease before staging.
        stats_bytes: the budget of the part's stats (:mod:`persist.indexed.format.stats`), in encoded
            bytes; 0: none. A blob part gets them; an inline part never does (see below).
        full: the part is a run at its size target: compaction does not tier it again, only
            merges it into the base (``PartMeta.full``).
        batch_rows: rows per record batch (row group) of the stored part (the unit per-batch
            stats describe and a filtered read skips).
        schema_id: the schema version of ``c`` the rows are of, recorded in a Parquet part's
            footer (None: the newest version whose part schema is ``table``'s). The caller
            tags the metadata (``evolve.tag``).
        ordered: ``table`` is sorted by (key, value, time) already (``consolidated`` implies
            it): not sorted again.
        times: ``table``'s ``(min, max)`` time, when the caller knows it (a group commit
            found it for each staged write); None: found here.

    Returns:
        The part's metadata: exactly one of ``inline`` and ``blob_key`` is set.

    Raises:
        ExternalError: writing the blob failed (the part is then not referenced by anything).
    """
    if lease_id is not None:
        part_id = layout.staged_part_id(lease_id)
        if layout.lease_of(layout.data_key(c.id, part_id)) != lease_id:
            raise InvalidUsage(f"a staging lease id is 32 lowercase hex digits, not {lease_id!r}")
    else:
        part_id = (layout.STAGED_PART_PREFIX if staged else "") + layout.random_id()
    lo, hi = times if times is not None else (
        columnar.time_range(table) if len(table) else (0, 0))
    flag: bool | msgspec.UnsetType = True if full else msgspec.UNSET
    inserted, retracted = diff_sums(table)
    if columnar.arrow_nbytes(table) <= INLINE_PROBE_FACTOR * inline_threshold:
        data, _ = columnar.encode_batches(table, batch_rows)
        if len(data) <= inline_threshold:
            # NB: no stats for an inline part: its bytes are already in the metadata every
            # reader holds, so pruning it saves only a small decode, while computing them would
            # cost every small write on the commit path a pass per field. Nor a sort: the
            # commit path of a small write is its whole latency, and a reader decodes an
            # inline part whole anyway.
            inline = columnar.pack_inline(data)
            return PartMeta(id=part_id, rows=len(table), nbytes=len(inline), min_time=lo,
                            max_time=hi, consolidated=consolidated, inline=inline,
                            full=flag, inserted=inserted, retracted=retracted)
    if not (consolidated or ordered):
        table = sorting.sort_updates(table)
    sid = _schema_id(c, table.schema) if schema_id is None else schema_id
    encoded = parquet.encode(table, batch_rows=batch_rows, schema_id=sid, sorted=True,
                             max_time=hi)
    computed = stats.compute(table, encoded.batch_rows, stats_bytes)
    # NB: the tail's checksum (the footer and page index another engine's reader trusts,
    # which no page checksum covers) rides in the stats: PartMeta has no field left.
    view = memoryview(encoded.data)
    tail = stats.Tail(encoded.tail, crc32c.crc32c(view[encoded.tail:]))
    # NB: and each row group's, so a reader of some row groups (a distributed compaction's
    # key range) fetches only those and still verifies every byte it decodes
    groups = None if encoded.groups is None or len(encoded.batch_rows) < 2 else stats.Groups(
        encoded.groups, tuple(crc32c.crc32c(view[a:b])
                              for a, b in itertools.pairwise(encoded.groups)))
    part_stats = (stats.PartStats(tail=tail, groups=groups) if computed is None
                  else msgspec.structs.replace(computed, tail=tail, groups=groups))
    key = layout.data_key(c.id, part_id)
    checksum = blob.set_plain(key, memoryview(encoded.data))
    return PartMeta(id=part_id, rows=len(table), nbytes=encoded.data.size, min_time=lo,
                    max_time=hi, consolidated=consolidated, blob_key=key, full=flag,
                    inserted=inserted, retracted=retracted, stats=part_stats,
                    checksum=checksum, sorted=True)


def _schema_id(c: CollectionMeta, schema: pa.Schema) -> int:
    """The newest schema version of ``c`` whose part schema is ``schema`` (0 if none is)."""
    versions = evolve.Schemas.of(c)
    for sid in range(versions.current, -1, -1):
        if versions.part_schema(sid).equals(schema, check_metadata=False):
            return sid
    return 0


def new_parts(
    blob: Blob, c: CollectionMeta, table: pa.Table, *, inline_threshold: int,
    final_rows: int, stats_bytes: int = stats.STATS_BYTES,
    batch_rows: int = columnar.BATCH_ROWS, schema_id: int | None = None,
    times: tuple[int, int] | None = None,
) -> list[PartMeta]:
    """``table`` (an append) as parts of ``c``: one part (:func:`new_part`), or, for an append
    of at least ``final_rows`` rows (a run compaction only merges into the base) and at least
    :data:`PARALLEL_ROWS` rows per piece, sorted once and cut where the key changes into
    key-disjoint pieces, each encoded and stored on its own thread and marked ``full`` (not
    tiered, as the whole would not have been: it waits for the base).

    NB: sorting and encoding are nearly all of a big append's acknowledgement (1 M rows of four
    int64 columns: 33-41 ms to sort, 41-49 ms to encode, 10 ms to store). Encoding releases the
    GIL, so pieces encode in parallel where a second core is free; cutting the sorted table
    costs nothing (slices), so where no core is free the pieces cost about what one part does
    (measured: W1 at 10.4-11 M rows/s with the second core free, 9.4-9.9 M single-threaded).
    Key-disjoint pieces are also what a key-range read splits best
    (:mod:`persist.indexed.read.split`). A single part is what a distributed writer's
    ``Stager`` stages: its tasks already run one per core.

    ``times``: ``table``'s ``(min, max)`` time if the caller knows it (passed to a single
    part; pieces find their own).

    Raises:
        ExternalError: storing a part failed; the other pieces' blobs are deleted again (best
            effort: a blob left over is a leak the sweeps reclaim).
    """
    n = len(table)
    k = min(PARALLEL_PARTS, n // PARALLEL_ROWS)
    if k < 2 or n < final_rows:
        return [new_part(blob, c, table, inline_threshold=inline_threshold, consolidated=False,
                         stats_bytes=stats_bytes, batch_rows=batch_rows, schema_id=schema_id,
                         times=times)]
    table = sorting.sort_updates(table)
    pieces = _key_slices(table, k)
    sid = _schema_id(c, table.schema) if schema_id is None else schema_id
    full = len(pieces) > 1
    futures = [_executor().submit(new_part, blob, c, piece, inline_threshold=0,
                                  consolidated=False, ordered=True, stats_bytes=stats_bytes,
                                  batch_rows=batch_rows, schema_id=sid, full=full)
               for piece in pieces]
    concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for f in futures:
            if f.exception() is None and f.result().blob_key is not None:
                try:
                    blob.delete(f.result().blob_key or "")
                except PersistError as e:
                    log.info("could not delete the unused part %s: %s", f.result().blob_key, e)
        raise failed[0]  # type: ignore[misc]
    return [f.result() for f in futures]


def _key_slices(table: pa.Table, k: int) -> list[pa.Table]:
    """``table`` (sorted by key) cut into about ``k`` equal slices, each cut where the key
    changes (keys that sort as ties, ``-0.0`` and ``0.0``, NaNs, nulls, are never cut apart);
    fewer when the keys are few."""
    n = len(table)
    frame = records.frame(table.column("key"))
    same = np.ones(n - 1, dtype=bool)
    for col in frame:
        eq = records.weak_equal(col.slice(1), col.slice(0, n - 1))
        same &= np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
    starts = np.flatnonzero(~same) + 1  # rows whose key differs from the one before
    cuts = sorted({int(starts[i]) for i in np.searchsorted(starts, [j * n // k for j in
                                                                   range(1, k)])
                   if i < len(starts)})
    edges = [0, *cuts, n]
    return [table.slice(a, b - a) for a, b in itertools.pairwise(edges) if b > a]


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(PARALLEL_PARTS,
                                                      thread_name_prefix="persist-part")
    return _pool


def diff_sums(table: pa.Table) -> tuple[int, int]:
    """The sum of ``table``'s positive diffs and the magnitude of the sum of its negative ones
    (what a seal's history entry reports as inserted and retracted), each exact and capped at
    ``2**64 - 1`` (the largest count a record stores; only diffs near int64's ends reach it).
    """
    if not len(table):
        return 0, 0
    diff = table.column("diff")
    small = columnar.small_ints(diff, pa.int64(), "q")
    if small is not None:
        # NB: a small append's (every group commit's) diffs summed as Python ints: exact, and
        # no compute call on the commit path (see ``columnar.small_ints``)
        total = sum(small)
        if min(small) >= 0:  # the usual case, insertions only: two C-level passes
            pos = total
        elif max(small) <= 0:
            pos = 0
        else:
            pos = sum(d for d in small if d > 0)
        return min(pos, _COUNT_MAX), min(pos - total, _COUNT_MAX)
    pos_d, neg_d = pc.max_element_wise(diff, 0), pc.min_element_wise(diff, 0)
    if columnar.may_overflow(diff):  # NB: pc.sum of int64 wraps; decimal128(38) cannot here
        pos_d, neg_d = pos_d.cast(pa.decimal128(38, 0)), neg_d.cast(pa.decimal128(38, 0))
    pos = pc.sum(pos_d).as_py() or 0
    neg = pc.sum(neg_d).as_py() or 0
    return min(int(pos), _COUNT_MAX), min(int(-neg), _COUNT_MAX)


#: The largest inserted or retracted count a part's record stores (msgpack's largest int).
_COUNT_MAX = 2**64 - 1


__all__ = ["PARALLEL_ROWS", "diff_sums", "new_part", "new_parts"]
