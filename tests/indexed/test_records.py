"""Records as keys and values: random nested Arrow types, consolidation against a plain-Python
model, snapshots through compaction, reopen and a read-only replica; type rules and errors."""

from __future__ import annotations

import datetime
import decimal
import math
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persist.blob.file import FileBlob
from persist.errors import SchemaMismatch
from persist.indexed.engine import Options
from persist.indexed.format import columnar, records
from persist.indexed.format.columnar import Codec
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.support.engine import Engine

UTC = datetime.UTC

# -- random types and values ------------------------------------------------------------------

LEAVES = [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
    pa.uint32(), pa.uint64(), pa.float32(), pa.float64(), pa.decimal128(9, 2),
    pa.decimal128(38, 10), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
    pa.date32(), pa.timestamp("s"), pa.timestamp("ms", tz="UTC"), pa.timestamp("us"),
    pa.timestamp("ns", tz="+05:30"),
]


def arrow_types(depth: int = 3) -> st.SearchStrategy[pa.DataType]:
    leaf = st.sampled_from(LEAVES)
    if depth == 0:
        return leaf
    inner = arrow_types(depth - 1)
    fields = st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=3).map(
        lambda fs: pa.struct([pa.field(f"f{i}", t, nullable=n) for i, (t, n) in enumerate(fs)]))
    lists = st.tuples(inner, st.booleans(), st.booleans()).map(
        lambda a: (pa.large_list if a[2] else pa.list_)(pa.field("item", a[0], nullable=a[1])))
    return st.one_of(leaf, fields, lists)


