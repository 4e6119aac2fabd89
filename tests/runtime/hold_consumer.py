"""Child process for the hold tests: a consumer in another process than the writer.

Usage: python -m tests.runtime.hold_consumer URL COLLECTION HOLD AT LEASE_SECONDS

Takes the named hold (the writer runs elsewhere: through a request it answers), prints
``{"held": seq}``, then waits for a line on stdin (the test pauses it meanwhile, SIGSTOP), then
tries to advance the hold and to read as of where it held, and prints what happened:
``{"advance": "ok" | "<ErrorClass>", "read": "ok" | "<ErrorClass>", "rows": n}``.
"""

from __future__ import annotations

import json
import sys

from persist.distributed import ConsumerHold, describe, read_task
from persist.errors import PersistError


def main() -> None:
    url, name, hold, at, lease = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
        float(sys.argv[5])
    h = ConsumerHold.take(url, name, hold, at, lease=lease, timeout=60.0)
    print(json.dumps({"held": at}), flush=True)
    sys.stdin.readline()
    out: dict[str, object] = {}
    try:
        h.advance(at + 1)
        out["advance"] = "ok"
    except PersistError as e:
        out["advance"] = type(e).__name__
        out["message"] = str(e)
    # NB: the consumer reads as of where it held: definite, or refused; never other rows.
    try:
        scan = describe(url, name).snapshot(at)
        out["rows"] = sum(t.num_rows for task in scan.tasks(consolidated=True)
                          for t in read_task(task))
        out["read"] = "ok"
    except PersistError as e:
        out["read"] = type(e).__name__
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
