"""Floats have one equality everywhere (DESIGN §4, §13): ``-0.0 == 0.0`` and NaN equals NaN
in filters, whatever the test (``==`` or ``isin``) and whatever reads it (a snapshot, a read
task, a part handle, with the pruning audit on or off); NaNs of any payload consolidate
together in every format version (issue 21, findings 17 and 18)."""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist.distributed import describe, read_part, read_task

#: Two NaNs with other payloads (bits): ``float("nan")`` and the negative one ``0.0 * inf``
#: gives on x86.
NAN_A = struct.unpack("<d", bytes.fromhex("000000000000f87f"))[0]
NAN_B = struct.unpack("<d", bytes.fromhex("000000000000f8ff"))[0]
VALUE = pa.struct([pa.field("x", pa.float32())])
KEYS = [0.0, -0.0, 1.0, -1.5, NAN_A, NAN_B, None]


def _same(a: float | None, b: float) -> bool:
    """persist's float equality: numerical, with NaN equal to NaN (null equals nothing)."""
    if a is None:
        return False
    return (math.isnan(a) and math.isnan(b)) or a == b


def _key(v: float | None) -> Any:
    """A hashable stand-in for a float that tells NaN and null apart and ``-0.0`` from 0."""
    if v is None:
        return None
    return "nan" if math.isnan(v) else (v, math.copysign(1, v))


def _counts(tables: list[pa.Table]) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for t in tables:
        for k, v, d in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                           t.column("diff").to_pylist(), strict=True):
            out[(_key(k), _key(v["x"]))] += d
    return +out


def _fill(url: str, options: persist.Options) -> None:
    with persist.open(url, options=options) as client:
        w, _ = client.create_or_load("f", key_type=pa.float64(), value_type=VALUE)
        for t, x in enumerate(KEYS):  # one blob part per time: each has its own stats
            rows = [((k, {"x": x}), t, 1) for k in KEYS]
            w.append(rows, upper=t + 1).result()


FILTERS: list[tuple[str, Callable[[str], persist.Filter], Callable[[float | None], bool]]] = [
    ("isin [0.0]", lambda p: persist.col(p).isin([0.0]), lambda v: _same(v, 0.0)),
    ("isin [-0.0]", lambda p: persist.col(p).isin([-0.0]), lambda v: _same(v, 0.0)),
    ("== -0.0", lambda p: persist.col(p) == -0.0, lambda v: _same(v, 0.0)),
    ("~isin [0.0]", lambda p: ~persist.col(p).isin([0.0]),
     lambda v: v is not None and not _same(v, 0.0)),
    ("isin [nan, -0.0]", lambda p: persist.col(p).isin([NAN_B, -0.0]),
     lambda v: _same(v, math.nan) or _same(v, 0.0)),
    ("~isin [-1.5, nan]", lambda p: ~persist.col(p).isin([-1.5, NAN_A]),
     lambda v: v is not None and not (_same(v, -1.5) or _same(v, math.nan))),
]


@pytest.mark.parametrize("audit", [False, True], ids=["audit-off", "audit-on"])
@pytest.mark.parametrize(("name", "make", "want"), FILTERS, ids=[f[0] for f in FILTERS])
def test_isin_follows_the_equality_of_eq_on_every_read_path(
        tmp_path: Path, audit: bool, name: str, make: Callable[[str], persist.Filter],
        want: Callable[[float | None], bool]) -> None:
    """``isin([0.0])`` missed ``-0.0`` rows (and ``~isin`` kept them): Arrow's ``is_in``
    looks floats up by their bits."""
    url = f"file://{tmp_path}/loc"
    options = persist.Options(audit_pruning=audit, inline_threshold=0)
    _fill(url, options)
    for path, pick in (("key", lambda kv: kv[0]), ("value.x", lambda kv: kv[1]["x"])):
        f = make(path)
        expected = Counter((_key(k), _key(v)) for k in KEYS for v in KEYS
                           if want(pick((k, {"x": v}))))
        with persist.open(url, read_only=True, options=options) as replica:
            _, r = replica.create_or_load("f", key_type=pa.float64(), value_type=VALUE)
            assert _counts([r.snapshot(r.upper - 1, filter=f).to_arrow()]) == expected, path
        scan = describe(url, "f").snapshot(filter=f, audit=audit)
        for consolidated in (False, True):
            tasks = scan.tasks(consolidated=consolidated, n=2)
            got = _counts([t for task in tasks for t in read_task(task)])
            assert got == expected, (path, consolidated)
        got = _counts([read_part(h, filter=f, audit=audit)
                       for h in describe(url, "f").snapshot().parts])
        assert got == expected, path


def test_nans_of_other_payloads_consolidate_in_every_format_version(tmp_path: Path) -> None:
    """A NaN inserted as ``float("nan")`` and retracted as another NaN cancelled in a struct
    (version 2) collection but stayed two rows, +1 and -1, in a version-1 float key or value
    and a version-2 primitive float."""
    url = f"file://{tmp_path}/loc"
    policy = type(persist.Options().compaction)(fanin=2)
    # NB: no background compaction: maintain() below does every merge (a background one
    # could still be running when maintain() returned False).
    options = persist.Options(inline_threshold=0, compaction=policy,
                              background_compaction=False)
    cases = {"v1_key": (pa.float64(), pa.int64()), "v1_value": (pa.string(), pa.float64()),
             "v2_float32": (pa.float32(), pa.int8()), "v2_struct": (pa.int64(), VALUE)}

    def row(name: str, nan: float) -> tuple[Any, Any]:
        return {"v1_key": (nan, 1), "v1_value": ("a", nan), "v2_float32": (nan, 1),
                "v2_struct": (1, {"x": nan})}[name]

    with persist.open(url, options=options) as client:
        for name, (kt, vt) in cases.items():
            w, r = client.create_or_load(name, key_type=kt, value_type=vt)
            w.append([(row(name, NAN_A), 0, 1), (row(name, 0.5), 0, 1)], upper=1).result()
            w.append([(row(name, NAN_B), 1, -1)], upper=2).result()
            assert [kv for kv, _, _ in r.snapshot(1).to_python()] == [row(name, 0.5)], name
            assert len(r.snapshot(0).to_python()) == 2, name
        for name in cases:
            tasks = describe(url, name).snapshot(1).tasks(consolidated=True, n=2)
            assert sum(len(t) for task in tasks for t in read_task(task)) == 1, name
        # compaction consolidates the stored parts the same way
        for name, (kt, vt) in cases.items():
            w, _ = client.create_or_load(name, key_type=kt, value_type=vt)
            w.allow_compaction(1).result()
        while client.maintain():
            pass
        for name, (kt, vt) in cases.items():
            _, r = client.create_or_load(name, key_type=kt, value_type=vt)
            assert [kv for kv, _, _ in r.snapshot(1).to_python()] == [row(name, 0.5)], name
            stored = [t for p in describe(url, name).snapshot(1).parts for t in [read_part(p)]]
            assert sum(len(t) for t in stored) == 1, name
