"""Measures per-operation latency and race outcomes against the serialized moto server.

Run: ``python -m tests.s3.latency [--n 200] [--rounds 200]``. Starts its own server. Numbers
land in docs/s3.md; they measure persist + boto3 + moto on loopback, not AWS.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from persist.blob import aws
from persist.blob.s3 import S3Blob
from persist.location import resolve
from persist.lock.dynamodb import create_table
from tests.support.engine import Engine

SERVER = Path(__file__).resolve().parents[1] / "support" / "moto_server.py"


def _stats(name: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:<48} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   n={len(ms)}")


def _time(n: int, fn: Callable[[int], Any]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def _race(blob: S3Blob, rounds: int, threads: int) -> int:
    violations = 0
    for r in range(rounds):
        barrier = threading.Barrier(threads)
        wins: list[int] = []

        def go(i: int, r: int = r, barrier: threading.Barrier = barrier,
               wins: list[int] = wins) -> None:
            barrier.wait()
            if blob.set_if_absent(f"race/{r}", str(i).encode()):
                wins.append(i)

        ts = [threading.Thread(target=go, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if len(wins) != 1:
            violations += 1
    return violations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().decode().strip()
        options: dict[str, Any] = {
            "endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1",
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "addressing_style": "path",
        }
        time.sleep(1)
        opts, _ = aws.AwsOptions.split(options)
        s3 = aws.client("s3", opts)
        bucket = f"latency-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        table = f"latency-{uuid.uuid4().hex[:12]}"
        create_table(options, table)
        dyn = {**options, "conditional_put": "dynamodb", "dynamodb_table": table}
        native = S3Blob(bucket, "n", storage_options=options)
        synced = S3Blob(bucket, "d", storage_options=dyn)
        payload = b"x" * 1024
        n = args.n

        _stats("raw boto3 put_object 1 KiB", _time(n, lambda i: s3.put_object(
            Bucket=bucket, Key=f"raw/{i}", Body=payload)))
        _stats("raw boto3 get_object 1 KiB", _time(n, lambda i: s3.get_object(
            Bucket=bucket, Key=f"raw/{i}")["Body"].read()))
        _stats("S3Blob.set 1 KiB", _time(n, lambda i: native.set(f"meta/s/{i}", payload)))
        _stats("S3Blob.get 1 KiB (meta/, uncached)", _time(n, lambda i: native.get(f"meta/s/{i}")))
        native.set("data/hot", payload)
        _stats("S3Blob.get 1 KiB (data/, cached)", _time(n, lambda i: native.get("data/hot")))
        _stats("S3Blob.set_if_absent native (new key)",
               _time(n, lambda i: native.set_if_absent(f"meta/c/{i}", payload)))
        _stats("S3Blob.set_if_absent native (key exists)",
               _time(n, lambda i: native.set_if_absent(f"meta/c/{i}", payload)))
        _stats("S3Blob.set_if_absent dynamodb (new key)",
               _time(n, lambda i: synced.set_if_absent(f"meta/c/{i}", payload)))
        _stats("S3Blob.set_if_absent dynamodb (key exists)",
               _time(n, lambda i: synced.set_if_absent(f"meta/c/{i}", payload)))
        _stats("S3Blob.get miss (meta/), native",
               _time(n, lambda i: native.get(f"meta/none/{i}")))
        _stats("S3Blob.get miss (meta/), dynamodb (+ GetItem)",
               _time(n, lambda i: synced.get(f"meta/none/{i}")))
        ddb = synced.dynamodb_client()
        _stats("raw DynamoDB conditional put_item", _time(n, lambda i: ddb.put_item(
            TableName=table, Item={"path": {"S": f"p{i}"}, "etag": {"S": "*"}},
            ConditionExpression="attribute_not_exists(#p)",
            ExpressionAttributeNames={"#p": "path"})))
        big = bytes(20 << 20)
        _stats("S3Blob.set 20 MiB (multipart, 3 parts)",
               _time(5, lambda i: native.set(f"data/big/{i}", big)))

        for kind in ("s3", "dynamodb"):
            loc = resolve(f"s3://{bucket}/lock-{kind}",
                          storage_options={**options, "lock": kind, "lock_table": table})
            lock = loc.lock()
            lease = lock.acquire("w")
            _stats(f"{kind} lock heartbeat (read + CAS)",
                   _time(n, lambda i, lock=lock, lease=lease: lock.heartbeat(lease)))

        for name, blob_opts in (("native", options), ("dynamodb", dyn)):
            loc = resolve(f"s3://{bucket}/engine-{name}", storage_options=blob_opts)
            engine = Engine.open(loc.blob, epoch=1, writer="w")
            engine.fence()
            engine.register("c", pa.string(), pa.int64())

            def step(i: int, engine: Engine = engine) -> None:
                engine.write({"c": [((f"k{j}", j), i, 1) for j in range(100)]})
                engine.seal("c", i + 1)

            _stats(f"engine write(100 rows)+seal, {name} commits", _time(min(n, 100), step))

        for name, blob in (("native", native), ("dynamodb", synced)):
            t = time.perf_counter()
            bad = _race(blob, args.rounds, args.threads)
            print(f"race {name}: {args.rounds} rounds x {args.threads} threads, "
                  f"{bad} rounds without exactly one winner ({time.perf_counter() - t:.1f} s)")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
