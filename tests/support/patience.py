"""How long a test waits before it calls something a hang: one number, sized for a busy machine.

Tests wait on events (a process's report, a future, a state they poll for), never for a fixed
time to pass. A wait still needs an end, or a lost event hangs the run; that end is the one
figure that depends on the machine, and it is a hang detector, never a speed requirement.

Sizing (issue 21): on a 2-core machine at load 4-13 the suite ran about 3 times slower than
idle, and single steps (a process starting and importing persist, a Spark micro-batch, a moto
server answering) up to about 10 times: an idle step of a few seconds then takes tens of
seconds. :data:`PATIENCE` allows 300 s for what takes at most a few seconds idle, which is
over 50 times that, and still ends well before pytest-timeout's 600 s per test so the failure
names what it waited for. ``PERSIST_TEST_PATIENCE`` (seconds) overrides it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Seconds a test waits for something that takes at most a few seconds on an idle machine.
PATIENCE = float(os.environ.get("PERSIST_TEST_PATIENCE", "300"))


def eventually(pred: Callable[[], bool], what: str, *, timeout: float = PATIENCE,
               interval: float = 0.01) -> None:
    """Waits until ``pred()`` holds, polling every ``interval`` seconds.

    Raises:
        AssertionError: it did not hold within ``timeout`` seconds (naming ``what``).
    """
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(interval)
