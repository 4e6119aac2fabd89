"""Read tasks and part handles travel between processes (issue 21, findings 20-22; issue 27):
every encoding the docs promise round-trips (filters included, with literals at every type's
bounds), the bytes are checked before anything in them is decoded, a record that decodes is
checked to hold together, an inline part's Arrow payload is validated before it is read, and
arguments of the wrong type are ``InvalidUsage``."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import pickle
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import persist
from persist import (
    ChecksumMismatch,
    Corruption,
    IncompatibleFormat,
    InvalidUsage,
    SchemaMismatch,
    distributed,
)
from persist.blob import envelope
from persist.blob.envelope import MAGIC
from persist.indexed.format import columnar
from persist.indexed.read import filter as filters
from persist.indexed.read.split import KeyRange
from tests.runtime import fuzz_tasks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"file://{tmp_path}/loc"
    fuzz_tasks.fill(u)
    return u


def test_damaged_tasks_and_handles_are_corruption_never_a_crash(url: str) -> None:
    """Flipped bits and truncations of encoded tasks killed the process (SIGSEGV), returned
    other rows or raised untyped errors: damage inside an inline part's Arrow payload travelled
    unchecked and was decoded unvalidated. Run in a process of its own: a crash fails the
    test instead of the suite."""
    proc = subprocess.run([sys.executable, "-m", "tests.runtime.fuzz_tasks", url, "21"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    got = json.loads(proc.stdout.splitlines()[-1])
    transit, payload, record = (Counter(got[k]) for k in ("transit", "payload", "record"))
    assert got["records"] >= 4
    # every damaged encoding refused by its checksum (or as truncated), none read
    assert set(transit) <= {"ChecksumMismatch", "Corruption"}, transit
    assert sum(transit.values()) == got["records"] * (fuzz_tasks.FLIPS + fuzz_tasks.TRUNCATIONS)
    # damage re-encoded with a valid checksum: typed errors or valid rows, nothing else
    assert payload
    assert not [k for k in payload if k.startswith("untyped") or k == "invalid"], payload
    assert payload["Corruption"] > 0, payload
    # flips anywhere in the record, re-checksummed (a buggy producer): 2 of 300 raised
    # OSError from a collection's damaged Arrow type (issue 27); a URL, a filter literal, a
    # part with neither blob nor payload... were InvalidUsage, AssertionError or
    # UnicodeDecodeError. The record's Corruption (or a newer version's refusal), or rows
    # (a flip in a value that still holds together: persist cannot know it was not meant).
    assert sum(record.values()) == got["records"] * fuzz_tasks.FLIPS
    assert set(record) <= {"Corruption", "IncompatibleFormat", "PartMissing", "rows"}, record
    assert record["Corruption"] > sum(record.values()) // 2, record


def _invalid_strings() -> bytes:
    """An inline part's payload that decodes but is not valid Arrow: a string key whose
    offsets run backwards (only a full validation looks at every offset)."""
    keys = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(
        pa.array([0, 2, 1], pa.int32()).buffers()[1]), pa.py_buffer(b"ab")])
    schema = columnar.part_schema(pa.string(), pa.int64())
    table = pa.Table.from_arrays([keys, pa.array([1, 2]), pa.array([0, 0], pa.uint64()),
                                  pa.array([1, 1])], schema=schema)
    return columnar.encode_part(table).to_pybytes()


def test_an_invalid_inline_payload_is_corruption_not_rows(url: str) -> None:
    """read_part handed back tables that failed ``validate(full=True)``; read_task fed them to
    compute kernels."""
    scan = distributed.describe(url, "c").snapshot()
    handle = next(h for h in scan.parts if h.part.inline is not None and h.rows >= 2)
    bad = _invalid_strings()
    part = msgspec.structs.replace(handle.part, inline=bad, nbytes=len(bad), rows=2,
                                   min_time=0, max_time=0, inserted=2, retracted=0)
    forged = distributed.PartHandle.from_bytes(
        msgspec.structs.replace(handle, part=part).to_bytes())
    with pytest.raises(Corruption, match="invalid Arrow data"):
        distributed.read_part(forged)
    task = next(t for t in scan.tasks() if any(p.id == part.id for p in t.parts))
    forged_task = msgspec.structs.replace(
        task, parts=tuple(part if p.id == part.id else p for p in task.parts))
    for consolidated in (False, True):
        t = msgspec.structs.replace(forged_task, kind="consolidated") if consolidated \
            else forged_task
        with pytest.raises(Corruption, match="invalid Arrow data"):
            list(distributed.read_task(distributed.ReadTask.from_bytes(t.to_bytes())))


def test_arguments_of_the_wrong_type_are_invalid_usage(url: str) -> None:
    """These raised AttributeError or TypeError."""
    scan = distributed.describe(url, "c").snapshot()
    task, handle = scan.tasks()[0], scan.parts[0]
    with pytest.raises(InvalidUsage, match="not NoneType"):
        list(distributed.read_task(None))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="not str"):
        list(distributed.read_task("x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match=r"decode it with ReadTask\.from_bytes"):
        list(distributed.read_task(task.to_bytes()))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="read a PartHandle with read_part"):
        list(distributed.read_task(handle))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="read a ReadTask with read_task"):
        distributed.read_part(task)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="filter must be a persist filter"):
        distributed.read_part(handle, filter="key == 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="columns must be a list"):
        distributed.read_part(handle, columns="key")
    for cls in (distributed.ReadTask, distributed.PartHandle):
        with pytest.raises(InvalidUsage, match="is bytes, not str"):
            cls.from_bytes("x")  # type: ignore[arg-type]
        with pytest.raises(InvalidUsage, match="is bytes, not NoneType"):
            cls.from_bytes(None)  # type: ignore[arg-type]
    # a task's bytes are not a handle's
    with pytest.raises(Corruption):
        distributed.PartHandle.from_bytes(task.to_bytes())


def test_pickle_carries_the_checked_bytes(url: str) -> None:
    """Spark ships tasks by pickle: damage on the way is caught as it is in to_bytes."""
    scan = distributed.describe(url, "c").snapshot()
    for rec in (scan.tasks()[0], scan.parts[0]):
        pickled = pickle.dumps(rec)
        assert pickle.loads(pickled) == rec
        at = pickled.index(MAGIC) + 40
        damaged = bytearray(pickled)
        damaged[at] ^= 0x10
        with pytest.raises(ChecksumMismatch):
            pickle.loads(bytes(damaged))


def test_a_newer_task_is_refused(url: str) -> None:
    task = distributed.describe(url, "c").snapshot().tasks()[0]
    newer = msgspec.structs.replace(task, version=task.version + 1)
    with pytest.raises(IncompatibleFormat, match="plan and read with the same persist"):
        distributed.ReadTask.from_bytes(newer.to_bytes())


def test_a_literal_in_no_form_of_its_kind_is_refused(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A literal is checked as it decodes: a big int's digits that do not parse, or one in
    the range msgpack carries as an int (two forms of one value), are not read as a value;
    nor is a task whose filter does not fit its collection's types."""
    url, _ = _typed(tmp_path_factory)
    f = persist.col("value.d0") > 2**70
    assert f == filters.Compare(("value", "d0"), ">", filters.Lit("bigint", str(2**70)))
    task = distributed.describe(url, "t").snapshot(filter=f).tasks()[0]
    assert distributed.ReadTask.from_bytes(task.to_bytes()) == task
    misfit = msgspec.structs.replace(task, filter=persist.col("value.i8") > 2**70)
    with pytest.raises(Corruption, match=r"does not hold together: SchemaMismatch: value\.i8"):
        distributed.ReadTask.from_bytes(misfit.to_bytes())
    for kind, data in (("bigint", "12x"), ("bigint", "5"), ("bigint", "007" + "9" * 30),
                       ("int", "5"), ("float", "inf"), ("decimal", "NaN"), ("date", "0"),
                       ("datetime", 3), ("bytes", None), ("bool", 1)):
        raw = msgspec.msgpack.encode(task).replace(
            msgspec.msgpack.encode(["bigint", str(2**70), None]),
            msgspec.msgpack.encode([kind, data, None]))
        forged = envelope.pack(distributed.ReadTask.KIND, raw)
        with pytest.raises(Corruption, match="undecodable record"):
            distributed.ReadTask.from_bytes(forged)
        with pytest.raises(InvalidUsage, match="not an encoded persist filter"):
            filters.decode(msgspec.msgpack.encode(task.filter).replace(
                msgspec.msgpack.encode(["bigint", str(2**70), None]),
                msgspec.msgpack.encode([kind, data, None])))
    with pytest.raises(InvalidUsage, match="no field holds it"):
        _ = persist.col("value") > 2**300


