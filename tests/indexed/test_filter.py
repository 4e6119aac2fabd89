"""Filters (persist/indexed/read/filter.py): exact SQL semantics against a plain-Python model on
random nested records, conservative stats decisions, validation errors, serialization."""

from __future__ import annotations

import datetime
import decimal
import math
import pickle
from collections.abc import Iterator
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persist
from persist.errors import InvalidUsage, SchemaMismatch
from persist.indexed.format import columnar, stats
from persist.indexed.format.columnar import Codec
from persist.indexed.read import filter
from persist.indexed.read.filter import Filter, bind, col
from tests.indexed.test_records import collections, values

# -- a plain-Python model of the semantics --------------------------------------------------


def field_paths(t: pa.DataType, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...],
                                                                        pa.DataType]]:
    """Every field a filter may name: struct nodes, their fields, lists and leaves."""
    yield path, t
    if pa.types.is_struct(t):
        for f in t:
            yield from field_paths(f.type, (*path, f.name))


def field_value(row: dict[str, Any], path: tuple[str, ...]) -> Any:
    x = row[path[0]]
    for s in path[1:]:
        if x is None:
            return None
        x = x[s]
    return x


def _order(x: Any) -> Any:
    """Floats: NaN above every number, -0.0 equal to 0.0; others as Python orders them."""
    if isinstance(x, float):
        return (1, 0.0) if math.isnan(x) else (0, x)
    return x


def model_test(x: Any, op: str, lits: list[Any]) -> bool | None:
    """SQL's answer for one field value: None is unknown."""
    if op == "null":
        return x is None
    if op == "notnull":
        return x is not None
    if x is None:
        return None
    a = _order(x)
    if op == "in":
        return any(a == _order(v) for v in lits)
    b = _order(lits[0])
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def model(f: Any, row: dict[str, Any]) -> bool | None:
    """Kleene's logic over the filter tree."""
    if isinstance(f, filter.Compare):
        return model_test(field_value(row, f.path), f.cmp, [f.value.value()])
    if isinstance(f, filter.IsIn):
        return model_test(field_value(row, f.path), "in", [v.value() for v in f.values])
    if isinstance(f, filter.IsNull):
        return model_test(field_value(row, f.path), "null", [])
    if isinstance(f, filter.IsNotNull):
        return model_test(field_value(row, f.path), "notnull", [])
    if isinstance(f, filter.Not):
        r = model(f.item, row)
        return None if r is None else not r
    got = [model(x, row) for x in f.items]
    if isinstance(f, filter.And):
        return False if False in got else None if None in got else True
    return True if True in got else None if None in got else False


@st.composite
def filters(draw: st.DrawFn, kt: pa.DataType, vt: pa.DataType, depth: int = 2) -> Filter:
    """A random filter over the fields of key type ``kt`` and value type ``vt``, with literals
    of each field's type (NaN, -0.0, extremes and empty strings among them)."""
    if depth > 0 and draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["and", "or", "not"]))
        if kind == "not":
            return ~draw(filters(kt, vt, depth - 1))
        a, b = draw(filters(kt, vt, depth - 1)), draw(filters(kt, vt, depth - 1))
        return (a & b) if kind == "and" else (a | b)
    paths = list(field_paths(kt, ("key",))) + list(field_paths(vt, ("value",)))
    path, t = draw(st.sampled_from(paths))
    c = col(*path)
    if not stats.orderable(t):
        return c.is_null() if draw(st.booleans()) else c.is_not_null()
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "null", "notnull"]))
    if op == "null":
        return c.is_null()
    if op == "notnull":
        return c.is_not_null()
    if op == "in":
        return c.isin(draw(st.lists(values(t, nullable=False), max_size=3)))
    lit = draw(values(t, nullable=False))
    return {"==": c == lit, "!=": c != lit, "<": c < lit, "<=": c <= lit, ">": c > lit,
            ">=": c >= lit}[op]


