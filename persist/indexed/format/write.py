"""The write side of parts: encoding updates into one immutable part, inline or in a blob.

Every part persist stores is made here, whoever makes it: a commit of user writes
(:mod:`persist.indexed.engine`), a compaction merge (:mod:`persist.indexed.maintenance.compact`), or a part
staged by a distributed writer (the Spark sink). Its counterpart for reading is
:mod:`persist.indexed.read.parts` (the part reader).
"""

from __future__ import annotations

import uuid

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import Blob
from persist.errors import InvalidUsage
from persist.indexed.format import columnar, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta


def new_part(
    blob: Blob, c: CollectionMeta, table: pa.Table, *, inline_threshold: int, consolidated: bool,
    staged: bool = False, lease_id: str | None = None, stats_bytes: int = stats.STATS_BYTES,
    full: bool = False,
    batch_rows: int = columnar.BATCH_ROWS,
) -> PartMeta:
    """Encodes ``table`` as a part of ``c``: inline when small, else in a fresh blob.

    Args:
        blob: where a part larger than ``inline_threshold`` encoded bytes is stored, under a new
            unique key of :func:`persist.layout.data_key` (never overwritten).
        c: the collection the part belongs to.
        table: updates already normalized to ``c``'s schema (``key, value, time, diff``).
        inline_threshold: parts encoding to at most this many bytes are returned inline (the
            caller puts them inside its metadata commit) and nothing is written.
        consolidated: whether ``table`` is sorted by (key, value, time) with no repeats.
        staged: the part is staged by another process for a later ``Client.apply(parts=...)``
            (its id starts with :data:`persist.layout.STAGED_PART_PREFIX`, which keeps the
            writer's automatic leaked-blob sweep away from it).
        lease_id: staged under this staging lease (:mod:`persist.indexed.state.lease`; implies
            ``staged``): the sweep leaves the part alone while the lease lives. The caller
            renews the lease before staging.
        stats_bytes: the budget of the part's stats (:mod:`persist.indexed.format.stats`), in encoded
            bytes; 0: none. A blob part gets them; an inline part never does (see below).
        full: compaction cut this part at its size target: it is never merged again
            (``PartMeta.full``).
        batch_rows: rows per Arrow record batch of the stored part (the unit per-batch stats
            describe and a filtered read skips).

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
        part_id = (layout.STAGED_PART_PREFIX if staged else "") + uuid.uuid4().hex
    data, batch_sizes = columnar.encode_batches(table, batch_rows)
    lo, hi = columnar.time_range(table) if len(table) else (0, 0)
    flag: bool | msgspec.UnsetType = True if full else msgspec.UNSET
    inserted, retracted = diff_sums(table)
    if len(data) <= inline_threshold:
        # NB: no stats for an inline part: its bytes are already in the metadata every reader
        # holds, so pruning it saves only a small decode, while computing them would cost every
        # small write on the commit path a pass per field.
        return PartMeta(id=part_id, rows=len(table), nbytes=len(data), min_time=lo, max_time=hi,
                        consolidated=consolidated, inline=data.to_pybytes(), full=flag,
                        inserted=inserted, retracted=retracted)
    computed = stats.compute(table, batch_sizes, stats_bytes)
    key = layout.data_key(c.id, part_id)
    blob.set(key, memoryview(data))
    return PartMeta(id=part_id, rows=len(table), nbytes=len(data), min_time=lo, max_time=hi,
                    consolidated=consolidated, blob_key=key, full=flag,
                    inserted=inserted, retracted=retracted,
                    stats=msgspec.UNSET if computed is None else computed)


def diff_sums(table: pa.Table) -> tuple[int, int]:
    """The sum of ``table``'s positive diffs and the magnitude of the sum of its negative ones
    (what a seal's history entry reports as inserted and retracted)."""
    if not len(table):
        return 0, 0
    diff = table.column("diff")
    pos = pc.sum(pc.max_element_wise(diff, 0)).as_py() or 0
    neg = pc.sum(pc.min_element_wise(diff, 0)).as_py() or 0
    return int(pos), int(-neg)


__all__ = ["diff_sums", "new_part"]
