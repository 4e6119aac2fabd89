"""Child process for the branch crash tests: writes, forks (in its location and into another
one), tags and renews a named hold forever, reporting each attempt and each ack.

Usage: python -m tests.runtime.branches_writer A B SEED

Stdout lines (JSON): ``{"attempt": kind, ...}`` before an operation and ``{"ack": kind, ...}``
once it is durable, with the digest of the source's contents the fork or tag must show. The
parent SIGKILLs this process at random, or a crash point (``PERSIST_CRASH_AT``) does.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from typing import Any

import pyarrow as pa

import persist
from persist.indexed.maintenance.compact import CompactionPolicy
from tests import knobs

knobs.activate_from_env()

# NB: background compaction pinned on: the crash rounds are about forks, tags and renewals
# racing merges and GC, and with it off (the compact-none knob set) parts never merge, so every
# check re-digests every fork over hundreds of parts (the test ran past its 600 s limit).
OPTIONS = persist.Options(
    inline_threshold=512, rollup_every=8, gc_grace_seconds=0.0, commit_deadline_seconds=2.0,
    background_compaction=True,
    compaction=CompactionPolicy(final_rows=4096, inline_flush_bytes=2048))


def digest(table: pa.Table) -> str:
    """A fingerprint of a consolidated snapshot (rows sorted by key and value)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table.combine_chunks())
    return hashlib.sha256(sink.getvalue()).hexdigest()


def say(**rec: Any) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def main() -> None:
    a, b, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    client = persist.open(a, reentrance_id="branches-writer", options=OPTIONS)
    dst = persist.open(b, reentrance_id="branches-dst", options=OPTIONS)
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    have = {h.name: h for h in client.holds("c")}.get("consumer")
    hold = client.hold("c", "consumer", have.frontier if have and not have.lapsed else r.since,
                       lease=3600)
    say(ready=True)
    n = 0
    while True:
        n += 1
        t = r.upper
        keys = [t * 1000 + i for i in range(rng.randint(1, 50))]
        w.append([((k, k), t, 1) for k in keys], upper=t + 1).result()
        if t > 10 and rng.random() < 0.2:
            w.allow_compaction(min(t - 5, hold.frontier)).result()
        op = rng.random()
        as_of = rng.randrange(r.since, r.upper)
        d = digest(r.snapshot(as_of).to_arrow())
        tag = f"run{seed}-{n}"
        if op < 0.25:
            say(attempt="fork", name=tag, as_of=as_of, digest=d)
            client.fork("c", into=tag, as_of=as_of).result()
            say(ack="fork", name=tag)
        elif op < 0.5:
            say(attempt="xfork", name=tag, as_of=as_of, digest=d)
            try:
                persist.fork(a, "c", b, into=tag, as_of=as_of, client=dst)
            except persist.Determinate as e:
                # NB: what a user gets on a busy machine (the commit came past the deadline
                # its pins promised, or the source kept retiring what it pinned): nothing
                # was committed; the test checks that it is not there
                say(refused="xfork", name=tag, why=type(e).__name__)
                continue
            say(ack="xfork", name=tag)
        elif op < 0.75:
            say(attempt="tag", name=tag, as_of=as_of, digest=d)
            client.tag("c", tag, as_of=as_of).result()
            say(ack="tag", name=tag)
        else:
            at = min(r.upper - 1, hold.frontier + rng.randint(0, 3))
            say(attempt="renew", frontier=at)
            hold.advance(at).result()
            say(ack="renew", frontier=at)


if __name__ == "__main__":
    main()
