"""Fixed records of storage format version 8 (marks: compaction's marks step replaced a base
part by a marked part reading the same data blob, and added a consolidated delta), for the
golden files."""

from __future__ import annotations

import pyarrow as pa

from persist.indexed.format.columnar import serialize_type
from persist.indexed.format.meta import CollectionMeta, Commit, PartMeta, ReplaceParts, State
from persist.indexed.format.stats import LeafStats, Marks, PartStats

_BASE = PartStats(leaves=(LeafStats("key", 0, 0, 1, 90),))
#: The base part the marks step replaced, and the marked part that replaced it: the same data
#: blob, 2 of its rows hidden by the marks blob, computed with the delta ``d1``.
_UNMARKED = PartMeta(id="b0", rows=90, nbytes=4321, min_time=3, max_time=3, consolidated=True,
                     blob_key="data/2/b0", stats=_BASE, checksum=0x0BADF00D, sorted=True)
_MARKED = PartMeta(id="b1", rows=90, nbytes=4321, min_time=3, max_time=3, consolidated=True,
                   blob_key="data/2/b0", checksum=0x0BADF00D, sorted=True,
                   stats=PartStats(leaves=_BASE.leaves,
                                   marks=Marks("data/2/b1.marks", 16, 0x12345678, 2, "d1")))
#: A base part no run touched: marked with no positions (no blob), naming the delta too.
_EMPTY = PartMeta(id="b2", rows=10, nbytes=999, min_time=3, max_time=3, consolidated=True,
                  blob_key="data/2/bx", checksum=0x00C0FFEE, sorted=True,
                  stats=PartStats(leaves=(LeafStats("key", 0, 0, 100, 120),),
                                  marks=Marks("", 0, 0, 0, "d1")))
_DELTA = PartMeta(id="d1", rows=3, nbytes=777, min_time=4, max_time=4, consolidated=True,
                  blob_key="data/2/d1", stats=PartStats(leaves=(LeafStats("key", 0, 0, 5, 77),)),
                  checksum=0x0FEEDBAC, sorted=True)
_COLL = CollectionMeta(id=2, name="marked", key_type=serialize_type(pa.int64()),
                       value_type=serialize_type(pa.int64()), since=4, upper=6,
                       parts=(_MARKED, _EMPTY, _DELTA))


def fixed_marks_step() -> Commit:
    """The commit of a marks step: the base parts and a run replaced by the marked parts and
    the delta."""
    return Commit(seq=9, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        ReplaceParts(name="marked", removed=("b0", "bz", "r1"),
                     added=(_MARKED, _EMPTY, _DELTA), frontier=4),))


def fixed_marked_state() -> State:
    """A state holding a marked collection."""
    return State(seq=9, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"marked": _COLL})


def unmarked_part() -> PartMeta:
    """The base part ``b1`` replaced."""
    return _UNMARKED
