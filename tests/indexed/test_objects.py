"""The column-by-column Python-object path (``persist/indexed/format/objects.py``) is only an
optimization: it converts exactly what the value-by-value checked path converts, to the same
array, or gives up; and it reads back the same instances that path's decoder made."""

from __future__ import annotations

import datetime
import decimal
import gc
import threading
import zoneinfo
from typing import Annotated, Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persist
from persist.errors import SchemaMismatch
from persist.indexed.format import objects, records
from persist.indexed.format.columnar import Codec

UTC = datetime.UTC
OSLO = "Europe/Oslo"


class Item(msgspec.Struct, frozen=True):
    sku: str
    qty: Annotated[int, persist.arrow(pa.int16())]


class Inner(msgspec.Struct, frozen=True):
    count: int | None
    flag: bool


class Everything(msgspec.Struct, frozen=True):
    i: int
    small: Annotated[int | None, persist.arrow(pa.int8())]
    u: Annotated[int, persist.arrow(pa.uint16())]
    f: float | None
    f32: Annotated[float, persist.arrow(pa.float32())]
    s: str | None
    b: bytes
    ok: bool | None
    amount: Annotated[decimal.Decimal | None, persist.decimal(6, 2)]
    day: datetime.date | None
    at: datetime.datetime | None
    naive: Annotated[datetime.datetime | None, persist.arrow(pa.timestamp("us"))]
    oslo: Annotated[datetime.datetime | None, persist.arrow(pa.timestamp("ns", tz=OSLO))]
    tags: list[int | None] | None
    strict_tags: list[str]
    items: list[Item] | None
    inner: Inner | None
    must: Inner


class KwOnly(msgspec.Struct, frozen=True, kw_only=True):
    a: int
    b: str | None = None


class Sub(Inner, frozen=True):
    """A subclass: the checked path takes it, the column path gives up."""


def _dt(aware: bool) -> st.SearchStrategy[datetime.datetime]:
    tz = st.sampled_from([UTC, datetime.timezone(datetime.timedelta(hours=-3))])
    return st.datetimes(min_value=datetime.datetime(1900, 1, 1),
                        max_value=datetime.datetime(2200, 1, 1),
                        timezones=tz if aware else st.none())


INTS = st.integers(-(2**63), 2**63 - 1)
DECIMALS = st.decimals(min_value=-9999, max_value=9999, places=2, allow_nan=False)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "i": INTS, "small": st.none() | st.integers(-128, 127), "u": st.integers(0, 65535),
    "f": st.none() | st.floats(), "f32": st.floats(width=32),
    "s": st.none() | st.text(max_size=5), "b": st.binary(max_size=5),
    "ok": st.none() | st.booleans(), "amount": st.none() | DECIMALS,
    "day": st.none() | st.dates(), "at": st.none() | _dt(True),
    "naive": st.none() | _dt(False), "oslo": st.none() | _dt(True),
    "tags": st.none() | st.lists(st.none() | INTS, max_size=3),
    "strict_tags": st.lists(st.text(max_size=2), max_size=3),
    "items": st.none() | st.lists(st.builds(Item, st.text(max_size=2),
                                            st.integers(-(2**15), 2**15 - 1)), max_size=2),
    "inner": st.none() | st.builds(Inner, st.none() | INTS, st.booleans()),
    "must": st.builds(Inner, st.none() | INTS, st.booleans()),
}
#: Values a field may be given that do not fit it (each refused by the checked path).
WRONG: dict[str, st.SearchStrategy[Any]] = {
    "i": st.sampled_from([1.5, True, "1", 2**63, None]),
    "small": st.sampled_from([128, -129, 1.0, False]),
    "u": st.sampled_from([-1, 65536]),
    "f": st.sampled_from([True, "1.0", decimal.Decimal(1)]),
    "s": st.sampled_from([b"x", 1]),
    "b": st.sampled_from(["x", None]),
    "ok": st.sampled_from([1, 0.0]),
    "amount": st.sampled_from([decimal.Decimal("0.001"), decimal.Decimal("10000"), 1.5, "1",
                               decimal.Decimal("NaN")]),
    "day": st.sampled_from([datetime.datetime(2024, 1, 1), "2024-01-01"]),
    "at": st.sampled_from([datetime.datetime(2024, 1, 1), datetime.date(2024, 1, 1)]),
    "naive": st.sampled_from([datetime.datetime(2024, 1, 1, tzinfo=UTC)]),
    "oslo": st.sampled_from([datetime.datetime(2024, 1, 1)]),
    "tags": st.sampled_from([[1.5], (1, 2), [True], "ab"]),
    "strict_tags": st.sampled_from([[None], [b"x"], None]),
    "items": st.sampled_from([[{"sku": "a", "qty": 1}], [Item("a", 2**15)], [None]]),
    "inner": st.sampled_from([{"count": 1, "flag": True}, Inner(1.5, True),  # type: ignore[arg-type]
                              Inner(1, None)]),  # type: ignore[arg-type]
    "must": st.sampled_from([None, Sub(1, True)]),
}


