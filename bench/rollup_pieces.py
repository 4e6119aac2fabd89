"""Incremental rollups at many collections: what a rollup writes, the metadata kept, the
writer's open and the append latency, at 1 collection against 10,000.

    python -m bench.rollup_pieces [--collections 1 10000] [--seconds S] [--grace G] [--dir D]
                                  [--whole] [--keep] [--rounds R] [--block B] [--opens O]

For each count ``n``, a fresh file location (``fsync`` off: bytes and decoding are measured,
not the disk) with ``n`` collections, each with one 100-row append, rolled up. Then, the
counts alternating, ``O`` writer opens of each in a fresh process (timed there: what the
collections cost an open). Then, for each count in turn, ``S`` seconds of 100-row appends to
one collection (its since following its upper every 100 appends) with the background
maintenance on (a rollup every 64 commits, the metadata trim after ``G`` seconds), sampling
the bytes under ``meta/`` (log, rollups, pieces) every second: the most at once over the run,
and from ``G + 10`` seconds into it on (the setup's own metadata trimmed by then, or being
trimmed). Then, both writers open in this process, ``R`` alternating blocks of ``B`` appends
each (after a warm-up block each) for the append p50 and p99, and ``O`` alternating opens of
each in a fresh process. Reports the bytes of one whole rollup (manifest and every piece it
names), the bytes and pieces written per rollup during the run, the metadata kept, the
medians, and the ratios. ``--whole`` writes whole-state rollups, as every persist before
incremental ones did: the baseline.

:func:`measure` is the whole bench (W12 runs it: ``bench/workloads/w12_scale.py``). Counting
written bytes patches :class:`persist.blob.file.FileBlob` in this process while :func:`run`
runs (a measurement, not a behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.format import meta

#: The repository root: a child open imports this bench (and persist) from here.
_REPO = Path(__file__).resolve().parents[1]

_written: dict[str, list[int]] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def _counting_writes() -> Iterator[None]:
    """Counts the bytes written under ``meta/`` by prefix (:data:`_written`) while open;
    restores :class:`FileBlob` after."""
    plain = FileBlob._set

    def counted(self: FileBlob, key: str, data: object) -> None:
        prefix = key.rsplit("/", 1)[0] + "/" if key.startswith(layout.META_PREFIX) else ""
        with _lock:
            _written.setdefault(prefix, []).append(len(data))  # type: ignore[arg-type]
        plain(self, key, data)  # type: ignore[arg-type]

    FileBlob._set = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        FileBlob._set = plain  # type: ignore[method-assign]


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # trimmed under us
                total += os.path.getsize(os.path.join(root, f))
    return total


def _rows(base: int) -> list[tuple[tuple[int, int], int, int]]:
    return [((base + i, i), 0, 1) for i in range(100)]


_SO = {"fsync": False}


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


def _du_meta(loc: Path) -> dict[str, int]:
    meta_dir = loc / "meta"
    return {"log": _du(meta_dir / "log"), "rollup": _du(meta_dir / "rollup"),
            "piece": _du(meta_dir / "piece")}


def _append(w: persist.WriteHandle, r: persist.ReadHandle, appends: int) -> float:
    """One 100-row append to the collection of ``w``/``r`` (its since following upper every
    100 appends); returns its latency in seconds."""
    t = r.upper
    rows = [((-t * 1000 - i, i), t, 1) for i in range(100)]
    t0 = time.perf_counter()
    w.append(rows, upper=t + 1).result()
    took = time.perf_counter() - t0
    if appends % 100 == 99:
        w.allow_compaction(t)  # since follows upper, as a service's would
    return took


def setup(n: int, grace: float, root: Path) -> tuple[Path, dict[str, float]]:
    """A location of ``n`` collections, each with one 100-row append, rolled up."""
    loc = root / f"loc-{n}"
    started = time.monotonic()
    with persist.open(loc, reentrance_id="bench", options=_opts(grace),
                      storage_options=_SO) as client:
        for i in range(n):
            w, _ = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
            w.append(_rows(i * 1000), upper=1).result()
        client.maintain()
        whole = _whole_rollup(loc, client.state)
    return loc, {"collections": n, "setup_s": time.monotonic() - started,
                 "whole_rollup_bytes": whole}


def run(loc: Path, seconds: float, grace: float, retained_from: float | None = None
        ) -> dict[str, float]:
    """``seconds`` of appends to one collection of ``loc`` with background maintenance,
    sampling the metadata kept every second; ``steady_*`` is the most at once from
    ``retained_from`` seconds into the run on (``grace + 10`` by default)."""
    with _counting_writes(), persist.open(loc, reentrance_id="bench", options=_opts(grace),
                                          storage_options=_SO) as client:
        with _lock:
            _written.clear()
        w, r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        peak, steady, at_steady = 0, 0, {"log": 0, "rollup": 0, "piece": 0}
        appends = 0
        started = time.monotonic()
        end = started + seconds
        # NB: the setup's own metadata (a commit per registration and per first append, and
        # its rollups) is trimmed a grace period after the setup's last rollup: what is kept
        # from then on is what the appends keep.
        steady_from = started + (grace + 10.0 if retained_from is None else retained_from)
        next_sample = time.monotonic()
        latencies: list[float] = []
        while time.monotonic() < end:
            latencies.append(_append(w, r, appends))
            appends += 1
            now = time.monotonic()
            if now >= next_sample:
                du = _du_meta(loc)
                total = sum(du.values())
                peak = max(peak, total)
                if now >= steady_from and total > steady:
                    steady, at_steady = total, du
                next_sample += 1.0
        with _lock:
            rollups = len(_written.get(layout.ROLLUP_PREFIX, []))
            rollup_bytes = (sum(_written.get(layout.ROLLUP_PREFIX, []))
                            + sum(_written.get(layout.PIECE_PREFIX, [])))
        with _lock:
            piece_sizes = list(_written.get(layout.PIECE_PREFIX, []))
    return {"appends": appends, "rollups": rollups,
            "bytes_per_rollup": rollup_bytes / max(1, rollups),
            "pieces_per_rollup": len(piece_sizes) / max(1, rollups),
            "largest_piece_bytes": max(piece_sizes, default=0),
            "append_p50_ms_run": 1000 * statistics.median(latencies),
            "peak_meta_bytes": peak, "steady_peak_meta_bytes": steady,
            "steady_log_bytes": at_steady["log"], "steady_rollup_bytes": at_steady["rollup"],
            "steady_piece_bytes": at_steady["piece"]}


def _open_in_child(loc: Path, grace: float) -> float:
    """Seconds a writer open of ``loc`` takes in a fresh process (timed there: the process's
    start and imports not counted, nor the garbage of the other location's state)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-m", "bench.rollup_pieces", "--open", str(loc),
                          "--grace", str(grace)], check=True, capture_output=True, text=True,
                         env=env, cwd=_REPO)
    return float(out.stdout.strip().splitlines()[-1])


