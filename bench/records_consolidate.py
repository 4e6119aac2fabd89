"""Sorting and consolidating a part of records against the same rows with one int64 value.

    python -m bench.records_consolidate [--rows N] [--repeat R]

The consolidation step of W10 (``bench/workloads/w10_records.py``) on its own, best of ``R``
runs instead of W10's interleaved rounds. It builds a part whose key is an int64 and whose
value is W10's record (a struct of string, decimal, zoned timestamp, date, float64, int32,
bool, list<int64> and a nested struct; ~10% nulls in every field), and a part of the same
keys, times and diffs with one int64 value (keys repeat: ``N`` draws from 70% as many keys, as
in a compaction of updates), and times ``columnar.consolidate`` on both (the issue asks for a
ratio <= 2). A second pair of timings consolidates input that does need summing (a quarter of
the rows retracted), which exercises the grouping path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import pyarrow as pa

from bench.workloads.w10_records import consolidate_inputs, with_retractions
from persist.indexed.format import columnar


def best(f: Callable[[pa.Table], object], table: pa.Table, repeat: int) -> float:
    """The fastest of ``repeat`` calls ``f(table)``, in seconds."""
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f(table)
        out = min(out, time.perf_counter() - t0)
    return out


def main() -> None:
    """Prints both timings and their ratio, on distinct rows and with retractions."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    plain, rec = consolidate_inputs(args.rows)
    print(f"rows={args.rows}  record value type: {rec.schema.field('value').type}")
    a = best(columnar.consolidate, plain, args.repeat)
    b = best(columnar.consolidate, rec, args.repeat)
    print(f"consolidate, distinct rows:    int64 value {a * 1e3:8.1f} ms   record value "
          f"{b * 1e3:8.1f} ms   ratio {b / a:.2f}")
    pd, rd = with_retractions(plain), with_retractions(rec)
    c = best(columnar.consolidate, pd, args.repeat)
    d = best(columnar.consolidate, rd, args.repeat)
    print(f"consolidate, with retractions: int64 value {c * 1e3:8.1f} ms   record value "
          f"{d * 1e3:8.1f} ms   ratio {d / c:.2f}")


if __name__ == "__main__":
    main()