def table_of(kt: pa.DataType, vt: pa.DataType, rows: list[Any]) -> pa.Table:
    return columnar.from_updates(rows, columnar.part_schema(kt, vt), Codec(kt), Codec(vt))


# -- semantics ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), collections())
def test_mask_matches_the_python_model(data: st.DataObject,
                                       c: tuple[pa.DataType, pa.DataType, list[Any]]) -> None:
    kt, vt, rows = c
    table = table_of(kt, vt, rows)
    f = data.draw(filters(kt, vt))
    b = bind(f, kt, vt)
    mask = b.mask(table)
    assert mask.null_count == 0
    assert len(mask) == len(table)
    want = [model(f, r) is True for r in table.to_pylist()]
    assert mask.to_pylist() == want, f
    # the filter survives serialization, and means the same after it
    again = filter.decode(f.encode())
    assert again == f
    assert pickle.loads(pickle.dumps(f)) == f
    assert bind(again, kt, vt).mask(table).to_pylist() == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), collections(), st.integers(1, 7), st.sampled_from([0, 60, 200, 1024, 4096]))
def test_stats_never_rule_out_a_matching_row(
    data: st.DataObject, c: tuple[pa.DataType, pa.DataType, list[Any]], batch: int,
    budget: int,
) -> None:
    """may_match is False only where no row matches: for the whole part and for each batch,
    under every budget (bounds trimmed, fields dropped)."""
    kt, vt, rows = c
    table = table_of(kt, vt, rows)
    f = data.draw(filters(kt, vt))
    b = bind(f, kt, vt)
    mask = b.mask(table).to_pylist()
    sizes = [min(batch, len(table) - i) for i in range(0, len(table), batch)]
    st_ = stats.compute(table, sizes, budget)
    if st_ is None:
        return
    assert len(msgspec_encode(st_)) <= budget
    part = stats.part_bounds(st_, len(table))
    if not b.may_match(part.get):
        assert not any(mask), (f, st_)
    at = 0
    for i, bb in enumerate(stats.batch_bounds(st_)):
        n = st_.batch_rows[i]
        if not b.may_match(bb.get):
            assert not any(mask[at:at + n]), (f, st_, i)
        at += n


def msgspec_encode(x: Any) -> bytes:
    return msgspec.msgpack.encode(x)


def test_sql_nulls_nan_and_negation() -> None:
    t = pa.struct([("x", pa.float64()), ("s", pa.struct([("n", pa.int64())]))])
    rows = [((0, {"x": 1.0, "s": {"n": 1}}), 0, 1),
            ((1, {"x": None, "s": {"n": None}}), 0, 1),
            ((2, {"x": math.nan, "s": None}), 0, 1),
            ((3, {"x": -0.0, "s": {"n": 5}}), 0, 1),
            ((4, None), 0, 1)]
    table = table_of(pa.int64(), t, rows)

    def keys(f: Filter) -> list[int]:
        m = bind(f, pa.int64(), t).mask(table)
        return [k for k, keep in zip(table.column("key").to_pylist(), m.to_pylist(),
                                     strict=True) if keep]

    x, n = col("value.x"), col("value.s.n")
    assert keys(x > 0.5) == [0, 2]                   # NaN is above every number
    assert keys(x > math.inf) == [2]
    assert keys(x == math.nan) == [2]                # NaN equals NaN
    assert keys(x < math.nan) == [0, 3]
    assert keys(x == 0.0) == [3]                     # -0.0 == 0.0
    assert keys(~(x > 0.5)) == [3]                   # not unknown is unknown: nulls stay out
    assert keys(x != 1.0) == [2, 3]
    assert keys(n.is_null()) == [1, 2, 4]            # a field of a null struct is null
    assert keys(col("value.s").is_null()) == [2, 4]
    assert keys(~n.is_null()) == [0, 3]
    assert keys((n > 2) | x.is_null()) == [1, 3, 4]  # unknown or true is true
    assert keys((n > 2) & x.is_null()) == []
    assert keys(n.isin([])) == []
    assert keys(~n.isin([])) == [0, 3]
    assert keys(x.isin([math.nan, 1.0])) == [0, 2]
    assert keys(~x.isin([math.nan, 1.0])) == [3]


