"""Storage format version 5 (forks: references and time cuts; restores) and named holds (which
need no version) stay readable forever: these bytes were written by the persist that introduced
them (``make_golden_v5``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import meta
from persist.indexed.format.meta import Register, Restore, SetHold
from tests.golden.make_golden_v5 import expected_of
from tests.golden.records_v5 import fixed_commit, fixed_restore, fixed_state

HERE = Path(__file__).parent


@pytest.mark.parametrize(("name", "make", "key"), [
    ("v5-commit.bin", fixed_commit, layout.log_key(7)),
    ("v5-restore.bin", fixed_restore, layout.log_key(8))])
def test_commit_bytes_are_pinned(name: str, make: object, key: str) -> None:
    golden = (HERE / name).read_bytes()
    record = make()  # type: ignore[operator]
    assert meta.encode(record) == golden
    decoded = meta.decode_commit(key, golden)
    assert decoded.version == meta.REFS_FORMAT_VERSION == 5
    assert decoded == msgspec.structs.replace(record, version=5)


def test_state_bytes_are_pinned() -> None:
    golden = (HERE / "v5-state.bin").read_bytes()
    assert meta.encode(fixed_state()) == golden
    decoded = meta.decode_state(layout.rollup_key(7), golden)
    assert decoded == msgspec.structs.replace(fixed_state(), version=5)
    source, fork = decoded.collections["events"], decoded.collections["events-copy"]
    assert meta.collection_version(source) == 1  # named holds need no version
    assert meta.collection_version(fork) == 5
    assert layout.parse_ref(fork.parts[0].blob_key or "") == (None, "data/1/aa", 3)
    assert layout.parse_ref(fork.parts[1].blob_key or "") == ("/srv/persist/other",
                                                              "data/4/bb", None)


def test_named_holds_alone_keep_older_bytes() -> None:
    """A commit of tags and holds (no fork) is version 1: an older persist reads it, as a
    plain hold, and a lapse as a release."""
    ops = tuple(op for op in fixed_commit().ops if isinstance(op, SetHold))
    commit = msgspec.structs.replace(fixed_commit(), ops=ops)
    assert meta.required_version(commit) == 1


def test_v5_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v5-location", loc)
    expected = json.loads((HERE / "v5-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        assert expected_of(replica) == expected
        assert meta.required_version(replica.state) == 5


def test_v5_location_logs_only_forks_and_restores_as_version_5() -> None:
    blob = FileBlob(HERE / "v5-location")
    by_kind: dict[str, set[int]] = {}
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        kinds = {type(op) for op in commit.ops}
        forked = any(isinstance(op, Register) and meta.borrows(op.collection)
                     for op in commit.ops)
        kind = ("restore" if Restore in kinds else "fork" if forked
                else "hold" if SetHold in kinds else "other")
        by_kind.setdefault(kind, set()).add(commit.version)
    assert by_kind["restore"] == {5}
    assert by_kind["fork"] == {5}
    assert by_kind["hold"] == {1}
    assert by_kind["other"] == {1}


def test_an_older_persist_refuses_the_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A persist that reads up to version 4 stops at the first version-5 record, before it
    could show a fork's hidden rows or let its GC delete a blob a fork still reads."""
    monkeypatch.setattr(meta, "FORMAT_VERSION", 4)
    with pytest.raises(IncompatibleFormat, match="format version 5"):
        Indexed.open(FileBlob(HERE / "v5-location").read_only())
    for name, seq in (("v5-commit.bin", 7), ("v5-restore.bin", 8)):
        with pytest.raises(IncompatibleFormat):
            meta.decode_commit(layout.log_key(seq), (HERE / name).read_bytes())


def test_reads_as_of_the_golden_tag() -> None:
    with persist.open(HERE / "v5-location", read_only=True) as replica:
        _, r = replica.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert r.tag("q3-close") == 2
        assert r.snapshot(r.tag("q3-close")).to_python()
