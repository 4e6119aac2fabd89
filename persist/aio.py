"""``persist.aio``: the asyncio client (see :mod:`persist.runtime.aio`)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from persist import location
from persist.runtime.aio import (
    AsyncClient,
    AsyncHoldHandle,
    AsyncReadHandle,
    AsyncSnapshot,
    AsyncWriteHandle,
)


async def open(url: str | os.PathLike[str], **kwargs: Any) -> AsyncClient:
    """``persist.open`` for asyncio code, with the same arguments; runs it in a worker thread
    (opening reads storage and may wait for the writer lock) and wraps the client."""
    return AsyncClient(await asyncio.to_thread(location.open, url, **kwargs))


__all__ = ["AsyncClient", "AsyncHoldHandle", "AsyncReadHandle", "AsyncSnapshot", "AsyncWriteHandle",
           "open"]
