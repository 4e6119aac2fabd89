"""Fixed records whose version-2 encodings are pinned in tests/golden/v2-*.bin, and the record
type of the golden v2 location."""

from __future__ import annotations

import datetime
import decimal
from typing import Annotated

import msgspec
import pyarrow as pa

from persist.indexed.format import records
from persist.indexed.format.columnar import serialize_type
from persist.indexed.format.meta import (
    AddPart,
    CollectionMeta,
    Commit,
    PartMeta,
    Register,
    State,
)


class Item(msgspec.Struct, frozen=True):
    sku: str
    qty: Annotated[int, records.arrow(pa.int32())]


class Order(msgspec.Struct, frozen=True):
    """The value type of the golden location's ``orders``: stored as an Arrow struct."""

    id: int
    amount: Annotated[decimal.Decimal, records.decimal(10, 2)]
    at: datetime.datetime
    day: datetime.date | None
    items: list[Item]
    score: float | None = None


#: A struct key with a list, a zoned timestamp and a decimal (the types, not the class).
KEY = pa.struct([pa.field("region", pa.string(), nullable=False),
                 pa.field("ids", pa.list_(pa.int16())),
                 pa.field("at", pa.timestamp("ms", tz="UTC")),
                 pa.field("price", pa.decimal128(8, 3))])

_PART = PartMeta(id="p1", rows=2, nbytes=5, min_time=3, max_time=4, inline=b"\x01\x02")
_RECORDS = CollectionMeta(id=1, name="orders", key_type=serialize_type(KEY),
                          value_type=serialize_type(pa.struct([("a", pa.date32())])),
                          value_codec="mod:Order", since=2, upper=8, parts=(_PART,))
_PLAIN = CollectionMeta(id=2, name="plain", key_type=serialize_type(pa.string()),
                        value_type=serialize_type(pa.int64()))


def fixed_commit() -> Commit:
    return Commit(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        Register(_RECORDS), Register(_PLAIN), AddPart(name="orders", part=_PART)))


def fixed_state() -> State:
    return State(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"orders": _RECORDS, "plain": _PLAIN})
