"""W7's measuring process: ``python -m bench.workloads.w7_child SYSTEM ROOT APPENDS ROWS``.

Runs W1's writes and then one full read in a fresh interpreter, sampling RSS every 5 ms, and
prints one JSON line: baseline RSS (after imports and creating the table), peak RSS while
writing, peak RSS while reading. Each batch is generated just before its append and dropped
after it, so the benchmark's own data adds one batch at most.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path


def main() -> None:
    name, root, appends, rows = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    from bench.common import RssSampler, make_batch
    from bench.systems import SYSTEMS

    s = SYSTEMS[name](root)
    s.create()
    s.append(make_batch(1, 10, time_lo=0), 1)  # import and initialise every code path
    gc.collect()
    sampler = RssSampler().start()
    baseline = sampler.rss()
    sampler.reset()
    for i in range(appends):
        b = make_batch(1000 + i, rows, time_lo=1 + i * rows, time_hi=1 + (i + 1) * rows)
        s.append(b, 1 + (i + 1) * rows)
        del b
    sampler.sample_now()
    write_peak = sampler.peak
    gc.collect()
    after_write = sampler.rss()
    sampler.reset()
    out = s.read()
    sampler.sample_now()
    read_peak = sampler.peak
    got = len(out)
    del out
    sampler.stop()
    s.close()
    print(json.dumps({"baseline": baseline, "write_peak": write_peak, "after_write": after_write,
                      "read_peak": read_peak, "rows": got}), flush=True)


if __name__ == "__main__":
    main()
    # NB: the result line is out; skip interpreter teardown. deltalake's native thread pool is
    # sometimes torn down while a worker is alive ("terminate called without an active
    # exception", SIGABRT at exit; delta-rs#2184), which failed a complete measurement.
    os._exit(0)