# -- every encoding round-trips, with random filters -------------------------------------------

#: Fixed UTC offsets (a zone's offset is all a literal keeps: ``isoformat``).
ZONES = st.sampled_from([datetime.UTC, datetime.timezone(datetime.timedelta(hours=5, minutes=30)),
                         datetime.timezone(-datetime.timedelta(hours=11))])
PATHS = st.lists(st.sampled_from(["a", "b", "c.d", "x y"]), max_size=2).map(
    lambda rest: ("key", *rest) if len(rest) % 2 else ("value", *rest))
LITERALS = st.one_of(
    # ints past msgpack's (a decimal128(38)'s), which travel as "bigint" literals
    st.integers(-(2**63), 2**63 - 1), st.integers(-(10**38), 10**38),
    st.sampled_from([-(2**63) - 1, 2**64 - 1, 2**64, 10**37 - 1, -(10**38) + 1]),
    st.floats(), st.text(max_size=4), st.binary(max_size=4),
    st.booleans(), st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.dates(), st.datetimes(), st.datetimes(timezones=ZONES))
LEAVES = st.one_of(
    st.builds(lambda p, op, v: filters.Compare(p, op, filters.Lit.of(v)), PATHS,
              st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), LITERALS),
    st.builds(lambda p, vs: filters.IsIn(p, tuple(map(filters.Lit.of, vs))), PATHS,
              st.lists(LITERALS, max_size=3)),
    st.builds(filters.IsNull, PATHS), st.builds(filters.IsNotNull, PATHS))
