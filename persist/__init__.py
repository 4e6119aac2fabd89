"""persist: durable, definite storage for differential collections.

A collection is a set of updates ``((key, value), time, diff)`` with two frontiers: ``upper``
(every time below it is sealed and durable) and ``since`` (history below it may be compacted).
Any read as of a time in ``[since, upper)`` is definite: the same everywhere, always.

    import persist, pyarrow as pa
    with persist.open("file:///data/loc", reentrance_id="svc-blue") as client:
        write, read = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        write.append([(("a", 1), 0, 1)], upper=1).result()
        read.snapshot(0).to_arrow()

Distributed readers and writers (Spark's executors, Dask, Ray) plan with ``persist.describe``
and read with ``persist.read_task`` / ``persist.read_part`` on any machine; they stage with a
``persist.Stager`` and commit once with ``Client.apply(parts=..., token=persist.Token(...))``
(see :mod:`persist.distributed`).
"""

from persist import aio
from persist.distributed import (
    RENEW_EVERY_SECONDS,
    Address,
    CollectionInfo,
    PartHandle,
    ReadTask,
    Scan,
    Stager,
    Watch,
    describe,
    read_part,
    read_task,
    set_read_hold,
)
from persist.errors import (
    ChecksumMismatch,
    CommitDeadline,
    Corruption,
    Determinate,
    ExternalError,
    Fenced,
    IncompatibleFormat,
    Indeterminate,
    InvalidUsage,
    LeaseRevoked,
    LockHeld,
    MissingResource,
    PartMissing,
    PersistError,
    ReadOnly,
    RuntimeShutdown,
    SchemaMismatch,
    Timeout,
    UnknownCollection,
)
from persist.indexed.engine import Options
from persist.indexed.format.records import arrow, check_type, decimal
from persist.indexed.read.filter import Column, Filter, col
from persist.location import open
from persist.runtime.client import (
    Client,
    ClientSnapshot,
    Listener,
    ListenEvent,
    ListenProgress,
    ListenUpdates,
    ReadHandle,
    StagedPart,
    Token,
    WriteHandle,
)

__version__ = "0.1.0"

__all__ = [
    "RENEW_EVERY_SECONDS",
    "Address",
    "ChecksumMismatch",
    "Client",
    "ClientSnapshot",
    "CollectionInfo",
    "Column",
    "CommitDeadline",
    "Corruption",
    "Determinate",
    "ExternalError",
    "Fenced",
    "Filter",
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
    "PartHandle",
    "PartMissing",
    "PersistError",
    "ReadHandle",
    "ReadOnly",
    "ReadTask",
    "RuntimeShutdown",
    "Scan",
    "SchemaMismatch",
    "StagedPart",
    "Stager",
    "Timeout",
    "Token",
    "UnknownCollection",
    "Watch",
    "WriteHandle",
    "aio",
    "arrow",
    "check_type",
    "col",
    "decimal",
    "describe",
    "open",
    "read_part",
    "read_task",
    "set_read_hold",
]
