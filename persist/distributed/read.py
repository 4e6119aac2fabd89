"""Distributed reads: plan on one machine, read anywhere, with no client, lock or runtime.

``describe`` reads a collection's metadata into a ``CollectionInfo`` (a ``Watch`` keeps one
fresh for a long-lived planner); its ``snapshot``/``changes`` plan a ``Scan`` of ``PartHandle``s
and ``ReadTask``s (:mod:`persist.indexed.read.scan`), read on any machine by :func:`read_part`
and :func:`read_task`. A reader that is not the writer keeps history readable with a
:class:`~persist.distributed.holds.ConsumerHold`. See :mod:`persist.distributed`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from persist.distributed.stores import load_state, read_half
from persist.errors import Corruption, InvalidUsage
from persist.indexed.format.meta import State
from persist.indexed.read.filter import Filter
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import Address, CollectionInfo, PartHandle, ReadTask, rows_per_time
from persist.indexed.read.scan import read_part as _read_part
from persist.indexed.read.scan import read_task as _read_task
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection

log = logging.getLogger("persist.distributed")


def describe(url: str, collection_name: str, *,
             storage_options: Mapping[str, Any] | None = None) -> CollectionInfo:
    """The collection ``collection_name`` at ``url`` as its latest metadata shows it, from
    which reads are planned (:meth:`CollectionInfo.snapshot`, :meth:`CollectionInfo.changes`).

    Reads the metadata log only: no lock, no runtime, never a write.

    Raises:
        MissingResource: no location exists at ``url`` (nothing was ever committed there).
        UnknownCollection: the location has no such collection (the message lists those it
            has).
        ExternalError: storage failed.
    """
    address = Address.of(url, storage_options)
    state = load_state(address, must_exist=True, name=collection_name)
    return CollectionInfo(address, collection(state.collections, collection_name), state.seq)


def record_reader(record: ReadTask | PartHandle) -> PartReader:
    """The reader of ``record``'s location (a task's or a handle's).

    Raises:
        Corruption: its address does not open (a planned record's did: a buggy producer
            changed it).
    """
    try:
        blob = read_half(record.address)
    except InvalidUsage as e:
        raise Corruption(record.KIND, f"its location {record.address.url!r} does not open: "
                                      f"{e}") from e
    # NB: no part cache on workers: each part is read once per task.
    return PartReader(blob, cache_bytes=0)


def read_part(handle: PartHandle, *, filter: Filter | None = None,
              columns: Sequence[str] | None = None, audit: bool = False) -> pa.Table:
    """The rows of ``handle``'s part that its scan covers (original times), as the scan's
    schema version; on any machine.

    Args:
        filter: only rows matching it (record batches whose stats rule it out are not
            decoded).
        columns: a subset of ``key, value, time, diff`` (default: all four, in that order).
        audit: also read what the filter's stats skip, and raise ``Corruption`` on a match.

    Raises:
        PartMissing: GC removed the part (the scan outlived the GC grace period: plan again).
        InvalidUsage: ``handle`` is not a ``PartHandle`` (a ``ReadTask`` is read with
            :func:`read_task`), ``filter`` not a filter, ``columns`` not a list of column
            names or an unknown one.
        SchemaMismatch: the filter does not fit the collection's types.
        Corruption, ExternalError: the bytes are damaged; storage failed.
    """
    if not isinstance(handle, PartHandle):
        hint = " (read a ReadTask with read_task)" if isinstance(handle, ReadTask) else ""
        raise InvalidUsage(f"read_part takes a persist.distributed.PartHandle (Scan.parts, "
                           f"PartHandle.from_bytes), not {type(handle).__name__}{hint}")
    if filter is not None and not isinstance(filter, Filter):
        raise InvalidUsage(f"read_part: filter must be a persist filter (persist.col(...)) or "
                           f"None, not {type(filter).__name__}")
    if columns is not None and (isinstance(columns, (str, bytes)) or not all(
            isinstance(c, str) for c in columns)):
        raise InvalidUsage(f"read_part: columns must be a list of column names, not "
                           f"{columns!r}")
    table = _read_part(record_reader(handle), handle, filter=filter, audit=bool(audit))
    if columns is None:
        return table
    unknown = [c for c in columns if c not in table.column_names]
    if unknown:
        raise InvalidUsage(f"read_part: unknown columns {unknown}; a part has "
                           f"{table.column_names}")
    return table.select(list(columns))


def read_task(task: ReadTask) -> Iterator[pa.Table]:
    """Reads one task of a scan (see :class:`~persist.indexed.read.scan.ReadTask`), on any machine.

    A consolidated task that finds a part collected re-plans its bucket on the newest state
    (its answer is definite, so the same); other tasks raise ``PartMissing``.

    Raises:
        PartMissing: GC removed a part (plan the read again).
        InvalidUsage: ``task`` is not a ``ReadTask`` (a ``PartHandle`` is read with
            :func:`read_part`; bytes are decoded with ``ReadTask.from_bytes`` first); since
            passed the as-of time while the read ran.
        SchemaMismatch: the schema changed under a consolidated task's retry.
        Corruption, ExternalError: the bytes are damaged; storage failed.
    """
    if not isinstance(task, ReadTask):
        hint = (" (read a PartHandle with read_part)" if isinstance(task, PartHandle) else
                " (decode it with ReadTask.from_bytes first)"
                if isinstance(task, (bytes, bytearray, memoryview)) else "")
        raise InvalidUsage(f"read_task takes a persist.distributed.ReadTask (Scan.tasks, "
                           f"ReadTask.from_bytes), not {type(task).__name__}{hint}")

    def fresh() -> State:
        return Machine(read_half(task.address)).load()

    return _read_task(record_reader(task), task, fresh)


class Watch:
    """One collection's metadata as a long-lived planner sees it (a streaming driver polling
    for new seals), refreshed incrementally at most every ``interval`` seconds.

    Raises (construction):
        MissingResource, UnknownCollection: as :func:`describe`.
    """

    def __init__(self, url: str, collection_name: str, *,
                 storage_options: Mapping[str, Any] | None = None,
                 interval: float | None = None) -> None:
        self.address = Address.of(url, storage_options)
        self.name = collection_name
        blob = read_half(self.address)
        # NB: a local location answers a poll in microseconds; S3 charges per request and
        # answers in milliseconds, so poll it less often.
        self.interval = interval if interval is not None else (0.1 if blob.is_local else 1.0)
        self._machine = Machine(blob)
        # NB: a part cache: admission control reads multi-time parts to count rows per time,
        # and the polls that follow ask again.
        self._reader = PartReader(blob)
        # NB: loaded by the machine that refreshes it: its first refresh then trusts a
        # missing next entry as any later one does (no LIST of the rollups).
        self._state = load_state(self.address, must_exist=True, name=collection_name,
                                 machine=self._machine)
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._info = self._make()

    def _make(self) -> CollectionInfo:
        return CollectionInfo(self.address, collection(self._state.collections, self.name),
                              self._state.seq)

    def current(self, *, fresh: bool = False) -> CollectionInfo:
        """The collection as last seen; refreshed if ``fresh`` or ``interval`` has passed.

        Raises:
            UnknownCollection: the collection is gone (never, as collections are never
                dropped, unless the location was replaced).
        """
        # NB: one refresh at a time: two callers (a table read from two threads) would
        # otherwise probe the same keys twice and could leave the info of an older state.
        with self._lock:
            now = time.monotonic()
            if fresh or now - self._at >= self.interval:
                state = self._machine.refresh(self._state)
                self._at = now
                if state is not self._state:
                    self._state = state
                    self._info = self._make()
            return self._info

    def rows_per_time(self, info: CollectionInfo, lo: int, hi: int) -> Counter[int]:
        """Updates per time in ``[lo, hi)`` of ``info`` (see
        :func:`persist.indexed.read.scan.rows_per_time`); multi-time parts are read once and
        cached."""
        return rows_per_time(self._reader, info, lo, hi)


__all__ = ["Watch", "describe", "read_part", "read_task"]
