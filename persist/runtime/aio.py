"""The asyncio face: the same surface as the sync client, with awaitables and async iterators.

One core, one thin wrapper: every write is ``await asyncio.wrap_future(<sync future>)``, and
everything that may block (opening, registering, reading storage, waiting for a seal) runs in a
worker thread, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pyarrow as pa

from persist.runtime import client as sync
from persist.runtime.client import ListenEvent


class AsyncClient:
    def __init__(self, client: sync.Client) -> None:
        self.sync = client

    @property
    def read_only(self) -> bool:
        return self.sync.read_only

    @property
    def collections(self) -> list[str]:
        return self.sync.collections

    async def create_or_load(
        self, name: str, *, key_type: Any, value_type: Any
    ) -> tuple[AsyncWriteHandle, AsyncReadHandle]:
        w, r = await asyncio.to_thread(
            self.sync.create_or_load, name, key_type=key_type, value_type=value_type
        )
        return AsyncWriteHandle(w), AsyncReadHandle(r)

    async def apply(
        self,
        *,
        writes: Mapping[str, Any] | None = None,
        seals: Mapping[str, int] | None = None,
        sinces: Mapping[str, int] | None = None,
    ) -> int:
        seq: int = await asyncio.wrap_future(
            self.sync.apply(writes=writes, seals=seals, sinces=sinces)
        )
        return seq

    async def stop(self) -> None:
        await asyncio.to_thread(self.sync.stop)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


class AsyncWriteHandle:
    def __init__(self, handle: sync.WriteHandle) -> None:
        self.sync = handle
        self.name = handle.name

    async def write(self, updates: Any) -> int:
        seq: int = await asyncio.wrap_future(self.sync.write(updates))
        return seq

    async def seal(self, upper: int) -> int:
        seq: int = await asyncio.wrap_future(self.sync.seal(upper))
        return seq

    async def append(self, updates: Any, upper: int) -> int:
        seq: int = await asyncio.wrap_future(self.sync.append(updates, upper))
        return seq

    async def allow_compaction(self, since: int) -> int:
        seq: int = await asyncio.wrap_future(self.sync.allow_compaction(since))
        return seq


class AsyncReadHandle:
    def __init__(self, handle: sync.ReadHandle) -> None:
        self.sync = handle
        self.name = handle.name

    @property
    def since(self) -> int:
        return self.sync.since

    @property
    def upper(self) -> int:
        return self.sync.upper

    def snapshot(self, as_of: int) -> AsyncSnapshot:
        return AsyncSnapshot(self.sync, as_of)

    async def wait_for_upper(self, beyond: int, timeout: float | None = None) -> int:
        """Waits until ``upper > beyond``; returns the new upper."""
        await asyncio.to_thread(self.sync.snapshot, beyond, timeout=timeout)
        return self.sync.upper

    async def listen(self, as_of: int, *, poll: float = 0.5) -> AsyncIterator[ListenEvent]:
        listener = self.sync.listen(as_of, poll=poll)
        try:
            while True:
                for event in await asyncio.to_thread(listener.poll, poll):
                    yield event
        finally:
            listener.close()


class AsyncSnapshot:
    def __init__(self, read: sync.ReadHandle, as_of: int) -> None:
        self._read = read
        self.as_of = as_of

    async def to_arrow(self) -> pa.Table:
        table: pa.Table = await asyncio.to_thread(
            lambda: self._read.snapshot(self.as_of).to_arrow()
        )
        return table

    async def to_python(self) -> list[tuple[tuple[Any, Any], int, int]]:
        rows: list[tuple[tuple[Any, Any], int, int]] = await asyncio.to_thread(
            lambda: self._read.snapshot(self.as_of).to_python()
        )
        return rows
