"""Diff sums that leave int64 are a typed error on every path that sums diffs, never a wrapped
number (issue 27): the client's snapshot, consolidated tasks, ``distributed.consolidate`` and
compaction, which refuses the merge, changes nothing and leaves the writer healthy."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import DiffOverflow, distributed
from persist.indexed.maintenance.compact import CompactionPolicy

BIG = 2**62
#: Value types: a flat one (hash-grouped sums) and a record (summed through its frame columns,
#: both by runs of sorted neighbours and by hash-grouping).
VALUES = {"flat": (pa.string(), lambda s: s), "record": (pa.struct([("s", pa.string())]),
                                                        lambda s: {"s": s})}


def _sums(tables: list[pa.Table]) -> dict[tuple[Any, Any], int]:
    out: Counter[tuple[Any, Any]] = Counter()
    for t in tables:
        for r in t.to_pylist():
            out[(r["key"], repr(r["value"]))] += r["diff"]
    return {k: d for k, d in out.items() if d}  # negative sums kept


@pytest.mark.parametrize("kind", sorted(VALUES))
def test_a_sum_outside_int64_is_refused_on_every_path(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    value_type, v = VALUES[kind]
    url = f"file://{tmp_path}/loc"
    # NB: compaction pinned: explicit only, merging two parts (the knob sets vary both)
    # NB: the merge this test expects refused is pinned: two inline parts, merged at fanin 2
    # as soon as there are two (the day's knob set may say otherwise).
    opts = persist.Options(background_compaction=False, inline_threshold=64 << 10,
                           compaction=CompactionPolicy(fanin=2, inline_flush_bytes=1))
    with persist.open(url, options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=value_type)
        # key 1 sums past 2**63 - 1, key 3 below -2**63; 4 and 5 each fit (their total does
        # not: a write's inserted count must not wrap either)
        w.append([((1, v("a")), 0, BIG), ((3, v("c")), 0, -(2**63)), ((4, v("d")), 0, BIG),
                  ((5, v("e")), 0, BIG), ((2, v("b")), 0, 1)], upper=1).result()
        w.append([((1, v("a")), 1, BIG), ((3, v("c")), 1, -1), ((2, v("b")), 1, 1)],
                 upper=2).result()
        assert r.history()[0].inserted == 3 * BIG + 1
        assert r.history()[0].retracted == 2**63
        want0 = {(1, repr(v("a"))): BIG, (3, repr(v("c"))): -(2**63), (4, repr(v("d"))): BIG,
                 (5, repr(v("e"))): BIG, (2, repr(v("b"))): 1}
        assert _sums([r.snapshot(0).to_arrow()]) == want0
        with pytest.raises(DiffOverflow, match=r"sum to (9223372036854775808|"
                                               r"-9223372036854775809), outside int64"):
            r.snapshot(1).to_arrow()

        scan = distributed.describe(url, "c").snapshot(1)
        raw = [t for task in scan.tasks() for t in distributed.read_task(task)]
        assert sum(len(t) for t in raw) == 8  # raw updates are exact: nothing is summed
        consolidated = scan.tasks(consolidated=True)
        with pytest.raises(DiffOverflow):
            _read_all(consolidated)
        with pytest.raises(DiffOverflow):
            _consolidate_all(consolidated, pa.concat_tables(raw))

        # compaction (times forwarded to since 1) would sum them: refused, nothing changed
        w.allow_compaction(1).result()
        before = client.state.collections["c"]
        with caplog.at_level(logging.WARNING, logger="persist.indexed"), \
                pytest.raises(DiffOverflow):
            client.maintain()
        assert "compaction of 'c' refused a merge of 2 parts" in caplog.text
        assert client.state.collections["c"].parts == before.parts
        # not planned again (it would fail again): a later round does nothing, quietly
        caplog.clear()
        client.maintain()
        assert "refused" not in caplog.text
        assert client.state.collections["c"].parts == before.parts

        # the writer is healthy: a retraction brings the sums back, and reads are exact
        w.append([((1, v("a")), 2, -BIG), ((3, v("c")), 2, 1)], upper=3).result()
        want2 = {**want0, (1, repr(v("a"))): BIG, (2, repr(v("b"))): 2}
        assert _sums([r.snapshot(2).to_arrow()]) == want2
        scan2 = distributed.describe(url, "c").snapshot(2)
        assert _sums([t for task in scan2.tasks(consolidated=True)
                      for t in distributed.read_task(task)]) == want2
    assert client.stopped
    assert client.lock_lost is None


def _read_all(tasks: list[distributed.ReadTask]) -> list[pa.Table]:
    return [t for task in tasks for t in distributed.read_task(task)]


def _consolidate_all(tasks: list[distributed.ReadTask], rows: pa.Table) -> list[pa.Table]:
    return [distributed.consolidate(task, rows) for task in tasks]
