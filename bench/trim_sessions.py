"""Short-lived writers and the metadata they leave: writer open time and LISTs after many
sessions.

    python -m bench.trim_sessions [--sessions N] [--commits C] [--grace G] [--dir D]

Runs ``N`` writer sessions one after another on a fresh file location (``fsync`` off: the
open, not the disk, is measured), each opening with ``persist.open``, appending ``C`` one-row
updates (each its own commit) and closing, as a service that restarts or a job that opens,
writes and closes does. Reports, per session, the writer's open time (lock, load and fence),
the LISTs that open made of ``meta/log/`` and how many keys they returned, and at the end the
log entries and rollups left and their bytes, and the open time of a fresh process after the
last session and of the location as it was after the first (best of 3 each), and the open
time of the location after one session and after the last, alternating in this process (7
each, medians: issue 29's target is <= 1.5x and <= 50 ms after 100 sessions; W12 runs
:func:`sessions` and :func:`alternating_opens`, ``bench/workloads/w12_scale.py``). With
``--grace`` shorter than a session, old sessions' metadata is due for trimming while the next
sessions run.

Counting LISTs patches :class:`persist.blob.file.FileBlob` in this process while the sessions
run (a measurement, not a behaviour).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist
from bench import trim_steady
from persist import layout

#: The GC grace of the sessions (persist's default): nothing is due for trimming inside a run
#: of 100 sessions here, so every session's metadata is still there.
GRACE = 300.0

def _open(loc: str, grace: float) -> persist.Client:
    return persist.open(loc, reentrance_id="svc", options=persist.Options(gc_grace_seconds=grace),
                        storage_options={"fsync": False})


def _meta(root: Path, prefix: str) -> tuple[int, int]:
    d = root / prefix
    if not d.exists():
        return 0, 0
    # NB: recursive: a sharded log (format 7) keeps its entries in a directory per shard
    files = [f for f in d.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def fresh_open(loc: str, grace: float) -> float:
    """One writer open in this process (a child's job): seconds."""
    started = time.perf_counter()
    client = _open(loc, grace)
    took = time.perf_counter() - started
    client.stop()
    return took


def sessions(root: Path, count: int, commits: int, grace: float, *,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """``count`` writer sessions one after another on a fresh file location at ``root``, each
    opening, appending ``commits`` one-row updates (each its own commit) and closing; the
    location as it was after the first session is copied to ``root``'s sibling
    ``after-one``. Logs a row for sessions 1, 2, every tenth and the last (open ms, LISTs of
    ``meta/log/`` by that open, log entries, rollups, MB of both). Returns ``after_one`` (the
    copy), ``rows`` (those rows as dicts), ``log_entries``, ``rollups``, ``meta_bytes`` at
    the end and ``seconds``."""
    loc = str(root)
    rows: list[dict[str, float]] = []
    one = root.parent / "after-one"
    started = time.monotonic()
    with trim_steady.counting():
        for s in range(1, count + 1):
            trim_steady.listed.clear()
            t0 = time.perf_counter()
            client = _open(loc, grace)
            open_ms = (time.perf_counter() - t0) * 1000
            log_lists = trim_steady.log_lists(trim_steady.listed)
            w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
            for i in range(commits):
                t = r.upper
                w.append([((i, t), t, 1)], t + 1).result()
            client.stop()
            if s in (1, 2) or s % max(1, count // 10) == 0 or s == count:
                logs, lb = _meta(root, layout.LOG_PREFIX)
                rollups, rb = _meta(root, layout.ROLLUP_PREFIX)
                full = sum(1 for after, _ in log_lists if not after)
                row = {"session": s, "open_ms": open_ms, "log_lists_full": full,
                       "log_lists_after": len(log_lists) - full,
                       "log_keys_listed": sum(n for _, n in log_lists), "log_entries": logs,
                       "rollups": rollups, "meta_bytes": lb + rb}
                rows.append(row)
                log(f"{s:7d}  {open_ms:7.1f}  {full:4d}/{len(log_lists) - full:<4d}"
                    f"               {row['log_keys_listed']:15d}  {logs:11d}  {rollups:7d}"
                    f"  {(lb + rb) / 1e6:7.1f}")
            if s == 1:
                shutil.copytree(root, one)
    last = rows[-1]
    return {"after_one": one, "rows": rows, "log_entries": last["log_entries"],
            "rollups": last["rollups"], "meta_bytes": last["meta_bytes"],
            "seconds": time.monotonic() - started}


def alternating_opens(paths: Sequence[Path], grace: float, rounds: int = 7) -> list[list[float]]:
    """Writer opens (ms) of each of ``paths`` in turn in this process, ``rounds`` rounds: a
    change of the machine's load hits each alike (imports paid, the page cache warm for
    all)."""
    took: list[list[float]] = [[] for _ in paths]
    for _ in range(rounds):
        for i, path in enumerate(paths):
            took[i].append(fresh_open(str(path), grace) * 1000)
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--commits", type=int, default=1000)
    p.add_argument("--grace", type=float, default=GRACE)
    p.add_argument("--dir", default=None)
    p.add_argument("--fresh-open", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fresh_open:
        print(fresh_open(args.fresh_open, args.grace))
        return
    root = Path(tempfile.mkdtemp(dir=args.dir)) / "loc"
    loc = str(root)
    print(f"{args.sessions} sessions x {args.commits} commits, grace {args.grace:g}s, at {loc}")
    print("session  open_ms  log_lists(full/after)  log_keys_listed  log_entries  rollups  meta_MB")
    out = sessions(root, args.sessions, args.commits, args.grace,
                   log=lambda line: print(line, flush=True))
    one: Path = out["after_one"]
    print(f"ran {out['seconds']:.0f}s")
    first = _fresh_opens(str(one), args.grace)
    last = _fresh_opens(loc, args.grace)
    for n, ms in ((1, first), (args.sessions, last)):
        print(f"fresh-process writer open after {n} sessions: best {min(ms):.1f} ms "
              f"(all: {', '.join(f'{x:.1f}' for x in ms)})")
    print(f"ratio (best after {args.sessions} / best after 1): {min(last) / min(first):.2f}")
    took = alternating_opens([one, root], args.grace)
    med = [statistics.median(ms) for ms in took]
    for n, m, ms in zip((1, args.sessions), med, took, strict=True):
        print(f"in-process writer open after {n} sessions, alternating: median {m:.1f} ms "
              f"(all: {', '.join(f'{x:.1f}' for x in ms)})")
    print(f"ratio (median after {args.sessions} / median after 1): {med[1] / med[0]:.2f}; "
          f"load average {os.getloadavg()[0]:.1f}")


def _fresh_opens(loc: str, grace: float, times: int = 3) -> list[float]:
    """Writer open times (ms) of ``times`` fresh processes, one after another."""
    out = []
    for _ in range(times):
        got = subprocess.run([sys.executable, "-m", "bench.trim_sessions", "--fresh-open", loc,
                              "--grace", str(grace)], capture_output=True, text=True,
                             env=dict(os.environ), check=True).stdout
        out.append(float(got.strip().splitlines()[-1]) * 1000)
    return out


if __name__ == "__main__":
    main()
