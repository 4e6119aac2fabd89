"""A Parquet part's tail checksum (``PartStats.tail``): recorded where the part is written,
exactly the bytes from the end of its last page to the end of the file (page index, footer,
length, magic), verified by one ranged read before another engine's reader may trust them
(:mod:`persist.indexed.read.tail`), and checked by ``verify``."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import crc32c
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from persist.blob.file import FileBlob
from persist.errors import ChecksumMismatch, PartMissing
from persist.indexed.engine import Options, Txn
from persist.indexed.format import stats
from persist.indexed.format.meta import AddPart, PartMeta
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import verify
from persist.indexed.read import tail
from tests.support.engine import Engine

PINNED = Options(inline_threshold=0, batch_rows=300, stats_bytes=1024,
                 background_compaction=False,
                 compaction=CompactionPolicy(final_rows=300, fanin=1 << 20,
                                             inline_flush_bytes=1 << 62))


def _engine(root: Path, options: Options = PINNED) -> Engine:
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=options)
    assert isinstance(ix, Engine)
    ix.fence()
    return ix


def _part(root: Path, *, string: bool = False, options: Options = PINNED) -> PartMeta:
    ix = _engine(root, options)
    ix.register("c", pa.string() if string else pa.int64(), pa.int64())
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 500, 2000)
    ix.write({"c": pa.table({
        "key": pa.array([f"k{k}" for k in keys]) if string else pa.array(keys),
        "value": pa.array(rng.integers(0, 3, 2000)),
        "time": pa.array(rng.integers(0, 4, 2000).astype(np.uint64)),
        "diff": pa.array(np.ones(2000, dtype=np.int64))})})
    ix.seal("c", 4)
    (p,) = ix.state.collections["c"].parts
    return p


@pytest.mark.parametrize("string", [False, True])
def test_the_tail_is_what_follows_the_last_page(tmp_path: Path, string: bool) -> None:
    p = _part(tmp_path, string=string)
    assert p.parquet
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    t = p.stats.tail
    assert t is not None
    data = (tmp_path / p.blob_key).read_bytes()
    assert t.crc == crc32c.crc32c(data[t.offset:])
    md = pq.read_metadata(io.BytesIO(data))
    assert md.num_row_groups == 7
    last = 0
    for i in range(md.num_row_groups):
        for j in range(md.num_columns):
            c = md.row_group(i).column(j)
            assert c.has_column_index
            assert c.has_offset_index
            start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
            last = max(last, start + c.total_compressed_size)
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    # every page lies before the tail; the page index and the footer inside it
    assert t.offset == last < footer
    assert data[t.offset:footer]  # the page index
    assert pq.ParquetFile(io.BytesIO(data), page_checksum_verification=True).read().num_rows \
        == 2000


def test_a_part_without_stats_still_records_its_tail(tmp_path: Path) -> None:
    p = _part(tmp_path, options=dataclasses.replace(PINNED, stats_bytes=0))
    assert not isinstance(p.stats, msgspec.UnsetType)
    assert p.stats.leaves == ()
    assert p.stats.batches == ()
    assert p.stats.tail is not None


def test_an_older_part_stats_reads_without_the_tail_and_keeps_its_bytes() -> None:
    class Before(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
        """``PartStats`` as a persist before the tail checksum has it."""

        leaves: tuple[stats.LeafStats, ...] = ()
        batch_rows: tuple[int, ...] = ()
        batches: tuple[stats.BatchStats, ...] = ()

    leaves = (stats.LeafStats("key", 0, 0, 1, 9),)
    old = msgspec.msgpack.encode(Before(leaves=leaves, batch_rows=(3, 4)))
    # no tail: the bytes of every part written before it
    assert msgspec.msgpack.encode(stats.PartStats(leaves=leaves, batch_rows=(3, 4))) == old
    new = msgspec.msgpack.encode(stats.PartStats(leaves=leaves, tail=stats.Tail(123, 0xABCD)))
    # an older persist ignores it
    assert msgspec.msgpack.decode(new, type=Before) == Before(leaves=leaves)
    assert msgspec.msgpack.decode(new, type=stats.PartStats).tail == stats.Tail(123, 0xABCD)


def test_verify_tail_reads_the_tail_once_and_names_a_damaged_part(tmp_path: Path) -> None:
    tail.forget()
    p = _part(tmp_path)
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    t = p.stats.tail
    assert t is not None
    blob = FileBlob(tmp_path).read_only()
    assert tail.verify_tail(blob, p.blob_key, p) is True
    path = tmp_path / p.blob_key
    good = path.read_bytes()
    footer = len(good) - 8 - int.from_bytes(good[-8:-4], "little")
    for at in (t.offset, (t.offset + footer) // 2, footer + 5, len(good) - 6, len(good) - 1):
        path.write_bytes(good)
        assert tail.verify_tail(blob, p.blob_key, p) is True
        bad = bytearray(good)
        bad[at] ^= 0x08
        path.write_bytes(bytes(bad))
        # remembered per process: a verified tail is not read again ...
        assert tail.verify_tail(blob, p.blob_key, p) is True
        tail.forget()
        # ... read afresh, a flipped bit is a ChecksumMismatch naming the part
        with pytest.raises(ChecksumMismatch, match=f"part {p.id}"):
            tail.verify_tail(blob, p.blob_key, p)
    for cut in (len(good) - 1, t.offset + 1, t.offset, 10):
        path.write_bytes(good[:cut])
        with pytest.raises(ChecksumMismatch, match="truncated or grew"):
            tail.verify_tail(blob, p.blob_key, p)
    path.write_bytes(good + b"\0")
    with pytest.raises(ChecksumMismatch, match="truncated or grew"):
        tail.verify_tail(blob, p.blob_key, p)
    path.unlink()
    with pytest.raises(PartMissing, match=p.id):
        tail.verify_tail(blob, p.blob_key, p)
    path.write_bytes(good)
    assert tail.verify_tail(blob, p.blob_key, p) is True
    # a part that recorded no tail cannot be verified: False (persist reads it)
    assert isinstance(p.stats, stats.PartStats)
    untailed = msgspec.structs.replace(p, stats=msgspec.structs.replace(p.stats, tail=None))
    assert tail.verify_tail(blob, p.blob_key, untailed) is False
    assert tail.verify_tail(blob, p.blob_key, msgspec.structs.replace(p, stats=msgspec.UNSET)) \
        is False


def test_verify_reports_a_tail_record_that_is_not_the_tail(tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    ix.write({"c": pa.table({"key": pa.array(np.arange(1000)),
                             "value": pa.array(np.arange(1000)),
                             "time": pa.array(np.zeros(1000, dtype=np.uint64)),
                             "diff": pa.array(np.ones(1000, dtype=np.int64))})})
    assert verify(ix.blob).problems == []
    (p,) = ix.state.collections["c"].parts
    assert p.blob_key is not None
    assert isinstance(p.stats, stats.PartStats)
    assert p.stats.tail is not None
    # the same file again, as a part whose tail record is wrong (a writer's bug)
    key = p.blob_key.rsplit("/", 1)[0] + "/" + "f" * 32
    (tmp_path / key).write_bytes((tmp_path / p.blob_key).read_bytes())
    wrong = msgspec.structs.replace(p.stats, tail=stats.Tail(p.stats.tail.offset,
                                                             p.stats.tail.crc ^ 1))
    txn = Txn(ix.state)
    txn.stage(AddPart(name="c", part=msgspec.structs.replace(p, id="f" * 32, blob_key=key,
                                                             stats=wrong)))
    ix.commit(txn)
    report = verify(ix.blob)
    assert [q for q in report.problems if "recorded Parquet tail" in q] == [
        f"c: {key}'s recorded Parquet tail (from byte {p.stats.tail.offset}, crc32c "
        f"{p.stats.tail.crc ^ 1:#010x}) is not its tail"], report.problems