FILTERS = st.recursive(LEAVES, lambda inner: st.one_of(
    st.builds(lambda xs: filters.And(tuple(xs)), st.lists(inner, max_size=3)),
    st.builds(lambda xs: filters.Or(tuple(xs)), st.lists(inner, max_size=3)),
    st.builds(filters.Not, inner)), max_leaves=8)
BOUNDS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1),
                   st.floats(allow_nan=False), st.binary(max_size=6))


# A collection with a field of every comparable type, holding each type's bounds (and nulls):
# random filters on it, with literals at those bounds, are read through task bytes.
# NB: made from strings: arithmetic on them would round to the context's 28 digits
_D38, _MINUS_D38 = decimal.Decimal("9" * 38), decimal.Decimal("-" + "9" * 38)
_D38_10 = decimal.Decimal("9" * 28 + "." + "9" * 10)
_MINUS_D38_10 = decimal.Decimal("-" + "9" * 28 + "." + "9" * 10)
_TS = pa.timestamp("us", tz="UTC")
TYPED_FIELDS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "i8": (pa.int8(), [-(2**7), -1, 0, 1, 2**7 - 1]),
    "i16": (pa.int16(), [-(2**15), 0, 2**15 - 1]),
    "i32": (pa.int32(), [-(2**31), 0, 2**31 - 1]),
    "i64": (pa.int64(), [-(2**63), -1, 0, 2**63 - 1]),
    "u64": (pa.uint64(), [0, 1, 2**63, 2**64 - 1]),
    "d0": (pa.decimal128(38, 0), [_MINUS_D38, decimal.Decimal(-(2**64)), decimal.Decimal(0),
                                  decimal.Decimal(2**64), _D38]),
    "d10": (pa.decimal128(38, 10), [_MINUS_D38_10, decimal.Decimal("-0.0000000001"),
                                    decimal.Decimal(0), _D38_10]),
    "f64": (pa.float64(), [-math.inf, -sys.float_info.max, -0.0, 0.0, 5e-324,
                           sys.float_info.max, math.inf, math.nan]),
    "f32": (pa.float32(), [-math.inf, -3.4028234663852886e38, -0.0, 1.5, math.inf, math.nan]),
    "s": (pa.string(), ["", "a", "\x00", "\U0010ffff"]),
    # a day inside datetime's ends, so that every zone can show them
    "ts": (_TS, [datetime.datetime(1, 1, 2, tzinfo=datetime.UTC),
                 datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
                 datetime.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=datetime.UTC)]),
    "dt": (pa.date32(), [datetime.date.min, datetime.date(1970, 1, 1), datetime.date.max]),
    "b": (pa.bool_(), [False, True]),
}
TYPED_VALUE = pa.struct([(n, t) for n, (t, _) in TYPED_FIELDS.items()])


