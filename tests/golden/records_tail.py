"""A fixed commit whose encoding is pinned in tests/golden/tail-commit.bin: Parquet parts that
record their tail checksum (``PartStats.tail``), with field stats and without (stats budget
0). The tail needs no format version of its own: the commit is version 4 as before."""

from __future__ import annotations

from persist.indexed.format.meta import AddPart, Commit, PartMeta
from persist.indexed.format.stats import BatchStats, LeafStats, PartStats, Tail

STATS = PartStats(leaves=(LeafStats("key", 0, 0, 1, 9), LeafStats("value", 0, 0, b"a", b"z")),
                  batch_rows=(2, 1), batches=(BatchStats("key", (1, 7), (5, 9)),),
                  tail=Tail(1_234_567, 0x89ABCDEF))
TAILED = PartMeta(id="p4", rows=3, nbytes=1_240_000, min_time=5, max_time=6,
                  blob_key="data/2/p4", stats=STATS, inserted=3, retracted=0,
                  checksum=0x01234567, sorted=True)
#: A part written with a stats budget of 0: stats holding only the tail.
TAIL_ONLY = PartMeta(id="p5", rows=2, nbytes=900, min_time=6, max_time=6,
                     blob_key="data/2/p5", stats=PartStats(tail=Tail(4, 0)), inserted=2,
                     retracted=0, checksum=0xFEDCBA98, sorted=True)


def fixed_commit() -> Commit:
    return Commit(seq=9, epoch=3, writer="w", wall_ms=1_700_000_000_000, ops=(
        AddPart(name="plain", part=TAILED), AddPart(name="plain", part=TAIL_ONLY)))
