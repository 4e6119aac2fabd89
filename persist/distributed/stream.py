"""A collection read as a stream: the cursor any engine's streaming source drives (Spark's
``DataSourceStreamReader`` in ``operators/source.py`` only delegates to it; a Flink or Dask
source would too).

Frontiers are the offsets. An offset ``u`` (:meth:`StreamCursor.offset`: ``{"upper": u}``)
means "every update at a time below ``u`` has been delivered"; a batch from ``a`` to ``b`` is
every update with ``a <= time < b``: the exact difference between the snapshots as of ``a - 1``
and ``b - 1``. Offsets only ever land on frontiers the writer sealed (``b <= upper``), so a
batch never holds part of a time, and replaying a batch after a restart reads the same
updates. The rules, each here once:

* **where a stream starts** (:meth:`StreamCursor.initial`): ``earliest`` is 0 (all retained
  history, everything compacted arriving at time since in the first batch), ``latest`` the
  current upper, or a given frontier;
* **how far a batch reaches** (:meth:`StreamCursor.latest`): the current upper (or, for a run
  that stops at what is available now, the upper when it began), never part of a time; from 0
  the first batch must reach past since to include the forwarded history; with a row limit,
  the largest end whose batch holds at most that many rows, cut only between times (a single
  time with more is taken whole);
* **exactness and data loss**: a batch from ``lo > 0`` is exact while ``lo - 1 >= since``
  (:meth:`CollectionInfo.exact`); once since passed it, the stream lost data: an error
  (``fail_on_data_loss``), or a warning and a skip ahead to ``since + 1``;
* **the consumer hold's lifecycle**: with a hold name, a named consumer hold with a lease
  (:class:`~persist.distributed.holds.ConsumerHold`) is taken where the stream starts (a live
  one of that name already there is adopted; a lapsed one taken again if since has not passed
  the stream), moved up to ``lo - 1`` when a batch from ``lo`` is planned and to ``end - 1``
  when a batch is committed, and renewed every quarter of its lease while the stream idles.
  Failing to take or move it is never unsafe, only less protective: the next batch tries
  again.

A cursor reads the metadata through a :class:`~persist.distributed.read.Watch` (refreshed at
most every ``refresh_interval``), never data, except to count rows per time for admission.
Pickled (a source's reader is shipped to tasks), it leaves its metadata view behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Literal

from persist.distributed.holds import ConsumerHold
from persist.distributed.read import Watch, describe
from persist.errors import InvalidUsage, SchemaMismatch, Timeout
from persist.indexed.read.scan import CollectionInfo, ReadTask

log = logging.getLogger("persist.distributed")

#: How long a cursor waits, by default, for its consumer hold to be committed (seconds).
HOLD_LOCK_TIMEOUT = 10.0
#: A consumer hold's lease, by default (seconds): a week.
HOLD_LEASE = 7 * 86400.0


class StreamCursor:
    """One stream of one collection's updates (see the module docstring).

    Args:
        url, collection_name, storage_options: the collection.
        schema_version: the schema version the stream reads (None: the current one); a
            batch planned after the schema evolved past it is refused.
        start: ``"earliest"``, ``"latest"`` or a frontier (an int >= 0).
        refresh_interval: seconds between metadata polls (None: by store, see ``Watch``).
        fail_on_data_loss: raise when since passed the stream, else warn and skip ahead.
        hold: the name of the stream's consumer hold (None: no hold).
        hold_lease: the hold's lease in seconds.
        hold_lock_timeout: how long taking the hold waits for it to be committed.

    Raises:
        InvalidUsage: an argument of the wrong type or value.
        MissingResource, UnknownCollection: as :func:`persist.distributed.describe`.
    """

    def __init__(self, url: str, collection_name: str, *,
                 storage_options: Mapping[str, Any] | None = None,
                 schema_version: int | None = None,
                 start: Literal["earliest", "latest"] | int = "earliest",
                 refresh_interval: float | None = None, fail_on_data_loss: bool = True,
                 hold: str | None = None, hold_lease: float = HOLD_LEASE,
                 hold_lock_timeout: float = HOLD_LOCK_TIMEOUT) -> None:
        if start not in ("earliest", "latest") and (
                isinstance(start, bool) or not isinstance(start, int) or start < 0):
            raise InvalidUsage(f"a stream starts at 'earliest', 'latest' or a frontier (an int "
                               f">= 0), not {start!r}")
        if hold is not None and (not isinstance(hold, str) or not hold):
            raise InvalidUsage(f"a stream's hold is a non-empty name or None, not {hold!r}")
        if not hold_lease > 0:
            raise InvalidUsage(f"a stream's hold lease must be > 0 seconds, not {hold_lease!r}")
        self.url = url
        self.collection = collection_name
        self.storage_options = dict(storage_options or {})
        if schema_version is None:
            schema_version = describe(url, collection_name,
                                      storage_options=self.storage_options).schema_version
        self.schema_version = schema_version
        self.start = start
        self.refresh_interval = refresh_interval
        self.fail_on_data_loss = fail_on_data_loss
        self.hold_name = hold
        self.hold_lease = hold_lease
        self.hold_lock_timeout = hold_lock_timeout
        self._watch: Watch | None = None
        #: A run that stops at what is available now: the upper to stop at.
        self._stop_at: int | None = None
        #: The frontier of our durable hold as last asked for by this process, and the hold
        #: (a named consumer hold with a lease) once taken.
        self._held: int | None = None
        self._hold: ConsumerHold | None = None
        self._renewed = 0.0
        self._memo: tuple[CollectionInfo, int, int, int, int] | None = None
        self._hold_tried = False
        self._warned: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # NB: a source's reader is pickled into every task, which needs none of this: the
        # metadata view and its part cache stay in the planning process.
        state = dict(self.__dict__)
        state["_watch"] = None
        state["_memo"] = None
        return state

    # -- offsets -------------------------------------------------------------------------------

    @staticmethod
    def offset(upper: int) -> dict[str, int]:
        """The offset of frontier ``upper`` as a source stores it: ``{"upper": upper}``."""
        return {"upper": upper}

    @staticmethod
    def frontier(offset: Mapping[str, Any]) -> int:
        """The frontier an offset names.

        Raises:
            InvalidUsage: not an offset of a persist stream.
        """
        try:
            u = offset["upper"]
        except (KeyError, TypeError):
            raise InvalidUsage(f"not a persist offset: {offset!r}; expected {{'upper': N}}"
                               ) from None
        if not isinstance(u, int) or isinstance(u, bool) or u < 0:
            raise InvalidUsage(f"not a persist offset: {offset!r}; expected {{'upper': N}}")
        return u

    # -- the collection ------------------------------------------------------------------------

    def current(self, *, fresh: bool = False) -> CollectionInfo:
        """The collection as the cursor's metadata view last saw it (refreshed if ``fresh``
        or the refresh interval passed)."""
        if self._watch is None:
            self._watch = Watch(self.url, self.collection, storage_options=self.storage_options,
                                interval=self.refresh_interval)
            return self._watch.current()
        return self._watch.current(fresh=fresh)

    @property
    def watching(self) -> bool:
        """Whether this cursor holds a metadata view (False in a pickled copy)."""
        return self._watch is not None

    # -- how far batches reach -----------------------------------------------------------------

    def initial(self) -> int:
        """Where the stream starts (``start``), and takes its hold there."""
        c = self.current(fresh=True)
        start = self.start
        upper = 0 if start == "earliest" else c.upper if start == "latest" else int(start)
        self._hold_tried = True
        self._hold_for(upper, c)
        return upper

    def latest(self, start: int | None = None, max_rows: int | None = None) -> int:
        """The end of the next batch from ``start``: a sealed frontier, never part of a time
        (None: the current upper, or the stop frontier, without admission or data-loss
        checks).

        Args:
            max_rows: admission: the batch holds at most this many rows, cut between times (a
                single time with more is taken whole).

        Raises:
            InvalidUsage: lost data with ``fail_on_data_loss``.
            HoldLapsed: the stream's hold lapsed (it was not renewed within its lease).
        """
        c = self.current()
        self._keep_hold()
        target = c.upper if self._stop_at is None else min(c.upper, self._stop_at)
        if start is None:
            return target
        lo = start
        if not self._hold_tried:
            # NB: once per process (a restart resumes here, not in initial()); if the lock is
            # busy, commit() retries rather than every poll waiting for the lock.
            self._hold_tried = True
            self._hold_for(lo, c)
        if lo > 0 and lo - 1 < c.since:
            self._data_loss(c, lo)
        if target <= lo or (lo == 0 and c.since >= target):
            # NB: from 0 the first batch must reach past since to include forwarded history.
            return lo
        if max_rows is not None:
            return self._admit(c, lo, target, max_rows)
        return target

    def reported(self) -> int:
        """The collection's upper (for progress reports), ignoring limits and the stop."""
        return self.current().upper

    def stop_at_now(self) -> None:
        """Read up to the upper sealed right now, then no further (Spark's
        ``Trigger.AvailableNow``)."""
        self._stop_at = self.current(fresh=True).upper

    def _admit(self, c: CollectionInfo, lo: int, target: int, max_rows: int) -> int:
        """The largest end in ``(lo, target]`` whose batch holds at most ``max_rows`` rows,
        cut only between times; a single time with more rows is taken whole."""
        if self._memo is not None:
            mc, mlo, mtarget, mmax, end = self._memo
            if mc is c and (mlo, mtarget, mmax) == (lo, target, max_rows):
                return end
        assert self._watch is not None
        counts = self._watch.rows_per_time(c, lo, target)
        end = target
        taken = 0
        for t in sorted(counts):
            if taken and taken + counts[t] > max_rows:
                end = t  # everything before t fits; t itself does not
                break
            taken += counts[t]
        self._memo = (c, lo, target, max_rows, end)
        return end

    # -- batches -------------------------------------------------------------------------------

    def tasks(self, lo: int, hi: int, *, rows_per_task: int | None = None) -> list[ReadTask]:
        """The batch ``[lo, hi)`` as read tasks (empty for an empty batch).

        Moves the hold (if any) up to ``lo - 1`` first. If since passed ``lo - 1``, the batch
        is no longer exact: without ``fail_on_data_loss`` it starts at ``since + 1`` instead
        (from 0, it is empty).

        Raises:
            InvalidUsage: ``hi`` beyond the collection's upper (a checkpoint of another
                location), or lost data with ``fail_on_data_loss``.
            SchemaMismatch: the schema evolved since the stream started (restart it to read
                the new schema).
            HoldLapsed: the stream's hold lapsed.
        """
        if lo >= hi:
            return []
        c = self.current()
        if c.upper < hi:
            c = self.current(fresh=True)
            if c.upper < hi:
                raise InvalidUsage(
                    f"micro-batch [{lo}, {hi}) of {c.name!r} ends beyond its upper {c.upper}: "
                    f"the checkpoint belongs to another location or collection"
                )
        if c.schema_version != self.schema_version:
            raise SchemaMismatch(
                f"the schema of {c.name!r} evolved to version {c.schema_version} since this "
                f"stream started with version {self.schema_version}: restart the query (from "
                f"its checkpoint) to read the new schema")
        if self._holding_below(lo - 1) and lo - 1 >= c.since:
            # NB: a source plans a batch only once the one before it committed (a replay after
            # a restart starts where the last committed batch ended), so nothing below lo is
            # needed again. commit(end) alone would lag a batch: Spark commits a source's
            # offsets lazily, and never the last batch of a Trigger.AvailableNow run.
            self._set_hold(lo - 1)
        if not c.exact(lo, hi):
            self._data_loss(c, lo)
            if lo == 0:
                return []
            lo = c.since + 1
            if lo >= hi:
                return []
        scan = c.changes(lo, hi, schema_version=self.schema_version, held=True)
        return scan.tasks(rows_per_task=rows_per_task)

    def commit(self, end: int) -> None:
        """Every update below ``end`` was processed: moves the hold up to ``end - 1``.

        Raises:
            HoldLapsed: the stream's hold lapsed.
        """
        self._memo = None
        if self._holding_below(end - 1):
            self._set_hold(end - 1)

    # -- data loss and the hold ----------------------------------------------------------------

    def _data_loss(self, c: CollectionInfo, lo: int) -> None:
        since = c.since
        msg = (
            f"persist stream of {c.name!r} lost data: its next micro-batch starts at upper {lo}, "
            f"but history up to {since} (since) was compacted, so the updates at times in "
            f"[{lo}, {since}] are no longer distinguishable."
        )
        if self.fail_on_data_loss:
            raise InvalidUsage(
                f"{msg} Keep a hold to keep since from passing a running stream (a Spark "
                f"stream's readHold), or let it skip ahead to upper {since + 1} "
                f"(failOnDataLoss=false)."
            )
        if self._warned != (lo, since):  # once, not at every poll
            self._warned = (lo, since)
            log.warning("%s Skipping ahead to upper %d (failOnDataLoss=false).", msg,
                        since + 1)

    def _holding_below(self, frontier: int) -> bool:
        """Whether a hold is asked for and ours is (as far as we know) below ``frontier``."""
        return (self.hold_name is not None and frontier >= 0
                and (self._held is None or frontier > self._held))

    def _hold_for(self, upper: int, c: CollectionInfo) -> None:
        """Establishes the hold of a stream that has delivered everything below ``upper``: at
        ``upper - 1`` (or, from 0, at the current since). A live hold of ours already there is
        adopted; a lapsed one (the stream was stopped longer than its lease) is taken again if
        since has not passed the stream (else the data-loss check reports it)."""
        if self.hold_name is None:
            return
        since = c.since
        frontier = upper - 1 if upper > 0 else since
        if frontier < since or (self._held is not None and self._held >= frontier):
            return  # already lost (the data-loss check reports it), or already held
        have = c.hold(self.hold_name)
        if have is not None and have.kind == "hold" and not have.lapsed \
                and have.frontier == frontier:
            self._hold = ConsumerHold(
                self.url, self.collection, self.hold_name,
                lease_ms=max(1, round(self.hold_lease * 1000)),
                storage_options=self.storage_options, timeout=self.hold_lock_timeout)
            self._held = frontier
            return
        self._take(frontier)

    def _take(self, frontier: int) -> None:
        """Takes the hold at ``frontier``, waiting up to ``hold_lock_timeout`` for it to be
        committed (by this process under the lock, or by the running writer)."""
        assert self.hold_name is not None
        try:
            self._hold = ConsumerHold.take(
                self.url, self.collection, self.hold_name, frontier, lease=self.hold_lease,
                storage_options=self.storage_options, timeout=self.hold_lock_timeout)
        except Timeout as e:
            # NB: failing to set a hold is never unsafe, only less protective: the hold stays
            # behind (or absent), and the next batch tries again.
            log.warning("read hold %r on %r not set to %s: %s (the next batch tries again)",
                        self.hold_name, self.collection, frontier, e)
            return
        self._held = frontier
        self._renewed = time.monotonic()

    def _set_hold(self, frontier: int) -> None:
        """Moves the hold up to ``frontier`` (and renews it) without waiting for the writer.

        Raises:
            HoldLapsed: the hold lapsed while the stream ran.
        """
        if self._hold is None:
            self._take(frontier)
            return
        self._hold.advance(frontier, wait=False)
        self._held = frontier
        self._renewed = time.monotonic()

    def _keep_hold(self) -> None:
        """Renews the hold of an idle stream (every quarter of its lease), and reports a lapse
        an earlier request found.

        Raises:
            HoldLapsed: as :meth:`_set_hold`.
        """
        if self._hold is None:
            return
        if time.monotonic() - self._renewed > self.hold_lease / 4:
            self._renewed = time.monotonic()
            self._hold.renew(wait=False)


__all__ = ["HOLD_LEASE", "HOLD_LOCK_TIMEOUT", "StreamCursor"]
