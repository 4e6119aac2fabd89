"""Damaged part files on every read path: one bit flipped in every region of a v4 part (page
bodies, page headers, page index, footer, footer statistics, footer length, magic) or the
file truncated, over an int64 and a string key. Every read through the client's snapshot, the
Python source (``format("persist")``) and the native path (``PersistTable.toDF()``), raw,
consolidated and filtered, is the undamaged answer or an error: never a silent wrong answer.

The Python source reads one damaged file per region (each read of a damaged file costs
seconds: Spark replaces the Python worker that failed), alternating key types and rotating
over the three modes; it verifies with the client's part reader, which reads every damaged
file.

Regions are found by parsing the file's Thrift structures (:func:`regions`): the footer (its
``Statistics`` structs apart), the page index between the last page and the footer, and each
page's header and body. Each trial damages one file of a fresh copy of the location; the
expected answers are read once from the undamaged location.

What each path must raise: the client and the Python source a persist ``Corruption`` (the
whole file's crc32c); the native path ``ChecksumMismatch`` before any job for every byte of
the tail (page index, footer, length, trailing magic: :mod:`persist.indexed.read.tail`; the
leading magic Spark does not read), and Spark's "CRC checksum verification failed" for a page
body. A page header is covered by neither
checksum (Parquet's page CRC covers the body only): there any error of Spark's reader counts,
and the counts are recorded (``-s`` prints them).
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from operators import PersistTable
from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.filter import col
from tests.support.engine import Engine

pytestmark = pytest.mark.spark

#: Blob parts only, no merging, row groups of 400 rows (several per part, so statistics
#: decide which to read).
PINNED = Options(inline_threshold=0, batch_rows=400, stats_bytes=1024,
                 background_compaction=False,
                 compaction=CompactionPolicy(final_rows=400, fanin=1 << 20,
                                             inline_flush_bytes=1 << 62))
AS_OF = 2
#: Trials per region and key type (seeded): 2 x 100 = 200 damaged files. The native path
#: fails before any job on the tail's (page index to magic), so those are cheap; a page's
#: needs a Spark job per read (a damaged header's ~1.4 s on a loaded 2-core machine: DESIGN
#: §11 has a larger run of header flips alone).
TRIALS = {"page body": 6, "page header": 8, "page index": 14, "footer": 20,
          "footer stats": 32, "footer length": 4, "magic": 6, "truncation": 10}
SEED = 27

# -- the Parquet file's regions ----------------------------------------------------------------

Span = tuple[int, int]


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        x = b[i]
        i += 1
        out |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return out, i


def _skip(b: bytes, i: int, t: int, path: tuple[int, ...],
          fields: list[tuple[tuple[int, ...], int, int]]) -> int:
    """Skips one Thrift compact value of type ``t`` at ``i``; records every struct field's
    ``(path, start, end)`` (a list element's index is a path step too)."""
    if t in (1, 2):  # a bool field: its value is in the field header
        return i
    if t == 3:
        return i + 1
    if t in (4, 5, 6):
        return _varint(b, i)[1]
    if t == 7:
        return i + 8
    if t == 8:
        n, i = _varint(b, i)
        return i + n
    if t in (9, 10):
        head = b[i]
        i += 1
        n, et = head >> 4, head & 0x0F
        if n == 15:
            n, i = _varint(b, i)
        for k in range(n):
            i = i + 1 if et in (1, 2) else _skip(b, i, et, (*path, k), fields)
        return i
    if t == 11:
        n, i = _varint(b, i)
        if n:
            kv = b[i]
            i += 1
            for _ in range(n):
                i = _skip(b, i, kv >> 4, path, fields)
                i = _skip(b, i, kv & 0x0F, path, fields)
        return i
    if t == 12:
        fid = 0
        while True:
            head = b[i]
            i += 1
            if head == 0:
                return i
            delta, ft = head >> 4, head & 0x0F
            if delta:
                fid += delta
            else:
                z, i = _varint(b, i)
                fid = (z >> 1) ^ -(z & 1)
            start = i
            i = _skip(b, i, ft, (*path, fid), fields)
            fields.append(((*path, fid), start, i))
    raise ValueError(f"Thrift compact type {t}")


def _struct(b: bytes, at: int) -> tuple[int, dict[tuple[int, ...], Span]]:
    fields: list[tuple[tuple[int, ...], int, int]] = []
    end = _skip(b, at, 12, (), fields)
    return end, {p: (s, e) for p, s, e in fields}


def _int(b: bytes, span: Span) -> int:
    z = _varint(b, span[0])[0]
    return (z >> 1) ^ -(z & 1)


def regions(data: bytes) -> dict[str, list[Span]]:
    """The byte ranges of each region of a Parquet file (see the module docstring)."""
    n = len(data)
    footer_len = int.from_bytes(data[n - 8:n - 4], "little")
    footer = n - 8 - footer_len
    _, f = _struct(data, footer)
    stats = [s for p, s in f.items() if len(p) == 6 and p[0] == 4 and p[2] == 1
             and p[4] == 3 and p[5] == 12]
    chunks = [p[:4] for p in f if len(p) == 5 and p[0] == 4 and p[2] == 1 and p[4] == 3]
    headers: list[Span] = []
    bodies: list[Span] = []
    tail = 4
    for c in chunks:
        meta = (*c, 3)
        start = _int(data, f[(*meta, 9)])
        if (*meta, 11) in f:
            start = min(start, _int(data, f[(*meta, 11)]))
        end = start + _int(data, f[(*meta, 7)])
        tail = max(tail, end)
        at = start
        while at < end:
            head_end, h = _struct(data, at)
            size = _int(data, h[(3,)])
            headers.append((at, head_end))
            bodies.append((head_end, head_end + size))
            at = head_end + size
        assert at == end
    cuts = sorted(stats)
    rest: list[Span] = []
    at = footer
    for s, e in cuts:
        rest.append((at, s))
        at = e
    rest.append((at, n - 8))
    return {"page body": bodies, "page header": headers, "page index": [(tail, footer)],
            "footer": [r for r in rest if r[1] > r[0]], "footer stats": cuts,
            "footer length": [(n - 8, n - 4)], "magic": [(0, 4), (n - 4, n)]}


def _pick(rng: random.Random, spans: list[Span]) -> int:
    total = sum(e - s for s, e in spans)
    k = rng.randrange(total)
    for s, e in spans:
        if k < e - s:
            return s + k
        k -= e - s
    raise AssertionError


# -- the locations -----------------------------------------------------------------------------


def _updates(rng: np.random.Generator, n: int, string: bool) -> pa.Table:
    keys = rng.integers(0, 600, n)
    return pa.table({
        "key": pa.array([f"k{k:04d}" for k in keys]) if string else pa.array(keys),
        "value": pa.array(rng.integers(0, 3, n)),
        "time": pa.array(rng.integers(0, 4, n).astype(np.uint64)),
        "diff": pa.array(rng.choice(np.array([1, 1, -1]), n))})


def _location(root: Path, string: bool) -> None:
    """Two v4 parts of 2,000 updates at times 0-3 (row groups of 400), sealed to 4."""
    rng = np.random.default_rng(11)
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=PINNED)
    assert isinstance(ix, Engine)
    ix.fence()
    ix.register("c", pa.string() if string else pa.int64(), pa.int64())
    for _ in range(2):
        ix.write({"c": _updates(rng, 2000, string)})
    ix.seal("c", 4)
    parts = ix.state.collections["c"].parts
    assert len(parts) == 2
    assert all(p.parquet for p in parts)