def _open_once(loc: Path, grace: float) -> None:
    t0 = time.perf_counter()
    client = persist.open(loc, reentrance_id="bench", options=_opts(grace), storage_options=_SO)
    took = time.perf_counter() - t0
    client.stop()
    print(took)


def alternate(locs: Sequence[Path], grace: float, rounds: int, block: int,
              opens: int) -> list[dict[str, Any]]:
    """Append latency and writer open at each location, measured alternating: ``rounds``
    blocks of ``block`` appends each, then ``opens`` opens each."""
    lat: list[list[float]] = [[] for _ in locs]
    clients = [persist.open(loc, reentrance_id="bench", options=_opts(grace),
                            storage_options=_SO) for loc in locs]
    try:
        handles = [c.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
                   for c in clients]
        for i in range(len(locs)):  # warm-up block each (the first round plans everything)
            for a in range(block):
                _append(*handles[i], a)
        for _ in range(rounds):
            for i in range(len(locs)):
                lat[i].extend(_append(*handles[i], a) for a in range(block))
    finally:
        for c in clients:
            c.stop()
    took = fresh_opens(locs, grace, opens)
    return [{"append_p50_ms": 1000 * statistics.median(lt),
             "append_p99_ms": 1000 * statistics.quantiles(lt, n=100)[98],
             "open_ms": [1000 * x for x in op],
             "open_ms_median": 1000 * statistics.median(op), "open_ms_min": 1000 * min(op)}
            for lt, op in zip(lat, took, strict=True)]


