"""Small helpers shared by the in-process replica tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import persist
from tests.replica.workers import NAME, updates_at


def eventually(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.002)


def events(client: persist.Client) -> tuple[Any, Any]:
    """The shared test collection: key string, value int64."""
    return client.create_or_load(NAME, key_type=pa.string(), value_type=pa.int64())


def append_times(w: Any, lo: int, hi: int, churn: int = 0) -> None:
    """Appends times ``lo..hi-1``, one commit each (the model of ``workers.updates_at``)."""
    for t in range(lo, hi):
        w.append(updates_at(t, churn), upper=t + 1).result()


def listened_rows(listener: persist.Listener, until: int, timeout: float = 10.0) -> list[Any]:
    """Collects (key, time, diff) from ``listener`` until its frontier reaches ``until``.

    Checks the listen contract on the way: progress only advances, and every batch lies in
    ``[lower, upper)`` at or above the previous progress. Within one batch the order of rows
    is unspecified, so the result is sorted by time within each progress step.
    """
    rows: list[Any] = []
    step: list[Any] = []
    frontier = listener.frontier
    deadline = time.monotonic() + timeout
    while listener.frontier < until:
        assert time.monotonic() < deadline, f"listener stuck at {listener.frontier}"
        for e in listener.poll(0.2):
            if isinstance(e, persist.ListenUpdates):
                b = e.batch
                assert e.lower == frontier
                step.extend(zip(b.column("key").to_pylist(), b.column("time").to_pylist(),
                                b.column("diff").to_pylist(), strict=True))
                assert all(e.lower <= t < e.upper for _, t, _ in step)
            else:
                assert e.upper > frontier
                frontier = e.upper
                rows.extend(sorted(step, key=lambda r: (r[1], r[0], r[2])))
                step = []
    assert not step
    return rows
