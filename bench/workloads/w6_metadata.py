"""W6 scale of metadata: the latency of ``--w6-appends`` acknowledged appends of ``--w6-rows``
records to one table when the location holds few or many other collections
(``--w6-collections``, default 10 vs 1,000) and after few or many prior seals
(``--w6-seals``, default 10 vs 10,000 data-less commits).

persist: collections are registered with ``create_or_load``; prior seals are awaited one by one
(one metadata commit each). The floor: collections are sibling directories, prior seals are
files already in the table's directory. delta-rs and pyiceberg: collections are tables (one
directory each; catalog rows for iceberg); they have no data-less commit, so the prior-seal
dimension is skipped for them (W2 shows their latency after N appends instead).
"""

from __future__ import annotations

import statistics

from bench.common import make_batch, rotate, settle, timed
from bench.results import WorkloadResult
from bench.systems import Skip
from bench.workloads.context import Context

WID = "W6"
TITLE = "scale of metadata"


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    dims = {"collections": list(a.w6_collections), "seals": list(a.w6_seals)}
    res = WorkloadResult(
        WID, f"{TITLE}: median of {a.w6_appends} appends x {a.w6_rows} records with "
        f"{' vs '.join(f'{x:,}' for x in dims['collections'])} collections and "
        f"{' vs '.join(f'{x:,}' for x in dims['seals'])} prior seals",
        params={**dims, "appends": a.w6_appends, "rows": a.w6_rows, "repeats": a.w6_repeats})
    batches = [make_batch(6000 + i, a.w6_rows, time_lo=0) for i in range(a.w6_appends)]
    for dim, sizes in dims.items():
        for r in range(a.w6_repeats):
            for name in rotate(ctx.systems, r):
                if ctx.peer_skips_round(name, r):
                    continue
                for size in rotate(sizes, r):
                    ctx.log(f"W6 {dim}={size:,} round {r + 1}/{a.w6_repeats}: {name}")
                    s = ctx.new_system(name, f"w6-{dim}-{size}-r{r}")
                    try:
                        with timed() as t:
                            try:
                                if dim == "collections":
                                    s.add_collections(size - 1)
                                else:
                                    s.add_history(size)
                            except Skip as e:
                                res.skip(name, str(e))
                                continue
                        res.add(f"setup: {size:,} {dim} (s)", "s", None, name, t.seconds)
                        settle()
                        base = _next_time(s)
                        lat = []
                        for i, b in enumerate(batches):
                            t_i = base + i
                            b = b.set_column(2, b.schema.field(2),
                                             _times(len(b), t_i))
                            with timed() as t:
                                s.append(b, t_i + 1)
                            lat.append(t.seconds * 1000)
                        res.add(f"median latency, {size:,} {dim} (ms)", "ms", "lower", name,
                                statistics.median(lat))
                    finally:
                        ctx.dispose(s)
    for dim, sizes in dims.items():
        lo, hi = min(sizes), max(sizes)
        m_lo = res.metrics.get(f"median latency, {lo:,} {dim} (ms)")
        m_hi = res.metrics.get(f"median latency, {hi:,} {dim} (ms)")
        if m_lo is None or m_hi is None:
            continue
        for name in ctx.systems:
            xs, ys = m_lo.samples.get(name, []), m_hi.samples.get(name, [])
            for x, y in zip(xs, ys, strict=False):
                res.add(f"ratio {hi:,}/{lo:,} {dim}", "x", "lower", name, y / x)
    return [res]


def _next_time(s: object) -> int:
    return int(getattr(s, "_next_time", 0))


def _times(n: int, t: int) -> object:
    import numpy as np
    import pyarrow as pa

    return pa.array(np.full(n, t, dtype=np.int64))
