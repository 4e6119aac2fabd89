"""An in-memory Blob, shareable between handles of one process by name (``mem://name``)."""

from __future__ import annotations

import threading
from typing import ClassVar

from typing_extensions import override

from persist.blob.base import Blob
from persist.blob.envelope import Framed


class MemoryBlob(Blob):
    """A dict behind a lock. Opening the same ``name`` twice gives two handles on one store."""

    _registry: ClassVar[dict[str, tuple[threading.Lock, dict[str, bytes]]]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        if name is None:
            self._lock = threading.Lock()
            self._data: dict[str, bytes] = {}
        else:
            with MemoryBlob._registry_lock:
                if name not in MemoryBlob._registry:
                    MemoryBlob._registry[name] = (threading.Lock(), {})
                self._lock, self._data = MemoryBlob._registry[name]
        self.is_local = True

    @classmethod
    def forget(cls, name: str) -> None:
        """Drops the shared store ``name`` (tests use it to start clean)."""
        with cls._registry_lock:
            cls._registry.pop(name, None)

    @override
    def locator(self) -> tuple[str, str] | None:
        return None if self.name is None else ("mem", self.name)

    @override
    def sibling(self, root: str) -> Blob:
        return MemoryBlob(root)

    @override
    def _get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | None:
        with self._lock:
            data = self._data.get(key)
        return None if data is None else data[start:end]

    @override
    def _list(self, prefix: str) -> list[str]:
        with self._lock:
            return [k for k in self._data if k.startswith(prefix)]

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        with self._lock:
            return [k for k in self._data if k.startswith(prefix) and k > start_after]

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        value = bytes(data)
        with self._lock:
            self._data[key] = value

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        value = bytes(data)
        with self._lock:
            if key in self._data:
                return False
            self._data[key] = value
            return True

    @override
    def _delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)