def values(t: pa.DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Python values of ``t``, from small pools so that equal records recur."""
    if pa.types.is_struct(t):
        base: st.SearchStrategy[Any] = st.fixed_dictionaries(
            {f.name: values(f.type, f.nullable) for f in t})
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        base = st.lists(values(t.value_type, t.value_field.nullable), max_size=2)
    elif pa.types.is_boolean(t):
        base = st.booleans()
    elif pa.types.is_integer(t):
        lo, hi = records._int_range(t)
        base = st.sampled_from([0, 1, lo, hi])
    elif pa.types.is_floating(t):
        base = st.sampled_from([0.0, -0.0, 1.5, math.nan, -math.inf])
    elif pa.types.is_decimal(t):
        base = st.sampled_from([decimal.Decimal("0"), decimal.Decimal("-1.25"),
                                decimal.Decimal("1.2")])
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        base = st.sampled_from(["", "a", "é"])
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        base = st.sampled_from([b"", b"\x00", b"ab"])
    elif pa.types.is_date32(t):
        base = st.sampled_from([datetime.date(1970, 1, 1), datetime.date(2024, 2, 29)])
    else:
        assert pa.types.is_timestamp(t)
        tz = UTC if t.tz else None
        base = st.sampled_from([datetime.datetime(2024, 1, 1, tzinfo=tz),
                                datetime.datetime(1969, 12, 31, 23, 59, 59, tzinfo=tz)])
    return st.none() | base if nullable else base


def canon(x: Any) -> Any:
    """The model's equality: NaN one value, -0.0 not 0.0, null only null, containers by value."""
    if isinstance(x, float):
        return ("nan",) if math.isnan(x) else ("f", x, math.copysign(1.0, x))
    if isinstance(x, dict):
        return ("d", tuple((k, canon(v)) for k, v in sorted(x.items())))
    if isinstance(x, (list, tuple)):
        return ("l", tuple(canon(v) for v in x))
    if isinstance(x, datetime.datetime) and x.tzinfo is not None:
        return ("t", x.astimezone(UTC))
    if isinstance(x, bool):
        return ("b", x)
    return x


@st.composite
def collections(draw: st.DrawFn) -> tuple[pa.DataType, pa.DataType, list[Any]]:
    """Key and value types (at least one a record) and rows ((k, v), t, d) drawn from small
    pools of keys and values, so that retractions and repeats meet."""
    kt = draw(arrow_types(2))
    vt = draw(arrow_types(3).filter(lambda t: records.is_nested(t) or records.is_nested(kt)))
    keys = draw(st.lists(values(kt), min_size=1, max_size=3))
    vals = draw(st.lists(values(vt), min_size=1, max_size=4))
    rows = draw(st.lists(st.tuples(st.sampled_from(keys), st.sampled_from(vals),
                                   st.integers(0, 3), st.sampled_from([1, -1, 2])),
                         max_size=30))
    return kt, vt, [((k, v), t, d) for k, v, t, d in rows]


def model(rows: list[Any], as_of: int | None = None) -> dict[Any, int]:
    sums: dict[Any, int] = defaultdict(int)
    for (k, v), t, d in rows:
        if as_of is None:
            sums[(canon(k), canon(v), t)] += d
        elif t <= as_of:
            sums[(canon(k), canon(v))] += d
    return {x: d for x, d in sums.items() if d}


def table_model(t: pa.Table, with_time: bool = True) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for r in t.to_pylist():
        x = (canon(r["key"]), canon(r["value"])) + ((r["time"],) if with_time else ())
        assert x not in out, f"two rows for {x}"
        assert r["diff"] != 0
        out[x] = r["diff"]
    return out


def rows_of(t: pa.Table) -> list[Any]:
    """The rows in order, canonical (NB: ``Table.equals`` finds NaN unequal to itself)."""
    return [tuple(canon(x) for x in r.values()) for r in t.to_pylist()]


def schema_of(kt: pa.DataType, vt: pa.DataType) -> pa.Schema:
    return columnar.part_schema(kt, vt)


# -- consolidation ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collections())
def test_consolidation_matches_a_python_model(c: tuple[pa.DataType, pa.DataType, list[Any]]) -> None:
    kt, vt, rows = c
    table = columnar.from_updates(rows, schema_of(kt, vt), Codec(kt), Codec(vt))
    out = columnar.consolidate(table)
    assert out.schema.equals(table.schema)
    assert table_model(out) == model(rows)
    grouped = columnar.consolidate_grouped(table)
    assert table_model(grouped) == model(rows)
    # consolidated output is a fixed point, and in the order consolidate itself sorts by
    assert rows_of(columnar.consolidate(out)) == rows_of(out)
    for as_of in (0, 3):
        assert table_model(columnar.contents_at(table, as_of), False) == model(rows, as_of)


def test_nan_null_and_signed_zero_in_records() -> None:
    t = pa.struct([("x", pa.float64()), ("l", pa.list_(pa.float32()))])
    rows = [
        ((1, {"x": math.nan, "l": [math.nan]}), 0, 1),
        ((1, {"x": math.nan, "l": [math.nan]}), 0, -1),   # NaN cancels NaN
        ((1, {"x": -0.0, "l": []}), 0, 1),
        ((1, {"x": 0.0, "l": []}), 0, -1),                # -0.0 is not 0.0
        ((1, {"x": None, "l": None}), 0, 1),
        ((1, None), 0, 1),                                # a null record is not a record of nulls
        ((1, {"x": None, "l": [None]}), 0, 1),            # nor is a list of a null an empty list
    ]
    table = columnar.from_updates(rows, schema_of(pa.int64(), t), Codec(pa.int64()), Codec(t))
    out = columnar.consolidate(table)
    assert table_model(out) == model(rows)
    assert len(out) == 5


def test_equal_records_apart_in_the_input_meet() -> None:
    """Many rows per key: equal records far apart in the input are summed."""
    t = pa.struct([("s", pa.string()), ("l", pa.list_(pa.struct([("a", pa.int8())])))])
    vals = [{"s": s, "l": [{"a": a}] * n} for s in ("a", "b") for a in (1, None) for n in (0, 2)]
    rows = [((k % 3, vals[k % len(vals)]), k % 2, 1 if k < 100 else -1) for k in range(150)]
    table = columnar.from_updates(rows, schema_of(pa.int64(), t), Codec(pa.int64()), Codec(t))
    assert table_model(columnar.consolidate(table)) == model(rows)


# -- through storage: compaction, reopen, a read-only replica ----------------------------------


def _options() -> Options:
    return Options(inline_threshold=300, rollup_every=3,
                   compaction=CompactionPolicy(fanin=2, inline_flush_bytes=600))


def written(loc: Path, kt: pa.DataType, vt: pa.DataType, rows: list[Any],
            options: Options) -> Engine:
    """A writer at ``loc`` whose collection ``r`` holds ``rows`` (times 0-3), each time
    written and then sealed."""
    ix = Engine.open(FileBlob(loc), epoch=1, writer="w", options=options)
    ix.fence()
    ix.register("r", kt, vt)
    for t in range(4):
        batch = [r for r in rows if r[1] == t]
        if batch:
            ix.write({"r": batch})
        ix.seal("r", t + 1)
    return ix


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collections())
def test_snapshots_match_the_model_through_compaction_reopen_and_replica(
    c: tuple[pa.DataType, pa.DataType, list[Any]],
) -> None:
    kt, vt, rows = c
    with tempfile.TemporaryDirectory() as d:
        loc = Path(d)
        ix = written(loc, kt, vt, rows, _options())

        def check(engine: Engine, lo: int) -> None:
            for as_of in range(lo, 4):
                got = engine.snapshot("r", as_of).to_arrow()
                assert table_model(got, False) == model(rows, as_of), as_of

        check(ix, 0)
        ix.allow_compaction("r", 2)
        ix.maintain()
        check(ix, 2)
        again = Engine.open(FileBlob(loc), epoch=2, writer="w2", options=_options())
        check(again, 2)
        replica = Engine.open(FileBlob(loc).read_only())
        check(replica, 2)


