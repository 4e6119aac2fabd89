from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock
from tests.lock.conformance import LockConformance, MakeLock


class TestMemoryLock(LockConformance):
    @pytest.fixture
    def make_lock(self) -> MakeLock:
        name = uuid.uuid4().hex
        return lambda **kw: MemoryLock(name, **kw)


class TestFileLock(LockConformance):
    @pytest.fixture
    def make_lock(self, tmp_path: Path) -> MakeLock:
        def make(**kw: Any) -> FileLock:
            return FileLock(tmp_path, **kw)

        return make
