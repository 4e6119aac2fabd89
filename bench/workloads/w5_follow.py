"""W5's follower process: ``python -m bench.workloads.w5_follow SYSTEM ROOT WARM EXPECT POLL``.

Prints ``READY`` once it follows the table, ``SEEN <count>`` whenever the visible-append count
grows while it is at most ``WARM`` (the writer's warm-up appends wait for these, so every code
path of the follower is warm before anything is measured), then, when ``EXPECT`` appends are
visible, one JSON line ``{"seen": {count: monotonic seconds}}``: when each count was first seen.

persist follows with its own API: a read-only replica (``persist.open(url, read_only=True)``,
default polling of the metadata log; ``persist-push``: with ``notify=True``, the writer's push
notifications) and ``ReadHandle.listen``; the count is the listened ``upper``. The peers have no change feed: the process polls for new versions every ``POLL``
seconds (delta ``update_incremental``, iceberg ``refresh``, the floor a file's existence).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def follow_persist(root: Path, warm: int, expect: int, *, push: bool) -> dict[int, float]:
    import pyarrow as pa

    import persist
    from bench.systems.persist import NAME, PersistSystem

    seen: dict[int, float] = {}
    url = PersistSystem(root).url
    # NB: missing_ok: the follower may start before the writer's first commit.
    client = persist.open(url, read_only=True, missing_ok=True, notify=push)
    try:
        _, read = client.create_or_load(NAME, key_type=pa.int64(), value_type=pa.int64())
        listener = read.listen(0)
        print("READY", flush=True)
        last = 0
        for ev in listener:
            if isinstance(ev, persist.ListenProgress):
                now = time.monotonic()
                for k in range(last + 1, ev.upper + 1):
                    seen[k] = now
                last = max(last, ev.upper)
                if last <= warm:
                    print(f"SEEN {last}", flush=True)
                if last >= expect:
                    break
        listener.close()
    finally:
        client.stop()
    return seen


def follow_polling(name: str, root: Path, warm: int, expect: int, poll: float
                   ) -> dict[int, float]:
    from bench.systems import SYSTEMS

    s = SYSTEMS[name].attach(root)
    seen: dict[int, float] = {}
    last = s.visible_appends()
    print("READY", flush=True)
    deadline = time.monotonic() + 600
    while last < expect and time.monotonic() < deadline:
        v = s.visible_appends()
        if v > last:
            now = time.monotonic()
            for k in range(last + 1, v + 1):
                seen[k] = now
            last = v
            if last <= warm:
                print(f"SEEN {last}", flush=True)
        else:
            time.sleep(poll)
    return seen


def main() -> None:
    name, root = sys.argv[1], Path(sys.argv[2])
    warm, expect, poll = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    if name in ("persist", "persist-push"):
        seen = follow_persist(root, warm, expect, push=name == "persist-push")
    else:
        seen = follow_polling(name, root, warm, expect, poll)
    print(json.dumps({"seen": seen}), flush=True)


if __name__ == "__main__":
    main()
