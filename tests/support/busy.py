"""Runs a command while CPU hogs keep every core busy: ``./dev test --busy`` (issue 21).

    python -m tests.support.busy [--hogs N] -- COMMAND...

A suite that passes only on an idle machine depends on the machine's speed: a newcomer's
laptop is often busy, and CI shares its two cores. This starts ``N`` busy-loop processes
(default: two per core, the load of 4 and more seen when the suite first failed this way), at
the same priority as the command, runs the command, stops the hogs, and prints one line with
the command's exit code, its duration and the 1-minute load average seen while it ran (sampled
every 5 s), so a run can be recorded and repeated.

The exit code is the command's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

#: A busy loop that never allocates or does I/O: pure CPU, one core each.
HOG = "while True:\n    pass\n"


def load1() -> float:
    return os.getloadavg()[0]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.busy")
    p.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1),
                   help="busy-loop processes to run alongside (default: two per core)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command given")
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL)
            for _ in range(a.hogs)]
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            samples.append(load1())

    sampler = threading.Thread(target=sample, daemon=True)
    began = time.monotonic()
    sampler.start()
    try:
        rc = subprocess.call(command)
    finally:
        done.set()
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
    took = time.monotonic() - began
    seen = samples or [load1()]
    print(f"busy run: exit {rc} in {took:.0f} s with {a.hogs} CPU hogs on {os.cpu_count()} "
          f"cores; load (1 min) min {min(seen):.1f}, mean {sum(seen) / len(seen):.1f}, "
          f"max {max(seen):.1f}; command: {' '.join(command)}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
