"""The base fast path changes no row (issue 28): a consolidated read with and without it
returns identical rows at every as-of time in ``[since, upper)``, through the client's
snapshot, ``read_task`` of key-range tasks, the native Spark path and the Python source.

Model-checked with hypothesis over a base load and batches of updates on top (retractions
cancelling base rows, new keys, new values of existing keys, null keys), the since advanced
batch by batch with compaction run to idle after each (so the base is a merged base, or a
marked base plus its delta when the marks step is drawn, with newer runs on top). *Without
the fast path* is read two ways: the same location with the read plan's base split turned
off in this process (every part summed: the client, ``read_task`` and the native plan, which
the driver makes here), and a twin location holding the same writes and since, never
compacted (no base at all), read through all four paths, the Python source included (its
planning and reads run in Spark's Python workers, where no patch reaches).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from persist.blob.file import FileBlob
from persist.indexed.read.scan import read_task
from tests.indexed.test_base import engine
from tests.indexed.test_read_base import no_base, rows_of
from tests.spark.test_native import _client, _native, _python
from tests.spark.test_native_base import _histories, _table

pytestmark = pytest.mark.spark

I64 = pa.int64()


def _load(root: Path, base: list[Any], batches: list[list[Any]], since: int, *,
          compacted: bool, marks: bool) -> Any:
    """Collection ``c`` at ``root``: ``base`` at time 0, batch ``t`` at time ``t``, the since
    advanced to ``since`` batch by batch; compaction to idle after each step if
    ``compacted`` (the marks step on any base if ``marks``, else never)."""
    ix = engine(FileBlob(root), inline_threshold=0, batch_rows=64,
                compaction={"marks_rows": 1 if marks else 1 << 40})
    ix.register("c", I64, I64)

    def settle() -> None:
        while compacted and ix.maintain():
            pass

    ix.write({"c": _table(base, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    settle()
    for t, b in enumerate(batches, start=1):
        ix.write({"c": _table(b, t)})
        ix.seal("c", t + 1)
        if t <= since:
            ix.allow_compaction("c", t)
            settle()
    return ix


def _tasks(ix: Any, as_of: int, n: int) -> Counter[tuple[Any, Any, int, int]]:
    tasks = ix.info("c").snapshot(as_of).tasks(consolidated=True, n=n)
    return sum((rows_of(t) for task in tasks for t in read_task(ix.reader, task)), Counter())


# NB: the since at 1 with marks (the first batch takes the marks step), else 0 or 1; with 2
# batches, the second is past the since: a run on top of the base
@pytest.mark.parametrize("marks", [True, False])
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=_histories(), since=st.integers(0, 1), n=st.integers(1, 3))
def test_reads_with_and_without_the_base_fast_path_are_identical(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, marks: bool,
        h: tuple[list[Any], list[list[Any]]], since: int, n: int) -> None:
    base, batches = h
    if marks:
        # NB: a retraction of a base row in the first batch: runs that overlap the base
        # (a run of keys beside it alone joins the base as a part of its own)
        k, v, _ = base[0]
        batches = [[(k, v, -1), *batches[0]], *batches[1:]]
    since = 1 if marks else min(since, len(batches))
    root = tmp_path_factory.mktemp("fast")
    twin_root = tmp_path_factory.mktemp("twin")
    ix = _load(root, base, batches, since, compacted=True, marks=marks)
    twin = _load(twin_root, base, batches, since, compacted=False, marks=marks)
    url, twin_url = str(root), str(twin_root)
    marked = [p for p in ix.state.collections["c"].parts if p.marks is not None]
    assert bool(marked) == marks
    event(f"runs past the since: {len(batches) > since}")
    for as_of in range(since, len(batches) + 1):
        lay = ix.info("c").snapshot(as_of).layers
        assert lay.base  # the fast path has a base to take
        assert not twin.info("c").snapshot(as_of).layers.base  # never compacted: none
        event(f"settled {lay.settled}, runs {min(len(lay.runs), 2)}")
        # with the fast path: the four paths agree with each other
        client = _client(root, as_of, consolidated=True)
        tasks = _tasks(ix, as_of, n)
        native = _native(spark, url, as_of, consolidated=True)
        python = _python(spark, url, as_of, consolidated=True)
        assert native == python == client
        assert tasks == rows_of(ix.snapshot("c", as_of).to_arrow())
        # without it, a twin that has no base: the same rows through each path
        assert _client(twin_root, as_of, consolidated=True) == client
        assert _tasks(twin, as_of, n) == tasks
        assert _native(spark, twin_url, as_of, consolidated=True) == native
        assert _python(spark, twin_url, as_of, consolidated=True) == python
        # without it, the same location: the base split off in this process
        with pytest.MonkeyPatch.context() as mp:
            no_base(mp)
            assert not ix.info("c").snapshot(as_of).layers.base
            assert _client(root, as_of, consolidated=True) == client
            assert _tasks(ix, as_of, n) == tasks
            assert _native(spark, url, as_of, consolidated=True) == native
