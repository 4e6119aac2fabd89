"""A fixed commit whose encoding is pinned in tests/golden/groups-commit.bin: a Parquet part
that records its row groups' byte ranges and checksums (``PartStats.groups``) beside its tail,
and one written with a stats budget of 0 (stats holding only the tail and the row groups).
They need no format version of their own: the commit is version 4 as before."""

from __future__ import annotations

from persist.indexed.format.meta import AddPart, Commit, PartMeta
from persist.indexed.format.stats import BatchStats, Groups, LeafStats, PartStats, Tail

STATS = PartStats(leaves=(LeafStats("key", 0, 0, 1, 9),),
                  batch_rows=(2, 1), batches=(BatchStats("key", (1, 7), (5, 9)),),
                  tail=Tail(1_234_567, 0x89ABCDEF),
                  groups=Groups((4, 600_000, 1_234_567), (0x01020304, 0xFFEEDDCC)))
GROUPED = PartMeta(id="p6", rows=3, nbytes=1_240_000, min_time=5, max_time=6,
                   blob_key="data/2/p6", stats=STATS, inserted=3, retracted=0,
                   checksum=0x01234567, sorted=True)
#: A part written with a stats budget of 0: stats holding only the tail and the row groups.
GROUPS_ONLY = PartMeta(id="p7", rows=2, nbytes=900, min_time=6, max_time=6,
                       blob_key="data/2/p7",
                       stats=PartStats(tail=Tail(800, 7), groups=Groups((4, 400, 800), (1, 2))),
                       inserted=2, retracted=0, checksum=0xFEDCBA98, sorted=True)


def fixed_commit() -> Commit:
    return Commit(seq=11, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        AddPart(name="plain", part=GROUPED), AddPart(name="plain", part=GROUPS_ONLY)))
