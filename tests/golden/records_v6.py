"""Fixed records of storage format version 6 (incremental rollups: a manifest and a piece),
for the golden files."""

from __future__ import annotations

import msgspec

from persist import layout
from persist.indexed.format import meta
from persist.indexed.format.meta import CollectionMeta, Dropped, Manifest, PieceRef, Retired
from tests.golden.records import fixed_state, fixed_trim


def fixed_piece() -> dict[str, CollectionMeta]:
    """The collections of one piece: those of the version-1 golden state."""
    return dict(fixed_state().collections)


def fixed_manifest() -> Manifest:
    """A manifest of 4 buckets, naming the piece above and one other, with one dropped piece
    and a trim record."""
    data = meta.encode_piece(fixed_piece())
    return Manifest(
        seq=7, epoch=2, writer="golden", wall_ms=1_700_000_000_000, next_cid=9,
        retired=(Retired(key="data/1/old", seq=5, wall_ms=1_699_999_999_000),),
        buckets=4,
        pieces=(PieceRef(bucket=1, key=layout.piece_key("ab" * 16), count=3, nbytes=4096),
                PieceRef(bucket=2, key=layout.piece_key(_digest(data)),
                         count=len(fixed_piece()), nbytes=len(data))),
        dropped=(Dropped(key=layout.piece_key("cd" * 16), seq=6),),
        trim=fixed_trim())


def fixed_counted_manifest() -> Manifest:
    """:func:`fixed_manifest` with its pieces' forks counted (``Manifest.forked``): two in
    the first piece (bucket 1), none in the golden one."""
    return msgspec.structs.replace(fixed_manifest(), forked={1: 2})


def _digest(data: bytes) -> str:
    from persist.indexed.state.pieces import digest

    return digest(data)
