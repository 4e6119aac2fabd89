"""W11 zero-copy fork: ``--w11-appends`` acknowledged appends of ``--w11-rows`` records in all
(default 10 x 1,000,000), each spread over 10 times; then forks of the table, each a new
writable line that shares the data (median of ``--w11-forks``): as of the latest version, and
as of a version in the middle.

persist: ``Client.fork(name, as_of=t, into=...)``, one metadata commit; the middle fork is as of
a time *inside* an append's part, so its parts carry a time cut. pyiceberg: a branch
(``manage_snapshots().create_branch``), one metadata commit. The floor: a hard link per data
file into a new directory (no data copied). delta-rs: skipped, with the reason (its Python API
has no shallow clone). Every system also reports the data files a fork wrote (persist and a
branch: none).
"""

from __future__ import annotations

import statistics

from bench.common import make_batch, settle, timed
from bench.results import WorkloadResult
from bench.systems import Skip
from bench.workloads.context import Context

WID = "W11"
TITLE = "zero-copy fork"
#: Times per append: each append's rows spread over this many times.
SPAN = 10


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    per = a.w11_rows // a.w11_appends
    res = WorkloadResult(
        WID, f"{TITLE}: fork of a {a.w11_rows:,}-record table ({a.w11_appends} appends), median "
        f"of {a.w11_forks} forks", params={"rows": a.w11_rows, "appends": a.w11_appends,
                                           "forks": a.w11_forks})
    for name in ctx.systems:
        ctx.log(f"W11: {name}")
        s = ctx.new_system(name, "w11")
        try:
            versions = []
            for i in range(a.w11_appends):
                batch = make_batch(11_000 + i, per, time_lo=i * SPAN, time_hi=(i + 1) * SPAN)
                versions.append(s.append(batch, (i + 1) * SPAN))
            settle()
            # NB: persist forks as of a time inside an append's part (its parts are cut
            # there); the peers' versions are whole appends, so theirs is the one before.
            mid = a.w11_appends // 2
            middle = (mid * SPAN + SPAN // 2) if name == "persist" else versions[mid - 1]
            for label, version in (("latest", versions[-1]), ("middle", middle)):
                times, written = [], []
                for k in range(a.w11_forks):
                    with timed() as t:
                        written.append(s.fork(version, f"fork-{label}-{k}"))
                    times.append(t.seconds * 1000)
                res.add(f"fork as of the {label} version (ms)", "ms", "lower", name,
                        statistics.median(times))
                res.add(f"data files written by a fork ({label})", "files", "lower", name,
                        max(written))
        except Skip as e:
            res.skip(name, str(e))
        finally:
            ctx.dispose(s)
    res.notes.append(
        "persist's middle fork is as of a time inside an append (its parts carry a time cut); "
        "the peers fork whole versions. pyiceberg: a branch. floor: one hard link per file.")
    return [res]
