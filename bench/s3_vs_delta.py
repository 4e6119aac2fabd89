"""persist vs delta-rs (``deltalake``) appending the same batches to the same S3 server.

Run: ``python -m bench.s3_vs_delta [--appends 100] [--rows 100] [--bulk 5] [--bulk-rows 200000]``
(or ``python bench/s3_vs_delta.py``). It starts its own serialized moto server
(``tests/support/moto_server.py``) on a free loopback port, creates one bucket (and a DynamoDB
table for persist's DynamoDB commit mode), and measures, in one run:

* **per-append latency**: ``--appends`` appends of ``--rows`` rows, each durable before the
  next starts. persist: ``WriteHandle.append(batch, upper).result()`` (write + seal, one atomic
  commit). delta-rs: ``write_deltalake(url, batch, mode="append")`` with
  ``aws_conditional_put="etag"`` (its S3 commit by conditional put). Systems alternate append by
  append, so both see the same server and machine load.
* **bulk ingest**: ``--bulk`` appends of ``--bulk-rows`` rows each, alternating the same way;
  the rate is rows over the summed append times.

persist runs with its defaults (S3 object lock; background compaction on), once with S3's native
conditional put and once with the DynamoDB-synchronized commit (``--no-dynamodb`` skips it).
Every system ingests the same Arrow tables (``key, value, time, diff``, int64, random keys).
At the end each table is read back and its row count checked.

Numbers measure persist/delta-rs + their S3 clients + moto on loopback, not AWS: moto's own
latency (~7 ms a request) dominates small appends. Compare within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: make `persist` and `tests` importable
    sys.path.insert(0, str(ROOT))

import persist  # noqa: E402
from persist import aws  # noqa: E402
from persist.lock.dynamodb import create_table  # noqa: E402

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("time", pa.int64()),
                    ("diff", pa.int64())])
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def make_batch(seed: int, rows: int, t: int) -> pa.Table:
    """``rows`` updates at time ``t``: random int64 keys and values, diff 1 (deterministic)."""
    rng = np.random.default_rng(seed)
    return pa.Table.from_arrays([
        pa.array(rng.integers(0, 1 << 40, rows, dtype=np.int64)),
        pa.array(rng.integers(0, 1_000_000, rows, dtype=np.int64)),
        pa.array(np.full(rows, t, dtype=np.int64)),
        pa.array(np.ones(rows, dtype=np.int64)),
    ], schema=SCHEMA)


@contextmanager
def moto_server() -> Iterator[str]:
    """Starts the serialized moto server; yields its endpoint URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.moto_server"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        port = proc.stdout.readline().decode().strip() if ready else ""
        if not port.isdigit():
            raise SystemExit(f"moto server did not start (got {port!r})")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class System:
    """One contender: how to append a batch, and how many rows it holds at the end."""

    name: str
    append: Callable[[pa.Table, int], None]
    count: Callable[[], int]
    close: Callable[[], None]
    small: list[float] = field(default_factory=list)
    bulk: list[float] = field(default_factory=list)


def persist_system(name: str, url: str, options: dict[str, Any]) -> System:
    """persist on ``url``: one ``append(batch, upper)`` per batch, waited for."""
    client = persist.open(url, reentrance_id=f"bench-{name}", storage_options=options)
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())

    def append(batch: pa.Table, t: int) -> None:
        w.append(batch.set_column(2, "time", batch.column(2).cast(pa.uint64())), t + 1).result()

    def count() -> int:
        snap = r.snapshot(r.upper - 1).to_arrow()
        return int(pa.compute.sum(snap.column("diff")).as_py())

    return System(name, append, count, client.stop)


