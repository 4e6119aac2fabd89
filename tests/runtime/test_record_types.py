"""Records say how they are stored (issue 21, findings 4-7): a ``msgspec.Struct`` field persist
cannot type is an error at ``create_or_load`` naming the field and the fix, opaque msgpack is
an explicit opt-in (``persist.msgpack(T)``), types that cannot be encoded at all are refused at
create, a Struct's identity is its structure (not its module), and key and value errors name
their side."""

from __future__ import annotations

import datetime
import decimal
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import SchemaMismatch
from persist.distributed import describe

ROOT = Path(__file__).resolve().parents[2]


class Order(msgspec.Struct, frozen=True):
    """``amount`` has no precision and scale: it does not map."""

    id: int
    amount: decimal.Decimal


class Typed(msgspec.Struct, frozen=True):
    id: int
    amount: Annotated[decimal.Decimal, persist.decimal(12, 2)]


class Item(msgspec.Struct, frozen=True):
    sku: str
    dims: complex


class Basket(msgspec.Struct, frozen=True):
    items: list[Item]


class Anything(msgspec.Struct, frozen=True):
    payload: object


class Tagged(msgspec.Struct, frozen=True):
    """Stored as msgpack by choice (a dict field has no Arrow mapping)."""

    kind: str
    tags: dict[str, int]


def _names(client: persist.Client) -> set[str]:
    return set(client.state.collections)


def test_a_struct_field_that_does_not_map_is_refused_at_create(tmp_path: Path) -> None:
    """A Struct with one unmappable field used to become opaque msgpack silently, found out
    only much later from a filter that named neither the field nor the fix."""
    with persist.open(tmp_path / "loc") as client:
        for column in ("key", "value"):
            types: dict[str, Any] = {"key_type": pa.string(), "value_type": pa.int64(),
                                     f"{column}_type": Order}
            with pytest.raises(SchemaMismatch,
                               match=rf"{column}.amount: Decimal needs Annotated\[Decimal, "
                                     rf"persist.decimal\(p, s\)\].*persist.msgpack\(Order\)"):
                client.create_or_load("orders", **types)
        assert "orders" not in _names(client)
        # the fix the message names
        w, r = client.create_or_load("orders", key_type=pa.string(), value_type=Typed)
        w.append([(("o", Typed(1, decimal.Decimal("9.50"))), 0, 1)], upper=1).result()
        assert r.snapshot(0).to_python() == [(("o", Typed(1, decimal.Decimal("9.50"))), 0, 1)]
        assert r.schema.field("value").type.field("amount").type == pa.decimal128(12, 2)


def test_msgpack_is_an_explicit_opt_in(tmp_path: Path) -> None:
    url = str(tmp_path / "loc")
    with persist.open(url) as client:
        with pytest.raises(SchemaMismatch, match=r"value.tags: dict\[str, int\] has no Arrow "
                                                 r"mapping.*persist.msgpack\(Tagged\)"):
            client.create_or_load("t", key_type=pa.string(), value_type=Tagged)
        for bare, arrow in ((int, "pa.int64()"), (str, "pa.string()")):
            with pytest.raises(SchemaMismatch, match=re.escape(
                    f"value: {bare.__name__} is a Python type: use the Arrow type ({arrow})")):
                client.create_or_load("t", key_type=pa.string(), value_type=bare)
        with pytest.raises(SchemaMismatch, match=r"value: dict is not a msgspec.Struct.*"
                                                 r"persist.msgpack\(dict\)"):
            client.create_or_load("t", key_type=pa.string(), value_type=dict)
        assert "t" not in _names(client)
        w, r = client.create_or_load("t", key_type=pa.string(),
                                     value_type=persist.msgpack(Tagged))
        w.append([(("a", Tagged("x", {"n": 1})), 0, 1)], upper=1).result()
        assert r.snapshot(0).to_python() == [(("a", Tagged("x", {"n": 1})), 0, 1)]
        with pytest.raises(SchemaMismatch, match=r"value: a value does not encode as "
                                                 r".*:Tagged"):
            w.append([(("b", {"kind": 1}), 1, 1)], upper=2).result()
        assert describe(url, "t").value_type == pa.binary()
        with pytest.raises(SchemaMismatch, match="stored as msgpack"):
            r.snapshot(0, filter=persist.col("value.kind") == "x")


@pytest.mark.parametrize(("spec", "field", "why"), [
    (complex, "value", "complex cannot be stored"),
    (object, "value", "object cannot be stored"),
    (Item, "value.dims", "complex cannot be stored"),
    (Basket, r"value.items\[\].dims", "complex cannot be stored"),
    (Anything, "value.payload", "object cannot be stored"),
])
def test_types_that_cannot_be_encoded_are_refused_at_create(
        tmp_path: Path, spec: Any, field: str, why: str) -> None:
    """These used to register, and every write failed with msgspec's ``Encoding objects of
    type complex is unsupported``, naming no field."""
    with persist.open(tmp_path / "loc") as client:
        with pytest.raises(SchemaMismatch, match=rf"{field}: {why}"):
            client.create_or_load("c", key_type=pa.string(), value_type=spec)
        assert "c" not in _names(client)
    # nor as msgpack: msgspec cannot encode them either
    with pytest.raises(SchemaMismatch, match=why):
        persist.msgpack(spec)


