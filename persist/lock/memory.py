"""An in-process writer lock, shared by name (pairs with ``mem://`` locations)."""

from __future__ import annotations

import threading
from typing import ClassVar

from typing_extensions import override

from persist.lock.base import LockRecord, WriterLock


class MemoryLock(WriterLock):
    _registry: ClassVar[dict[str, list[LockRecord | None]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, **kw: float) -> None:
        super().__init__(**kw)
        with MemoryLock._mutex:
            self._cell = MemoryLock._registry.setdefault(name, [None])

    @override
    def _read(self) -> LockRecord | None:
        with MemoryLock._mutex:
            return self._cell[0]

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord) -> bool:
        with MemoryLock._mutex:
            if self._cell[0] != expected:
                return False
            self._cell[0] = new
            return True
