"""Writes the golden location of idempotency tokens as persist recorded them before the record
was the engine's: in the collection ``__sink_progress`` (key: the token id; value: the last seq
applied under it; one row per id, since following upper), which is what ``Client.apply(token=...)``
and, before it, the Spark sink wrote until the collection became ``__persist_tokens``. Run once;
never regenerate: it pins what every future persist must keep honouring.

    python -m tests.golden.make_golden_tokens

NB: the bookkeeping is spelled out (plain writes, seals and sinces beside the data), exactly as
the persist of that time did it in ``Client.apply(token=...)``, so that this script keeps making
the old layout whatever the current persist records tokens in.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist

HERE = Path(__file__).parent
#: The old name of the token collection.
LEGACY = "__sink_progress"
#: Each commit: (token id, seq, keys added to ``events`` at the time it lands at).
COMMITS: list[tuple[str, int, list[str]]] = [
    ("loader", 1, [f"a{i}" for i in range(40)]),
    ("copy@q", 0, [f"b{i}" for i in range(3)]),
    ("copy@q", 1, [f"c{i}" for i in range(3)]),
    ("loader", 2, [f"d{i}" for i in range(400)]),
    ("copy@q", 2, [f"e{i}" for i in range(3)]),
    ("loader", 3, [f"f{i}" for i in range(5)]),
    ("copy@q", 4, [f"g{i}" for i in range(3)]),
]


def main() -> None:
    loc = HERE / "tokens-location"
    shutil.rmtree(loc, ignore_errors=True)
    options = persist.Options(inline_threshold=600, rollup_every=4)
    with persist.open(loc, reentrance_id="golden", options=options) as client:
        client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        client.create_or_load(LEGACY, key_type=pa.string(), value_type=pa.int64())
        last: dict[str, int] = {}
        for t, (token, seq, keys) in enumerate(COMMITS):
            at = client.state.collections[LEGACY].upper
            book: list[tuple[tuple[str, int], int, int]] = [((token, seq), at, 1)]
            if token in last:
                book.append(((token, last[token]), at, -1))
            last[token] = seq
            client.apply(writes={"events": [((k, t), t, 1) for k in keys], LEGACY: book},
                         seals={"events": t + 1, LEGACY: at + 1},
                         sinces={LEGACY: at}).result()
        client.maintain()
        _, read = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        expected: dict[str, Any] = {
            "tokens": last,
            "events": {str(t): sorted([k, v, d] for (k, v), _, d in read.snapshot(t).to_python())
                       for t in range(read.since, read.upper)},
        }
    # NB: the writer lock's files are not what is pinned (a fresh location has none)
    for lock in loc.glob("LOCK*"):
        shutil.rmtree(lock) if lock.is_dir() else lock.unlink()
    (HERE / "tokens-expected.json").write_text(json.dumps(expected, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
