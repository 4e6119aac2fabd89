"""Fixed records whose version-3 encodings are pinned in tests/golden/v3-*.bin, and the record
types of the golden v3 location (schema evolution)."""

from __future__ import annotations

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
    EvolveSchema,
    PartMeta,
    SchemaVersion,
    State,
)


class Item(msgspec.Struct, frozen=True):
    sku: str
    qty: Annotated[int, records.arrow(pa.int16())]


class Order0(msgspec.Struct, frozen=True):
    """``orders``' value at schema version 0."""

    id: Annotated[int, records.arrow(pa.int32())]
    name: str | None
    items: list[Item]


class Item1(msgspec.Struct, frozen=True):
    sku: str
    qty: Annotated[int, records.arrow(pa.int32())]
    note: str | None = None


class Order1(msgspec.Struct, frozen=True):
    """Version 1: ``id`` widened to int64, ``amount`` added, items' ``qty`` widened and
    ``note`` added."""

    id: int
    amount: Annotated[decimal.Decimal, records.decimal(10, 2)] | None
    name: str | None
    items: list[Item1]


class Order2(msgspec.Struct, frozen=True):
    """Version 2: ``name`` dropped."""

    id: int
    amount: Annotated[decimal.Decimal, records.decimal(10, 2)] | None
    items: list[Item1]


#: ``keyed``'s key at versions 0 and 1 (a zone added, the region widened).
KEY0 = pa.struct([pa.field("region", pa.string(), nullable=False)])
KEY1 = pa.struct([pa.field("region", pa.large_string(), nullable=False),
                  pa.field("zone", pa.int8())])

_V0 = SchemaVersion(id=0, key_type=serialize_type(pa.int64()),
                    value_type=serialize_type(pa.struct([("a", pa.int32())])))
_V1 = SchemaVersion(id=1, key_type=serialize_type(pa.int64()),
                    value_type=serialize_type(pa.struct([("a", pa.int64()), ("b", pa.string())])),
                    value_codec="mod:Order")
_OLD = PartMeta(id="p0", rows=2, nbytes=5, min_time=3, max_time=4, inline=b"\x01\x02")
_NEW = PartMeta(id="p1", rows=1, nbytes=3, min_time=5, max_time=5, inline=b"\x03",
                schema_id=1)
_EVOLVED = CollectionMeta(id=1, name="orders", key_type=_V1.key_type, value_type=_V1.value_type,
                          value_codec="mod:Order", since=2, upper=8, parts=(_OLD, _NEW),
                          schemas=(_V0, _V1))
_PLAIN = CollectionMeta(id=2, name="plain", key_type=serialize_type(pa.string()),
                        value_type=serialize_type(pa.int64()))


def fixed_commit() -> Commit:
    return Commit(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        EvolveSchema(name="orders", schema=_V1), AddPart(name="orders", part=_NEW)))


def fixed_state() -> State:
    return State(seq=7, epoch=3, writer="w", wall_ms=1_700_000_000_000, next_cid=3,
                 collections={"orders": _EVOLVED, "plain": _PLAIN})