def test_every_leaf_type_compares_exactly() -> None:
    utc = datetime.UTC
    t = pa.struct([
        ("i8", pa.int8()), ("u64", pa.uint64()), ("f32", pa.float32()),
        ("d", pa.decimal128(38, 10)), ("s", pa.large_string()), ("b", pa.binary()),
        ("day", pa.date32()), ("ts", pa.timestamp("ns", tz="+05:30")), ("flag", pa.bool_()),
    ])
    big = decimal.Decimal("12345678901234567890.5")
    v = {"i8": -128, "u64": 2**64 - 1, "f32": 1.100000023841858, "d": big, "s": "é",
         "b": b"\x00\xff", "day": datetime.date(2024, 2, 29),
         "ts": datetime.datetime(2024, 1, 1, tzinfo=utc), "flag": True}
    table = table_of(pa.int64(), t, [((1, v), 0, 1)])

    def hit(f: Filter) -> bool:
        return bool(bind(f, pa.int64(), t).mask(table)[0].as_py())

    assert hit(col("value.i8") == -128)
    assert not hit(col("value.i8") > -128)
    assert hit(col("value.u64") >= 2**64 - 1)
    assert not hit(col("value.f32") == 1.1)          # float32 1.1 is not float64 1.1
    assert hit(col("value.f32") > 1.1)
    assert hit(col("value.d") > decimal.Decimal("12345678901234567890.4"))
    assert hit(col("value.s") > "e")
    assert hit(col("value.s") == "é")
    assert hit(col("value.b") < b"\x01")
    assert hit(col("value.day") == datetime.date(2024, 2, 29))
    five_thirty = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    assert hit(col("value.ts") == datetime.datetime(2024, 1, 1, 5, 30, tzinfo=five_thirty))
    assert hit(col("value.flag") > False)


# -- validation --------------------------------------------------------------------------------

VT = pa.struct([("amount", pa.int64()), ("tags", pa.list_(pa.string())),
                ("when", pa.timestamp("us", tz="UTC")), ("a.b", pa.int32())])


@pytest.mark.parametrize(("f", "match"), [
    (col("value.nope") == 1, r"value\.nope: no such field \(value has amount, tags"),
    (col("key.x") == 1, r"key\.x: no such field \(key is int64, not a struct\)"),
    (col("value.amount") == "1", r"value\.amount: '1' \(str\) does not fit int64"),
    (col("value.amount") == 1.5, r"value\.amount: 1\.5 \(float\) does not fit int64"),
    (col("value.amount") == True, r"value\.amount: True \(bool\) does not fit int64"),  # noqa: E712
    (col("key") > 2**63, r"key: 9223372036854775808 \(int\) does not fit int64 \(out of range"),
    (col("value.tags") == "x", r"value\.tags: a list<item: string> field cannot be compared"),
    (col("value") > 1, r"value: a struct<.*> field cannot be compared"),
    (col("value.when") > datetime.datetime(2024, 1, 1), r"value\.when: .*an aware datetime"),
    (col("value.amount").isin([1, "x"]), r"value\.amount: 'x'"),
    (col("value.a.b") == 1, r"value\.a\.b: no such field"),
])
def test_bad_filters_name_the_field(f: Filter, match: str) -> None:
    with pytest.raises(SchemaMismatch, match=match):
        bind(f, pa.int64(), VT)


def test_a_field_named_with_a_dot_is_addressed_by_segments() -> None:
    table = table_of(pa.int64(), VT, [((1, {"amount": 1, "tags": [], "when": None,
                                             "a.b": 7}), 0, 1)])
    assert bind(col("value", "a.b") == 7, pa.int64(), VT).mask(table).to_pylist() == [True]