def _typed_rows() -> list[tuple[tuple[int, dict[str, Any]], int, int]]:
    """Rows cycling through every field's bounds (a null in every seventh row's field), over
    two times, some retracted."""
    rows = []
    for k in range(60):
        v = {n: (None if (k + j) % 7 == 0 else vs[(k + j) % len(vs)])
             for j, (n, (_, vs)) in enumerate(TYPED_FIELDS.items())}
        rows.append(((k, v), k % 2, 1 if k % 5 else 2))
    return rows


@st.composite
def typed_literals(draw: st.DrawFn, name: str) -> Any:
    """A literal for field ``name``: one of its bounds, a near one, or any value of its kind
    (some out of the field's range: both reads must refuse those alike)."""
    t, bounds = TYPED_FIELDS[name]
    pick = st.sampled_from(bounds)
    if pa.types.is_integer(t) or name == "d0":
        lo, hi = (-(10**38) + 1, 10**38 - 1) if name == "d0" else (
            (0, 2**64 - 1) if name == "u64" else (-(2 ** (t.bit_width - 1)),
                                                  2 ** (t.bit_width - 1) - 1))
        near = st.sampled_from([lo, lo + 1, hi - 1, hi, lo - 1, hi + 1, 2**64, -(2**63) - 1])
        return draw(pick | near | st.integers(lo, hi))
    if name == "d10":
        return draw(pick | st.decimals(_MINUS_D38_10, _D38_10, places=10))
    if pa.types.is_floating(t):
        return draw(pick | st.floats() | st.sampled_from([-0.0, 5e-324, -5e-324]))
    if name == "s":
        return draw(pick | st.text(max_size=3))
    if name == "ts":
        return draw(st.sampled_from(bounds).map(lambda d: d.astimezone(draw(ZONES)))
                    | st.datetimes(timezones=ZONES))
    if name == "dt":
        return draw(pick | st.dates())
    return draw(pick)


@st.composite
def typed_leaves(draw: st.DrawFn) -> filters.Filter:
    name = draw(st.sampled_from(sorted(TYPED_FIELDS)))
    c = persist.col("value", name)
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "null", "notnull"]))
    if op == "null":
        return c.is_null()
    if op == "notnull":
        return c.is_not_null()
    if op == "in":
        return c.isin(draw(st.lists(typed_literals(name), max_size=3)))
    lit = draw(typed_literals(name))
    return {"==": c == lit, "!=": c != lit, "<": c < lit, "<=": c <= lit, ">": c > lit,
            ">=": c >= lit}[op]


