"""persist: durable, definite storage for differential collections.

A collection is a set of updates ``((key, value), time, diff)`` with two frontiers: ``upper``
(every time below it is sealed and durable) and ``since`` (history below it may be compacted).
Any read as of a time in ``[since, upper)`` is definite: the same everywhere, always.

    import persist, pyarrow as pa
    with persist.open("file:///data/loc", reentrance_id="svc-blue") as client:
        write, read = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        write.append([(("a", 1), 0, 1)], upper=1).result()
        read.snapshot(0).to_arrow()

Distributed readers and writers (Spark's executors, Dask, Ray, a fleet of scripts) have an
API of their own, :mod:`persist.distributed`: plan a read on one machine and read it anywhere;
stage parts anywhere and commit them exactly once.
"""

from persist import aio, distributed
from persist.errors import (
    ChecksumMismatch,
    CommitDeadline,
    Corruption,
    Determinate,
    DiffOverflow,
    ExternalError,
    Fenced,
    HoldLapsed,
    IncompatibleFormat,
    Indeterminate,
    InvalidUsage,
    LeaseRevoked,
    LockHeld,
    MissingResource,
    PartMissing,
    PartsChanged,
    PersistError,
    ReadOnly,
    RuntimeShutdown,
    SchemaMismatch,
    Timeout,
    UnknownCollection,
    UnknownHold,
)
from persist.forks import fork
from persist.indexed.engine import Options
from persist.indexed.format.records import arrow, decimal, msgpack
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.filter import Column, Filter, col
from persist.indexed.read.scan import CollectionInfo
from persist.indexed.state.holds import HoldInfo
from persist.location import open
from persist.runtime.branches import HoldHandle
from persist.runtime.client import (
    Client,
    ClientSnapshot,
    Listener,
    ListenEvent,
    ListenProgress,
    ListenUpdates,
    ReadHandle,
    WriteHandle,
)

__version__ = "0.1.0"

__all__ = [
    "ChecksumMismatch",
    "Client",
    "ClientSnapshot",
    "CollectionInfo",
    "Column",
    "CommitDeadline",
    "CompactionPolicy",
    "Corruption",
    "Determinate",
    "DiffOverflow",
    "ExternalError",
    "Fenced",
    "Filter",
    "HoldHandle",
    "HoldInfo",
    "HoldLapsed",
    "IncompatibleFormat",
    "Indeterminate",
    "InvalidUsage",
    "LeaseRevoked",
    "ListenEvent",
    "ListenProgress",
    "ListenUpdates",
    "Listener",
    "LockHeld",
    "MissingResource",
    "Options",
    "PartMissing",
    "PartsChanged",
    "PersistError",
    "ReadHandle",
    "ReadOnly",
    "RuntimeShutdown",
    "SchemaMismatch",
    "Timeout",
    "UnknownCollection",
    "UnknownHold",
    "WriteHandle",
    "aio",
    "arrow",
    "col",
    "decimal",
    "distributed",
    "fork",
    "msgpack",
    "open",
]
