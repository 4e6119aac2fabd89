"""Storage format version 8 (marks: compaction's marks step) stays readable forever, and a
persist that predates it refuses a marked location rather than read the rows its marks hide:
these bytes were written by the persist that introduced it (``make_golden_v8``)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import meta
from persist.indexed.format.meta import CollectionMeta
from tests.golden.pinning import pinned_records, reads_identically
from tests.golden.records_v8 import fixed_marked_state, fixed_marks_step, unmarked_part

HERE = Path(__file__).parent


def test_records_are_pinned() -> None:
    got = pinned_records(8, fixed_marks_step(), fixed_marked_state())
    marked = got.collections["marked"].parts[0]
    assert marked.marks is not None
    assert marked.marks.count == 2
    assert marked.blob_key == unmarked_part().blob_key
    assert meta.MARKS_FORMAT_VERSION == 8 < meta.FORMAT_VERSION
    # an unmarked part keeps its bytes (marks omitted while None)
    assert b"marks" not in meta.encode(msgspec.structs.replace(
        fixed_marked_state(), collections={}))


def _marked(c: CollectionMeta) -> None:
    assert any(p.marks is not None and p.marks.count for p in c.parts)


def test_v8_location_reads_identically(tmp_path: Path) -> None:
    reads_identically(8, tmp_path, _marked)


def test_an_older_persist_refuses_a_marked_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta, "FORMAT_VERSION", 7)
    with pytest.raises(IncompatibleFormat, match="format version 8"):
        Indexed.open(FileBlob(HERE / "v8-location").read_only())
    for name in ("v8-commit.bin", "v8-state.bin"):
        with pytest.raises(IncompatibleFormat, match="format version 8"):
            meta.decode_commit(layout.log_key(9), (HERE / name).read_bytes())
