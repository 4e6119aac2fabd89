"""A steady append run long enough to include metadata trims: appends per 10 s bin.

    python -m bench.trim_steady [--seconds S] [--grace G] [--bin B] [--dir D]

One writer appends one-row updates one after another (each its own commit) to a fresh file
location (``fsync`` off) for ``S`` seconds, with a GC grace of ``G`` seconds, so trims begin
``G`` seconds in. Prints, per bin of ``B`` seconds (10 by default), the appends per second,
the LISTs of ``meta/log/`` made during the bin and how many keys they returned, and the log
entries on disk at the end of the bin; then when the first log entry was deleted (the first
trim) and the lowest bin's rate after it over the rate of the bin before it (issue 29's
target: >= 0.8). :func:`steady` is the run (W12 runs it: ``bench/workloads/w12_scale.py``).
Counting LISTs and deletes patches :class:`persist.blob.file.FileBlob` in this process while
the run lasts (a measurement, not a behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob

#: Every LIST while :func:`counting`: its prefix, whether it started after a key, keys returned.
listed: list[tuple[str, bool, int]] = []
#: Monotonic times of the deletes of ``meta/log/`` keys (one per entry or per shard).
_log_deletes: list[float] = []


def log_lists(lists: Sequence[tuple[str, bool, int]]) -> list[tuple[bool, int]]:
    """The LISTs of ``lists`` that read ``meta/log/``: whether after a key, keys returned."""
    return [(after, n) for prefix, after, n in lists if layout.LOG_PREFIX.startswith(prefix)]


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Records every LIST (:data:`listed`) and times the deletes of ``meta/log/`` keys
    (:data:`_log_deletes`) while open; restores :class:`FileBlob` after."""
    plain, after = FileBlob._list, getattr(FileBlob, "_list_after", None)
    delete, delete_shard = FileBlob._delete, FileBlob._delete_shard

    def counted(self: FileBlob, prefix: str) -> list[str]:
        keys = plain(self, prefix)
        listed.append((prefix, False, len(keys)))
        return keys

    def counted_after(self: FileBlob, prefix: str, start_after: str) -> list[str]:
        assert after is not None
        keys: list[str] = after(self, prefix, start_after)
        listed.append((prefix, True, len(keys)))
        return keys

    def timed_delete(self: FileBlob, key: str) -> None:
        if key.startswith(layout.LOG_PREFIX):
            _log_deletes.append(time.monotonic())
        delete(self, key)

    def timed_delete_shard(self: FileBlob, shard: str, keys: Sequence[str]) -> None:
        _log_deletes.append(time.monotonic())
        delete_shard(self, shard, keys)

    listed.clear()
    _log_deletes.clear()
    FileBlob._list = counted  # type: ignore[method-assign]
    if after is not None:
        FileBlob._list_after = counted_after  # type: ignore[method-assign]
    FileBlob._delete = timed_delete  # type: ignore[method-assign]
    FileBlob._delete_shard = timed_delete_shard  # type: ignore[method-assign]
    try:
        yield
    finally:
        FileBlob._list = plain  # type: ignore[method-assign]
        if after is not None:
            FileBlob._list_after = after  # type: ignore[method-assign]
        FileBlob._delete = delete  # type: ignore[method-assign]
        FileBlob._delete_shard = delete_shard  # type: ignore[method-assign]


def _log_entries(root: Path) -> int:
    # NB: recursive: a sharded log (format 7) keeps its entries in a directory per shard.
    # os.walk, not Path.rglob: the writer's trim removes whole shard directories while this
    # counts (rglob raised FileNotFoundError on one in a W12 run); a shard gone meanwhile
    # holds no entry any more
    return sum(len(files) for _, _, files in os.walk(root / layout.LOG_PREFIX))


def steady(root: Path, seconds: float, grace: float, *, bin_s: float = 10.0,
           log: Callable[[str], None] = print) -> dict[str, Any]:
    """``seconds`` of one-row appends, one after another, to a fresh file location at
    ``root`` (``fsync`` off, GC grace ``grace``), in bins of ``bin_s`` seconds.

    Returns ``bins`` (per bin: ``start_s``, ``end_s`` from the start, ``rate`` appends/s,
    ``lists`` and ``keys_listed`` of ``meta/log/``, ``log_entries`` on disk at its end),
    ``first_trim_s`` (the first delete of a log entry, from the start; None if none),
    ``before`` (the rate of the last bin that ended before it), ``lowest_after`` (the lowest
    rate of the bins that ended after it), their ratio ``ratio`` (None without a trim or a bin
    before it), and ``appends``."""
    bins: list[dict[str, float]] = []
    appends = 0
    with counting():
        client = persist.open(str(root), reentrance_id="steady",
                              options=persist.Options(gc_grace_seconds=grace),
                              storage_options={"fsync": False})
        try:
            w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
            started = time.monotonic()
            bin_start, n = started, 0
            while True:
                now = time.monotonic()
                if now - bin_start >= bin_s:
                    lists = [keys for _, keys in log_lists(listed)]
                    listed.clear()
                    bins.append({"start_s": bin_start - started, "end_s": now - started,
                                 "rate": n / (now - bin_start), "lists": len(lists),
                                 "keys_listed": sum(lists), "log_entries": _log_entries(root)})
                    b = bins[-1]
                    log(f"{b['end_s']:9.0f}  {b['rate']:9.0f}  {b['lists']:9d}"
                        f"  {b['keys_listed']:15d}  {b['log_entries']:11d}")
                    bin_start, n = now, 0
                    if now - started >= seconds:
                        break
                t = r.upper
                w.append([((appends, t), t, 1)], t + 1).result()
                n += 1
                appends += 1
        finally:
            client.stop()
        first = (_log_deletes[0] - started) if _log_deletes else None
    before = [b["rate"] for b in bins if first is not None and b["end_s"] <= first]
    after = [b["rate"] for b in bins if first is not None and b["end_s"] > first]
    lowest = min(after, default=None)
    ratio = (lowest / before[-1]) if before and lowest is not None and before[-1] else None
    return {"bins": bins, "first_trim_s": first, "before": before[-1] if before else None,
            "lowest_after": lowest, "ratio": ratio, "appends": appends}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--bin", type=float, default=10.0)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir)) / "loc"
    print(f"{args.seconds:g}s of appends, grace {args.grace:g}s, at {root}")
    print("bin_end_s  appends/s  log_lists  log_keys_listed  log_entries")
    out = steady(root, args.seconds, args.grace, bin_s=args.bin,
                 log=lambda line: print(line, flush=True))
    if out["ratio"] is None:
        print(f"first trim at {out['first_trim_s']} s: no ratio (no trim, or no bin before it)")
    else:
        print(f"first trim at {out['first_trim_s']:.1f} s; lowest bin after it "
              f"{out['lowest_after']:.0f}/s over the bin before it {out['before']:.0f}/s: "
              f"{out['ratio']:.2f} (target >= 0.8)")


if __name__ == "__main__":
    main()
