"""A rollup recording the metadata trim's progress (``State.trim``): its bytes are pinned, it
is read back whole, and a persist that predates the field reads the same state from it (the
field is optional and ignorable: DESIGN.md §9)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from persist import layout
from persist.indexed.format import meta
from persist.indexed.format.meta import CollectionMeta, Retired
from tests.golden.records import fixed_state, fixed_trim

HERE = Path(__file__).parent
KEY = layout.rollup_key(7)


class _StateBeforeTrim(msgspec.Struct, frozen=True, kw_only=True):
    """``State`` as a persist before the trim record decodes it (the same fields, no trim)."""

    version: int = meta.BASE_FORMAT_VERSION
    seq: int = 0
    epoch: int = 0
    writer: str = ""
    wall_ms: int = 0
    next_cid: int = 1
    collections: dict[str, CollectionMeta] = msgspec.field(default_factory=dict)
    retired: tuple[Retired, ...] = ()


def test_rollup_with_a_trim_record_bytes_are_pinned() -> None:
    golden = (HERE / "trim-state.bin").read_bytes()
    assert meta.encode_rollup(fixed_state(), fixed_trim()) == golden
    assert meta.decode_rollup(KEY, golden) == (fixed_state(), fixed_trim())
    assert meta.decode_state(KEY, golden) == fixed_state()  # the record is no part of the state


def test_a_rollup_without_a_record_keeps_its_version_1_bytes() -> None:
    golden = (HERE / "v1-state.bin").read_bytes()
    assert meta.encode_rollup(fixed_state(), None) == golden
    assert meta.decode_rollup(KEY, golden) == (fixed_state(), None)


def test_a_persist_before_the_record_reads_the_same_state() -> None:
    golden = (HERE / "trim-state.bin").read_bytes()
    assert msgspec.msgpack.decode(golden, type=meta._Versioned).version == 1  # no version bump
    old = msgspec.msgpack.decode(golden, type=_StateBeforeTrim)
    want = fixed_state()
    assert msgspec.structs.asdict(old) == {
        f: getattr(want, f) for f in _StateBeforeTrim.__struct_fields__}
