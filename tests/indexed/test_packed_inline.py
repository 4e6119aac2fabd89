"""Compressed inline parts (metadata format 9): an inline part's Arrow stream is stored as
one LZ4 block when that saves an eighth of its bytes, reads back exactly, makes the records
holding it version 9, and a damaged frame is a typed error."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from persist.blob.file import FileBlob
from persist.errors import Corruption
from persist.indexed.engine import Options
from persist.indexed.format import columnar, meta, transfer
from persist.indexed.format.meta import PartMeta
from tests.support.engine import Engine

#: Inline parts are what is tested: not under a knob set that makes every part a blob.
pytestmark = pytest.mark.knobs("default")

SCHEMA = columnar.part_schema(pa.int64(), pa.int64())


def _rows(n: int, seed: int = 1) -> pa.Table:
    """``n`` updates as the benchmarks write them: random 40-bit ids, values below a million,
    one time, diff 1."""
    rng = np.random.default_rng(seed)
    return pa.table({"key": pa.array(rng.integers(0, 1 << 40, n)),
                     "value": pa.array(rng.integers(0, 1_000_000, n)),
                     "time": pa.array(np.full(n, 3, np.uint64)),
                     "diff": pa.array(np.ones(n, np.int64))}, schema=SCHEMA)


def _engine(path: Path) -> Engine:
    ix = Engine.open(FileBlob(path), epoch=1, writer="w")
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    return ix


def _log_entry_bytes(path: Path) -> list[int]:
    return sorted(p.stat().st_size for p in (path / "meta" / "log").rglob("*") if p.is_file())


def test_an_append_is_stored_compressed_and_reads_back_exactly(tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    rows = _rows(100)
    state = ix.write({"c": rows})
    (part,) = state.collections["c"].parts
    plain, _ = columnar.encode_batches(rows)
    assert part.packed
    assert part.inline is not None
    assert part.nbytes == len(part.inline) < 0.5 * plain.size
    ix.seal("c", 4)
    state = ix.state
    assert ix.snapshot("c", 3).to_arrow().sort_by("key").equals(rows.sort_by("key"))
    # a rollup holding it is format 9 (the commit adding it: the golden files)
    assert meta.required_version(state) == meta.PACKED_FORMAT_VERSION == 9
    reopened = Engine.open(FileBlob(tmp_path).read_only(), epoch=0, writer="r")
    assert reopened.snapshot("c", 3).to_arrow().sort_by("key").equals(rows.sort_by("key"))


def test_log_entries_of_small_appends_are_about_half_their_plain_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the format is for: the log and the rollups are mostly inline parts."""
    packed, plain = tmp_path / "packed", tmp_path / "plain"
    ix = _engine(packed)
    for i in range(5):
        ix.write({"c": _rows(100, seed=i)})
    monkeypatch.setattr(columnar, "INLINE_PACK_SHARE", 0.0)  # as a persist before format 9 stored
    ix = _engine(plain)
    for i in range(5):
        ix.write({"c": _rows(100, seed=i)})
    big = _log_entry_bytes(packed)[-5:]
    was = _log_entry_bytes(plain)[-5:]
    assert min(was) > 4000
    assert max(big) < 0.55 * min(was)
    assert all(not p.packed for p in ix.state.collections["c"].parts)
    assert meta.required_version(ix.state) < meta.PACKED_FORMAT_VERSION


def test_a_part_that_does_not_compress_keeps_its_plain_stream() -> None:
    rng = random.Random(7)
    table = pa.table({"key": pa.array([rng.randbytes(200) for _ in range(40)], pa.binary()),
                      "value": pa.array([rng.randbytes(200) for _ in range(40)], pa.binary()),
                      "time": pa.array([1] * 40, pa.uint64()),
                      "diff": pa.array([1] * 40, pa.int64())},
                     schema=columnar.part_schema(pa.binary(), pa.binary()))
    data, _ = columnar.encode_batches(table)
    stored = columnar.pack_inline(data)
    assert stored == data.to_pybytes()
    assert not columnar.is_packed(stored)
    assert columnar.decode_part("k", stored, table.schema).equals(table)


def _frame() -> bytes:
    data, _ = columnar.encode_batches(_rows(100))
    stored = columnar.pack_inline(data)
    assert columnar.is_packed(stored)
    return stored


def _damaged() -> dict[str, bytes]:
    good = _frame()
    size = int.from_bytes(good[4:8], "little")
    return {
        "header cut short": good[:6],
        "no body": good[:8],
        "body cut short": good[: len(good) // 2],
        "a size past LZ4's ratio": good[:4] + (300 * len(good)).to_bytes(4, "little")
                                   + good[8:],
        "a size larger than the block": good[:4] + (size + 100).to_bytes(4, "little")
                                        + good[8:],
        "a size smaller than the block": good[:4] + (size - 100).to_bytes(4, "little")
                                         + good[8:],
    }


@pytest.mark.parametrize("case", list(_damaged()))
def test_a_damaged_frame_is_corruption_on_every_decode(case: str) -> None:
    data = _damaged()[case]
    with pytest.raises(Corruption, match="compressed inline part"):
        columnar.decode_part("k", data, SCHEMA)
    with pytest.raises(Corruption, match="compressed inline part"):
        columnar.decode_batches("k", data, SCHEMA, [True])


def test_a_staged_inline_part_with_a_damaged_frame_is_refused_before_a_commit() -> None:
    good = _frame()
    part = PartMeta(id="x", rows=100, nbytes=len(good) // 2, min_time=3, max_time=3,
                    inline=good[: len(good) // 2], inserted=100, retracted=0)
    with pytest.raises(Corruption, match="inline part x"):
        transfer.check_inline(part, SCHEMA)


def test_compaction_merges_compressed_parts_exactly(tmp_path: Path) -> None:
    """Six compressed inline appends are tiered (decoded from their frames, merged, written
    again) and read as the sum of what was written."""
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w",
                     options=Options(gc_grace_seconds=0))
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    tables = [_rows(100, seed=i) for i in range(6)]
    for t in tables:
        ix.write({"c": t})
    ix.seal("c", 4)
    ix.allow_compaction("c", 3)
    ix.maintain()
    parts = ix.state.collections["c"].parts
    assert len(parts) < 6
    want = pa.concat_tables(tables).group_by(["key", "value"]).aggregate([("diff", "sum")])
    got = ix.snapshot("c", 3).to_arrow()
    assert sorted(zip(got["key"].to_pylist(), got["value"].to_pylist(), got["diff"].to_pylist(),
                      strict=True)) == sorted(zip(want["key"].to_pylist(),
                                                  want["value"].to_pylist(),
                                                  want["diff_sum"].to_pylist(), strict=True))
