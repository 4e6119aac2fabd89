"""What the golden tests of one format version share: the pinned records' bytes, and a golden
location read as it was written and then written on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.format import meta
from persist.indexed.format.meta import CollectionMeta, Commit, State
from persist.indexed.maintenance.verify import verify
from tests.golden.make_golden_v8 import expected_of

HERE = Path(__file__).parent


def pinned_records(version: int, commit: Commit, state: State) -> State:
    """Checks that ``commit`` and ``state`` (of seq 9) encode to the bytes pinned in
    ``v<version>-commit.bin`` and ``v<version>-state.bin`` and decode back from them as records of
    ``version``; returns the decoded state."""
    commit_bytes = (HERE / f"v{version}-commit.bin").read_bytes()
    state_bytes = (HERE / f"v{version}-state.bin").read_bytes()
    assert meta.encode(commit) == commit_bytes
    assert meta.encode(state) == state_bytes
    assert meta.decode_commit(layout.log_key(9), commit_bytes) == msgspec.structs.replace(
        commit, version=version)
    got = meta.decode_state(layout.rollup_key(9), state_bytes)
    assert got == msgspec.structs.replace(state, version=version)
    return got


def reads_identically(version: int, tmp_path: Path, check: Callable[[CollectionMeta], None]
                      ) -> None:
    """A copy of ``v<version>-location`` reads as its expected snapshots in a replica (whose
    collection ``c0`` passes ``check``) and verifies clean; a writer then appends to it,
    compacts and reads what it wrote, and it still verifies clean."""
    loc = tmp_path / "loc"
    shutil.copytree(HERE / f"v{version}-location", loc)
    expected = json.loads((HERE / f"v{version}-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        check(replica.state.collections["c0"])
        assert expected_of(replica) == expected
    assert verify(FileBlob(loc).read_only()).problems == []
    with persist.open(loc, reentrance_id="golden") as client:
        w, r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        w.append([((5000, 1), r.upper, 1)], upper=r.upper + 1).result()
        w.allow_compaction(r.upper - 1).result()
        client.maintain()
        assert expected_of(client)["c0"]["snapshots"][str(r.upper - 1)][-1] == [5000, 1, 1]
    assert verify(FileBlob(loc).read_only()).problems == []
