"""Shared helpers: identical data for every system, timing, statistics, RSS sampling, files.

Every workload draws its batches from :func:`make_batch` with a fixed seed, so each system
ingests byte-for-byte the same Arrow tables (columns ``key, value, time, diff``, all int64).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema(
    [
        pa.field("key", pa.int64()),
        pa.field("value", pa.int64()),
        pa.field("time", pa.int64()),
        pa.field("diff", pa.int64()),
    ]
)

#: Keys are drawn from this many distinct values (random, so compression has real work to do).
KEY_SPACE = 1 << 40


def make_batch(seed: int, rows: int, *, time_lo: int, time_hi: int | None = None) -> pa.Table:
    """``rows`` updates: random int64 key, random int64 value, times increasing from ``time_lo``
    (all equal to ``time_lo`` when ``time_hi`` is None, else spread over ``[time_lo, time_hi)``),
    diff 1. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, KEY_SPACE, rows, dtype=np.int64)
    values = rng.integers(0, 1_000_000, rows, dtype=np.int64)
    if time_hi is None:
        times = np.full(rows, time_lo, dtype=np.int64)
    else:
        times = np.linspace(time_lo, time_hi - 1, rows).astype(np.int64)
    diffs = np.ones(rows, dtype=np.int64)
    return pa.Table.from_arrays(
        [pa.array(keys), pa.array(values), pa.array(times), pa.array(diffs)], schema=SCHEMA
    )


def with_time(table: pa.Table, t: int) -> pa.Table:
    """``table`` with every time set to ``t`` (cheap: one new column)."""
    return table.set_column(2, SCHEMA.field(2), pa.array(np.full(len(table), t, dtype=np.int64)))


# -- statistics ---------------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """Median/min/max (and the samples) of repeated measurements."""
    xs = [float(x) for x in samples if x is not None and not math.isnan(float(x))]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0, "samples": []}
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "samples": xs,
    }


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by linear interpolation."""
    if not xs:
        return float("nan")
    return float(np.percentile(np.asarray(xs, dtype=np.float64), p))


@dataclass
class Timer:
    seconds: float = 0.0


@contextlib.contextmanager
def timed() -> Iterator[Timer]:
    """``with timed() as t: ...`` then ``t.seconds`` (perf_counter; GC paused inside)."""
    t = Timer()
    was = gc.isenabled()
    gc.disable()
    start = time.perf_counter()
    try:
        yield t
    finally:
        t.seconds = time.perf_counter() - start
        if was:
            gc.enable()


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` rotated left by ``k``: round ``k`` of an interleaved run starts elsewhere."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


# -- files ----------------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def du(path: str | os.PathLike[str]) -> int:
    """Bytes stored under ``path`` (sum of file sizes)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def settle() -> None:
    """Flushes dirty pages (so one system's unsynced writes don't slow the next one's fsyncs)
    and collects garbage. Never inside a timed region."""
    os.sync()
    gc.collect()


def timed_full_read(system: Any, expected: int, what: str) -> float:
    """Settles, then times one full read through ``system`` (its ``read()``), checks that it
    returned ``expected`` rows, and returns the seconds it took.

    Raises:
        AssertionError: another number of rows (``what`` names the read in the message).
    """
    settle()
    with timed() as t:
        out = system.read()
    got = len(out)
    del out
    if got != expected:
        raise AssertionError(f"{what} read {got} rows, expected {expected}")
    return t.seconds


def fresh_dir(root: Path, name: str) -> Path:
    d = root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- memory ---------------------------------------------------------------------------------------


@dataclass
class RssSampler:
    """Samples this process's RSS every ``interval`` seconds in a thread; ``peak`` since reset."""

    interval: float = 0.005
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @staticmethod
    def rss() -> int:
        """Resident set size of this process in bytes (/proc on Linux, else psutil)."""
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * _PAGE
        except OSError:
            import psutil  # type: ignore[import-untyped]  # NB: no stubs in the bench extra

            return int(psutil.Process().memory_info().rss)

    def reset(self) -> None:
        self.peak = self.rss()

    def start(self) -> RssSampler:
        self.reset()

        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.peak = max(self.peak, self.rss())

        self._thread = threading.Thread(target=loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def sample_now(self) -> None:
        self.peak = max(self.peak, self.rss())


MiB = float(1 << 20)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
