"""Damages encoded read tasks and part handles and reads them, in a process of its own (run by
``tests/runtime/test_task_encoding.py``, which treats a crash of this process as a failure).

    python -m tests.runtime.fuzz_tasks URL SEED

``URL`` holds a collection ``c`` (string -> int64, inline parts) that :func:`fill` wrote. Two
kinds of damage:

* **in transit**: single bit flips and truncations of ``to_bytes()``. The checksum must refuse
  every one: each read ends in ``Corruption`` (``ChecksumMismatch`` included).
* **inside an inline part's Arrow payload**, the record then encoded again with a valid
  checksum (what a buggy or hostile encoder could hand over): persist cannot know the
  payload's intended rows, but it must never crash, nor raise an untyped error, nor hand back
  a table that fails ``validate(full=True)``.
* **anywhere in the record's msgpack payload**, then put back in an envelope with a valid
  checksum (a buggy producer): the same (types, the collection's serialized Arrow types and
  the filter included: a flip there raised ``OSError: Invalid flatbuffers message``).

Prints one JSON object: for each kind, the outcomes counted by name (an exception's type, or
``"rows"`` for a read that returned, ``"invalid"`` for one that returned an invalid table).
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from typing import Any

import msgspec
import pyarrow as pa

import persist
from persist import distributed
from persist.blob import envelope

#: Parts that stay inline (this fuzzer damages inline payloads).
INLINE = persist.Options(inline_threshold=64 << 10, background_compaction=False)

#: Bit flips per encoding, and truncations.
FLIPS = 300
TRUNCATIONS = 60


def fill(url: str) -> None:
    """Small appends (inline parts) to ``c``, some retracted."""
    # NB: inline parts whatever the knob set (a small inline threshold, or a compaction that
    # flushes inline parts at once, would leave no inline payload to damage)
    with persist.open(url, options=INLINE) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            rows = [((f"k{i}", i * t), t, 1) for i in range(t * 5, t * 5 + 8)]
            if t:
                rows.append(((f"k{t * 5 - 3}", (t * 5 - 3) * (t - 1)), t, -1))
            w.append(rows, upper=t + 1).result()


def _read(record: Any) -> list[pa.Table]:
    if isinstance(record, distributed.PartHandle):
        return [distributed.read_part(record)]
    return list(distributed.read_task(record))


def _outcome(decode: Any, data: bytes) -> str:
    try:
        tables = _read(decode(data))
    except persist.PersistError as e:
        return type(e).__name__
    except Exception as e:  # reported, and the test fails on it
        return f"untyped {type(e).__name__}"
    for t in tables:
        try:
            t.validate(full=True)
        except pa.ArrowException:
            return "invalid"
    return "rows"


def records(url: str) -> list[Any]:
    """Encodable records of ``c``: raw, consolidated and change tasks (one with a filter) and
    the part handles."""
    info = distributed.describe(url, "c")
    f = persist.col("value") >= 2
    return [*info.snapshot(filter=f).tasks(),
            *info.snapshot().tasks(consolidated=True, n=2),
            *info.changes(1, 3).tasks(), *info.snapshot().parts]


def transit(recs: list[Any], rng: random.Random) -> Counter[str]:
    out: Counter[str] = Counter()
    for rec in recs:
        data = rec.to_bytes()
        decode = type(rec).from_bytes
        for _ in range(FLIPS):
            damaged = bytearray(data)
            at = rng.randrange(len(data))
            damaged[at] ^= 1 << rng.randrange(8)
            out[_outcome(decode, bytes(damaged))] += 1
        for _ in range(TRUNCATIONS):
            out[_outcome(decode, data[:rng.randrange(len(data))])] += 1
    return out


def payloads(recs: list[Any], rng: random.Random) -> Counter[str]:
    out: Counter[str] = Counter()
    for rec in recs:
        parts = rec.parts if isinstance(rec, distributed.ReadTask) else (rec.part,)
        inline = [i for i, p in enumerate(parts) if p.inline is not None]
        if not inline:
            continue
        decode = type(rec).from_bytes
        for _ in range(FLIPS // 3):
            i = rng.choice(inline)
            payload = bytearray(parts[i].inline)
            for _ in range(rng.randrange(1, 4)):
                payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
            part = msgspec.structs.replace(parts[i], inline=bytes(payload))
            if isinstance(rec, distributed.ReadTask):
                damaged = msgspec.structs.replace(
                    rec, parts=(*parts[:i], part, *parts[i + 1:]))
            else:
                damaged = msgspec.structs.replace(rec, part=part)
            out[_outcome(decode, damaged.to_bytes())] += 1
    return out


def records_rechecked(recs: list[Any], rng: random.Random) -> Counter[str]:
    out: Counter[str] = Counter()
    for rec in recs:
        payload = envelope.unpack(rec.KIND, rec.to_bytes())
        decode = type(rec).from_bytes
        for _ in range(FLIPS):
            damaged = bytearray(payload)
            for _ in range(rng.randrange(1, 3)):
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            out[_outcome(decode, bytes(envelope.pack(rec.KIND, bytes(damaged))))] += 1
    return out


def main(url: str, seed: int) -> None:
    rng = random.Random(seed)
    recs = records(url)
    assert any(p.inline is not None for r in recs
               for p in (r.parts if isinstance(r, distributed.ReadTask) else (r.part,)))
    print(json.dumps({"records": len(recs), "transit": transit(recs, rng),
                      "payload": payloads(recs, rng),
                      "record": records_rechecked(recs, rng)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
