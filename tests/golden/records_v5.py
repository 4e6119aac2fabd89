"""Fixed records whose version-5 encodings (references, named holds, restores) are pinned in
tests/golden/v5-*.bin."""

from __future__ import annotations

import pyarrow as pa

from persist import layout
from persist.indexed.format.columnar import serialize_type
from persist.indexed.format.meta import (
    CollectionMeta,
    Commit,
    HoldTerms,
    Lineage,
    PartMeta,
    Register,
    Restore,
    SetHold,
    State,
)

_K, _V = serialize_type(pa.string()), serialize_type(pa.int64())
_OWN = PartMeta(id="p0", rows=4, nbytes=700, min_time=0, max_time=5, consolidated=True,
                blob_key="data/1/aa")
#: A fork's parts: one cut at 3 (its rows past 3 hidden), one of another location's blob.
_CUT = PartMeta(id="f0", rows=4, nbytes=700, min_time=0, max_time=3, consolidated=True,
                blob_key=layout.ref_key("data/1/aa", upto=3))
_FOREIGN = PartMeta(id="f1", rows=2, nbytes=650, min_time=1, max_time=2,
                    blob_key=layout.ref_key("data/4/bb", root="/srv/persist/other"))
_SOURCE = CollectionMeta(id=1, name="events", key_type=_K, value_type=_V, since=0, upper=6,
                         parts=(_OWN,), holds={"q3-close": 2, "billing-export": 1, "plain": 3},
                         terms={"q3-close": HoldTerms(kind="tag", renewed_ms=1_700_000_000_000),
                                "billing-export": HoldTerms(kind="hold", lease_ms=21_600_000,
                                                            renewed_ms=1_700_000_000_500),
                                "stopped": HoldTerms(kind="hold", lease_ms=1000,
                                                     renewed_ms=1_699_999_000_000,
                                                     lapsed_at=1)})
_FORK = CollectionMeta(id=2, name="events-copy", key_type=_K, value_type=_V, since=0, upper=4,
                       parts=(_CUT, _FOREIGN),
                       lineage=Lineage(source="events", as_of=3, seq=6))


def fixed_commit() -> Commit:
    """A commit registering a fork and setting a tag, a consumer hold and a lapse."""
    return Commit(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        Register(collection=_FORK),
        SetHold(name="events", hold_id="q3-close", frontier=2, kind="tag"),
        SetHold(name="events", hold_id="billing-export", frontier=1, kind="hold",
                lease_ms=21_600_000),
        SetHold(name="events", hold_id="stopped", frontier=None, lapse=1_699_999_000_000)))


def fixed_restore() -> Commit:
    """A restore of seq 5."""
    return Commit(seq=8, epoch=3, writer="w", wall_ms=1_700_000_001_000, ops=(
        Restore(seq=5, collections={"events": CollectionMeta(
            id=1, name="events", key_type=_K, value_type=_V, since=0, upper=4, parts=(_OWN,),
            lineage=Lineage(restored=8))}),))


def fixed_state() -> State:
    return State(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"events": _SOURCE, "events-copy": _FORK})
