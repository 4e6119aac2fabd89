"""A store wrapper that counts what crosses the blob edge into :mod:`persist.metrics`.

Byte counts are taken below the envelope, so they are what actually goes over the wire or to
disk; errors are counted by operation and error class. Every writer's engine reads and writes
through one when the metrics are on (:func:`metered`, used by ``persist.location``); without
``prometheus_client`` nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from typing_extensions import override

from persist import metrics
from persist.blob.base import Blob, Wrapping
from persist.blob.envelope import Framed
from persist.errors import PersistError


class MeteredBlob(Wrapping):
    """Wraps a store and counts bytes and errors into the blob metrics (below the envelope,
    so byte counts are what actually crosses the wire). Transparent otherwise."""

    def __init__(self, inner: Blob) -> None:
        """Wraps ``inner``; its capabilities are the wrapper's."""
        self.inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        return _counted_read(lambda: self.inner._get(key))

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        return _counted_read(lambda: self.inner._get_range(key, start, end))

    @override
    def _external_url(self, key: str) -> str | None:
        return self.inner._external_url(key)

    @override
    def _list(self, prefix: str) -> list[str]:
        try:
            return self.inner._list(prefix)
        except PersistError as e:
            metrics.blob_error("list", e)
            raise

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        try:
            return self.inner._list_after(prefix, start_after)
        except PersistError as e:
            metrics.blob_error("list", e)
            raise

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        try:
            self.inner._set(key, data)
        except PersistError as e:
            metrics.blob_error("set", e)
            raise
        metrics.blob_bytes("written", len(data))

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        try:
            created = self.inner._set_if_absent(key, data)
        except PersistError as e:
            metrics.blob_error("set_if_absent", e)
            raise
        if created:
            metrics.blob_bytes("written", len(data))
        return created

    @override
    def _delete(self, key: str) -> None:
        try:
            self.inner._delete(key)
        except PersistError as e:
            metrics.blob_error("delete", e)
            raise

    @override
    def _delete_shard(self, shard: str, keys: Sequence[str]) -> None:
        try:
            self.inner._delete_shard(shard, keys)
        except PersistError as e:
            metrics.blob_error("delete", e)
            raise

    @override
    def close(self) -> None:
        self.inner.close()


def metered(blob: Blob) -> Blob:
    """``blob`` wrapped in a :class:`MeteredBlob` when the metrics are on (``prometheus_client``
    is installed), else ``blob`` itself: a writer's storage traffic is then counted at no cost
    to anyone without the metrics."""
    return MeteredBlob(blob) if metrics.enabled() else blob


def _counted_read(read: Callable[[], bytes | memoryview | None]) -> bytes | memoryview | None:
    """``read()``, its bytes counted as read and its failure as a failed get."""
    try:
        data = read()
    except PersistError as e:
        metrics.blob_error("get", e)
        raise
    if data is not None:
        metrics.blob_bytes("read", len(data))
    return data


__all__ = ["MeteredBlob", "metered"]

