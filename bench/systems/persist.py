"""persist, through its public API only: ``persist.open``, ``create_or_load``,
``WriteHandle.append(batch, upper=...)`` (write + seal as one durable step) and snapshots.

Reads open a read-only replica (``persist.open(url, read_only=True)``), as another process
would, so no decoded-part cache of the writer can flatter them. Compaction is never called:
the runtime's maintenance thread does it in the background.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

import persist
import persist.distributed
from bench.common import SCHEMA
from bench.systems.base import System

NAME = "t"

#: Whether this persist has push notifications for replicas (``persist.open(notify=...)``).
HAS_NOTIFY = "notify" in inspect.signature(persist.open).parameters


def _data_files(root: Path) -> set[Path]:
    return {p for p in (root / "location" / "data").rglob("*") if p.is_file()}


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


class PersistSystem(System):
    name: ClassVar[str] = "persist"
    guarantee: ClassVar[str] = "durable (fsync'd data + metadata commit) and sealed"

    def __init__(self, root: Path, *, notify: bool = False, schema: pa.Schema = SCHEMA) -> None:
        super().__init__(root, schema=schema)
        self.url = str(root / "location")
        #: Serve push notifications to replicas (``persist.open(..., notify=True)``), for W5.
        self.notify = notify
        self.client: persist.Client | None = None
        self.write: persist.WriteHandle | None = None
        self._lock = threading.Lock()
        self._next_time = 0

    def create(self) -> None:
        self.client = persist.open(self.url, notify=True) if self.notify else persist.open(self.url)
        self.write, _ = self.client.create_or_load(NAME, **self._types())

    def append(self, table: pa.Table, upper: int) -> Any:
        assert self.write is not None
        self.write.append(table, upper=upper).result()
        self._next_time = upper
        return upper - 1

    def _types(self) -> dict[str, pa.DataType]:
        return {"key_type": self.schema.field("key").type,
                "value_type": self.schema.field("value").type}

    def _open_read(self) -> tuple[persist.Client, persist.ReadHandle]:
        client = persist.open(self.url, read_only=True)
        _, read = client.create_or_load(NAME, **self._types())
        return client, read

    def fork(self, version: Any, into: str) -> int:
        assert self.client is not None
        data = self.root / "location"
        before = _data_files(self.root)
        self.client.fork(NAME, into=into, as_of=int(version)).result()
        # NB: the blobs the fork reads that did not exist before it (its parts reference the
        # source's blobs; a part key is ``data/...``, possibly inside a reference
        # ``ref/<cut>/<root>/data/...``). New files of the background compaction are not the
        # fork's.
        keys = [p.blob_key for p in self.client.state.collections[into].parts if p.blob_key]
        read = {data / k[k.index("data/"):] for k in keys}
        return len(read - before)

    def read(self, version: Any = None) -> pa.Table:
        client, read = self._open_read()
        try:
            as_of = read.upper - 1 if version is None else int(version)
            snap = read.snapshot(as_of)
            return _concat(list(snap.batches()), snap.schema)
        finally:
            client.stop()

    def read_open(self, version: Any = None) -> pa.Table:
        """Raw rows read from the writer's already open client: no metadata to load, and blob
        parts decoded once stay in its part cache (persist's usual in-process read path)."""
        assert self.client is not None
        _, read = self.client.create_or_load(NAME, **self._types())
        as_of = read.upper - 1 if version is None else int(version)
        snap = read.snapshot(as_of)
        return _concat(list(snap.batches()), snap.schema)

    def read_consolidated(self, version: Any = None) -> pa.Table:
        """The definite contents (one row per (key, value), diffs summed): persist's answer to
        "what is in the collection as of t", which the peers have no equivalent of."""
        client, read = self._open_read()
        try:
            as_of = read.upper - 1 if version is None else int(version)
            return read.snapshot(as_of).to_arrow()
        finally:
            client.stop()

    def decode_amplification(self, n: int) -> tuple[float, int]:
        """A consolidated read of the latest version planned for ``n`` tasks
        (``persist.distributed.describe(...).snapshot().tasks(consolidated=True, n=n)``) and
        read task by task as workers would (``persist.distributed.read_task``, no part cache):
        the stored bytes all
        tasks decoded over the bytes stored, and how many tasks the plan has.

        NB: the count is the part reader's (``persist.indexed.read.parts.DECODED``: a Parquet
        part's compressed column chunks of the row groups decoded), the one figure outside the
        public API here."""
        from persist.indexed.read.parts import DECODED

        scan = persist.distributed.describe(self.url, NAME).snapshot()
        stored = sum(h.nbytes for h in scan.parts)
        tasks = scan.tasks(consolidated=True, n=n)
        before = DECODED.bytes
        for task in tasks:
            for table in persist.distributed.read_task(task):
                del table
        return (DECODED.bytes - before) / max(stored, 1), len(tasks)

    def compact(self) -> str:
        return "none (background compaction in the runtime's maintenance thread)"

    def concurrent_appender(self) -> Callable[[pa.Table], int]:
        write = self.write
        assert write is not None
        lock = self._lock
        field = self.schema.field(2)

        def append(table: pa.Table) -> int:
            n = len(table)
            # NB: taking a time and enqueueing happen under one lock so that times reach the
            # runtime in order (a write below upper is refused); enqueueing never blocks, the
            # wait for durability happens outside the lock, where group commit batches it.
            with lock:
                t = self._next_time
                self._next_time = t + 1
                fut = write.append(
                    table.set_column(2, field, pa.array(np.full(n, t, dtype=np.int64))),
                    upper=t + 1,
                )
            fut.result()
            return 0

        return append

    # -- W5 / W6 -----------------------------------------------------------------------------

    def _attach(self) -> None:
        pass  # the follower opens its own read-only client (see workloads/w5_listen.py)

    def add_collections(self, n: int) -> None:
        assert self.client is not None
        have = len(self.client.collections)
        for i in range(have, have + n):
            self.client.create_or_load(f"other-{i:06d}", key_type=pa.int64(),
                                       value_type=pa.int64())

    def add_history(self, n: int) -> None:
        assert self.write is not None
        for _ in range(n):
            self._next_time += 1
            self.write.seal(self._next_time).result()

    def close(self) -> None:
        if self.client is not None:
            self.client.stop()
            self.client = None
