from __future__ import annotations

import uuid

import pytest

from persist.blob.memory import MemoryBlob
from tests.blob.conformance import BlobConformance


class TestMemoryBlob(BlobConformance):
    @pytest.fixture
    def blob(self) -> MemoryBlob:
        return MemoryBlob(f"test-{uuid.uuid4().hex}")


def test_same_name_shares_one_store() -> None:
    name = f"shared-{uuid.uuid4().hex}"
    a, b = MemoryBlob(name), MemoryBlob(name)
    a.set("k", b"v")
    assert b.get("k") == b"v"
    MemoryBlob.forget(name)
    assert MemoryBlob(name).get("k") is None
