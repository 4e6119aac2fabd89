"""Fixed records whose version-1 encodings are pinned in tests/golden/v1-*.bin."""

from __future__ import annotations

from persist.indexed.format.meta import (
    AddPart,
    AllowCompaction,
    CollectionMeta,
    Commit,
    Forget,
    PartMeta,
    Register,
    ReplaceParts,
    Retired,
    RollupAt,
    Seal,
    SetHold,
    State,
    Trim,
)

_PART_INLINE = PartMeta(id="p1", rows=2, nbytes=5, min_time=3, max_time=4, inline=b"\x01\x02")
_PART_BLOB = PartMeta(id="p2", rows=9, nbytes=99, min_time=0, max_time=7, consolidated=True,
                      blob_key="data/1/p2")
_COLLECTION = CollectionMeta(id=1, name="events", key_type=b"K", value_type=b"V",
                             value_codec="mod:Type", since=2, upper=8,
                             parts=(_PART_BLOB, _PART_INLINE), holds={"h": 3})


def fixed_commit() -> Commit:
    return Commit(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        Register(_COLLECTION),
        AddPart(name="events", part=_PART_INLINE),
        Seal(name="events", upper=9),
        AllowCompaction(name="events", since=3),
        ReplaceParts(name="events", removed=("p0",), added=(_PART_BLOB,), frontier=2),
        SetHold(name="events", hold_id="h", frontier=None),
        Forget(keys=("data/1/old",)),
    ))


def fixed_state() -> State:
    return State(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=2,
                 collections={"events": _COLLECTION},
                 retired=(Retired("data/1/old", 6, 1_699_999_999_000),))


def fixed_trim() -> Trim:
    """The trim progress a rollup at seq 7 records: the log trimmed to seq 2, rollups 3 and 5
    still kept."""
    return Trim(written_ms=1_700_000_000_500, trimmed=2,
                rollups=(RollupAt(3, 1_699_999_000_000), RollupAt(5, 1_699_999_500_000)))
