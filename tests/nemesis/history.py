"""The nemesis history: every invocation, acknowledgement, failure and observation, stamped.

Stamps come from one global counter, taken at the moment something happens (a write is about
to be submitted, its future resolved, a frontier was read), so "A happened before B" is
``A.stamp < B.stamp`` across threads. The validator (:mod:`tests.nemesis.validate`) only
reads a History; the driver (:mod:`tests.nemesis.driver`) only appends to it.

Data model: every write has a unique id ``wid``. Each collection it writes gets one *marker*
``("m<wid>", wid, +1)`` that is never retracted, plus records ``("r<wid>.<i>", wid, d)`` and
possibly retractions (``-1``) of records that earlier writes had acknowledged. Whether a write
landed is then read off the final state (its markers are there or not), and the exact contents
of a collection as of any time follow from the writes that landed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

#: ``(key, value, time, diff)``
Update = tuple[str, int, int, int]

_MASK = (1 << 64) - 1


def contents_hash(rows: Iterable[tuple[str, int, int]]) -> int:
    """An order-independent hash of consolidated contents ``(key, value, diff)``.

    NB: a sum of per-row hashes can be updated incrementally as the validator sweeps through
    time, so checking thousands of snapshots costs one pass over the updates, not one per
    snapshot. Python's str hash is salted per process; the validator runs in the same process.
    """
    h = 0
    for row in rows:
        h = (h + hash(row)) & _MASK
    return h


def row_hash(key: str, value: int, diff: int) -> int:
    return hash((key, value, diff)) & _MASK


@dataclass
class WriteRecord:
    """One command sent to a writer: writes and/or seals and/or sinces (``client.apply``)."""

    wid: int
    #: The nemesis's number for the writer client (opening order), not the lock generation.
    gen: int
    kind: str
    updates: dict[str, list[Update]]
    seals: dict[str, int]
    sinces: dict[str, int]
    invoked: int
    completed: int | None = None
    ok: bool = False
    error: type[BaseException] | None = None
    message: str = ""

    @property
    def resolved(self) -> bool:
        return self.completed is not None


@dataclass
class SnapshotRecord:
    reader: str
    gen: int
    collection: str
    as_of: int
    stamp: int
    rows: int
    digest: int
    #: The contents, kept only while the run is small enough (for readable failure messages).
    contents: dict[tuple[str, int], int] | None = None


@dataclass
class ListenRecord:
    reader: str
    collection: str
    as_of: int
    #: ("updates", lower, upper, [(key, value, time, diff), ...]) or ("progress", upper, upper, [])
    events: list[tuple[str, int, int, list[Update]]] = field(default_factory=list)
    error: type[BaseException] | None = None


@dataclass
class FrontierRecord:
    observer: str
    #: "writer" (its view is always current) or "replica" (may lag).
    kind: str
    gen: int
    collection: str
    since: int
    upper: int
    stamp: int


@dataclass
class OpenRecord:
    gen: int
    mode: str
    invoked: int
    completed: int | None = None
    error: type[BaseException] | None = None


@dataclass
class ErrorRecord:
    """Any exception an API call raised (the validator checks it is a PersistError)."""

    op: str
    error: type[BaseException]
    message: str
    stamp: int


class History:
    """A thread-safe, append-only record of one nemesis run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self.writes: list[WriteRecord] = []
        self.snapshots: list[SnapshotRecord] = []
        self.listens: list[ListenRecord] = []
        self.frontiers: list[FrontierRecord] = []
        self.opens: list[OpenRecord] = []
        self.errors: list[ErrorRecord] = []
        self.notes: list[str] = []
        self.counts: dict[str, int] = {}

    def stamp(self) -> int:
        # NB: itertools.count's __next__ is atomic under the GIL: no lock needed.
        return next(self._counter)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def add(self, record: Any) -> None:
        """Appends a record to the list for its type."""
        target = {
            WriteRecord: self.writes,
            SnapshotRecord: self.snapshots,
            ListenRecord: self.listens,
            FrontierRecord: self.frontiers,
            OpenRecord: self.opens,
            ErrorRecord: self.errors,
        }[type(record)]
        with self._lock:
            target.append(record)

    def error(self, op: str, e: BaseException) -> None:
        self.add(ErrorRecord(op, type(e), str(e)[:300], self.stamp()))

    def track(self, record: WriteRecord, future: Future[Any]) -> None:
        """Resolves ``record`` when ``future`` does (stamped at that moment, on any thread)."""

        def done(f: Future[Any]) -> None:
            record.completed = self.stamp()
            e = f.exception()
            if e is None:
                record.ok = True
            else:
                record.error = type(e)
                record.message = str(e)[:300]

        future.add_done_callback(done)

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)
