"""The native read over a marked base (DESIGN.md §8, the marks step; §11a, *Marks*): Spark
reads every base file once, minus its marked rows (``FileRead.marks``, a bitmap tested
against ``_metadata.row_index``), and the delta raw, nothing summed; runs newer than the marks
are applied by key on top, as over any base.

Checked against the client's snapshot and the Python source (``format("persist")``) on the
same collection, raw and consolidated, at every as-of time in ``[since, upper)``, after one
and after several marks steps (marks accumulate, the delta re-made): retractions cancelling
base rows, new keys, new values of existing keys, null keys. A damaged marks blob fails the
plan with ``ChecksumMismatch`` naming the part; a bare file of a marked part is never handed
out (``parquet_files``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from persist import distributed, layout
from persist.blob.file import FileBlob
from persist.errors import ChecksumMismatch
from tests.indexed.test_base import engine
from tests.spark.test_native import _client, _native, _python
from tests.spark.test_native_base import _histories, _table

pytestmark = pytest.mark.spark

I64 = pa.int64()


def _marked(root: Path, base: list[Any], batches: list[list[Any]], since: int) -> Any:
    ix = engine(FileBlob(root), inline_threshold=0, batch_rows=64,
                compaction={"marks_rows": 1})
    ix.register("c", I64, I64)
    ix.write({"c": _table(base, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    for t, b in enumerate(batches, start=1):
        ix.write({"c": _table(b, t)})
        ix.seal("c", t + 1)
        if t <= since:
            ix.allow_compaction("c", t)
            while ix.maintain():
                pass
    return ix


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=_histories())
def test_a_marked_base_reads_as_the_client_and_the_python_source(
        spark: Any, tmp_path_factory: pytest.TempPathFactory,
        h: tuple[list[Any], list[list[Any]]]) -> None:
    base, batches = h
    # NB: a marks step needs a run that touches the base: runs of only new keys past its last
    # part (one row of key 600, drawn in a CI run) are appended to the base, nothing marked.
    # A retraction of a base row in the first batch makes every history one that marks.
    k, v, _ = base[0]
    batches = [[(k, v, -1), *batches[0]], *batches[1:]]
    root = tmp_path_factory.mktemp("marks")
    since = len(batches) - 1 if len(batches) > 1 else 1
    ix = _marked(root, base, batches, since)
    assert any(p.marks is not None for p in ix.state.collections["c"].parts)
    url = str(root)
    for as_of in range(since, len(batches) + 1):
        plan = distributed.plan_native(distributed.describe(url, "c").snapshot(as_of))
        marked = [m for f in plan.files for m in f.marks]
        assert marked  # the marked base files are Spark's, with their marks
        assert not plan.tasks or all(t.kind != "snapshot" or not t.parts for t in plan.tasks)
        for consolidated in (True, False):
            want = _client(root, as_of, consolidated=consolidated)
            assert _native(spark, url, as_of, consolidated=consolidated) == want
            assert _python(spark, url, as_of, consolidated=consolidated) == want


def test_damaged_marks_fail_the_native_plan_and_bare_files_are_never_handed_out(
        spark: Any, tmp_path: Path) -> None:
    ix = _marked(tmp_path, [(k, k % 3, 1) for k in range(2000)],
                 [[(5, 2, -1), (6, 1, 1), (3000, 0, 1)]], 1)
    url = str(tmp_path)
    scan = distributed.describe(url, "c").snapshot(1)
    files, rest = distributed.parquet_files(scan)
    marked = [p for p in ix.state.collections["c"].parts if p.marks is not None]
    assert marked
    assert not any(f.endswith(layout.parse_ref(p.blob_key)[1].rsplit("/", 1)[1])
                   for p in marked for f in files)  # a marked part is read by persist
    assert {p.id for p in marked} <= {h.id for h in rest.parts}
    want = _client(tmp_path, 1, consolidated=True)
    assert _native(spark, url, 1, consolidated=True) == want
    p = next(p for p in marked if p.marks.count)
    path = tmp_path / p.marks.key
    good = path.read_bytes()
    path.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(ChecksumMismatch, match=p.id):
        distributed.plan_native(distributed.describe(url, "c").snapshot(1))
    path.write_bytes(good)
    assert _native(spark, url, 1, consolidated=True) == want
