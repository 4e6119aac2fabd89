"""Measures replica latency and cost: ``python -m tests.replica.measure_latency [--quick]``.

For each notification mode (``poll``: the replica only polls; ``push``: the writer serves push
notifications and the replica subscribes) it runs a writer process and a replica process on one
location and reports:

* write -> replica-visible latency, p50/p99: from the writer calling ``append`` to the replica's
  listener delivering the progress that covers it (both ends read CLOCK_MONOTONIC, which is
  system-wide on Linux, so the two processes' timestamps compare directly). Writes come at random
  gaps in two regimes, *steady* and *sparse*, because a polling replica's latency depends on how
  far its backoff has grown since the last commit.
* the writer's own commit latency (``append`` to acknowledgement), for reference;
* storage requests per second of an idle replica (writer open, nothing written), from the
  replica's request counters: with a listener waiting, and with no reader at all.

Everything runs on a fresh ``file://`` location in a temporary directory, or with ``--s3`` on a
bucket of the serialized moto server (``tests/support/moto_server.py``, about 7 ms a request).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import persist
from persist.runtime.replica import _ACTIVE_FOR
from tests.replica import workers
from tests.replica.workers import emit, open_events, updates_at

ROOT = Path(__file__).resolve().parents[2]
REGIMES = {"steady": (0.01, 0.1), "sparse": (0.5, 2.0)}


# -- the two processes ----------------------------------------------------------------------------


def _commands() -> Any:
    for line in sys.stdin:
        yield line.split()


def writer_role(a: argparse.Namespace) -> None:
    client, w, r = open_events(a.url, reentrance_id="measure", notify=a.notify)
    try:
        t = r.upper
        for _ in range(3):  # warm up: first commits pay for imports and caches
            w.append(updates_at(t, 0), upper=t + 1).result()
            t += 1
        emit(ev="ready", upper=t)
        rng = random.Random(a.seed)
        for cmd in _commands():
            if cmd[0] == "write":
                n, lo, hi = int(cmd[1]), float(cmd[2]), float(cmd[3])
                for _ in range(n):
                    time.sleep(rng.uniform(lo, hi))
                    called = time.monotonic()
                    w.append(updates_at(t, 0), upper=t + 1).result()
                    emit(ev="write", t=t, called=called, acked=time.monotonic())
                    t += 1
                emit(ev="written", upper=t)
            elif cmd[0] == "stop":
                break
    finally:
        client.stop()


def replica_role(a: argparse.Namespace) -> None:
    client, _, r = open_events(a.url, read_only=True, missing_ok=True, notify=a.notify)
    seen: list[tuple[int, float]] = []
    listening = threading.Event()
    listening.set()

    # NB: listen from 0 and wait for the warm-up writes to arrive before measuring: the first
    # read in a fresh process pays ~0.4 s of one-time pyarrow initialization (IPC, zstd).
    listener = r.listen(0)
    while listener.frontier < r.upper or not listener.frontier > 1:
        listener.poll(1.0)

    def listen() -> None:
        while listening.is_set():
            for e in listener.poll(1.0):
                if isinstance(e, persist.ListenProgress):
                    seen.append((e.upper, time.monotonic()))
        listener.close()

    thread = threading.Thread(target=listen, daemon=True)
    try:
        if a.notify:  # measure push only once subscribed
            deadline = time.monotonic() + 10
            while not client.stats["push"]["live"] and time.monotonic() < deadline:
                time.sleep(0.01)
        thread.start()
        emit(ev="ready", push=client.stats.get("push"))
        for cmd in _commands():
            if cmd[0] == "seen":
                emit(ev="seen", seen=seen)
            elif cmd[0] == "mark":
                emit(ev="mark", at=time.monotonic(), stats=client.stats)
            elif cmd[0] == "unlisten":
                listening.clear()
                thread.join()
                emit(ev="unlistened")
            elif cmd[0] == "stop":
                break
    finally:
        listening.clear()
        client.stop()


# -- the driver -----------------------------------------------------------------------------------


class _Proc:
    def __init__(self, role: str, url: str, notify: bool, storage_options: Any) -> None:
        args = [sys.executable, "-m", "tests.replica.measure_latency", "--role", role,
                "--url", url]
        if notify:
            args.append("--notify")
        if storage_options:
            args += ["--storage-options", json.dumps(storage_options)]
        self.p = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def send(self, *words: object) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(" ".join(map(str, words)) + "\n")
        self.p.stdin.flush()

    def expect(self, ev: str) -> dict[str, Any]:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            e: dict[str, Any] = json.loads(line)
            if e["ev"] == ev:
                return e
        raise RuntimeError(f"process exited before {ev!r} (rc {self.p.wait()})")

    def collect(self, until: str) -> list[dict[str, Any]]:
        assert self.p.stdout is not None
        out: list[dict[str, Any]] = []
        for line in self.p.stdout:
            e = json.loads(line)
            if e["ev"] == until:
                return out
            out.append(e)
        raise RuntimeError(f"process exited before {until!r}")

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send("stop")
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            if f is not None:
                f.close()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def _rates(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    dt = b["at"] - a["at"]
    ra, rb = a["stats"]["requests"], b["stats"]["requests"]
    out = {k: (rb[k] - ra[k]) / dt for k in rb}
    out["total"] = sum(out.values())
    out["polls"] = (b["stats"]["polls"] - a["stats"]["polls"]) / dt
    return out


def measure(mode: str, url: str, *, writes: dict[str, int], idle: float,
            storage_options: dict[str, Any] | None, settle: float = 1.0) -> dict[str, Any]:
    """One writer and one replica process on ``url``; see the module docstring."""
    notify = mode == "push"
    writer = _Proc("writer", url, notify, storage_options)
    # NB: started together: the replica waits for the writer's collection to appear
    replica = _Proc("replica", url, notify, storage_options)
    try:
        writer.expect("ready")
        ready = replica.expect("ready")
        result: dict[str, Any] = {"mode": mode, "push": ready.get("push")}
        for regime, n in writes.items():
            lo, hi = REGIMES[regime]
            time.sleep(settle)  # let the replica's backoff grow as after any quiet spell
            writer.send("write", n, lo, hi)
            done = writer.collect("written")
            time.sleep(max(settle, hi))
            replica.send("seen")
            seen = replica.expect("seen")["seen"]
            visible, commit, lag = [], [], []
            for w in done:
                when = next((at for upper, at in seen if upper > w["t"]), None)
                if when is not None:
                    visible.append((when - w["called"]) * 1000)
                    lag.append((when - w["acked"]) * 1000)
                commit.append((w["acked"] - w["called"]) * 1000)
            result[regime] = {
                "writes": len(done), "seen": len(visible),
                "visible_p50_ms": _pct(visible, 0.5), "visible_p99_ms": _pct(visible, 0.99),
                "visible_max_ms": max(visible, default=float("nan")),
                "commit_p50_ms": _pct(commit, 0.5), "commit_p99_ms": _pct(commit, 0.99),
                "after_ack_p50_ms": _pct(lag, 0.5), "after_ack_p99_ms": _pct(lag, 0.99),
                "visible_ms": [round(v, 2) for v in visible],
                "commit_ms": [round(v, 2) for v in commit],
            }
        if idle:
            for phase in ("listening", "no_reader"):
                if phase == "no_reader":
                    replica.send("unlisten")
                    replica.expect("unlistened")
                # NB: a follower verifies the log more often for 10 s after the writer's last
                # commit (replica._ACTIVE_FOR); measure the idle rate once that has passed
                time.sleep(min(idle, _ACTIVE_FOR + 2.0) if phase == "listening"
                           else min(idle, 2.0))
                replica.send("mark")
                first = replica.expect("mark")
                time.sleep(idle)
                replica.send("mark")
                result[f"idle_{phase}_per_s"] = _rates(first, replica.expect("mark"))
        return result
    finally:
        replica.close()
        writer.close()


def _moto() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    server = subprocess.Popen([sys.executable, str(ROOT / "tests/support/moto_server.py")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert server.stdout is not None
    port = server.stdout.readline().decode().strip()
    opts = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1",
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "addressing_style": "path"}
    import boto3

    s3 = boto3.client("s3", endpoint_url=opts["endpoint_url"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    deadline = time.monotonic() + 30
    while True:
        try:
            s3.create_bucket(Bucket="persist-measure")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    s3.close()
    return server, opts


def run(*, quick: bool = False, s3: bool = False, idle: float | None = None,
        modes: tuple[str, ...] = ("poll", "push"), writes: dict[str, int] | None = None,
        settle: float = 1.0) -> list[dict[str, Any]]:
    """Measures each mode on a fresh location; returns one result dict per mode."""
    if writes is None:
        writes = {"steady": 15, "sparse": 4} if quick else {"steady": 200, "sparse": 40}
    idle = (1.0 if quick else 30.0) if idle is None else idle
    server, opts = _moto() if s3 else (None, None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = []
            for mode in modes:
                url = (f"s3://persist-measure/{uuid.uuid4().hex[:8]}" if s3
                       else os.path.join(tmp, mode))
                results.append(measure(mode, url, writes=writes, idle=idle,
                                       storage_options=opts, settle=settle))
            return results
    finally:
        if server is not None:
            server.terminate()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()


def report(results: list[dict[str, Any]]) -> str:
    lines = ["mode  regime  writes  write->visible p50/p99/max ms  commit p50/p99 ms  "
             "ack->visible p50/p99 ms"]
    for r in results:
        for regime in REGIMES:
            if regime in r:
                x = r[regime]
                lines.append(
                    f"{r['mode']:<5} {regime:<7} {x['seen']:>3}/{x['writes']:<3} "
                    f"{x['visible_p50_ms']:8.1f} {x['visible_p99_ms']:8.1f} "
                    f"{x['visible_max_ms']:8.1f}       {x['commit_p50_ms']:6.1f} "
                    f"{x['commit_p99_ms']:6.1f}      {x['after_ack_p50_ms']:6.1f} "
                    f"{x['after_ack_p99_ms']:6.1f}")
    lines.append("mode  idle replica        requests/s: total  (meta GET, LIST)  polls/s")
    for r in results:
        for phase in ("listening", "no_reader"):
            k = f"idle_{phase}_per_s"
            if k in r:
                x = r[k]
                lines.append(f"{r['mode']:<5} {phase:<19} {x['total']:12.2f}  "
                             f"({x['get_meta']:.2f}, {x['list']:.2f})  {x['polls']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["writer", "replica"])
    p.add_argument("--url")
    p.add_argument("--notify", action="store_true")
    p.add_argument("--storage-options", type=json.loads)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a few writes, 1 s idle (a smoke run)")
    p.add_argument("--s3", action="store_true", help="on the moto S3 server instead of a file")
    p.add_argument("--idle", type=float, help="seconds of each idle measurement")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON")
    a = p.parse_args(argv)
    workers.STORAGE_OPTIONS = a.storage_options
    if a.role == "writer":
        writer_role(a)
    elif a.role == "replica":
        replica_role(a)
    else:
        results = run(quick=a.quick, s3=a.s3, idle=a.idle)
        print(json.dumps(results, indent=1) if a.json else report(results))
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