# -- type rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "message"), [
    (pa.struct([("items", pa.list_(pa.struct([("price", pa.float16())])))]),
     "value.items[].price: halffloat is not supported"),
    (pa.map_(pa.string(), pa.int64()), "value: map<string, int64> is not supported"),
    (pa.struct([("d", pa.decimal256(40, 2))]), "value.d: decimal256(40, 2) is not supported"),
    (pa.list_(pa.time64("us")), "value[]: time64[us] is not supported"),
    (pa.struct([("n", pa.null())]), "value.n: null is not supported"),
    (pa.struct([]), "value: a struct needs at least one field"),
    (pa.dictionary(pa.int32(), pa.string()), "is not supported"),
])
def test_unsupported_types_name_the_field(t: pa.DataType, message: str) -> None:
    with pytest.raises(SchemaMismatch, match=re.escape(message)):
        Codec.of(t, "value")


@pytest.mark.parametrize(("t", "value", "message"), [
    (pa.struct([("a", pa.int64())]), {"a": 1.5}, "value.a: 1.5"),
    (pa.struct([("a", pa.int64())]), {"a": 1, "b": 2}, "value: unknown field 'b'"),
    (pa.struct([pa.field("a", pa.int64(), nullable=False)]), {}, "value.a: null"),
    (pa.list_(pa.int8()), [1, 300], r"value\[1\]: 300 .*out of range"),
    (pa.timestamp("ms"), datetime.datetime(2024, 1, 1, 0, 0, 0, 1500), "finer than ms"),
    (pa.timestamp("us", tz="UTC"), datetime.datetime(2024, 1, 1), "aware datetime"),
    (pa.timestamp("us"), datetime.datetime(2024, 1, 1, tzinfo=UTC), "naive datetime"),
    (pa.date32(), datetime.datetime(2024, 1, 1), "does not fit date32"),
    (pa.decimal128(5, 2), decimal.Decimal("1.005"), "more than 2 decimal places"),
    (pa.decimal128(5, 2), decimal.Decimal("1234"), "more than 3 integer digits"),
    (pa.decimal128(5, 2), 1.5, "does not fit decimal128"),
    (pa.list_(pa.string()), "ab", "a list is a list"),
])
def test_values_are_checked_before_pyarrow_converts(t: pa.DataType, value: Any,
                                                    message: str) -> None:
    with pytest.raises(SchemaMismatch, match=message):
        columnar.from_updates([((1, value), 0, 1)], schema_of(pa.int64(), t),
                              Codec(pa.int64()), Codec(t))


def test_arrow_input_widens_within_a_kind_only() -> None:
    want = pa.struct([("a", pa.int64()), ("l", pa.large_list(pa.large_string()))])
    schema = schema_of(pa.int64(), want)
    have = pa.array([{"a": 1, "l": ["x"]}],
                    pa.struct([("a", pa.int32()), ("l", pa.list_(pa.string()))]))
    base = {"key": [1], "time": pa.array([0], pa.uint64()), "diff": [1]}
    out = columnar.from_updates(pa.table({**base, "value": have}), schema, Codec(pa.int64()),
                                Codec(want))
    assert out.column("value").type == want
    for bad in (pa.array([{"a": 1.0, "l": ["x"]}]), pa.array([{"b": 1, "l": ["x"]}]),
                pa.array([{"a": 1, "l": [b"x"]}])):
        with pytest.raises(SchemaMismatch, match="'value' of type"):
            columnar.from_updates(pa.table({**base, "value": bad}), schema, Codec(pa.int64()),
                                  Codec(want))