def test_misuse_is_refused_when_the_filter_is_built() -> None:
    with pytest.raises(InvalidUsage, match="None is not a filter literal"):
        col("key") == None  # noqa: B015, E711
    with pytest.raises(InvalidUsage, match="no truth value"):
        bool((col("key") > 1) and (col("key") < 5))
    with pytest.raises(InvalidUsage, match="no truth value"):
        1 < col("key") < 5  # type: ignore[operator]  # noqa: B015
    with pytest.raises(InvalidUsage, match="must start at 'key' or 'value'"):
        col("amount")
    with pytest.raises(InvalidUsage, match="not a filter literal"):
        col("key") == [1]  # noqa: B015
    with pytest.raises(InvalidUsage, match="list of literals"):
        col("key").isin("abc")
    with pytest.raises(InvalidUsage, match="not a persist filter"):
        (col("key") > 1) & True  # type: ignore[operator]
    with pytest.raises(InvalidUsage, match="not an encoded persist filter"):
        filter.decode(b"\x01")


def test_msgpack_collections_cannot_be_filtered() -> None:
    with pytest.raises(SchemaMismatch, match=r"key: the key is stored as msgpack \(mod:Cls\)"):
        bind(col("key") == b"x", pa.binary(), pa.int64(), key_codec="mod:Cls")


def test_filters_are_immutable_values() -> None:
    f = (col("key") > 1) & (col("value.amount") == 2) & col("value.tags").is_null()
    assert isinstance(f, filter.And)
    assert len(f.items) == 3
    assert f == (col("key") > 1) & (col("value.amount") == 2) & col("value.tags").is_null()
    assert hash(f) == hash(filter.decode(f.encode()))
    assert f.paths() == [("key",), ("value", "amount"), ("value", "tags")]
    with pytest.raises(AttributeError):
        f.items = ()  # type: ignore[misc]
    assert persist.col is col
    assert persist.Filter is Filter


# -- through a client ------------------------------------------------------------------------


def test_client_snapshots_take_a_filter(tmp_path: Any) -> None:
    vt = pa.struct([("amount", pa.int64()), ("note", pa.string())])
    rows = [((k, {"amount": k * 10, "note": None if k % 3 else f"n{k}"}), k % 4, 1)
            for k in range(40)]
    rows.append(((7, {"amount": 70, "note": None}), 5, -1))  # a retraction in a later part
    f = (col("value.amount") >= 70) & col("value.note").is_null()
    with persist.open(str(tmp_path)) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=vt)
        for t in range(6):
            w.append([u for u in rows if u[1] == t], upper=t + 1).result()
        snap = r.snapshot(5, filter=f)
        whole = r.snapshot(5).to_python()
        want = [x for x in whole if x[0][1]["amount"] >= 70 and x[0][1]["note"] is None]
        assert snap.to_python() == want
        assert 7 not in [k for (k, _), _, _ in want]
        assert snap.to_arrow().to_pylist() == [
            r_ for r_ in r.snapshot(5).to_arrow().to_pylist()
            if r_["value"]["amount"] >= 70 and r_["value"]["note"] is None]
        raw = pa.concat_tables(list(snap.batches()))
        assert all(v["amount"] >= 70 and v["note"] is None for v in raw.column("value").to_pylist())
        with pytest.raises(SchemaMismatch, match=r"value\.nope"):
            r.snapshot(5, filter=col("value.nope") == 1)


def test_async_snapshots_take_a_filter(tmp_path: Any) -> None:
    import asyncio

    async def main() -> list[Any]:
        client = await persist.aio.open(str(tmp_path))
        w, r = await client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        await w.append([((f"k{i}", i), 0, 1) for i in range(10)], upper=1)
        out = await r.snapshot(0, filter=col("value") > 6).to_python()
        await client.stop()
        return out

    assert [v for (_, v), _, _ in asyncio.run(main())] == [7, 8, 9]
