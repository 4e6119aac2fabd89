"""W8 S3: persist, delta-rs and a bare PUT appending the same batches to the same S3 server.

The workload starts its own serialized moto server (``tests/support/moto_server.py``) on a free
loopback port, creates one bucket (and a DynamoDB table for persist's DynamoDB commit mode) and,
in each of ``--w8-repeats`` rounds, into fresh tables:

* **per-append latency**: ``--w8-appends`` appends of ``--w8-rows`` records, each acknowledged
  before the next starts. persist: ``WriteHandle.append(batch, upper).result()`` (write + seal,
  one conditional commit). delta-rs: ``write_deltalake(url, batch, mode="append")`` with
  ``aws_conditional_put="etag"`` (its S3 commit by conditional put). floor: one plain
  ``put_object`` of the batch as Arrow IPC + zstd (what the local floor writes), no commit at
  all: the cost of the request itself.
* **bulk ingest**: ``--w8-bulk`` appends of ``--w8-bulk-rows`` records; the rate is records over
  the summed append times.

Contenders alternate append by append, the first one rotated every append, so they share the
server and the machine's load. persist runs with its defaults (S3 object lock, background
compaction), once with S3's native conditional put (the ``persist`` column) and once with the
DynamoDB-synchronized commit (the "DynamoDB commit" rows). Every table's row count is checked at
the end (not timed).

Numbers measure the engines + their S3 clients + moto on loopback, not AWS: moto's own latency
(~7 ms a request) dominates small appends. Compare within one run.
"""

from __future__ import annotations

import importlib
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

import pyarrow as pa
import pyarrow.compute as pc

from bench.common import SCHEMA, make_batch, percentile, rotate, settle
from bench.results import WorkloadResult
from bench.systems.floor import encode
from bench.workloads.context import Context

WID = "W8"
TITLE = "S3 appends on one moto server"
REPO = Path(__file__).resolve().parents[2]

#: What the workload needs beyond persist: boto3 for persist's S3 blob, moto[server] (and its
#: werkzeug) for the server. deltalake is a system of its own (``bench.systems.delta``).
REQUIRES = ("boto3", "moto.moto_server.werkzeug_app", "werkzeug")
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
#: The metric-name prefix of persist's DynamoDB-commit rows.
DYNAMO = "DynamoDB commit: "


def unavailable() -> str | None:
    """Why W8 cannot run here (a package missing), or None."""
    for mod in REQUIRES:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            return f"{mod.split('.')[0]} is not installed ({e}); install the 'test' extra"
    return None


