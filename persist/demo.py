"""The end-to-end demo: ``./dev demo`` (or ``python -m persist.demo [LOCATION]``).

Writes a small collection of page views on a local file location, seals it time by time, lets
history compact, reads it as of several frontiers (from the writer and from a read-only
replica), restarts, and prints what it did at each step.

The demo only ever deletes a directory it created itself: it leaves a marker file,
``.persist-demo``, in every location it makes, and refuses (exit code 2, nothing touched) to run
on an existing path without one. A location it made is reset on the next run.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa

import persist

#: Written into every location the demo creates: only such a directory is ever deleted.
MARKER = ".persist-demo"


def prepare(location: Path) -> str | None:
    """Makes ``location`` an empty demo directory, or explains why it must not be touched.

    Returns:
        None when ready; otherwise the error to print (nothing was changed).
    """
    if location.is_symlink() or (location.exists() and not location.is_dir()):
        return f"{location} exists and is not a directory; give the demo a new directory"
    if location.exists():
        if not (location / MARKER).is_file():
            return (f"{location} exists and was not created by the demo (no {MARKER} file "
                    f"in it); the demo deletes only directories it created. Give it a path "
                    f"that does not exist yet, e.g. `./dev demo my-demo`")
        shutil.rmtree(location)  # ours: reset it
    location.mkdir(parents=True)
    (location / MARKER).write_text("created by `python -m persist.demo`; "
                                   "the next demo run on this directory deletes it\n")
    return None


def main(argv: list[str]) -> int:
    """Runs the demo on the directory named in ``argv`` (default ``demo-location``); returns
    the exit code (2 for a usage error or a directory the demo did not create)."""
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m persist.demo [DIRECTORY]  (default: demo-location; a new "
              "directory, or one an earlier demo run created)", file=sys.stderr)
        return 2
    location = Path(argv[0] if argv else "demo-location").absolute()
    problem = prepare(location)
    if problem is not None:
        print(f"persist demo: {problem}", file=sys.stderr)
        return 2
    print(f"persist demo on file://{location}")
    pages = ["/", "/about", "/docs", "/pricing"]
    with persist.open(location, reentrance_id="demo") as client:
        write, read = client.create_or_load("views", key_type=pa.string(),
                                            value_type=pa.int64())
        print(f"  created collection 'views' (key string, value int64): "
              f"since={read.since} upper={read.upper}")
        started = time.perf_counter()
        for t in range(100):
            page = pages[t % len(pages)]
            updates = [((page, t % 7), t, 1)]
            if t >= 10:  # retract an older view: a differential update
                updates.append(((pages[(t - 10) % len(pages)], (t - 10) % 7), t, -1))
            write.append(updates, upper=t + 1).result()  # durable once the future resolves
        ms = (time.perf_counter() - started) * 1000
        print(f"  appended and sealed 100 times ({ms / 100:.2f} ms per durable append): "
              f"upper={read.upper}")
        before = {t: read.snapshot(t).to_python() for t in (5, 50, 99)}
        for t, rows in before.items():
            print(f"  as of {t:>2}: {len(rows)} (page, value) rows, e.g. {rows[:2]}")
        write.allow_compaction(50).result()
        client.maintain()  # compaction also runs in the background on its own
        parts = len(client.state.collections["views"].parts)
        print(f"  allowed compaction up to 50: since={read.since}, {parts} storage parts")
        assert read.snapshot(50).to_python() == before[50]
        assert read.snapshot(99).to_python() == before[99]
        print("  as of 50 and 99: identical after compaction (definite)")
        try:
            read.snapshot(5)
        except persist.InvalidUsage as e:
            print(f"  as of 5 is refused now: {e}")
        try:
            write.write([(("/", 1), 10, 1)]).result()
        except persist.InvalidUsage as e:
            print(f"  a write below upper is refused: {e}")
    with persist.open(location, read_only=True) as replica:
        _, r = replica.create_or_load("views", key_type=pa.string(), value_type=pa.int64())
        same = r.snapshot(99).to_python() == before[99]
        print(f"  after restart, a read-only replica sees since={r.since} upper={r.upper}; "
              f"as of 99 identical: {same}")
        assert same
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
