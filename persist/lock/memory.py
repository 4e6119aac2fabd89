"""An in-process writer lock, shared by name (pairs with ``mem://`` locations)."""

from __future__ import annotations

import threading
from typing import ClassVar

from typing_extensions import override

from persist.lock.base import LockRecord, WriterLock


class MemoryLock(WriterLock):
    """A writer lock kept in a process-wide registry: handles made with one ``name`` share it.

    NB: the registry's mutex is held only for a dict lookup or store, by threads of this one
    process; no wait depends on another process, so the deadline needs no enforcing here.
    """

    _registry: ClassVar[dict[str, list[LockRecord | None]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, **kw: float) -> None:
        """Args:
            name: which lock (all handles with one name share it).
            kw: lease settings, as for :class:`~persist.lock.base.WriterLock`.
        """
        super().__init__(**kw)
        with MemoryLock._mutex:
            self._cell = MemoryLock._registry.setdefault(name, [None])

    @override
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        with MemoryLock._mutex:
            return self._cell[0]

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord, *,
             deadline: float | None = None) -> bool:
        with MemoryLock._mutex:
            if self._cell[0] != expected:
                return False
            self._cell[0] = new
            return True
