"""Incremental rollups at many collections: what a rollup writes, the metadata kept, and the
writer's open, at 1 collection against 10,000.

    python -m bench.rollup_pieces [--collections 1 10000] [--seconds S] [--grace G] [--dir D]
                                  [--whole]

For each count ``n``, on a fresh file location (``fsync`` off: bytes and decoding are
measured, not the disk): creates ``n`` collections, each with one 100-row append, and rolls
up; then appends 100 rows at a time to one collection for ``S`` seconds (its since following
its upper every 100 appends) with the background maintenance on (a rollup every 64 commits, the metadata trim after ``G`` seconds), sampling
the bytes under ``meta/`` every second; then closes and opens the writer 5 times. Reports the
bytes of one whole rollup (manifest and every piece it names), the bytes written per rollup
during the run (manifests and pieces), the most metadata bytes kept at once, and the median
open. ``--whole`` writes whole-state rollups, as every persist before incremental ones did:
the baseline.

Counting written bytes patches :class:`persist.blob.file.FileBlob` in this process (a
measurement, not a behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.format import meta

_written: dict[str, list[int]] = {}
_lock = threading.Lock()


def _count_writes() -> None:
    plain = FileBlob._set

    def counted(self: FileBlob, key: str, data: object) -> None:
        prefix = key.rsplit("/", 1)[0] + "/" if key.startswith(layout.META_PREFIX) else ""
        with _lock:
            _written.setdefault(prefix, []).append(len(data))  # type: ignore[arg-type]
        plain(self, key, data)  # type: ignore[arg-type]

    FileBlob._set = counted  # type: ignore[method-assign,assignment]


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # trimmed under us
                total += os.path.getsize(os.path.join(root, f))
    return total


def _rows(base: int) -> list[tuple[tuple[int, int], int, int]]:
    return [((base + i, i), 0, 1) for i in range(100)]


def _opts(grace: float) -> persist.Options:
    return persist.Options(gc_grace_seconds=grace)


def _whole_rollup(loc: Path, state: meta.State) -> int:
    """The bytes of the newest rollup, with every piece it names (none yet: of the state's
    whole encoding)."""
    blob = FileBlob(str(loc))
    keys = blob.list_keys(layout.ROLLUP_PREFIX)
    if not keys:
        return len(meta.encode(state))
    key = keys[-1]
    data = blob.get(key)
    assert data is not None
    if not meta.is_manifest(key, bytes(data)):
        return len(data)
    m = meta.decode_manifest(key, bytes(data))
    return len(data) + sum(p.nbytes for p in m.pieces)


def run(n: int, seconds: float, grace: float, root: Path) -> dict[str, float]:
    loc = root / f"loc-{n}"
    so = {"fsync": False}
    started = time.monotonic()
    with persist.open(loc, reentrance_id="bench", options=_opts(grace),
                      storage_options=so) as client:
        for i in range(n):
            w, _ = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
            w.append(_rows(i * 1000), upper=1).result()
        client.maintain()
        setup = time.monotonic() - started
        whole = _whole_rollup(loc, client.state)
        with _lock:
            _written.clear()
        w, r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        peak, appends = 0, 0
        end = time.monotonic() + seconds
        next_sample = time.monotonic()
        while time.monotonic() < end:
            t = r.upper
            w.append([((-t * 1000 - i, i), t, 1) for i in range(100)], upper=t + 1).result()
            appends += 1
            if appends % 100 == 0:
                w.allow_compaction(t)  # since follows upper, as a service's would
            if time.monotonic() >= next_sample:
                peak = max(peak, _du(loc / "meta"))
                next_sample += 1.0
        peak = max(peak, _du(loc / "meta"))
        with _lock:
            rollups = len(_written.get(layout.ROLLUP_PREFIX, []))
            rollup_bytes = (sum(_written.get(layout.ROLLUP_PREFIX, []))
                            + sum(_written.get(layout.PIECE_PREFIX, [])))
    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        with persist.open(loc, reentrance_id="bench", options=_opts(grace), storage_options=so):
            opens.append(time.perf_counter() - t0)
    return {"collections": n, "setup_s": setup, "whole_rollup_bytes": whole,
            "appends": appends, "rollups": rollups,
            "bytes_per_rollup": rollup_bytes / max(1, rollups),
            "peak_meta_bytes": peak, "open_ms_median": 1000 * statistics.median(opens),
            "open_ms_min": 1000 * min(opens)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", type=int, nargs="+", default=[1, 10_000])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--grace", type=float, default=300.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the locations (loc-<n>)")
    ap.add_argument("--whole", action="store_true",
                    help="whole-state rollups, as before incremental ones (the baseline)")
    args = ap.parse_args()
    if args.whole:
        from persist.indexed.state import pieces

        pieces.COLLECTIONS_PER_PIECE = 1 << 30
    _count_writes()
    if args.keep:
        d = tempfile.mkdtemp(dir=args.dir)
        results = [run(n, args.seconds, args.grace, Path(d)) for n in args.collections]
        print(f"locations kept under {d}")
    else:
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            results = [run(n, args.seconds, args.grace, Path(d)) for n in args.collections]
    print(f"load average at the end: {os.getloadavg()}")
    for res in results:
        print("  ".join(f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v:,}"
                        for k, v in res.items()))
    if len(results) >= 2:
        a, b = results[0], results[-1]
        print(f"open ratio {b['collections']}/{a['collections']}: "
              f"{b['open_ms_median'] / a['open_ms_median']:.2f}x (median of 5)")


if __name__ == "__main__":
    main()
