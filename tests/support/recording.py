"""A real store that records what crosses to it: the one counting wrapper of the tests.

Tests that bound what persist asks of storage (LISTs of the log, bytes written per commit or
rollup, data blobs a pruned read fetches) wrap a real store in :class:`RecordingBlob` and read
its records. It forwards every call unchanged, so the store's own behaviour (conditional
create, listing order, missing keys) is what the code under test sees.
"""

from __future__ import annotations

import threading

from typing_extensions import override

from persist import layout
from persist.blob.base import Blob, Wrapping
from persist.blob.envelope import Framed


class RecordingBlob(Wrapping):
    """``inner``, recording per call: LISTs (prefix, start-after key or None, keys returned),
    GETs (key), writes (key, bytes) and deletes (key). Thread-safe."""

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local
        self.lists: list[tuple[str, str | None, int]] = []
        self.gets: list[str] = []
        self.writes: list[tuple[str, int]] = []
        self.deletes: list[str] = []
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forgets everything recorded so far."""
        with self._lock:
            self.lists.clear()
            self.gets.clear()
            self.writes.clear()
            self.deletes.clear()

    # -- what the tests ask ----------------------------------------------------------------

    def full_log_lists(self) -> int:
        """LISTs of the whole metadata log (from its start, no start-after key)."""
        with self._lock:
            return sum(1 for p, after, _ in self.lists
                       if layout.LOG_PREFIX.startswith(p) and after is None)

    def log_keys_listed(self) -> int:
        """Keys the LISTs of the metadata log returned, in all."""
        with self._lock:
            return sum(n for p, _, n in self.lists if layout.LOG_PREFIX.startswith(p))

    def bytes_written(self, prefix: str = "") -> int:
        """Bytes written under ``prefix`` (every key by default)."""
        with self._lock:
            return sum(n for k, n in self.writes if k.startswith(prefix))

    def keys_written(self, prefix: str = "") -> list[str]:
        """The keys written under ``prefix``, in order, once per write."""
        with self._lock:
            return [k for k, _ in self.writes if k.startswith(prefix)]

    def keys_read(self, prefix: str = "") -> list[str]:
        """The keys read (GET) under ``prefix``, in order, once per read."""
        with self._lock:
            return [k for k in self.gets if k.startswith(prefix)]

    # -- the store ---------------------------------------------------------------------------

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        with self._lock:
            self.gets.append(key)
        return self.inner._get(key)

    @override
    def _list(self, prefix: str) -> list[str]:
        keys = self.inner._list(prefix)
        with self._lock:
            self.lists.append((prefix, None, len(keys)))
        return keys

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        keys = self.inner._list_after(prefix, start_after)
        with self._lock:
            self.lists.append((prefix, start_after, len(keys)))
        return keys

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        with self._lock:
            self.writes.append((key, len(data)))
        self.inner._set(key, data)

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        with self._lock:
            self.writes.append((key, len(data)))
        return self.inner._set_if_absent(key, data)

    @override
    def _delete(self, key: str) -> None:
        with self._lock:
            self.deletes.append(key)
        self.inner._delete(key)
