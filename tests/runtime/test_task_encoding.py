"""Read tasks and part handles travel between processes (issue 21, findings 20-22): every
encoding the docs promise round-trips (filters included), the bytes are checked before anything
in them is decoded, an inline part's Arrow payload is validated before it is read, and
arguments of the wrong type are ``InvalidUsage``."""

from __future__ import annotations

import datetime
import json
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persist import ChecksumMismatch, Corruption, IncompatibleFormat, InvalidUsage, distributed
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
    transit, payload = Counter(got["transit"]), Counter(got["payload"])
    assert got["records"] >= 4
    # every damaged encoding refused by its checksum (or as truncated), none read
    assert set(transit) <= {"ChecksumMismatch", "Corruption"}, transit
    assert sum(transit.values()) == got["records"] * (fuzz_tasks.FLIPS + fuzz_tasks.TRUNCATIONS)
    # damage re-encoded with a valid checksum: typed errors or valid rows, nothing else
    assert payload
    assert not [k for k in payload if k.startswith("untyped") or k == "invalid"], payload
    assert payload["Corruption"] > 0, payload


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


# -- every encoding round-trips, with random filters -------------------------------------------

PATHS = st.lists(st.sampled_from(["a", "b", "c.d", "x y"]), max_size=2).map(
    lambda rest: ("key", *rest) if len(rest) % 2 else ("value", *rest))
LITERALS = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=4), st.binary(max_size=4),
    st.booleans(), st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.dates(), st.datetimes(), st.datetimes(timezones=st.just(datetime.UTC)))
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
       bucket=st.integers(0, 7), audited=st.booleans())
def test_every_promised_encoding_round_trips(
        tmp_path_factory: pytest.TempPathFactory, f: filters.Filter | None,
        key_range: KeyRange | None, slices: list[tuple[str, int, int]], bucket: int,
        audited: bool) -> None:
    """``ReadTask.from_bytes(task.to_bytes())`` raised ``Invalid value 'cmp' - at
    $.filter.op`` for every task with a filter."""
    task, handle = _records(tmp_path_factory)
    task = msgspec.structs.replace(task, filter=f, key_range=key_range, slices=tuple(slices),
                                   bucket=bucket, buckets=8, audited=audited, audit=task.parts)
    for rec in (task, handle):
        assert type(rec).from_bytes(rec.to_bytes()) == rec
        assert type(rec).from_bytes(memoryview(rec.to_bytes())) == rec
        assert pickle.loads(pickle.dumps(rec)) == rec
    if f is not None:
        assert filters.decode(f.encode()) == f
        assert pickle.loads(pickle.dumps(f)) == f


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

