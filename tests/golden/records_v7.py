"""Fixed records of storage format version 7 (the sharded log: the commit that shards it, and
rollups of a sharded log, whole and as a manifest), for the golden files."""

from __future__ import annotations

import msgspec

from persist.indexed.format.meta import Commit, Manifest, State
from tests.golden.records import fixed_state, fixed_trim
from tests.golden.records_v6 import fixed_manifest


def fixed_switch() -> Commit:
    """The commit that shards the log: a writer's fence at seq 8, its entries from 9 on
    stored under shards."""
    return Commit(seq=8, epoch=4, writer="golden", wall_ms=1_700_000_000_000, log_from=9)


def fixed_sharded_state() -> State:
    """The version-1 golden state, of a log sharded from seq 5 on, with a trim record."""
    return msgspec.structs.replace(fixed_state(), log_from=5, trim=fixed_trim())


def fixed_sharded_manifest() -> Manifest:
    """The version-6 golden manifest, of a log sharded from seq 5 on (so version 7)."""
    return msgspec.structs.replace(fixed_manifest(), log_from=5, version=7)
