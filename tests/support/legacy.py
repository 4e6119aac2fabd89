"""Parts as a persist before part format 4 wrote them: an Arrow IPC stream in an envelope,
unsorted (the rows as given). Tests of reading, planning and compacting old parts use them;
nothing in persist writes them any more."""

from __future__ import annotations

import uuid

import msgspec
import pyarrow as pa

from persist import layout
from persist.blob.base import Blob
from persist.indexed.format import columnar, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.format.write import diff_sums


def legacy_part(blob: Blob, c: CollectionMeta, table: pa.Table, *, consolidated: bool = False,
                batch_rows: int = columnar.BATCH_ROWS,
                stats_bytes: int = stats.STATS_BYTES) -> PartMeta:
    """``table`` stored as a blob part of ``c`` the way parts were before format 4 (and
    described by the metadata of then: no format, checksum or order)."""
    part_id = uuid.uuid4().hex
    data, sizes = columnar.encode_batches(table, batch_rows)
    lo, hi = columnar.time_range(table) if len(table) else (0, 0)
    inserted, retracted = diff_sums(table)
    computed = stats.compute(table, sizes, stats_bytes)
    key = layout.data_key(c.id, part_id)
    blob.set(key, memoryview(data))
    return PartMeta(id=part_id, rows=len(table), nbytes=len(data), min_time=lo, max_time=hi,
                    consolidated=consolidated, blob_key=key, inserted=inserted,
                    retracted=retracted,
                    stats=msgspec.UNSET if computed is None else computed)