def _files(root: Path) -> list[Path]:
    ix = Engine.open(FileBlob(root).read_only())
    return [root / p.blob_key for p in ix.state.collections["c"].parts if p.blob_key]


def canon(table: pa.Table) -> list[tuple[Any, ...]]:
    cols = [table.column(c).to_pylist() for c in ("key", "value", "time", "diff")]
    return sorted(zip(*cols, strict=True))


@dataclass(frozen=True)
class Read:
    """One read of one path: ``raw``, ``consolidated`` or ``filtered`` (consolidated, a key
    range pushed down)."""

    path: str
    mode: str


MODES = ("raw", "consolidated", "filtered")
READS = tuple(Read(p, m) for p in ("client", "python", "native") for m in MODES)


def _bound(string: bool) -> Any:
    return "k0300" if string else 300


def read(spark: Any, root: Path, r: Read, string: bool) -> list[tuple[Any, ...]]:
    bound = _bound(string)
    if r.path == "client":
        ix = Engine.open(FileBlob(root).read_only())
        if r.mode == "raw":
            snap = ix.snapshot("c", AS_OF)
            return canon(pa.concat_tables([*snap.batches(), snap.schema.empty_table()]))
        flt = col("key") >= bound if r.mode == "filtered" else None
        return canon(ix.snapshot("c", AS_OF, filter=flt).to_arrow())
    lit = f"'{bound}'" if string else str(bound)
    if r.path == "python":
        df = (spark.read.format("persist").option("collection", "c").option("as_of", AS_OF)
              .option("mode", "raw" if r.mode == "raw" else "consolidated").load(str(root)))
    else:
        df = PersistTable.forPath(spark, str(root), "c").toDF(
            as_of=AS_OF, consolidated=r.mode != "raw")
    if r.mode == "filtered":
        df = df.where(f"key >= {lit}")
    return canon(df.toArrow())


