"""Fixed records whose version-4 encodings are pinned in tests/golden/v4-*.bin (Parquet parts),
and the types of the golden v4 location."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from persist.indexed.format.columnar import serialize_type
from persist.indexed.format.meta import (
    AddPart,
    CollectionMeta,
    Commit,
    PartMeta,
    ReplaceParts,
    Retired,
    State,
)
from persist.indexed.format.stats import BatchStats, LeafStats, PartStats

#: ``readings``' value: a float that may be NaN or -0.0, a decimal, a seconds timestamp (stored
#: in milliseconds, or as int64 seconds when a value does not fit), a list, a nullable record.
READING = pa.struct([
    pa.field("level", pa.float64()),
    pa.field("amount", pa.decimal128(20, 4), nullable=False),
    pa.field("at", pa.timestamp("s")),
    pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False))),
    pa.field("probe", pa.struct([pa.field("serial", pa.uint32(), nullable=False),
                                 pa.field("label", pa.large_string())])),
])
#: ``evolved``'s value before and after its evolution (a field added).
EVOLVED0 = pa.struct([pa.field("a", pa.int32())])
EVOLVED1 = pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())])

_STATS = PartStats(leaves=(LeafStats("key", 0, 0, 1, 9), LeafStats("value", 0, 0, b"a", b"z")),
                   batch_rows=(2, 1),
                   batches=(BatchStats("key", (1, 7), (5, 9)),))
_PARQUET = PartMeta(id="p2", rows=3, nbytes=1234, min_time=5, max_time=6,
                    blob_key="data/2/p2", stats=_STATS, inserted=3, retracted=0,
                    checksum=0x89ABCDEF, sorted=True)
_MERGED = PartMeta(id="p3", rows=4, nbytes=2345, min_time=6, max_time=6, consolidated=True,
                   blob_key="data/2/p3", full=True, checksum=0x01234567, sorted=True)
_INLINE = PartMeta(id="p1", rows=1, nbytes=3, min_time=4, max_time=4, inline=b"\x03")
_PLAIN = CollectionMeta(id=2, name="plain", key_type=serialize_type(pa.int64()),
                        value_type=serialize_type(pa.string()), since=6, upper=8,
                        parts=(_INLINE, _MERGED))


def fixed_commit() -> Commit:
    return Commit(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        AddPart(name="plain", part=_PARQUET),
        ReplaceParts(name="plain", removed=("p2",), added=(_MERGED,), frontier=6)))


def fixed_state() -> State:
    return State(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"plain": _PLAIN},
                 retired=(Retired("data/2/p2", 7, 1_700_000_000_000),))


def plain(arr: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``arr``'s values as JSON: floats by their bits (NaN payloads and -0.0 kept), dates and
    timestamps by their stored integers (any value, not only those ``datetime`` holds),
    decimals as strings, binaries as hex; nulls None."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _as_json(_viewed(arr).to_pylist())


def _viewed(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_floating(t):
        return arr.view(pa.uint64() if t == pa.float64() else pa.uint32())
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return arr.view(pa.int64() if pa.types.is_timestamp(t) else pa.int32())
    if pa.types.is_struct(t):
        children = [_viewed(arr.field(i)) for i in range(t.num_fields)]
        fields = [f.with_type(c.type) for f, c in zip(t, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields,
                                          mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = _viewed(arr.values)
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        new = (pa.large_list if pa.types.is_large_list(t) else pa.list_)(
            t.value_field.with_type(values.type))
        return cls.from_arrays(arr.offsets, values, type=new,
                               mask=arr.is_null() if arr.null_count else None)
    return arr


def _as_json(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _as_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_as_json(v) for v in x]
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, (str, int, type(None))):
        return x
    return str(x)  # decimals
