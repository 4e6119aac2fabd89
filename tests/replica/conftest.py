"""Fixtures for replica tests: locations, and worker processes that report in JSON lines."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.patience import PATIENCE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loc(tmp_path: Path) -> str:
    """A file location (the multi-process tests need a store other processes can open)."""
    return str(tmp_path / "loc")


class Proc:
    """A ``tests.replica.workers`` process; its JSON lines arrive on ``events``."""

    def __init__(self, role: str, *args: str) -> None:
        self.role = role
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.replica.workers", role, *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr = ""
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.events.put(json.loads(line))

    def _read_err(self) -> None:
        assert self.popen.stderr is not None
        self.stderr = self.popen.stderr.read()

    def wait_for(self, ev: str, timeout: float = PATIENCE,
                 pred: Callable[[dict[str, Any]], bool] = lambda e: True) -> dict[str, Any]:
        """Returns the first event ``ev`` (matching ``pred``), keeping every event in ``seen``."""
        for e in self.seen:
            if e["ev"] == ev and pred(e):
                return e
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{self.role}: no {ev!r} within {timeout}s; "
                                     f"last events {self.seen[-3:]}; stderr:\n{self.stderr}")
            try:
                e = self.events.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if self.popen.poll() is not None:
                    # NB: the process is gone, but its last lines may still be in the pipe: on
                    # a loaded machine the readers lag behind the exit (a handover test once
                    # failed "without 'done'" that way). Wait for both pipes' EOF, then look
                    # at what arrived.
                    for t in self._threads:
                        t.join(timeout=PATIENCE)
                    if not self.events.empty():
                        continue
                    raise AssertionError(f"{self.role} exited ({self.popen.returncode}) "
                                         f"without {ev!r}; last events {self.seen[-5:]}; "
                                         f"stderr:\n{self.stderr}") from None
                continue
            self.seen.append(e)
            if e["ev"] == ev and pred(e):
                return e

    def drain(self) -> list[dict[str, Any]]:
        while True:
            try:
                self.seen.append(self.events.get_nowait())
            except queue.Empty:
                return self.seen

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def finish(self, timeout: float = PATIENCE) -> int:
        rc = self.popen.wait(timeout)
        time.sleep(0.05)
        self.drain()
        return rc

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        for t in self._threads:
            t.join(5)
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    """Starts worker processes; every one still running at the end is killed."""
    started: list[Proc] = []

    def start(role: str, *args: str) -> Proc:
        p = Proc(role, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