def delta_system(url: str, endpoint: str) -> System:
    """delta-rs on ``url``: one ``write_deltalake(mode="append")`` per batch."""
    from deltalake import DeltaTable, write_deltalake

    options = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
               "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
               "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
               "aws_conditional_put": "etag"}
    DeltaTable.create(url, schema=SCHEMA, storage_options=options)

    def append(batch: pa.Table, t: int) -> None:
        write_deltalake(url, batch, mode="append", storage_options=options)

    def count() -> int:
        return int(DeltaTable(url, storage_options=options).to_pyarrow_table().num_rows)

    return System("delta-rs", append, count, lambda: None)


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the benchmark; returns the results (also printed as a table)."""
    with moto_server() as endpoint:
        aws_options = {"endpoint_url": endpoint, "region_name": "us-east-1",
                       "addressing_style": "path", **CREDENTIALS}
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        aws.client("s3", aws.AwsOptions.split(aws_options)[0]).create_bucket(Bucket=bucket)
        systems = [persist_system("persist", f"s3://{bucket}/persist-native", aws_options)]
        if args.dynamodb:
            create_table(aws_options, "bench")
            systems.append(persist_system(
                "persist (DynamoDB commit)", f"s3://{bucket}/persist-dynamodb",
                {**aws_options, "conditional_put": "dynamodb", "dynamodb_table": "bench",
                 "lock": "s3"}))
        systems.append(delta_system(f"s3://{bucket}/delta", endpoint))
        delta = systems[-1]
        try:
            # warm-up: one append each (client start-up, table creation), not measured
            for s in systems:
                s.append(make_batch(0, args.rows, 0), 0)
            t = 1
            for i in range(args.appends):
                batch = make_batch(1 + i, args.rows, t)
                for s in systems:
                    start = time.perf_counter()
                    s.append(batch, t)
                    s.small.append(time.perf_counter() - start)
                t += 1
            for i in range(args.bulk):
                batch = make_batch(10_000 + i, args.bulk_rows, t)
                for s in systems:
                    start = time.perf_counter()
                    s.append(batch, t)
                    s.bulk.append(time.perf_counter() - start)
                t += 1
            expected = args.rows * (1 + args.appends) + args.bulk_rows * args.bulk
            counts = {s.name: s.count() for s in systems}
        finally:
            for s in systems:
                s.close()
    bad = {name: n for name, n in counts.items() if n != expected}
    if bad:
        raise SystemExit(f"row counts differ from {expected}: {bad}")

    results: dict[str, Any] = {"appends": args.appends, "rows": args.rows, "bulk": args.bulk,
                               "bulk_rows": args.bulk_rows, "systems": {}}
    for s in systems:
        results["systems"][s.name] = {
            "append_p50_ms": statistics.median(s.small) * 1000,
            "append_p99_ms": pct(s.small, 99) * 1000,
            "append_mean_ms": statistics.fmean(s.small) * 1000,
            "bulk_rows_per_s": args.bulk_rows * args.bulk / sum(s.bulk) if s.bulk else None,
        }
    base = results["systems"][delta.name]
    print(f"\n{args.appends} appends of {args.rows} rows (each durable before the next), and "
          f"{args.bulk} x {args.bulk_rows:,} rows bulk, on one serialized moto server:\n")
    header = (f"{'system':<28}{'append p50':>12}{'p99':>10}{'mean':>10}{'bulk rows/s':>14}"
              f"{'p50 vs delta':>14}{'bulk vs delta':>15}")
    print(header)
    print("-" * len(header))
    for name, r in results["systems"].items():
        speed = base["append_p50_ms"] / r["append_p50_ms"]
        bulk = (r["bulk_rows_per_s"] / base["bulk_rows_per_s"]) if r["bulk_rows_per_s"] else 0
        r["p50_speedup_vs_delta"] = speed
        r["bulk_ratio_vs_delta"] = bulk
        rate = f"{r['bulk_rows_per_s'] / 1e6:.2f} M" if r["bulk_rows_per_s"] else "-"
        print(f"{name:<28}{r['append_p50_ms']:>9.1f} ms{r['append_p99_ms']:>7.1f} ms"
              f"{r['append_mean_ms']:>7.1f} ms{rate:>14}{speed:>13.2f}x{bulk:>14.2f}x")
    print("\n'p50 vs delta': delta-rs p50 / this p50 (> 1: faster than delta-rs); "
          "'bulk vs delta': this rate / delta-rs rate.")
    return results


def main(argv: list[str] | None = None) -> None:
    """Parses arguments, runs, optionally writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--bulk", type=int, default=5)
    parser.add_argument("--bulk-rows", type=int, default=200_000)
    parser.add_argument("--no-dynamodb", dest="dynamodb", action="store_false",
                        help="skip persist with the DynamoDB-synchronized commit")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
