"""The row groups of a Parquet part (``PartStats.groups``: byte ranges and checksums) keep
their bytes forever (``make_golden_groups``), change no byte of a part that does not record
them, and are ignored by a persist that predates them (it reads such a part whole)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from persist import layout
from persist.indexed.format import meta
from persist.indexed.format.meta import AddPart
from persist.indexed.format.stats import BatchStats, Groups, LeafStats, Tail
from tests.golden.records_groups import GROUPED, GROUPS_ONLY, STATS, fixed_commit

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "groups-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    decoded = meta.decode_commit(layout.log_key(11), golden)
    assert decoded.version == meta.PARQUET_FORMAT_VERSION == 4
    assert decoded == msgspec.structs.replace(fixed_commit(), version=4)
    parts = [op.part for op in decoded.ops if isinstance(op, AddPart)]
    assert [p.stats.groups for p in parts if not isinstance(p.stats, msgspec.UnsetType)] == [
        Groups((4, 600_000, 1_234_567), (0x01020304, 0xFFEEDDCC)), Groups((4, 400, 800), (1, 2))]


def test_without_row_groups_the_bytes_are_the_older_ones() -> None:
    """A part that records no row groups is encoded as before the field existed (the tail's
    golden file pins those bytes); one that does differs only by the field."""
    bare = msgspec.structs.replace(GROUPED, stats=msgspec.structs.replace(STATS, groups=None))
    with_groups = meta.encode(msgspec.structs.replace(
        fixed_commit(), ops=(AddPart("plain", GROUPED),)))
    without = meta.encode(msgspec.structs.replace(fixed_commit(), ops=(AddPart("plain", bare),)))
    assert b"groups" in with_groups
    assert b"groups" not in without
    assert len(with_groups) > len(without)


def test_an_older_persist_ignores_the_row_groups() -> None:
    class OldStats(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
        leaves: tuple[LeafStats, ...] = ()
        batch_rows: tuple[int, ...] = ()
        batches: tuple[BatchStats, ...] = ()
        tail: Tail | None = None

    for part in (GROUPED, GROUPS_ONLY):
        assert not isinstance(part.stats, msgspec.UnsetType)
        raw = msgspec.msgpack.encode(part.stats)
        old = msgspec.msgpack.decode(raw, type=OldStats)
        assert old == OldStats(leaves=part.stats.leaves, batch_rows=part.stats.batch_rows,
                               batches=part.stats.batches, tail=part.stats.tail)