@st.composite
def everything(draw: st.DrawFn, wrong: bool) -> Everything | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    fields = {name: draw(s) for name, s in VALID.items()}
    if wrong:
        name = draw(st.sampled_from(sorted(WRONG)))
        fields[name] = draw(WRONG[name])
    return Everything(**fields)


CODEC = Codec.of(Everything)
PLAN = objects.plan(Everything, CODEC.arrow_type)


def _same(a: pa.Array, b: pa.Array) -> bool:
    """The same records, value for value (NaN as NaN, -0.0 as -0.0, nulls where nulls)."""
    return bool(a.type == b.type and repr(a.to_pylist()) == repr(b.to_pylist())
                and records.row_bytes(a).equals(records.row_bytes(b)))


def _checked(values: list[Any]) -> pa.Array | SchemaMismatch:
    try:
        return CODEC.encode_checked(values, "value")
    except SchemaMismatch as e:
        return e


def test_every_field_has_a_column_plan() -> None:
    assert PLAN is not None
    assert objects.plan(KwOnly, records.struct_type(KwOnly, "value")) is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(everything(wrong=False), max_size=12))
def test_valid_records_convert_column_by_column_as_value_by_value(
        values: list[Everything | None]) -> None:
    assert PLAN is not None
    fast = objects.encode(PLAN, values)
    slow = _checked(values)
    assert isinstance(slow, pa.Array), slow
    assert fast is not None  # every value here is exactly what its field takes
    fast.validate(full=True)
    assert _same(fast, slow)
    back = objects.decode(PLAN, fast)
    old = [records.struct_decoder(Everything)(d) for d in slow.to_pylist()]
    assert repr(back) == repr(old)
    assert back == values or repr(back) == repr(old)  # (NaN != NaN)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(everything(wrong=True), min_size=1, max_size=6),
       st.lists(everything(wrong=False), max_size=6))
def test_the_column_path_gives_up_where_the_checked_path_refuses(
        bad: list[Everything | None], good: list[Everything | None]) -> None:
    assert PLAN is not None
    values = good + bad
    fast = objects.encode(PLAN, values)
    slow = _checked(values)
    if isinstance(slow, SchemaMismatch):
        assert fast is None, slow
    elif fast is not None:
        assert _same(fast, slow)


def test_a_refusal_names_the_field_as_before() -> None:
    good = Everything(i=1, small=None, u=1, f=None, f32=0.5, s=None, b=b"", ok=None,
                      amount=None, day=None, at=None, naive=None, oslo=None, tags=None,
                      strict_tags=[], items=None, inner=None, must=Inner(None, True))
    bad = msgspec.structs.replace(good, amount=decimal.Decimal("0.001"))
    with pytest.raises(SchemaMismatch, match=r"value.amount: .*more than 2 decimal places"):
        CODEC.encode_values([good, bad], "value")
    assert _same(CODEC.encode_values([good] * 5000, "value"),
                 CODEC.encode_checked([good] * 5000, "value"))