TYPED_FILTERS = st.recursive(typed_leaves(), lambda inner: st.one_of(
    st.builds(lambda xs: filters.And(tuple(xs)), st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda xs: filters.Or(tuple(xs)), st.lists(inner, min_size=1, max_size=3)),
    st.builds(filters.Not, inner)), max_leaves=4)


@st.composite
def key_ranges(draw: st.DrawFn) -> KeyRange | None:
    kind = draw(st.sampled_from([None, "int", "float", "bytes"]))
    if kind is None:
        return None
    values = {"int": st.integers(-(2**63), 2**63 - 1), "float": st.floats(allow_nan=False),
              "bytes": st.binary(max_size=6)}[kind]
    lo, hi = draw(st.none() | values), draw(st.none() | values)
    if lo is not None and hi is not None and not lo < hi:
        lo, hi = (None, hi) if draw(st.booleans()) else (lo, None)
    return KeyRange(lo, hi)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=st.none() | FILTERS, key_range=key_ranges(),
       slices=st.lists(st.tuples(st.text(max_size=3), st.integers(0, 9), st.integers(0, 9)),
                       max_size=3),
       bucket=st.integers(0, 7), audited=st.booleans(), typed=TYPED_FILTERS,
       consolidated=st.booleans())
def test_every_promised_encoding_round_trips(
        tmp_path_factory: pytest.TempPathFactory, f: filters.Filter | None,
        key_range: KeyRange | None, slices: list[tuple[str, int, int]], bucket: int,
        audited: bool, typed: filters.Filter, consolidated: bool) -> None:
    """``ReadTask.from_bytes(task.to_bytes())`` raised ``Invalid value 'cmp' - at
    $.filter.op`` for every task with a filter; a literal past msgpack's ints (a
    ``decimal128(38, 0)``'s) raised an untyped ``OverflowError`` in ``to_bytes`` (issue 27).

    Every filter the client accepts travels in a task and reads the rows the client's snapshot
    reads under it; one the client refuses is refused alike when planned."""
    task, handle = _records(tmp_path_factory)
    task = msgspec.structs.replace(task, filter=f, key_range=key_range, slices=tuple(slices),
                                   bucket=bucket, buckets=8, audited=audited, audit=task.parts)
    try:
        filters.bind(filters.And(()) if f is None else f, pa.string(), pa.int64())
    except SchemaMismatch as e:  # a task whose filter does not fit its types is refused
        with pytest.raises(Corruption, match=re.escape(str(e))):
            distributed.ReadTask.from_bytes(task.to_bytes())
        task = msgspec.structs.replace(task, filter=None)
    for rec in (task, handle):
        assert type(rec).from_bytes(rec.to_bytes()) == rec
        assert type(rec).from_bytes(memoryview(rec.to_bytes())) == rec
        assert pickle.loads(pickle.dumps(rec)) == rec
    for g in (f, typed):
        if g is not None:
            assert filters.decode(g.encode()) == g
            assert pickle.loads(pickle.dumps(g)) == g
    url, reader = _typed(tmp_path_factory)
    try:
        want = Counter(_rows([reader.snapshot(1, filter=typed).to_arrow()]))
    except SchemaMismatch as e:
        event("refused by the client")
        with pytest.raises(SchemaMismatch, match=re.escape(str(e).split(":")[0])):
            distributed.describe(url, "t").snapshot(1, filter=typed)
        return
    scan = distributed.describe(url, "t").snapshot(1, filter=typed)
    tasks = scan.tasks(consolidated=True, n=2) if consolidated else scan.tasks(n=2)
    got = Counter(_rows([t for task in tasks for t in distributed.read_task(
        distributed.ReadTask.from_bytes(task.to_bytes()))]))
    event(f"read {'some' if got else 'no'} rows")
    if consolidated:  # every row once, its diffs summed
        assert all(n == 1 for n in got.values())
        assert _sums(got) == _sums(want)
    else:
        assert got == want


