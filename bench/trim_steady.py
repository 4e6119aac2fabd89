"""A steady append run long enough to include metadata trims: appends per 10 s bin.

    python -m bench.trim_steady [--seconds S] [--grace G] [--dir D]

One writer appends one-row updates one after another (each its own commit) to a fresh file
location (``fsync`` off) for ``S`` seconds, with a GC grace of ``G`` seconds, so trims begin
``G`` seconds in. Prints, per 10 s bin, the appends per second, the LISTs of ``meta/log/``
made during the bin and how many keys they returned, and the log entries on disk at the end of
the bin. Counting LISTs patches :class:`persist.blob.file.FileBlob` in this process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob

_lists: list[int] = []


def _count_log_lists() -> None:
    plain = FileBlob._list
    after = getattr(FileBlob, "_list_after", None)

    def counted(self: FileBlob, prefix: str) -> list[str]:
        keys = plain(self, prefix)
        if layout.LOG_PREFIX.startswith(prefix):
            _lists.append(len(keys))
        return keys

    FileBlob._list = counted  # type: ignore[method-assign]
    if after is not None:
        def counted_after(self: FileBlob, prefix: str, start_after: str) -> list[str]:
            keys: list[str] = after(self, prefix, start_after)
            if layout.LOG_PREFIX.startswith(prefix):
                _lists.append(len(keys))
            return keys

        FileBlob._list_after = counted_after  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--grace", type=float, default=30.0)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    _count_log_lists()
    root = Path(tempfile.mkdtemp(dir=args.dir)) / "loc"
    client = persist.open(str(root), reentrance_id="steady",
                          options=persist.Options(gc_grace_seconds=args.grace),
                          storage_options={"fsync": False})
    print(f"{args.seconds:g}s of appends, grace {args.grace:g}s, at {root}")
    print("bin_end_s  appends/s  log_lists  log_keys_listed  log_entries")
    try:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        started = time.monotonic()
        bin_start, n, i = started, 0, 0
        while True:
            now = time.monotonic()
            if now - bin_start >= 10.0:
                logs = sum(1 for _ in (root / layout.LOG_PREFIX).iterdir())
                lists = list(_lists)
                _lists.clear()
                print(f"{now - started:9.0f}  {n / (now - bin_start):9.0f}  {len(lists):9d}"
                      f"  {sum(lists):15d}  {logs:11d}", flush=True)
                bin_start, n = now, 0
                if now - started >= args.seconds:
                    break
            t = r.upper
            w.append([((i, t), t, 1)], t + 1).result()
            n += 1
            i += 1
    finally:
        client.stop()


if __name__ == "__main__":
    main()
