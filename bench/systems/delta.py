"""delta-rs (the ``deltalake`` package): one ``write_deltalake(path, batch, mode="append")`` per
append, reads with ``DeltaTable(path, version=v)``, manual compaction with
``optimize.compact()`` plus ``create_checkpoint()``.

NB: a local delta-rs commit is a link/rename of a JSON log file with no fsync of data, log or
directory: an acknowledged append is not durable across a power loss. The numbers here are
therefore an upper bound for what delta-rs costs when it is made durable.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from bench.common import SCHEMA
from bench.systems.base import Skip, System


class DeltaSystem(System):
    name: ClassVar[str] = "delta"
    requires: ClassVar[tuple[str, ...]] = ("deltalake",)
    guarantee: ClassVar[str] = "committed to the log (no fsync locally)"

    def __init__(self, root: Path, *, schema: pa.Schema = SCHEMA) -> None:
        super().__init__(root, schema=schema)
        self.path = str(root / "table")
        self.version = 0

    def create(self) -> None:
        from deltalake import DeltaTable

        DeltaTable.create(self.path, schema=self.schema)
        self.version = 0

    def append(self, table: pa.Table, upper: int) -> Any:
        from deltalake import write_deltalake

        write_deltalake(self.path, table, mode="append")
        self.version += 1
        return self.version

    def read(self, version: Any = None) -> pa.Table:
        from deltalake import DeltaTable

        dt = DeltaTable(self.path, version=version)
        return dt.to_pyarrow_table()

    def compact(self) -> str:
        from deltalake import DeltaTable

        dt = DeltaTable(self.path)
        m = dt.optimize.compact()
        dt = DeltaTable(self.path)
        dt.create_checkpoint()
        self.version = dt.version()
        return (f"optimize.compact(): {m.get('numFilesRemoved')} files -> "
                f"{m.get('numFilesAdded')}; create_checkpoint()")

    def fork(self, version: Any, into: str) -> int:
        import deltalake

        raise Skip(f"deltalake {deltalake.__version__} has no shallow clone: its Python API "
                   f"(DeltaTable) offers none; SHALLOW CLONE is a Spark/Databricks SQL "
                   f"command")

    def concurrent_appender(self) -> Callable[[pa.Table], int]:
        from deltalake import write_deltalake

        path = self.path

        def append(table: pa.Table) -> int:
            # delta-rs retries a conflicting blind append internally.
            write_deltalake(path, table, mode="append")
            return 0

        return append

    def _attach(self) -> None:
        from deltalake import DeltaTable

        self._dt = DeltaTable(self.path)
        self._base = self._dt.version()

    def visible_appends(self) -> int:
        self._dt.update_incremental()
        return int(self._dt.version())

    def add_collections(self, n: int) -> None:
        from deltalake import DeltaTable

        for i in range(n):
            DeltaTable.create(str(self.root / f"other-{i:06d}"), schema=self.schema)

    def add_history(self, n: int) -> None:
        raise Skip("delta-rs has no data-less commit; W2 shows its latency after N appends")
