"""Records and the format version; the msgspec.Struct mapping through the client."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path
from typing import Annotated

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat, SchemaMismatch
from persist.indexed.format import columnar, meta, records
from persist.indexed.format.columnar import Codec
from tests.support.engine import Engine

UTC = datetime.UTC


class Line(msgspec.Struct):
    sku: str
    qty: Annotated[int, persist.arrow(pa.int32())]
    tags: list[str]


class Order(msgspec.Struct):
    id: int
    amount: Annotated[decimal.Decimal, persist.decimal(12, 2)]
    at: datetime.datetime
    day: datetime.date | None
    lines: list[Line]
    note: str | None = None
    score: float = 0.0
    paid: bool = False
    blob: bytes = b""


class Opaque(msgspec.Struct):
    """Does not map (a dict field): refused, unless stored as msgpack by choice."""

    attrs: dict[str, int]


def test_struct_mapping() -> None:
    t = records.struct_type_of(Order)
    assert t is not None
    assert t.field("amount").type == pa.decimal128(12, 2)
    assert not t.field("amount").nullable
    assert t.field("at").type == pa.timestamp("us", tz="UTC")
    assert t.field("day").type == pa.date32()
    assert t.field("day").nullable
    lines = t.field("lines").type
    assert pa.types.is_list(lines)
    assert lines.value_type.field("qty").type == pa.int32()
    assert records.struct_type_of(Opaque) is None
    with pytest.raises(SchemaMismatch, match=r"value.attrs: dict\[str, int\] has no Arrow "
                                             r"mapping .* persist.msgpack\(Opaque\)"):
        Codec.of(Opaque)
    assert Codec.of(persist.msgpack(Opaque)).arrow_type == pa.binary()


def _order(i: int) -> Order:
    return Order(i, decimal.Decimal("10.50"), datetime.datetime(2024, 5, 1, 12, tzinfo=UTC),
                 None if i % 2 else datetime.date(2024, 5, 1),
                 [Line("a", 2, ["x", "y"]), Line("b", -1, [])], note=None if i % 3 else "n",
                 score=float("nan") if i == 3 else -0.0)


def test_struct_round_trip_through_the_client(tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc", reentrance_id="a") as client:
        w, r = client.create_or_load("orders", key_type=pa.int64(), value_type=Order)
        w.append([((i, _order(i)), 0, 1) for i in range(5)], upper=1).result()
        w.append([((i, _order(i)), 1, -1) for i in range(0, 5, 2)], upper=2).result()
        got = r.snapshot(1).to_python()
        assert [k for (k, _), _, _ in got] == [1, 3]
        assert all(isinstance(v, Order) for (_, v), _, _ in got)
        assert msgspec.structs.astuple(got[0][0][1]) == msgspec.structs.astuple(_order(1))
        assert got[1][0][1].lines[0] == Line("a", 2, ["x", "y"])
        bad = msgspec.structs.replace(_order(1), at=datetime.datetime(2024, 1, 1))
        with pytest.raises(SchemaMismatch, match=r"value.at: .* aware datetime"):
            w.append([((9, bad), 2, 1)], upper=3).result()
    ix = Engine.open(FileBlob(tmp_path / "loc").read_only())
    arrow = ix.snapshot("orders", 1).to_arrow()
    assert arrow.schema.field("value").type == records.struct_type_of(Order)


def test_a_msgpack_collection_of_a_class_that_now_maps_opens_with_persist_msgpack(
        tmp_path: Path) -> None:
    """A class stored as msgpack (by persist 0.1, which so stored every class) keeps msgpack:
    opened with ``persist.msgpack(Line)``; the bare class, which now maps to a struct, is
    refused with a message naming that (it used to open silently as msgpack)."""
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w")
    ix.fence()
    old = Codec(pa.binary(), Line, f"{Line.__module__}:{Line.__qualname__}")  # persist <= v1
    from persist.indexed.engine import Txn, new_collection
    from persist.indexed.format.meta import Register

    txn = Txn(ix.state)
    txn.stage(Register(new_collection(ix.state, txn, "lines", Codec(pa.int64()), old)))
    ix.commit(txn)
    with pytest.raises(SchemaMismatch, match=r"stored as opaque msgpack of "
                                             r"tests.indexed.test_records_format:Line.*"
                                             r"value_type=persist.msgpack\(Line\)"):
        ix.register("lines", pa.int64(), Line)
    c = ix.register("lines", pa.int64(), persist.msgpack(Line))
    assert c.value_type == columnar.serialize_type(pa.binary())
    ix.write({"lines": [((1, Line("a", 1, [])), 0, 1)]})
    ix.seal("lines", 1)
    assert ix.snapshot("lines", 0).to_python() == [((1, Line("a", 1, [])), 0, 1)]


def _get(blob: FileBlob, key: str) -> bytes:
    data = blob.get(key)
    assert data is not None
    return bytes(data)


def _log_versions(loc: Path) -> list[int]:
    blob = FileBlob(loc)
    keys = sorted(k for k in blob.list_keys(layout.LOG_PREFIX))
    return [msgspec.msgpack.decode(_get(blob, k))["version"] for k in keys]


#: NB: these tests pin inline parts, whatever knob set the suite runs under: the versions they
#: assert are those of inline parts and of commits carrying them (a blob part is a format-4
#: Parquet file, and a commit adding one is metadata format 4).
#: Nor is a lone inline part flushed into a blob (a base part) by compaction.
INLINE = persist.Options(inline_threshold=64 << 10,
                         compaction=persist.CompactionPolicy(inline_flush_bytes=1 << 20))


def test_only_what_carries_records_is_version_2(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar, "INLINE_PACK_SHARE", 0.0)  # plain streams: before format 9
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=INLINE)
    ix.fence()
    ix.register("plain", pa.string(), pa.int64())
    ix.write({"plain": [(("a", 1), 0, 1)]})
    # the fence is the commit that shards the log (format 7), the rest is what it carries
    assert _log_versions(tmp_path) == [7, 1, 1]
    assert meta.required_version(ix.state) == 7
    unsharded = msgspec.structs.replace(ix.state, log_from=msgspec.UNSET)
    assert meta.required_version(unsharded) == 1
    ix.register("rec", pa.int64(), pa.struct([("a", pa.list_(pa.int32()))]))
    ix.write({"rec": [((1, {"a": [1]}), 0, 1)]})
    assert _log_versions(tmp_path) == [7, 1, 1, 2, 1]
    assert meta.required_version(msgspec.structs.replace(ix.state, log_from=msgspec.UNSET)) == 2
    assert columnar.part_version(pa.string(), pa.int64()) == 1
    assert columnar.part_version(pa.int64(), pa.decimal128(5, 1)) == 2
    # a decimal, a date or an int8 alone is version 2 as well
    for t in (pa.decimal128(5, 1), pa.date32(), pa.int8(), pa.timestamp("us")):
        c = meta.CollectionMeta(id=9, name="x", key_type=columnar.serialize_type(pa.int64()),
                                value_type=columnar.serialize_type(t))
        assert meta.collection_version(c) == 2


def test_a_reader_that_predates_records_refuses_them(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=INLINE)
    ix.fence()
    ix.register("plain", pa.string(), pa.int64())
    ix.register("rec", pa.int64(), pa.struct([("a", pa.int32())]))
    ix.write({"rec": [((1, {"a": 1}), 0, 1)]})
    ix.maintain()
    blob = FileBlob(tmp_path)
    register_rec = layout.log_key(3, meta.log_from(ix.state))
    part = ix.state.collections["rec"].parts[0]
    schema = columnar.part_schema(pa.int64(), pa.struct([("a", pa.int32())]))
    monkeypatch.setattr(meta, "FORMAT_VERSION", 1)
    monkeypatch.setattr(columnar, "PART_FORMAT_VERSION", 1)
    plain = layout.log_key(2, meta.log_from(ix.state))
    meta.decode_commit(plain, _get(blob, plain))  # plain: fine
    with pytest.raises(IncompatibleFormat, match="upgrade persist"):
        meta.decode_commit(register_rec, _get(blob, register_rec))
    with pytest.raises(IncompatibleFormat):
        Engine.open(FileBlob(tmp_path).read_only())
    data = part.inline if part.inline is not None else _get(blob, part.blob_key or "")
    with pytest.raises(IncompatibleFormat, match="format version 2"):
        columnar.decode_part("p", data, schema)