# -- the trials --------------------------------------------------------------------------------

CHECKSUM = ("ChecksumMismatch", "CRC checksum verification failed")


def outcome(fn: Callable[[], list[tuple[Any, ...]]], want: list[tuple[Any, ...]]) -> str:
    """``exact``, ``wrong`` (a silent wrong answer), ``persist`` (a persist error, or Spark's
    carrying one from a Python worker), ``crc`` (Spark's page checksum failure), or
    ``spark: <first line>`` (another error of Spark's reader)."""
    try:
        got = fn()
    except persist.PersistError:
        return "persist"
    except Exception as e:
        text = str(e)
        if "persist.errors" in text or "ChecksumMismatch" in text or "Corruption" in text:
            return "persist"
        if "CRC checksum verification failed" in text:
            return "crc"
        causes = [ln for ln in text.splitlines() if ln.startswith("Caused by:")]
        line = causes[-1] if causes else (text.splitlines() or [type(e).__name__])[0]
        return f"spark: {line.removeprefix('Caused by: ').strip()[:160]}"
    return "exact" if got == want else "wrong"


def _damage(rng: random.Random, data: bytes, region: str, spans: list[Span]) -> bytes:
    if region == "truncation":
        return data[:rng.randrange(len(data))]
    out = bytearray(data)
    out[_pick(rng, spans)] ^= 1 << rng.randrange(8)
    return bytes(out)


@pytest.mark.parametrize("string", [False, True], ids=["int64", "string"])
def test_every_damaged_part_reads_exactly_or_fails(spark: Any, tmp_path: Path,
                                                   string: bool) -> None:
    base = tmp_path / "base"
    _location(base, string)
    want = {r: read(spark, base, r, string) for r in READS if r.path == "client"}
    for r in READS:
        got = read(spark, base, r, string)
        assert got == want[Read("client", r.mode)], r
        assert got
    rng = random.Random(SEED + string)
    files = _files(base)
    seen: Counter[tuple[str, str, str]] = Counter()
    wrong: list[str] = []
    trial = 0
    for n, (region, count) in enumerate(TRIALS.items()):
        for i in range(count):
            trial += 1
            root = tmp_path / f"t{trial}"
            shutil.copytree(base, root)
            which = rng.randrange(len(files))
            target = root / files[which].relative_to(base)
            data = target.read_bytes()
            target.write_bytes(_damage(rng, data, region, regions(data).get(region, [])))
            for r in READS:
                # NB: a Python-source read of a damaged part costs seconds (the failing
                # worker is replaced), so it reads one damaged file per region (the first,
                # of the int64 key for even regions, the string key for odd ones), in a mode
                # that rotates over regions. It verifies as the client does (the same part
                # reader, whole-file crc32c), which reads every one.
                if r.path == "python" and (i or (n + string) % 2 or r.mode != MODES[n % 3]):
                    continue
                got = outcome(lambda r=r, root=root: read(spark, root, r, string),
                              want[Read("client", r.mode)])
                seen[(region, r.path, got)] += 1
                if got == "wrong":
                    wrong.append(f"trial {trial} ({region}, file {which}): {r}")
            shutil.rmtree(root)
    print(f"\n{'string' if string else 'int64'} keys, {trial} damaged files:")
    for (region, path, got), n in sorted(seen.items()):
        print(f"  {region:14} {path:7} {got}: {n}")
    assert not wrong, wrong
    for (region, path, got), _ in seen.items():
        if path in ("client", "python") or region not in ("page body", "page header"):
            # whole-file crc32c (client, Python source), tail checksum (native)
            assert got in ("persist", "exact"), (region, path, got)
        elif region == "page body":
            assert got in ("crc", "exact"), (region, path, got)
    # every flip in the tail is refused before Spark plans with it, in every mode
    for region in ("page index", "footer", "footer stats", "footer length", "truncation"):
        assert seen[(region, "native", "persist")] == len(MODES) * TRIALS[region], region
    assert seen[("page body", "native", "crc")] > 0
