"""Helpers shared by the replica tests: waiting, the test collection, checking reports."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import persist
from tests.replica.conftest import Proc
from tests.replica.workers import NAME, key, updates_at
from tests.support.patience import PATIENCE


def eventually(pred: Callable[[], bool], timeout: float = PATIENCE,
               what: str = "condition") -> None:
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


def listened_rows(listener: persist.Listener, until: int, timeout: float = PATIENCE
                  ) -> list[Any]:
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


def file_tree(root: str) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: to show that nothing changed."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(d, f))
            out[os.path.relpath(os.path.join(d, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


def acks(p: Proc) -> set[int]:
    """The times a writer process reported as acknowledged."""
    return {e["t"] for e in p.drain() if e["ev"] == "ack"}


def check_listened(done: dict[str, Any], until: int, acked: set[int], churn: int = 0) -> None:
    """Every time below ``until`` exactly once (inserts, and retractions with churn), in
    order of progress, and every acknowledged write among them."""
    rows = [r for r in done["rows"] if r[1] < until]
    inserts = Counter((k, t) for k, t, d in rows if d == 1)
    assert inserts == Counter((key(t), t) for t in range(until)), "a gap or a duplicate"
    if churn:
        retracts = Counter((k, t) for k, t, d in rows if d == -1)
        assert retracts == Counter((key(t - churn), t) for t in range(churn, until))
    assert all(d in (1, -1) for _, _, d in rows)
    assert acked <= {t for _, t, _ in rows}
    progress = done["progress"]
    assert progress == sorted(set(progress)), "progress went backwards or repeated"


def check_snapshots(checked: dict[str, Any]) -> None:
    """A replica process's snapshot checks: enough of them, none wrong, none failed."""
    assert checked["snapshots"] > 10, "too few snapshots to prove anything"
    assert (checked["bad"], checked["failures"]) == (0, 0), checked["errors"]
