"""``persist.aio``: the asyncio client (see :mod:`persist.runtime.aio`)."""

from persist.runtime.aio import (
    AsyncClient,
    AsyncReadHandle,
    AsyncSnapshot,
    AsyncWriteHandle,
    open,
)

__all__ = ["AsyncClient", "AsyncReadHandle", "AsyncSnapshot", "AsyncWriteHandle", "open"]