def _rows(tables: list[pa.Table]) -> list[tuple[tuple[Any, ...], int]]:
    """Each row as ``((key, value fields as text...), diff)``: NaN and -0.0 compared by their
    text, so that equal rows are equal."""
    return [((r["key"], *map(repr, r["value"].values())), r["diff"])
            for t in tables for r in t.to_pylist()]


def _sums(rows: Counter[tuple[tuple[Any, ...], int]]) -> Counter[tuple[Any, ...]]:
    out = Counter[tuple[Any, ...]]()
    for (row, d), n in rows.items():
        out[row] += d * n
    return +out


_typed_cache: list[tuple[str, Any]] = []


def _typed(factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The typed collection ``t`` (made once) and a reader of it, on a client left open."""
    if not _typed_cache:
        u = f"file://{factory.mktemp('typed')}/loc"
        client = persist.open(u, options=persist.Options(inline_threshold=1 << 10,
                                                         background_compaction=False))
        w, r = client.create_or_load("t", key_type=pa.int64(), value_type=TYPED_VALUE)
        rows = _typed_rows()
        w.append([x for x in rows if x[1] == 0], upper=1).result()
        w.append([x for x in rows if x[1] == 1], upper=2).result()
        _typed_cache.append((u, r))
    return _typed_cache[0]


_cached: list[tuple[distributed.ReadTask, distributed.PartHandle]] = []


def _records(factory: pytest.TempPathFactory
             ) -> tuple[distributed.ReadTask, distributed.PartHandle]:
    """A task and a handle of a real scan (made once: hypothesis calls the test many times)."""
    if not _cached:
        u = f"file://{factory.mktemp('encoding')}/loc"
        fuzz_tasks.fill(u)
        scan = distributed.describe(u, "c").snapshot()
        _cached.append((scan.tasks()[0], scan.parts[0]))
    return _cached[0]


def test_stagers_tokens_and_staged_parts_travel_too(url: str) -> None:
    stager = distributed.Stager.start(url, "c", job="t")
    assert pickle.loads(pickle.dumps(stager)) == stager
    staged = stager.stage([(("z", 1), 9, 1)])
    assert distributed.StagedPart.from_bytes(staged.to_bytes()) == staged
    assert pickle.loads(pickle.dumps(staged)) == staged
    token = distributed.Token("job", 3)
    assert pickle.loads(pickle.dumps(token)) == token
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(token), type=distributed.Token) == token
    stager.release([staged])



def test_a_staged_part_damaged_and_checksummed_again_is_corruption(url: str) -> None:
    """Bytes a buggy stager damaged and then checksummed: decoding them (and checking the part
    against the collection, as a commit does) is the record's ``Corruption``, or a record that
    holds together, never an untyped error."""
    stager = distributed.Stager.start(url, "c", job="flips")
    staged = stager.stage([(("z", 1), 9, 1)])
    payload = envelope.unpack(staged.KIND, staged.to_bytes())
    rng = random.Random(27)
    outcomes: Counter[str] = Counter()
    collections = distributed.describe(url, "c")
    for _ in range(300):
        damaged = bytearray(payload)
        for _ in range(rng.randrange(1, 3)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        try:
            rec = distributed.StagedPart.from_bytes(envelope.pack(staged.KIND, bytes(damaged)))
            rec.check("c", url, {"c": collections.meta})
            outcomes["record"] += 1
        except persist.PersistError as e:
            outcomes[type(e).__name__] += 1
    assert set(outcomes) <= {"Corruption", "IncompatibleFormat", "InvalidUsage",
                             "SchemaMismatch", "UnknownCollection", "record"}, outcomes
    assert outcomes["Corruption"] > 150, outcomes
    stager.release([staged])
