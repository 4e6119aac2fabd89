"""The background brings a bulk-loaded collection into the base (DESIGN.md §8) without any call
from the user, while appends keep committing; ``Client.maintain()`` does it at once."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import persist
from persist.indexed.maintenance import compact
from persist.indexed.state.holds import effective_since

ROWS = 600_000  # >= final_rows: written as two key-disjoint full pieces


def _bulk(seed: int, t: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"key": pa.array(rng.integers(-(1 << 62), 1 << 62, ROWS)),
                     "value": pa.array(rng.integers(0, 9, ROWS)),
                     "time": pa.array(np.full(ROWS, t), pa.uint64()),
                     "diff": pa.array(np.ones(ROWS, np.int64))})


def _in_base(client: persist.Client, name: str) -> bool:
    c = client.state.collections[name]
    base, runs = compact.layout(c, effective_since(c))
    return bool(base) and not any(p.max_time <= effective_since(c) for p in runs)


def _policy(**kw: object) -> persist.CompactionPolicy:
    # NB: pinned: the default merging, with the whole maintenance time allowed for big merges
    # (the budget only spaces them; this asserts where they lead, not how soon). The options
    # pin batches and stats of the default sizes (4-row batches of 1.2 M rows take minutes)
    return persist.CompactionPolicy(fanin=4, final_rows=1 << 19, base_ratio=4, max_runs=16,
                                    inline_flush_bytes=1 << 20, part_target_bytes=8 << 20,
                                    **kw)  # type: ignore[arg-type]


def test_the_background_merges_a_bulk_load_into_the_base_while_appends_commit(
        tmp_path: Path) -> None:
    options = persist.Options(background_compaction=True, batch_rows=1 << 16, stats_bytes=1024,
                              compaction=_policy(rewrite_share=1.0))
    with persist.open(tmp_path, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(2):
            w.append(_bulk(t, t), upper=t + 1).result()
        w.allow_compaction(1).result()
        # small appends keep committing while the base is written
        t = 2
        deadline = time.monotonic() + 120
        while not _in_base(client, "c"):
            assert time.monotonic() < deadline, "the background never formed the base"
            w.append([((t, t), t, 1)], upper=t + 1).result()
            t += 1
        c = client.state.collections["c"]
        base, _ = compact.layout(c, effective_since(c))
        assert sum(p.rows for p in base) >= 2 * ROWS
        assert all(p.consolidated and p.min_time == p.max_time for p in base)
        bounds = [compact.key_bounds(p) for p in base]
        assert all(a[1] < b[0] for a, b in itertools.pairwise(bounds))  # type: ignore[index,operator]
        got = r.snapshot(t - 1).to_arrow()
        assert len(got) == 2 * ROWS + (t - 2)


def test_maintain_merges_at_once_and_says_when_it_did(tmp_path: Path) -> None:
    options = persist.Options(background_compaction=False, batch_rows=1 << 16, stats_bytes=1024,
                              compaction=_policy())
    with persist.open(tmp_path, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(2):
            w.append(_bulk(t, t), upper=t + 1).result()
        before = len(client.state.collections["c"].parts)
        assert before == 4  # two appends, two key-disjoint full pieces each
        w.allow_compaction(1).result()
        assert client.maintain()
        assert _in_base(client, "c")
        while client.maintain():  # GC and rollups may still have work; compaction has none
            pass
        assert not client.maintain()
        assert len(r.snapshot(1).to_arrow()) == 2 * ROWS
