"""No read plan relies on every task reading every part: a consolidated read by ``n`` tasks
decodes each stored byte at most 1.5 times, whatever ``n``, counted by the part reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from persist.blob.file import FileBlob
from persist.distributed import describe
from persist.indexed.engine import Options, Txn
from persist.indexed.format import columnar
from persist.indexed.format.meta import AddPart
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read import split
from persist.indexed.read.parts import DECODED, PartReader
from persist.indexed.read.scan import read_task
from tests.support.engine import Engine
from tests.support.legacy import legacy_part

ROWS = 20_000
TASKS = [1, 2, 3, 4, 5, 8, 16, 64, 1000]


def _appends(rng: np.random.Generator, n: int, t: int, keys: int = 1 << 40) -> pa.Table:
    return pa.table({"key": pa.array(rng.integers(0, keys, n)),
                     "value": pa.array(rng.integers(0, 5, n)),
                     "time": pa.array(np.full(n, t, dtype=np.int64)),
                     "diff": pa.array(rng.choice(np.array([1, 1, 1, -1]), n))})


def _writer(root: Path, **opts: object) -> Engine:
    # NB: pinned: no background merging, no inline parts (the parts are what each test
    # builds), and room for per-batch key stats (what key ranges are planned from)
    base: dict[str, object] = {"inline_threshold": 0, "batch_rows": 1000, "stats_bytes": 1024,
                               "background_compaction": False,
                               "compaction": CompactionPolicy(final_rows=1000, fanin=4)}
    options = Options(**{**base, **opts})  # type: ignore[arg-type]
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=options)
    ix.fence()
    return ix


def check_bound(root: Path, name: str, as_of: int) -> dict[int, tuple[int, float]]:
    """For each n of TASKS: the consolidated tasks' outputs are the snapshot, and together
    they decode at most 1.5 times the bytes stored. Returns n -> (tasks, amplification)."""
    want = Engine.open(FileBlob(root).read_only()).snapshot(name, as_of).to_arrow()
    scan = describe(str(root), name).snapshot(as_of)
    stored = sum(h.nbytes for h in scan.parts)
    out = {}
    for n in TASKS:
        tasks = scan.tasks(consolidated=True, n=n)
        assert 1 <= len(tasks) <= n
        decoded = 0
        got = []
        before = DECODED.bytes
        for task in tasks:
            reader = PartReader(FileBlob(root).read_only(), cache_bytes=0)
            got.extend(read_task(reader, task))
            decoded += reader.decoded.bytes
        assert DECODED.bytes - before == decoded  # the process-wide count saw the same
        amplification = decoded / stored
        assert amplification <= split.MAX_AMPLIFICATION, (n, len(tasks), amplification)
        table = pa.concat_tables(got) if got else want.slice(0, 0)
        assert columnar.contents_at(table, as_of).equals(want), n
        out[n] = (len(tasks), amplification)
    return out


def test_appends_of_random_keys(tmp_path: Path) -> None:
    """Five sorted appends over the whole key space (W9's shape): ranges, not buckets, and
    about half as many tasks as each part has batches before the bound stops more."""
    rng = np.random.default_rng(7)
    ix = _writer(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(5):
        ix.write({"c": _appends(rng, ROWS, t)})
    ix.seal("c", 5)
    assert all(p.parquet and p.sorted for p in ix.state.collections["c"].parts)
    got = check_bound(tmp_path, "c", 4)
    assert got[1][0] == 1
    assert got[4][0] == 4
    assert got[1000][0] >= 8  # 20 batches per part: well beyond the 1 a bucket plan allows


def test_compacted_key_disjoint_parts_allow_many_tasks(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    ix = _writer(tmp_path, compaction=CompactionPolicy(fanin=2, final_rows=1 << 19,
                                                       part_target_bytes=100_000))
    ix.register("c", pa.int64(), pa.int64())
    for t in range(4):
        ix.write({"c": _appends(rng, ROWS, t)})
    ix.seal("c", 4)
    ix.allow_compaction("c", 3)
    ix.maintain()
    parts = ix.state.collections["c"].parts
    assert len(parts) > 5
    got = check_bound(tmp_path, "c", 3)
    assert got[64][0] >= 32  # key-disjoint parts: a boundary straddles one batch at most


def test_old_unsorted_and_inline_parts_allow_fewer_tasks(tmp_path: Path) -> None:
    """An older persist's unsorted parts and inline parts are read by every range: the plan
    has fewer ranges (one when they are most of the bytes) until compaction rewrites them."""
    rng = np.random.default_rng(9)
    ix = _writer(tmp_path)
    c = ix.register("c", pa.int64(), pa.int64())
    for t in range(4):
        ix.write({"c": _appends(rng, ROWS, t)})
    old = legacy_part(ix.blob, c, ix.normalize("c", _appends(rng, ROWS // 4, 4)),
                      batch_rows=1000)
    txn = Txn(ix.state)
    txn.stage(AddPart(name="c", part=old))
    ix.commit(txn)
    ix.set_options(Options(inline_threshold=1 << 20, batch_rows=1000, stats_bytes=1024,
                           background_compaction=False))
    ix.write({"c": _appends(rng, 300, 5)})  # inline
    ix.seal("c", 6)
    parts = ix.state.collections["c"].parts
    assert any(p.inline is not None for p in parts)
    assert any(not p.ordered for p in parts)
    mixed = check_bound(tmp_path, "c", 5)
    assert mixed[16][0] >= 2
    # mostly unsorted: one task
    for t in range(6, 10):
        part = legacy_part(ix.blob, c, ix.normalize("c", _appends(rng, ROWS, t)),
                           batch_rows=1000)
        txn = Txn(ix.state)
        txn.stage(AddPart(name="c", part=part))
        ix.commit(txn)
    ix.seal("c", 10)
    assert check_bound(tmp_path, "c", 9)[1000][0] == 1
    # compaction rewrites the old parts: sorted again, and the plan splits again
    ix.set_options(Options(inline_threshold=0, batch_rows=1000, stats_bytes=1024,
                           background_compaction=False,
                           compaction=CompactionPolicy(final_rows=1000, fanin=1 << 20,
                                                       inline_flush_bytes=1 << 30)))
    ix.maintain()
    assert all(p.parquet and p.ordered for p in ix.state.collections["c"].parts
               if p.blob_key is not None)
    assert check_bound(tmp_path, "c", 9)[16][0] >= 4


@pytest.mark.parametrize("key", [pa.struct([("a", pa.int64())]), pa.list_(pa.int64())])
def test_keys_without_a_range_order_are_read_by_one_task(tmp_path: Path,
                                                         key: pa.DataType) -> None:
    ix = _writer(tmp_path)
    ix.register("r", key, pa.int64())
    value = (lambda k: {"a": k}) if pa.types.is_struct(key) else (lambda k: [k, k])
    for t in range(3):
        ix.write({"r": [((value(k), k), t, 1) for k in range(t, 3000, 3)]})
    ix.seal("r", 3)
    assert {n: tasks for n, (tasks, _) in check_bound(tmp_path, "r", 2).items()} == {
        n: 1 for n in TASKS}