@contextmanager
def moto_server() -> Iterator[str]:
    """Starts the serialized moto server in a child process; yields its endpoint URL."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.moto_server"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        port = proc.stdout.readline().decode().strip() if ready else ""
        if not port.isdigit():
            raise RuntimeError(f"moto server did not start (got {port!r})")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Contender:
    """One writer on the server: how to append a batch, how many rows it holds at the end."""

    #: The column it is reported in (a system name), and the prefix of its metric names.
    column: str
    prefix: str
    append: Callable[[pa.Table, int], None]
    count: Callable[[], int]
    close: Callable[[], None]
    small: list[float] = field(default_factory=list)
    bulk: list[float] = field(default_factory=list)


def persist_contender(prefix: str, url: str, options: dict[str, Any]) -> Contender:
    """persist on ``url``: one ``append(batch, upper)`` per batch, waited for."""
    import persist

    client = persist.open(url, reentrance_id=f"bench-{uuid.uuid4().hex[:8]}",
                          storage_options=options)
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())

    def append(batch: pa.Table, t: int) -> None:
        w.append(batch, upper=t + 1).result()

    def count() -> int:
        snap = r.snapshot(r.upper - 1).to_arrow()
        return int(pc.sum(snap.column("diff")).as_py())

    return Contender("persist", prefix, append, count, client.stop)


def delta_contender(url: str, endpoint: str) -> Contender:
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

    return Contender("delta", "", append, count, lambda: None)


def floor_contender(s3: Any, bucket: str, prefix: str) -> Contender:
    """The floor on S3: each batch one unconditional ``put_object`` of its IPC + zstd bytes."""
    keys: list[str] = []

    def append(batch: pa.Table, t: int) -> None:
        key = f"{prefix}/{len(keys):09d}.arrows"
        s3.put_object(Bucket=bucket, Key=key, Body=encode(batch).to_pybytes())
        keys.append(key)

    def count() -> int:
        total = 0
        for key in keys:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            total += pa.ipc.open_stream(pa.py_buffer(body)).read_all().num_rows
        return total

    return Contender("floor", "", append, count, lambda: None)


def measure(contenders: list[Contender], *, appends: int, rows: int, bulk: int,
            bulk_rows: int, seed: int) -> None:
    """The alternating appends (timed into each contender's ``small``/``bulk``), then the
    row-count check."""
    # warm-up: one append each (client start-up, first requests), not measured
    for c in contenders:
        c.append(make_batch(seed, rows, time_lo=0), 0)
    t = 1
    for i in range(appends):
        batch = make_batch(seed + 1 + i, rows, time_lo=t)
        for c in rotate(contenders, i):
            start = time.perf_counter()
            c.append(batch, t)
            c.small.append(time.perf_counter() - start)
        t += 1
    for i in range(bulk):
        batch = make_batch(seed + 100_000 + i, bulk_rows, time_lo=t)
        for c in rotate(contenders, i):
            start = time.perf_counter()
            c.append(batch, t)
            c.bulk.append(time.perf_counter() - start)
        t += 1
    expected = rows * (1 + appends) + bulk_rows * bulk
    counts = {f"{c.prefix}{c.column}": c.count() for c in contenders}
    bad = {name: n for name, n in counts.items() if n != expected}
    if bad:
        raise AssertionError(f"W8 row counts differ from {expected}: {bad}")


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    n, rows, bulk, bulk_rows = a.w8_appends, a.w8_rows, a.w8_bulk, a.w8_bulk_rows
    res = WorkloadResult(
        WID, f"{TITLE}: {n} appends x {rows:,} records, then {bulk} x {bulk_rows:,} bulk",
        params={"appends": n, "rows": rows, "bulk": bulk, "bulk_rows": bulk_rows,
                "repeats": a.w8_repeats})
    res.columns["floor"] = "floor (S3 PUT)"
    res.skip("iceberg", "not measured on S3 (pyiceberg would need a catalog served by moto "
             "too; W2 has its appends)")
    why = unavailable()
    if why is not None:
        for name in ctx.systems:
            res.skip(name, why)
        return [res]
    wanted = [s for s in ("persist", "floor", "delta") if s in ctx.systems]
    ctx.log(f"W8: starting the moto server ({', '.join(wanted)})")
    from persist.blob import aws
    from persist.lock.dynamodb import create_table

    with moto_server() as endpoint:
        options: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-east-1",
                                   "addressing_style": "path", **CREDENTIALS}
        s3 = aws.client("s3", aws.AwsOptions.split(options)[0])
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        if "persist" in wanted:
            create_table(options, "bench")
        for r in range(a.w8_repeats):
            ctx.log(f"W8 round {r + 1}/{a.w8_repeats}")
            contenders: list[Contender] = []
            try:
                if "persist" in wanted:
                    contenders.append(persist_contender("", f"s3://{bucket}/r{r}/persist", options))
                    contenders.append(persist_contender(
                        DYNAMO, f"s3://{bucket}/r{r}/persist-dynamodb",
                        {**options, "conditional_put": "dynamodb", "dynamodb_table": "bench",
                         "lock": "s3"}))
                if "floor" in wanted:
                    contenders.append(floor_contender(s3, bucket, f"r{r}/floor"))
                if "delta" in wanted:
                    contenders.append(delta_contender(f"s3://{bucket}/r{r}/delta", endpoint))
                settle()
                measure(rotate(contenders, r), appends=n, rows=rows, bulk=bulk,
                        bulk_rows=bulk_rows, seed=8000 + 1000 * r)
            finally:
                for c in contenders:
                    c.close()
            _record(res, contenders, bulk_rows)
    res.notes.append("acknowledged: persist, a conditional commit of write + seal; delta, its "
                     "conditional-put commit; floor, S3 answered one plain PUT (no commit)")
    if "persist" in wanted:
        res.notes.append(f"'{DYNAMO.strip(': ')}' rows: persist with conditional_put=dynamodb "
                         "from the same alternating run; the peer columns repeat the peers' "
                         "numbers so p/X compares that mode too")
    res.notes.append("moto on loopback (~7 ms a request, serialized), not AWS; "
                     f"{a.w8_repeats} round(s) (--w8-repeats)")
    return [res]


def _record(res: WorkloadResult, contenders: list[Contender], bulk_rows: int) -> None:
    prefixes = sorted({c.prefix for c in contenders if c.column == "persist"}) or [""]
    for c in contenders:
        # NB: the peers have one run per round; each persist mode gets the peers' numbers in
        # its own rows, so the table's ratio columns work for both modes.
        for prefix in ([c.prefix] if c.column == "persist" else prefixes):
            if c.small:
                res.add(f"{prefix}append median (ms)", "ms", "lower", c.column,
                        statistics.median(c.small) * 1000)
                res.add(f"{prefix}append p99 (ms)", "ms", "lower", c.column,
                        percentile(c.small, 99) * 1000)
                res.add(f"{prefix}append mean (ms)", "ms", "lower", c.column,
                        statistics.fmean(c.small) * 1000)
            if c.bulk:
                res.add(f"{prefix}bulk records/s", "rec/s", "higher", c.column,
                        bulk_rows * len(c.bulk) / sum(c.bulk))
