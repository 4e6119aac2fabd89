"""Old parts (an older persist's Arrow streams, unsorted) are rewritten into sorted Parquet
parts by the runtime's maintenance, final and full ones included, within a budget that never
starves the commit path; reads are the same before, during and after."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

import persist
import persist.distributed
from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.engine import Options, Txn
from persist.indexed.format.meta import AddPart
from persist.indexed.maintenance import compact
from persist.indexed.maintenance.compact import CompactionPolicy, outdated
from tests.support.engine import Engine
from tests.support.legacy import legacy_part

ROWS = 3000


def _old_location(root: Path, parts: int) -> list[tuple[tuple[int, int], int, int]]:
    """A location an older persist wrote: ``parts`` unsorted Arrow-stream parts of ``c``, each
    big enough to be final (never merged), one of them full; returns the contents as of the
    last time."""
    rng = np.random.default_rng(3)
    ix = Engine.open(FileBlob(root), epoch=1, writer="old", options=Options(inline_threshold=0))
    ix.fence()
    c = ix.register("c", pa.int64(), pa.int64())
    for t in range(parts):
        table = pa.table({"key": pa.array(rng.integers(0, 10**9, ROWS)),
                          "value": pa.array(rng.integers(0, 9, ROWS)),
                          "time": pa.array(np.full(ROWS, t, dtype=np.uint64)),
                          "diff": pa.array(np.ones(ROWS, dtype=np.int64))})
        part = legacy_part(ix.blob, c, ix.normalize("c", table), batch_rows=500)
        if t == 0:
            part = msgspec.structs.replace(part, full=True)
        txn = Txn(ix.state)
        txn.stage(AddPart(name="c", part=part))
        ix.commit(txn)
    ix.seal("c", parts)
    want = ix.snapshot("c", parts - 1).to_python()
    return sorted(want)


def _policy(**kw: object) -> CompactionPolicy:
    # NB: final at 1,000 rows: no merge ever picks these parts, only rewrites do (and no
    # marks step either: it would take the old runs into a delta)
    return CompactionPolicy(final_rows=1000, marks_rows=1 << 30,  # type: ignore[arg-type]
                            **kw)


def _wait(pred: object, seconds: float = 120.0) -> None:
    # NB: polls a condition the maintenance thread brings about; the timeout is generous
    # (each rewrite is milliseconds of work here; a loaded CI machine is slower)
    deadline = time.monotonic() + seconds
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "maintenance did not rewrite the old parts"
        time.sleep(0.05)


def test_the_background_rewrites_old_parts_into_sorted_parquet(tmp_path: Path) -> None:
    want = _old_location(tmp_path, 6)
    # NB: pinned: background compaction on (rewrites are part of it), no inline parts (a
    # rewritten part small enough would ride inline, which a key-range plan reads in every
    # task), record batches small enough that these parts have several
    options = persist.Options(inline_threshold=0, batch_rows=500, background_compaction=True,
                              compaction=_policy())
    with persist.open(tmp_path, options=options) as client:
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert all(outdated(p) for p in client.state.collections["c"].parts)
        _wait(lambda: not any(outdated(p) for p in client.state.collections["c"].parts))
        parts = client.state.collections["c"].parts
        assert all(p.parquet and p.ordered for p in parts)
        assert sum(p.rows for p in parts) == 6 * ROWS
        # the full one stayed full, or (its rows at the since) joined the base
        base, _ = compact.layout(client.state.collections["c"], 0)
        assert sum(p.full is True for p in parts) + len(base) >= 1
        assert sorted(r.snapshot(5).to_python()) == want
        # and the plan now splits the collection by key
        scan = persist.distributed.describe(str(tmp_path), "c").snapshot(5)
        assert len(scan.tasks(consolidated=True, n=4)) > 1


def test_no_share_no_background_rewrites_but_maintain_rewrites(tmp_path: Path) -> None:
    want = _old_location(tmp_path, 3)
    options = persist.Options(rollup_every=1, compaction=_policy(rewrite_share=0.0))
    with persist.open(tmp_path, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((1, 1), 3, 1)], upper=4).result()  # a commit wakes the maintenance thread
        seq = client.state.seq
        blob = FileBlob(tmp_path)
        # a rollup at that seq: a background round ran after the commit (its rollup step comes
        # after its rewrite step), and it rewrote nothing
        _wait(lambda: any(layout.seq_of(k) >= seq for k in blob.list_keys(layout.ROLLUP_PREFIX)))
        parts = client.state.collections["c"].parts
        # the two old runs above the since (0) wait for no merge, and were not rewritten
        assert sum(outdated(p) for p in parts if p.min_time >= 1) == 2
        # NB: the full part at the since is a ready run: background compaction may start the
        # base with it (a merge, consolidated), which rewrite_share does not hold back
        assert all(outdated(p) or p.consolidated for p in parts if p.max_time == 0)
        while client.maintain():
            pass
        assert not any(outdated(p) for p in client.state.collections["c"].parts)
        assert sorted(r.snapshot(2).to_python()) == want


def test_rewrites_leave_appends_their_turn(tmp_path: Path) -> None:
    """Appends made while old parts are rewritten all commit, and the rewrites still finish:
    the budget spaces them, and none starts while an append waits."""
    _old_location(tmp_path, 8)
    options = persist.Options(background_compaction=True, compaction=_policy())  # (pinned)
    with persist.open(tmp_path, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(8, 40):
            w.append([((10**10 + t, t), t, 1)], upper=t + 1).result()
        _wait(lambda: not any(outdated(p) for p in client.state.collections["c"].parts))
        assert r.upper == 40
        got = dict(((k, v), d) for (k, v), _, d in r.snapshot(39).to_python())
        assert all(got[(10**10 + t, t)] == 1 for t in range(8, 40))
