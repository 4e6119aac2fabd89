"""Fixed records of storage format version 9 (compressed inline parts), for the golden files.

The inline part's bytes are pinned here as written by the persist that introduced the format
(an LZ4 frame of an 8-row Arrow stream), not computed: an encoder that changes must not move
the golden bytes with it.
"""

from __future__ import annotations

import pyarrow as pa

from persist.indexed.format.columnar import serialize_type
from persist.indexed.format.meta import AddPart, CollectionMeta, Commit, PartMeta, Seal, State

#: Keys 1..8, value 10, time 5, diff 1, in a version-1 part (int64 key and value).
PACKED = bytes.fromhex(
    "504c5a3498030000483cd5c0a0ffffffff6801000010000100b00a000e000600050008000a0f00250104"
    "1800530c00000004180011400c0051000001000018003108000c1c002208004800041c0013312000c070"
    "6572736973742e70617274570000200093c00000007c000000484c0080d0ffffff000000028800131814"
    "00000200002c0040646966660c0012542400100180009110001400080000000782001310a8000240001b"
    "1c4000d374696d65000006000800040006c0000270001d017000dd0500000076616c7565000000c47000"
    "1b06700002400008700071030000006b6579140131080007a40004b4000002000070015018010000140d"
    "0001200113167201110cca00310003040001015d01010200330a00186001009401139c640100fc000402"
    "00080c000c0200002c010002000408000402000410000408001480190003020004100004200000b00108"
    "020004100004200000020000ac010c8c000f10001d00540200020010020500000f01010600025c000002"
    "0000a00100020000c801000200100705000768000024010002000f0800250460000f08002504c0000f08"
    "002580ffffffff00000000")
PACKED_ROWS = [((k, 10), 5, 1) for k in range(1, 9)]

_PART = PartMeta(id="p9", rows=8, nbytes=len(PACKED), min_time=5, max_time=5, inline=PACKED,
                 inserted=8, retracted=0)
_COLL = CollectionMeta(id=2, name="packed", key_type=serialize_type(pa.int64()),
                       value_type=serialize_type(pa.int64()), since=0, upper=6, parts=(_PART,))


def fixed_packed_append() -> Commit:
    """An append of a compressed inline part, sealed in the same commit."""
    return Commit(seq=9, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        AddPart(name="packed", part=_PART), Seal(name="packed", upper=6)))


def fixed_packed_state() -> State:
    """A state holding a collection with a compressed inline part."""
    return State(seq=9, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"packed": _COLL})