class Renamed(msgspec.Struct, frozen=True):
    """The structure of the script's ``Order`` below, under another module and name."""

    id: int
    city: str | None = None


class Wider(msgspec.Struct, frozen=True):
    id: int
    city: str | None = None
    coupon: str | None = None


class Narrower(msgspec.Struct, frozen=True):
    id: int
    city: str


_SCRIPT = """
    import sys
    import msgspec
    import pyarrow as pa
    import persist

    class Order(msgspec.Struct, frozen=True):
        id: int
        city: str | None = None

    with persist.open(sys.argv[1]) as client:
        w, _ = client.create_or_load("orders", key_type=pa.string(), value_type=Order)
        w.append([(("o-1", Order(1, "Oslo")), 0, 1)], upper=1).result()
"""


def test_a_struct_is_identified_by_its_structure_not_its_module(tmp_path: Path) -> None:
    """A collection written by a script (``__main__:Order``) could not be opened with the same
    class imported from a module, nor with its Arrow type from ``describe``."""
    url = str(tmp_path / "loc")
    subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), url], cwd=ROOT,
                   check=True, timeout=120)
    info = describe(url, "orders")
    assert info.codecs[1] == "__main__:Order"  # the registered name, for information
    with persist.open(url) as client:
        w, r = client.create_or_load("orders", key_type=pa.string(), value_type=Renamed)
        w.append([(("o-2", Renamed(2)), 1, 1)], upper=2).result()
        got = r.snapshot(1).to_python()
        assert got == [(("o-1", Renamed(1, "Oslo")), 1, 1), (("o-2", Renamed(2)), 1, 1)]
        assert all(type(v) is Renamed for (_, v), _, _ in got)
        # the exact Arrow type describe gives opens it too, reading dicts
        _, raw = client.create_or_load("orders", key_type=pa.string(),
                                       value_type=info.value_type)
        assert [v for (_, v), _, _ in raw.snapshot(1).to_python()] == [
            {"id": 1, "city": "Oslo"}, {"id": 2, "city": None}]
        assert describe(url, "orders").schema_version == 0  # nothing evolved
    with persist.open(url, read_only=True) as replica:
        _, r = replica.create_or_load("orders", key_type=pa.string(), value_type=Renamed)
        assert r.snapshot(1).to_python() == got


def test_another_structure_names_the_fields_that_differ_and_how_to_evolve(
        tmp_path: Path) -> None:
    with persist.open(tmp_path / "loc") as client:
        client.create_or_load("orders", key_type=pa.string(), value_type=Renamed)
        with pytest.raises(SchemaMismatch,
                           match=r"value.coupon: asked for, not stored; "
                                 r"client.evolve_schema\('orders', value_type=...\)"):
            client.create_or_load("orders", key_type=pa.string(), value_type=Wider)
        with pytest.raises(SchemaMismatch,
                           match=r"value.city: stored nullable, asked for non-nullable; that "
                                 r"change is not an allowed evolution"):
            client.create_or_load("orders", key_type=pa.string(), value_type=Narrower)
        with pytest.raises(SchemaMismatch, match=r"key: stored as string, asked for as int64"):
            client.create_or_load("orders", key_type=pa.int64(), value_type=Renamed)
        with pytest.raises(SchemaMismatch, match=r"not as msgpack"):
            client.create_or_load("orders", key_type=pa.string(),
                                  value_type=persist.msgpack(Renamed))
        # the evolution the message names
        assert client.evolve_schema("orders", value_type=Wider).result() == 1
        client.create_or_load("orders", key_type=pa.string(), value_type=Wider)


def test_key_and_value_errors_name_their_side(tmp_path: Path) -> None:
    """A wrong key was reported as a value: ``value 5 (int) does not fit string``."""
    when = datetime.datetime(2024, 1, 1)  # naive: a zoned timestamp refuses it
    with persist.open(tmp_path / "loc") as client:
        w, r = client.create_or_load("s", key_type=pa.string(), value_type=pa.int64())
        with pytest.raises(SchemaMismatch, match=r"^key: 5 \(int\) does not fit string"):
            w.write([((5, 1), 1, 1)]).result()
        with pytest.raises(SchemaMismatch, match=r"^value: 'x' \(str\) does not fit int64"):
            w.write([(("a", "x"), 1, 1)]).result()
        w, _ = client.create_or_load("t", key_type=pa.timestamp("us", tz="UTC"),
                                     value_type=persist.msgpack(Tagged))
        with pytest.raises(SchemaMismatch, match=r"^key: .* aware datetime"):
            w.write([((when, Tagged("a", {})), 1, 1)]).result()
        with pytest.raises(SchemaMismatch, match=r"^value: a value does not encode"):
            w.write([((when.replace(tzinfo=datetime.UTC), 3), 1, 1)]).result()
        w, _ = client.create_or_load("r", key_type=Renamed, value_type=Typed)
        with pytest.raises(SchemaMismatch, match=r"key: .* is not a .*:Renamed"):
            w.write([((Typed(1, decimal.Decimal(1)), Typed(1, decimal.Decimal(1))), 1, 1)]
                    ).result()
        with pytest.raises(SchemaMismatch, match=r"value.amount: .*more than 2 decimal"):
            w.write([((Renamed(1), Typed(1, decimal.Decimal("0.001"))), 1, 1)]).result()
        assert r.upper == 0
