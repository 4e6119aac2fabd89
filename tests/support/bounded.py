"""Running a call that might block forever, with a bound: the tests of "no wait without a
deadline" need to fail (not hang) when a call does block."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


def within(seconds: float, fn: Callable[[], Any], *, what: str = "still running") -> Any:
    """Runs ``fn`` in a daemon thread; returns its result or the exception it raised, and fails
    the test with ``what`` if it is still running after ``seconds`` (it may be blocked for
    good; the daemon thread is then abandoned)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{what} after {seconds:g}s")
    return out[0]
