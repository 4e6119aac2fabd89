"""pyiceberg with its SQL catalog on sqlite and a local warehouse: one ``table.append()`` per
append, reads by snapshot id (``table.scan(snapshot_id=...)``).

pyiceberg 0.12 has no ``rewrite_data_files``; its nearest equivalent of compaction is an
``overwrite`` of the table with its own scan (one new data file, one new snapshot).
NB: pyiceberg writes local files without fsync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from bench.common import SCHEMA
from bench.systems.base import Skip, System

IDENT = "bench.t"


class IcebergSystem(System):
    name: ClassVar[str] = "iceberg"
    requires: ClassVar[tuple[str, ...]] = ("pyiceberg", "sqlalchemy")
    guarantee: ClassVar[str] = "committed to the sqlite catalog (no fsync of data files)"

    def __init__(self, root: Path, *, schema: pa.Schema = SCHEMA) -> None:
        super().__init__(root, schema=schema)
        self.table: Any = None
        self.catalog: Any = None

    def _catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        warehouse = self.root / "warehouse"
        warehouse.mkdir(exist_ok=True)
        return SqlCatalog(
            "bench",
            uri=f"sqlite:///{self.root / 'catalog.db'}",
            warehouse=f"file://{warehouse}",
        )

    def create(self) -> None:
        self.catalog = self._catalog()
        self.catalog.create_namespace("bench")
        self.table = self.catalog.create_table(IDENT, schema=self.schema)

    def append(self, table: pa.Table, upper: int) -> Any:
        self.table.append(table)
        return self.table.current_snapshot().snapshot_id

    def fork(self, version: Any, into: str) -> int:
        # NB: an Iceberg branch: a named, writable snapshot reference, one metadata commit
        before = {p for p in self.root.rglob("*.parquet")}
        self.table.manage_snapshots().create_branch(snapshot_id=version, branch_name=into).commit()
        return len({p for p in self.root.rglob("*.parquet")} - before)

    def read(self, version: Any = None) -> pa.Table:
        t = self.catalog.load_table(IDENT)
        result: pa.Table = t.scan(snapshot_id=version).to_arrow()
        return result

    def compact(self) -> str:
        t = self.catalog.load_table(IDENT)
        data = t.scan().to_arrow()
        t.overwrite(data)
        self.table = self.catalog.load_table(IDENT)
        return "overwrite with its own scan (pyiceberg 0.12 has no rewrite_data_files)"

    def concurrent_appender(self) -> Callable[[pa.Table], int]:
        from pyiceberg.exceptions import CommitFailedException

        local = threading.local()

        def append(table: pa.Table) -> int:
            t = getattr(local, "table", None)
            if t is None:
                t = local.table = self.catalog.load_table(IDENT)
            conflicts = 0
            while True:
                try:
                    t.append(table)
                    return conflicts
                except CommitFailedException:
                    # Another writer committed first: refresh and retry, as an application must.
                    conflicts += 1
                    t.refresh()

        return append

    def _attach(self) -> None:
        self.catalog = self._catalog()
        self.table = self.catalog.load_table(IDENT)

    def visible_appends(self) -> int:
        self.table.refresh()
        return len(self.table.metadata.snapshots)

    def add_collections(self, n: int) -> None:
        for i in range(n):
            self.catalog.create_table(f"bench.other_{i:06d}", schema=self.schema)

    def add_history(self, n: int) -> None:
        raise Skip("pyiceberg has no data-less commit; W2 shows its latency after N appends")
