"""The tail checksum of a Parquet part (``PartStats.tail``) keeps its bytes forever
(``make_golden_tail``), changes no byte of a part that does not record one, and is ignored by
a persist that predates it."""

from __future__ import annotations

from pathlib import Path

import msgspec

from persist import layout
from persist.indexed.format import meta
from persist.indexed.format.meta import AddPart
from persist.indexed.format.stats import BatchStats, LeafStats, Tail
from tests.golden.records_tail import STATS, TAIL_ONLY, TAILED, fixed_commit

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "tail-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    decoded = meta.decode_commit(layout.log_key(9), golden)
    assert decoded.version == meta.PARQUET_FORMAT_VERSION == 4
    assert decoded == msgspec.structs.replace(fixed_commit(), version=4)
    parts = [op.part for op in decoded.ops if isinstance(op, AddPart)]
    assert [p.stats.tail for p in parts if not isinstance(p.stats, msgspec.UnsetType)] == [
        Tail(1_234_567, 0x89ABCDEF), Tail(4, 0)]


def test_without_a_tail_the_bytes_are_the_older_ones() -> None:
    """A part that records no tail is encoded as before the field existed (the v4 golden
    files pin those bytes); one that does differs only by the field."""
    bare = msgspec.structs.replace(TAILED, stats=msgspec.structs.replace(STATS, tail=None))
    with_tail = meta.encode(msgspec.structs.replace(fixed_commit(), ops=(AddPart("plain",
                                                                                 TAILED),)))
    without = meta.encode(msgspec.structs.replace(fixed_commit(), ops=(AddPart("plain",
                                                                               bare),)))
    assert b"tail" in with_tail
    assert b"tail" not in without
    assert len(with_tail) > len(without)


def test_an_older_persist_ignores_the_tail() -> None:
    class OldStats(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
        leaves: tuple[LeafStats, ...] = ()
        batch_rows: tuple[int, ...] = ()
        batches: tuple[BatchStats, ...] = ()

    for part in (TAILED, TAIL_ONLY):
        assert not isinstance(part.stats, msgspec.UnsetType)
        raw = msgspec.msgpack.encode(part.stats)
        old = msgspec.msgpack.decode(raw, type=OldStats)
        assert old == OldStats(leaves=part.stats.leaves, batch_rows=part.stats.batch_rows,
                               batches=part.stats.batches)