def test_kw_only_structs_and_subclasses() -> None:
    codec = Codec.of(KwOnly)
    values = [KwOnly(a=1), None, KwOnly(a=2, b="x")]
    arr = codec.encode_values(values, "value")
    assert _same(arr, codec.encode_checked(values, "value"))
    assert codec.decode_values(arr) == values
    inner = Codec.of(Inner)
    assert inner.encode_values([Sub(1, True)], "value").to_pylist() == [
        {"count": 1, "flag": True}]  # the checked path takes the subclass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.dates(), max_size=8),
       st.lists(st.none() | st.datetimes(timezones=st.just(UTC)), max_size=8),
       st.lists(st.none() | st.datetimes(), max_size=8),
       st.lists(st.none() | st.decimals(min_value=-10**5, max_value=10**5, places=3,
                                        allow_nan=False), max_size=8))
def test_leaf_values_are_what_to_pylist_gives(dates: list[Any], aware: list[Any],
                                              naive: list[Any], decs: list[Any]) -> None:
    for values, t in ((dates, pa.date32()), (aware, pa.timestamp("us", tz="UTC")),
                      (naive, pa.timestamp("us")), (decs, pa.decimal128(12, 3))):
        arr = pa.array(values, type=t)
        assert repr(objects.leaf_values(arr)) == repr(arr.to_pylist())
        assert repr(objects.leaf_values(arr.slice(1))) == repr(arr.slice(1).to_pylist())


#: Zones of offset 0 (the column path converts their datetimes as timedeltas) and others.
ZONES = [UTC, zoneinfo.ZoneInfo("UTC"), datetime.timezone(datetime.timedelta(0), "Z"),
         datetime.timezone(datetime.timedelta(hours=3)), zoneinfo.ZoneInfo(OSLO), None]
STAMPS = [pa.timestamp("us"), pa.timestamp("us", tz="UTC"), pa.timestamp("ns", tz="UTC"),
          pa.timestamp("us", tz=OSLO), pa.timestamp("ns")]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ZONES), st.sampled_from(ZONES), st.booleans(),
       st.lists(st.none() | st.datetimes(), max_size=8), st.sampled_from(STAMPS))
def test_timestamps_convert_as_pyarrow_converts_them(zone: Any, other: Any, mixed: bool,
                                                     naive: list[Any], t: Any) -> None:
    """Whatever zone (and year from 1 to 9999: beyond a nanosecond timestamp's
    range) the datetimes have, the column path gives what pyarrow gives, or gives up."""
    values = [None if v is None else v.replace(tzinfo=other if mixed and i % 2 else zone)
              for i, v in enumerate(naive)]
    leaf = objects._leaf(t)
    try:
        fast: pa.Array | None = objects._encode_leaf(leaf, values)
    except objects._GiveUp:
        fast = None
    zones = {v.tzinfo for v in values if v is not None}
    one = zones.pop() if len(zones) == 1 else zone if not zones else "mixed"
    if one != "mixed" and (one is None) == (t.tz is None) and t.unit == "us" and (
            one is None or one.utcoffset(None) == datetime.timedelta(0)):
        assert fast is not None  # the timedelta path takes these
    if fast is not None:
        fast.validate(full=True)
        assert fast.equals(pa.array(values, type=t))


def test_leaf_values_beyond_pythons_range_fail_as_to_pylist_does() -> None:
    far = pa.array([2_932_897 + 10], type=pa.int32()).cast(pa.date32())  # past 9999-12-31
    with pytest.raises(OverflowError):  # pyarrow's own error
        far.to_pylist()
    with pytest.raises(OverflowError):
        objects.leaf_values(far)


def test_the_collector_pause_nests_across_threads_and_restores_its_state() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        inside = threading.Event()
        release = threading.Event()

        def other() -> None:
            with objects.gc_paused():
                inside.set()
                release.wait(10)

        t = threading.Thread(target=other)
        with objects.gc_paused():
            assert not gc.isenabled()
            t.start()
            assert inside.wait(10)
        assert not gc.isenabled()  # the other thread's pause still holds
        release.set()
        t.join(10)
        assert gc.isenabled()
        gc.disable()
        with objects.gc_paused():
            pass
        assert not gc.isenabled()  # disabled before: left disabled
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