def fresh_opens(locs: Sequence[Path], grace: float, opens: int) -> list[list[float]]:
    """Writer opens (s) of each of ``locs`` in a fresh process each, alternating, ``opens``
    rounds."""
    took: list[list[float]] = [[] for _ in locs]
    for _ in range(opens):
        for i, loc in enumerate(locs):
            took[i].append(_open_in_child(loc, grace))
    return took


def measure(root: Path, counts: Sequence[int], *, seconds: float, grace: float, rounds: int,
            block: int, opens: int, retained_from: float | None = None,
            log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The whole bench (the module docstring) at locations ``root/loc-<n>`` for each of
    ``counts``: one dict per count, with ``open_fresh_ms`` and ``open_ms`` (the opens right
    after the setup and after the run, each in a fresh process), the medians and the rest
    :func:`setup`, :func:`run` and :func:`alternate` report."""
    results: list[dict[str, Any]] = []
    for n in counts:
        log(f"rollup_pieces: setting up {n:,} collections")
        _, made = setup(n, grace, root)
        results.append(made)
    locs = [root / f"loc-{n}" for n in counts]
    log(f"rollup_pieces: {opens} alternating writer opens each, in fresh processes")
    # right after the setup: what the collections cost
    fresh = fresh_opens(locs, grace, opens)
    for res, loc, took in zip(results, locs, fresh, strict=True):
        res["open_fresh_ms"] = [1000 * x for x in took]
        res["open_fresh_ms_median"] = 1000 * statistics.median(took)
        res["open_fresh_ms_min"] = 1000 * min(took)
        res["load_before_run"] = os.getloadavg()[0]
        log(f"rollup_pieces: {seconds:g} s of appends at {res['collections']:,} collections")
        res.update(run(loc, seconds, grace, retained_from))
        res["load_after_run"] = os.getloadavg()[0]
    log(f"rollup_pieces: {rounds} alternating blocks of {block} appends, {opens} opens each")
    for res, alt in zip(results, alternate(locs, grace, rounds, block, opens), strict=True):
        res.update(alt)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", type=int, nargs="+", default=[1, 10_000])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--grace", type=float, default=300.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the locations (loc-<n>)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating blocks of appends")
    ap.add_argument("--block", type=int, default=300, help="appends per block")
    ap.add_argument("--opens", type=int, default=7, help="alternating opens per location")
    ap.add_argument("--whole", action="store_true",
                    help="whole-state rollups, as before incremental ones (the baseline)")
    ap.add_argument("--open", default=None, help=argparse.SUPPRESS)  # a child's one open
    args = ap.parse_args()
    if args.open is not None:
        _open_once(Path(args.open), args.grace)
        return
    if args.whole:
        from persist.indexed.state import pieces

        pieces.COLLECTIONS_PER_PIECE = 1 << 30
    d = tempfile.mkdtemp(dir=args.dir)
    try:
        results = measure(Path(d), args.collections, seconds=args.seconds, grace=args.grace,
                          rounds=args.rounds, block=args.block, opens=args.opens,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        if args.keep:
            print(f"locations kept under {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()}")
    for res in results:
        print("  ".join(f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v:,}"
                        for k, v in res.items() if not isinstance(v, list)))
    if len(results) >= 2:
        a, b = results[0], results[-1]
        n0, n1 = a["collections"], b["collections"]
        print(f"alternating, {n1} against {n0} collections: writer open right after the "
              f"setup {b['open_fresh_ms_median'] / a['open_fresh_ms_median']:.2f}x, after the "
              f"run {b['open_ms_median'] / a['open_ms_median']:.2f}x (medians of {args.opens} "
              f"opens in fresh processes)")
        print(f"alternating, {n1} against {n0} collections: writer open "
              f"{b['open_ms_median'] / a['open_ms_median']:.2f}x (median of {args.opens}), "
              f"append p50 {b['append_p50_ms'] / a['append_p50_ms']:.2f}x, p99 "
              f"{b['append_p99_ms'] / a['append_p99_ms']:.2f}x ({args.rounds} blocks of "
              f"{args.block} each)")


if __name__ == "__main__":
    main()
