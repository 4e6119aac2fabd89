"""A writer process for the lock liveness tests: takes a file location's lock, then misbehaves.

Usage: ``python -m tests.lock.holder pause|crash LOCATION``

* ``pause``: opens with ``reentrance_id="svc"``, then opens again with the same id (a takeover)
  and SIGSTOPs itself right after writing the lock record, i.e. in the middle of the lock's
  compare-and-set (where the single-file lock held its ``flock``), printing ``stopping`` first.
* ``crash``: opens with no reentrance id, prints ``ready`` and waits to be SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import persist
from persist.blob.file import FileBlob


def _stop_after_lock_writes() -> None:
    write = FileBlob._write_durably

    def stopping(self: FileBlob, key: str, data: Any, *, exclusive: bool) -> bool:
        done = write(self, key, data, exclusive=exclusive)
        if key.startswith("LOCK"):
            print("stopping", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return done

    FileBlob._write_durably = stopping  # type: ignore[method-assign]


def main(mode: str, location: str) -> None:
    if mode == "pause":
        first = persist.open(location, reentrance_id="svc")
        _stop_after_lock_writes()
        second = persist.open(location, reentrance_id="svc")
        first.stop()
        second.stop()
    elif mode == "crash":
        client = persist.open(location)  # NB: kept referenced: a dropped client releases the lock
        print("ready", flush=True)
        time.sleep(600)
        client.stop()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
