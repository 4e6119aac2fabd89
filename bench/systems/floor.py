"""The physical floor: what durable appends cost with no engine at all.

Each append encodes the batch as one Arrow IPC stream with zstd (level 1, as persist's parts),
writes it to a new file, fsyncs the file and then the directory. Reads list the directory and
decode the files with pyarrow (memory-mapped). ``compact`` rewrites everything as one file: the
"read of one compacted file" W3 compares persist with.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from bench.common import SCHEMA, fsync_dir
from bench.systems.base import System

_OPTS = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
_SUFFIX = ".arrows"


def encode(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC stream, zstd level 1 (what the floor stores, locally or on S3)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_OPTS) as w:
        w.write_table(table, max_chunksize=1 << 20)
    return sink.getvalue()


def write_file(path: str, table: pa.Table) -> None:
    """Encodes ``table`` and writes it to a new file at ``path``, fsync'd (not the directory)."""
    buf = encode(table)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(buf)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return pa.ipc.open_stream(source).read_all()


class FloorSystem(System):
    name: ClassVar[str] = "floor"
    guarantee: ClassVar[str] = "durable (file and directory fsync'd)"

    def __init__(self, root: Path, *, schema: pa.Schema = SCHEMA) -> None:
        super().__init__(root, schema=schema)
        self.dir = root / "table"
        self._uppers: list[int] = []  # upper after each append (version n -> _uppers[n-1])
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._compacted: tuple[str, int] | None = None  # (path, versions it holds)

    def create(self) -> None:
        self.dir.mkdir(parents=True)
        fsync_dir(self.root)

    def _name(self, i: int) -> str:
        return str(self.dir / f"{i:09d}{_SUFFIX}")

    def append(self, table: pa.Table, upper: int) -> Any:
        i = next(self._counter)
        write_file(self._name(i), table)
        fsync_dir(self.dir)
        self._uppers.append(upper)
        return len(self._uppers)

    def _files(self, version: int | None) -> list[str]:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(_SUFFIX))
        if version is not None:
            names = names[:version]
        return [str(self.dir / n) for n in names]

    def read(self, version: Any = None) -> pa.Table:
        if self._compacted is not None:
            path, held = self._compacted
            table = read_file(path)
            if version is not None and version < held:
                limit = pa.scalar(self._uppers[version - 1] - 1, pa.int64())
                table = table.filter(pc.less_equal(table.column("time"), limit))
            return table
        tables = [read_file(p) for p in self._files(version)]
        return pa.concat_tables(tables) if tables else self.schema.empty_table()

    def compact(self) -> str:
        files = self._files(None)
        table = pa.concat_tables([read_file(p) for p in files])
        path = str(self.root / f"compacted{_SUFFIX}")
        write_file(path, table.combine_chunks())
        fsync_dir(self.root)
        self._compacted = (path, len(self._uppers))
        return f"rewrote {len(files)} files as one"

    def fork(self, version: Any, into: str) -> int:
        # NB: the floor's zero-copy fork: a hard link per file (a directory entry each, no
        # data), fsync'd like an append
        target = self.root / into
        target.mkdir()
        for path in self._files(version):
            os.link(path, target / os.path.basename(path))
        fsync_dir(target)
        fsync_dir(self.root)
        return 0

    def concurrent_appender(self) -> Callable[[pa.Table], int]:
        def append(table: pa.Table) -> int:
            with self._lock:
                i = next(self._counter)
            write_file(self._name(i), table)
            fsync_dir(self.dir)
            return 0

        return append

    # -- W5 / W6 -----------------------------------------------------------------------------

    def _attach(self) -> None:
        self._seen = 0

    def visible_appends(self) -> int:
        # NB: a floor file is visible as soon as it is created (before its fsync): this is a
        # lower bound on what any durable system can offer.
        while os.path.exists(self._name(self._seen)):
            self._seen += 1
        return self._seen

    def add_collections(self, n: int) -> None:
        # A "collection" of the floor is a sibling directory of files.
        for i in range(n):
            (self.root / f"other-{i:06d}").mkdir()
        fsync_dir(self.root)

    def add_history(self, n: int) -> None:
        # Prior appends: files already in the directory (written unsynced, then flushed once).
        empty = self.schema.empty_table()
        for _ in range(n):
            i = next(self._counter)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self.schema, options=_OPTS) as w:
                w.write_table(empty)
            with open(self._name(i), "wb") as f:
                f.write(sink.getvalue())
        os.sync()
