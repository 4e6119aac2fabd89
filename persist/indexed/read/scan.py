"""Read plans and read tasks: every read of a collection, a snapshot or a range of changes,
planned from one state's metadata and read straight from the blob store, here or on any machine.

This is the one place that knows which parts a read needs and how they are read. A client's
snapshots and listeners (:mod:`persist.runtime.client`, through :class:`SnapshotRead` and the
client's part cache), ``persist snapshot`` and ``persist inspect --live``, and every engine
that reads persist in parallel (the Spark source in ``operators/``, Dask, Ray, ...: through the
public face in :mod:`persist.distributed`) plan a :class:`Scan` and read its tasks::

    info = persist.distributed.describe(url, "events")   # metadata only, no lock
    scan = info.snapshot(41, filter=persist.col("key") == "a")
    tasks = scan.tasks(consolidated=True, n=8)            # picklable / msgspec-encodable
    # ... on any machine:
    for table in persist.distributed.read_task(task): ...

Planning reads the metadata log only. A task carries everything it reads — the location's
address, the collection's schema history, its parts (inline parts with their bytes) and its
time bounds — so it needs no client, no lock and no call back to the planner, and its output
depends only on the task.

The rules, stated once (DESIGN.md §11a lists where each lives):

* **Which parts.** A snapshot as of ``t`` needs every part with a row at a time ``<= t``
  (:func:`snapshot_parts`); a range ``[lo, hi)`` the parts with a time in it
  (:func:`range_parts`). A filter's stats prune parts on the planner and record batches in
  the task (:class:`persist.indexed.read.prune.Pruner`); what is read is then filtered exactly.
* **Exactness.** A snapshot is definite for ``as_of`` in ``[since, upper)``
  (:func:`check_as_of`). A range is exact while nothing before it was forwarded into it
  (:meth:`CollectionInfo.exact`).
* **Consolidated tasks** split the keys into disjoint ranges (:mod:`persist.indexed.read.split`,
  from the sorted parts' per-batch key stats: a task decodes only the parts and record
  batches that may hold its keys), as many as keep what all of them decode within 1.5 times
  the bytes stored. No plan relies on every task reading every part: parts without a usable
  order (an older persist's unsorted parts, until compaction rewrites them; inline parts) are
  read by every range and so allow fewer ranges, and keys without a range order (records)
  are read by one task. Every key lands in exactly one task, so the tasks' outputs are
  disjoint and their union is the snapshot. A single task over every key can also be read
  sorted (``ordered``): what a client's snapshot returns (:class:`SnapshotRead`).
* **Planning again.** A consolidated read that finds a part gone (GC after compaction replaced
  it) re-plans on a newer state: its answer is definite, so the same. Every read that retries
  does so through :func:`retrying`, with one budget (:data:`READ_ATTEMPTS`). Raw snapshot
  tasks do not retry (raw rows are not definite); a reader of changes may re-plan the whole
  range and read it again (the client's listener does), never part of it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, cast

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import Corruption, InvalidUsage, PartMissing, PersistError, SchemaMismatch
from persist.indexed.format import columnar, evolve, records, stats, transfer
from persist.indexed.format.meta import CollectionMeta, OfPart, PartMeta, State
from persist.indexed.read import buckets, split
from persist.indexed.read.filter import AnyFilter, Bound, Filter, bind
from persist.indexed.read.parts import PartReader
from persist.indexed.read.prune import PruneCounts, Pruner
from persist.indexed.state import history
from persist.indexed.state import holds as named
from persist.indexed.state.holds import HoldInfo
from persist.indexed.state.transitions import check_time, collection, effective_since

#: Consolidated reads split by key range: one range (task) per this many rows, by default.
ROWS_PER_RANGE = 4_000_000
#: Raw and change reads: tasks of about this many rows, by default (about Spark's default
#: 128 MiB file split for two int64 columns).
ROWS_PER_TASK = 4_000_000
#: How many states a read tries before a part that GC removed meanwhile is reported as
#: ``PartMissing``: the one it was planned on, then a newer one per retry. A part goes only a
#: GC grace (300 s by default) after compaction replaced it, so a retry is rare and a second
#: one rarer; the budget is for writers compacting and collecting with no grace at all (tests,
#: the nemesis), where each retry can lose the race again.
READ_ATTEMPTS = 8

_T = TypeVar("_T")


def retrying(read: Callable[[State | None], _T], fresh: Callable[[], State] | None) -> _T:
    """``read(None)`` (on the state the read was planned on) and, each time it raises
    ``PartMissing``, ``read(fresh())`` on a newer state, up to :data:`READ_ATTEMPTS` in all.

    Only for reads whose answer does not depend on the state they are read on (a definite
    snapshot, or a range of changes read whole): that is what makes a retry invisible.

    Raises:
        PartMissing: the last attempt found a part gone too (or ``fresh`` is None).
    """
    state: State | None = None
    for attempt in range(READ_ATTEMPTS):
        try:
            return read(state)
        except PartMissing:
            if attempt == READ_ATTEMPTS - 1 or fresh is None:
                raise
            state = fresh()
    raise AssertionError("unreachable")  # pragma: no cover


def check_as_of(c: CollectionMeta, as_of: int) -> None:
    """Checks that a read of ``c`` as of ``as_of`` is definite: ``since <= as_of < upper``.

    Raises:
        InvalidUsage: ``as_of`` is not a time, or lies outside ``[since, upper)``.
    """
    check_time("as_of", as_of)
    since = effective_since(c)
    if as_of < since:
        raise InvalidUsage(
            f"read of {c.name!r} as of {as_of} is below its since {since}: history before "
            f"{since} may be compacted and is no longer distinguishable"
        )
    if as_of >= c.upper:
        raise InvalidUsage(
            f"read of {c.name!r} as of {as_of} is not below its upper {c.upper}: times "
            f">= {c.upper} are not sealed yet"
        )


def resolve_as_of(c: CollectionMeta, as_of: int | None) -> int:
    """The time a snapshot of ``c`` reads as of: ``as_of``, checked (:func:`check_as_of`), or,
    for None, the latest sealed time (``upper - 1``).

    Raises:
        InvalidUsage: nothing is sealed yet (upper 0: there is no time to read as of);
            ``as_of`` is not a time or lies outside ``[since, upper)``.
    """
    if as_of is None:
        if c.upper == 0:
            raise InvalidUsage(f"collection {c.name!r} has nothing sealed yet (upper is 0): "
                               f"there is no time to read as of")
        as_of = c.upper - 1
    check_as_of(c, as_of)
    return as_of


#: The newest encoding of a part handle this persist decodes (and the one it encodes,
#: :meth:`PartHandle.to_bytes`). 2: its part may be a marked part (metadata format 8), whose
#: hidden rows a persist that predates marks would read. 3: its part may be a compressed inline
#: part (metadata format 9), which a persist that predates it cannot decode.
READ_RECORD_VERSION = 3
#: The newest encoding of a read task this persist decodes (and the one it encodes,
#: :meth:`ReadTask.to_bytes`). 2: a filter's int literal outside msgpack's ints (a
#: ``decimal128(38, 0)`` field's, say) travels as a ``"bigint"`` literal; 1 could not carry it.
#: 3: a part may be marked (as a handle's 2). 4: a part may be a compressed inline part (as a
#: handle's 3).
READ_TASK_VERSION = 4


class Address(msgspec.Struct, frozen=True):
    """Where a location is, as every process opens it: its URL and storage options (sorted
    ``(name, value)`` pairs)."""

    url: str
    storage: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Address:
        """The address of ``url`` opened with ``storage_options``."""
        return cls(str(url), tuple(sorted((storage_options or {}).items())))

    @property
    def storage_options(self) -> dict[str, Any]:
        """The ``storage_options`` to open the location with (a fresh dict)."""
        return dict(self.storage)


def stripped(c: CollectionMeta) -> CollectionMeta:
    """``c`` without what a reading task never needs (parts, holds, history): its types and
    schema history, small enough to ride in every task."""
    return msgspec.structs.replace(c, parts=(), holds={}, history=msgspec.UNSET,
                                   unsealed=msgspec.UNSET)


class PartHandle(transfer.Travelling, msgspec.Struct, OfPart, frozen=True, kw_only=True):
    """One storage part of a scan, and which of its rows the scan covers (``lo <= time < hi``),
    readable on any machine with :func:`persist.distributed.read_part`.

    Serializable: :meth:`to_bytes` / :meth:`from_bytes`, and pickle (which uses them), both
    checksummed (:class:`persist.indexed.format.transfer.Travelling`).
    """

    #: The format of this record (refused by a persist that predates it).
    version: int = READ_RECORD_VERSION
    address: Address
    collection: CollectionMeta
    #: The schema version its rows are read as (migrated on read).
    schema_version: int
    part: PartMeta
    lo: int
    hi: int

    @property
    def stats(self) -> Any:
        """The part's per-field stats (``persist.indexed.format.stats.PartStats``), or None."""
        s = self.part.stats
        return None if s is msgspec.UNSET else s

    KIND: ClassVar[str] = "persist.PartHandle"
    NEWEST: ClassVar[int] = READ_RECORD_VERSION
    NEWER: ClassVar[str] = "plan and read with the same persist version"

    def check_decoded(self) -> None:
        """Its collection's types decode, it reads as one of their versions, and its part
        holds together (see ``Travelling.check_decoded``)."""
        _check_travelling(self.collection, self.schema_version, (self.part,), None)


TaskKind = Literal["snapshot", "consolidated", "changes"]


@dataclass(frozen=True)
class Layers:
    """A snapshot's parts as its consolidated read uses them (:func:`layers`): the ``base``,
    parts that are settled among themselves (consolidated, one time at or before the as-of
    time, key-disjoint by their stats, of the schema version read), whose rows are their own
    contents already; and the ``runs``, every other part with rows, applied on top of the base.

    How a read applies them (DESIGN.md §11a, the read plan): a base row whose key no run
    holds is an answer row as it is (its time forwarded to the as-of time); only the base
    rows whose key a run holds are summed, together with the runs' rows. With no runs the
    read sums nothing (:attr:`settled`).
    """

    base: tuple[PartMeta, ...]
    runs: tuple[PartMeta, ...]
    #: The base's *delta*, when it has one (also in ``base``): the consolidated part that
    #: the marked base parts' marks were computed with (:func:`persist.indexed.read.split.
    #: paired`). The base parts, each minus its marks (``PartMeta.marks``, applied by every
    #: read of the part), and the delta hold every ``(key, value)`` at most once.
    delta: PartMeta | None = None

    @property
    def settled(self) -> bool:
        """Whether there are no runs: the base alone is the contents."""
        return not self.runs

    @property
    def base_rows(self) -> int:
        """Rows stored in the base's parts."""
        return sum(p.rows for p in self.base)

    @property
    def run_rows(self) -> int:
        """Rows stored in the runs (an upper bound on the updates applied to the base)."""
        return sum(p.rows for p in self.runs)


def layers(parts: Sequence[PartMeta], as_of: int, view: evolve.View) -> Layers:
    """``parts`` (of a snapshot as of ``as_of``, read as ``view``) split into its base and its
    runs (:class:`Layers`): the base is :func:`persist.indexed.read.split.base` of the parts
    stored as the version read (a part of another version is migrated on read, and a migration
    may make two records equal), the runs every other part with rows. The one rule every
    consolidated read follows: ``read_task``, a client's snapshot and the native plan
    (:func:`persist.distributed.plan_native`)."""
    same = [p for p in parts if evolve.part_version(p) == view.target]
    key_type = view.schema.field("key").type
    b = split.base(same, as_of, key_type)
    # NB: a marks step's delta (DESIGN.md §8) is not key-disjoint from the marked base parts
    # by their stats, only by their marks: it joins the base when they name it.
    delta = split.paired(b, same, as_of, key_type)
    if delta is not None:
        b = tuple(p for p in parts if p.id == delta.id or p.id in {x.id for x in b})
    ids = {p.id for p in b}
    return Layers(b, tuple(p for p in parts if p.rows and p.id not in ids), delta)


class ReadTask(transfer.Travelling, msgspec.Struct, frozen=True, kw_only=True):
    """One task of a scan (:meth:`Scan.tasks`), read on any machine with
    :func:`persist.distributed.read_task`.

    * ``snapshot``: the raw updates of ``parts`` at or before ``hi - 1`` (the as-of time), with
      times forwarded to it;
    * ``consolidated``: the contents as of ``hi - 1`` of the keys in ``key_range`` (None: every
      key): every ``(key, value)`` once, its diffs summed (never 0), time ``hi - 1``. ``bucket``
      is the task's index among ``buckets`` tasks of the plan (its share of the audit);
    * ``changes``: the updates of ``parts`` with ``lo <= time < hi``, original times.

    With a ``filter``, exactly the rows that match it. ``audit``: this task's share of the
    parts the planner's pruning skipped, each re-read and checked (``audited``).

    Serializable: :meth:`to_bytes` / :meth:`from_bytes`, and pickle (which uses them), both
    checksummed (:class:`persist.indexed.format.transfer.Travelling`).
    """

    #: The format of this record (refused by a persist that predates it).
    version: int = READ_TASK_VERSION
    kind: TaskKind
    address: Address
    collection: CollectionMeta
    schema_version: int
    parts: tuple[PartMeta, ...]
    lo: int
    hi: int
    # NB: the union of the filter's node types, not their base class: msgspec decodes a
    # tagged union, and a field typed as the base decoded nothing but the base (every task
    # with a filter failed ReadTask.from_bytes).
    filter: AnyFilter | None = None
    #: The task's index among the plan's ``buckets`` consolidated tasks (the names are from
    #: when they were key-hash buckets; the record keeps them).
    bucket: int = 0
    buckets: int = 1
    #: A consolidated task over a key range (None: over every key).
    key_range: split.KeyRange | None = None
    #: Raw and change tasks: parts read only in part, ``(part id, first batch, end batch)``
    #: (record batches ``first <= i < end``, as the part's stats count them); other parts are
    #: read whole. Lets tasks be balanced finer than by whole parts.
    slices: tuple[tuple[str, int, int], ...] = ()
    audit: tuple[PartMeta, ...] = ()
    audited: bool = False

    @property
    def as_of(self) -> int:
        """The time a snapshot or consolidated task reads as of (``hi - 1``)."""
        return self.hi - 1

    @property
    def rows(self) -> int:
        """Rows stored in the task's parts (an upper bound on what it reads)."""
        return sum(p.rows for p in self.parts)

    @property
    def handles(self) -> tuple[PartHandle, ...]:
        """The task's parts as public views (``PartHandle``: id, rows, bytes, times, stats),
        each readable on its own over the task's times. ``parts`` holds the engine's own
        records (``PartMeta``, whose fields are the storage format's, not an API)."""
        c = stripped(self.collection)
        return tuple(PartHandle(address=self.address, collection=c,
                                schema_version=self.schema_version, part=p, lo=self.lo,
                                hi=self.hi) for p in self.parts)

    @property
    def view(self) -> evolve.View:
        """How the task's parts are read: migrated to its schema version."""
        return evolve.View.of(self.collection, self.schema_version)

    @property
    def schema(self) -> pa.Schema:
        """The schema of every table the task yields (``key, value, time, diff``)."""
        return self.view.schema

    @property
    def layers(self) -> Layers:
        """A consolidated task's parts split into the base its read passes through and the
        runs it applies on top (:func:`layers`, as of the task's as-of time)."""
        return layers(self.parts, self.as_of, self.view)

    KIND: ClassVar[str] = "persist.ReadTask"
    NEWEST: ClassVar[int] = READ_TASK_VERSION
    NEWER: ClassVar[str] = "plan and read with the same persist version"

    def check_decoded(self) -> None:
        """Its collection's types decode, it reads as one of their versions, its parts hold
        together and its filter applies to its types (see ``Travelling.check_decoded``)."""
        _check_travelling(self.collection, self.schema_version, (*self.parts, *self.audit),
                          self.filter)


def _check_travelling(c: CollectionMeta, sid: int, parts: Sequence[PartMeta],
                      f: Filter | None) -> None:
    """What a read task or a part handle must hold, decoded from bytes (a buggy producer's
    with a valid checksum): ``c``'s types decode, ``sid`` is one of its versions, every part
    is stored in one place with one of its versions, and ``f`` binds to version ``sid``.

    Raises:
        Corruption, InvalidUsage, SchemaMismatch: it does not (``from_bytes`` reports each as
            the record's ``Corruption``).
    """
    view = evolve.View.of(c, sid)
    for p in parts:
        transfer.check_part_record(p, view.schemas)
    if f is not None:
        _bound(f, c, sid)


@dataclass(frozen=True)
class CollectionInfo:
    """A collection as one state of its location's metadata shows it: its types, frontiers,
    holds and history, and the reads it can plan (:meth:`snapshot`, :meth:`changes`).

    Made by :func:`persist.distributed.describe`, :class:`persist.distributed.Watch` or
    ``Client.info``; planning from it reads no storage.
    """

    address: Address
    meta: CollectionMeta = field(repr=False)
    #: The metadata sequence number of the state this was taken from.
    seq: int = 0

    @property
    def name(self) -> str:
        """The collection's name."""
        return self.meta.name

    @property
    def id(self) -> int:
        """The collection's id (unique within its location, never reused)."""
        return self.meta.id

    @property
    def upper(self) -> int:
        """Every time below it is sealed."""
        return self.meta.upper

    @property
    def since(self) -> int:
        """The effective since: ``min(since, holds)``; reads as of a time below it are not
        definite."""
        return effective_since(self.meta)

    @property
    def holds(self) -> dict[str, int]:
        """Durable read holds: hold id -> frontier."""
        return dict(self.meta.holds)

    def hold(self, name: str) -> HoldInfo | None:
        """Hold (or tag) ``name``, live or lapsed, with its kind and lease (None: none)."""
        return next((h for h in named.listing(self.meta) if h.name == name), None)

    @property
    def tags(self) -> dict[str, int]:
        """The collection's tags: name -> the time each pins."""
        return named.tags(self.meta)

    def tag(self, name: str) -> int:
        """The time tag ``name`` pins (read as of it: ``snapshot(info.tag(name))``).

        Raises:
            UnknownHold: no such tag.
        """
        return named.tag_time(self.meta, name)

    @property
    def schema_version(self) -> int:
        """The current schema version (0 until the first evolution)."""
        return evolve.version(self.meta)

    def types(self, schema_version: int | None = None) -> tuple[pa.DataType, pa.DataType]:
        """The key and value Arrow types of ``schema_version`` (None: the current one).

        Raises:
            InvalidUsage: not a version of the collection.
        """
        v = evolve.View.of(self.meta, schema_version)
        s = v.schema
        return s.field("key").type, s.field("value").type

    @property
    def key_type(self) -> pa.DataType:
        """The current key type."""
        return self.types()[0]

    @property
    def value_type(self) -> pa.DataType:
        """The current value type."""
        return self.types()[1]

    @property
    def codecs(self) -> tuple[str | None, str | None]:
        """The key's and value's Python-object codecs (dotted type names), if any."""
        return self.meta.key_codec, self.meta.value_codec

    def schema(self, schema_version: int | None = None) -> pa.Schema:
        """The schema every read of ``schema_version`` yields: ``key, value, time, diff``."""
        return evolve.View.of(self.meta, schema_version).schema

    @property
    def rows(self) -> int:
        """Rows stored in the collection's parts (updates, before consolidation)."""
        return sum(p.rows for p in self.meta.parts)

    def history(self) -> list[history.Seal]:
        """The most recent seals, oldest first (see :mod:`persist.indexed.state.history`)."""
        return history.entries(self.meta)

    def as_of_timestamp(self, when: Any) -> int:
        """The latest time sealed at or before wall-clock ``when`` (a datetime, an ISO-8601
        string or epoch milliseconds).

        Raises:
            InvalidUsage: nothing was sealed by then, or ``when`` is malformed.
        """
        return history.as_of_at(self.meta, when)

    def check_filter(self, f: Filter, schema_version: int | None = None) -> None:
        """Checks that ``f`` applies to this collection's types.

        Raises:
            SchemaMismatch: it names a field the types do not have, or compares a field with a
                value of another type (the message names the field).
        """
        self._bind(f, evolve.View.of(self.meta, schema_version).target)

    def _bind(self, f: Filter, sid: int) -> Bound:
        """``f`` checked against and bound to the types of schema version ``sid``."""
        t = evolve.Types.of(self.meta, sid)
        return bind(f, t.key.arrow_type, t.value.arrow_type, key_codec=t.key.name,
                    value_codec=t.value.name)

    def resolve_as_of(self, as_of: int | None = None) -> int:
        """The time a snapshot as of ``as_of`` reads as of: ``as_of`` checked against the
        frontiers, or (None) the latest sealed time, ``upper - 1`` (:func:`resolve_as_of`).

        Raises:
            InvalidUsage: nothing sealed yet; ``as_of`` outside ``[since, upper)``.
        """
        return resolve_as_of(self.meta, as_of)

    def exact(self, lo: int, hi: int) -> bool:
        """Whether the updates with ``lo <= time < hi`` can still be read exactly.

        Compaction forwards times below the effective since to it. From ``lo > 0`` the range
        is exact while ``lo - 1 >= since`` (nothing earlier was forwarded into it). From
        ``lo == 0`` nothing was delivered before, so forwarded history belongs in the range:
        it is exact while ``since < hi`` (history arrives at time ``since``, summing to the
        snapshot as of since).
        """
        since = self.since
        return since < hi if lo == 0 else lo - 1 >= since

    # -- planning ---------------------------------------------------------------------------

    def snapshot(self, as_of: int | None = None, *, filter: Filter | None = None,
                 schema_version: int | None = None, audit: bool = False) -> Scan:
        """Plans a read as of ``as_of`` (None: the latest sealed time, ``upper - 1``).

        Args:
            filter: only rows whose ``(key, value)`` match it; parts whose stats prove no row
                matches are left out of the plan (:attr:`Scan.skipped`).
            schema_version: read as this version of the collection's schema (None: current).
            audit: every part and record batch pruning skips is read anyway and checked
                (raising ``Corruption`` if one holds a match).

        Raises:
            InvalidUsage: ``as_of`` outside ``[since, upper)``; nothing sealed yet.
            SchemaMismatch: a filter that does not fit the types.
        """
        c = self.meta
        as_of = resolve_as_of(c, as_of)
        sid = evolve.View.of(c, schema_version).target
        bound = None if filter is None else self._bind(filter, sid)
        kept, skipped = _prune(snapshot_parts(c, as_of), filter, c, sid, bound)
        return Scan(self, sid, "snapshot", 0, as_of + 1, filter, kept, skipped, audit, bound)

    def check_changes(self, lo: int, hi: int, *, held: bool = False) -> None:
        """Checks that the updates with ``lo <= time < hi`` can be read: both are times, the
        range is sealed (``hi <= upper``), not empty, and exact (:meth:`exact`) unless
        ``held`` (the caller holds a read hold at ``lo - 1``). Every range plan checks it
        (:meth:`changes`); a reader that names the range otherwise (a change feed's inclusive
        versions) checks it here before planning.

        Raises:
            InvalidUsage: naming what is wrong and, for a range no longer exact, the since.
        """
        c = self.meta
        for what, t in (("lo", lo), ("hi", hi)):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidUsage(f"changes of {c.name!r}: {what} must be a time (an int >= "
                                   f"0), not {t!r}")
        if hi > c.upper:
            raise InvalidUsage(f"changes of {c.name!r} up to {hi}: times from its upper "
                               f"{c.upper} on are not sealed yet")
        if lo >= hi:
            raise InvalidUsage(f"changes of {c.name!r} from {lo} to {hi}: an empty range")
        if not held and not self.exact(lo, hi):
            raise InvalidUsage(
                f"changes of {c.name!r} from {lo} are no longer exact: its since is "
                f"{self.since} (updates before {lo} may have been compacted into the range); "
                f"start at {self.since + 1} or later, or keep a read hold")

    def changes(self, lo: int, hi: int, *, schema_version: int | None = None,
                held: bool = False) -> Scan:
        """Plans a read of the updates with ``lo <= time < hi``, with their original times.

        Args:
            held: the caller holds a read hold at ``lo - 1`` (or knows the range is exact).

        Raises:
            InvalidUsage: ``hi`` beyond upper, ``lo >= hi``, or the range is no longer exact
                (:meth:`exact`), naming the since.
        """
        self.check_changes(lo, hi, held=held)
        c = self.meta
        sid = evolve.View.of(c, schema_version).target
        return Scan(self, sid, "changes", lo, hi, None, range_parts(c, lo, hi), (), False)


def snapshot_parts(c: CollectionMeta, as_of: int) -> tuple[PartMeta, ...]:
    """The parts that hold every update at or before ``as_of``."""
    return tuple(p for p in c.parts if p.rows and p.min_time <= as_of)


def range_parts(c: CollectionMeta, lo: int, hi: int) -> tuple[PartMeta, ...]:
    """The parts that may hold updates with ``lo <= time < hi``."""
    return tuple(p for p in c.parts if p.rows and p.max_time >= lo and p.min_time < hi)


def _bound(f: Filter, c: CollectionMeta, sid: int) -> Bound:
    s = evolve.View.of(c, sid).schema
    return bind(f, s.field("key").type, s.field("value").type)


def _pruner(f: Filter | None, c: CollectionMeta, sid: int, *, audit: bool = False,
            counts: PruneCounts | None = None, bound: Bound | None = None) -> Pruner | None:
    """The pruner of reads of ``c`` as version ``sid`` filtered by ``f`` (None without one);
    ``bound``: ``f`` already bound to those types (the plan's), so not bound again."""
    if f is None:
        return None
    return Pruner(bound or _bound(f, c, sid), evolve.View.of(c, sid), audit=audit,
                  counts=counts)


def _prune(parts: Sequence[PartMeta], f: Filter | None, c: CollectionMeta, sid: int,
           bound: Bound | None = None) -> tuple[tuple[PartMeta, ...], tuple[PartMeta, ...]]:
    """``parts`` split into those that may hold a row matching ``f`` and those whose stats
    prove none does. A part without stats is kept; without a filter every part is.

    Sound for consolidated reads too: the filter reads only ``(key, value)``, so a part holding
    no matching row contributes nothing to a matching group's sum.
    """
    pr = _pruner(f, c, sid, bound=bound)
    if pr is None:
        return tuple(parts), ()
    kept: list[PartMeta] = []
    skipped: list[PartMeta] = []
    for p in parts:
        (kept if pr.part_may_match(p) else skipped).append(p)
    return tuple(kept), tuple(skipped)


def _share(parts: Sequence[PartMeta], i: int, n: int) -> tuple[PartMeta, ...]:
    """Task ``i`` of ``n``'s share of ``parts`` (every part in exactly one share)."""
    return tuple(p for j, p in enumerate(parts) if j % n == i)


def group(parts: Sequence[PartMeta], rows: int) -> list[tuple[PartMeta, ...]]:
    """Parts grouped into tasks: big parts alone, small ones together up to ``rows``."""
    out: list[tuple[PartMeta, ...]] = []
    pending: list[PartMeta] = []
    pending_rows = 0
    for p in sorted(parts, key=lambda p: (p.min_time, p.id)):
        if p.rows >= rows:
            out.append((p,))
            continue
        if pending and pending_rows + p.rows > rows:
            out.append(tuple(pending))
            pending, pending_rows = [], 0
        pending.append(p)
        pending_rows += p.rows
    if pending:
        out.append(tuple(pending))
    return out


Share = tuple[tuple[PartMeta, ...], tuple[tuple[str, int, int], ...]]


def balanced(parts: Sequence[PartMeta], rows: int) -> list[Share]:
    """Parts split into ``ceil(total / rows)`` tasks of nearly equal rows (at least one,
    possibly empty), cutting parts between record batches where their stats count them (a part
    without per-batch counts stays whole): each task's parts, and the batch ranges of those it
    reads only in part.
    """
    total = sum(p.rows for p in parts)
    k = max(1, math.ceil(total / max(rows, 1)))
    quota = total / k
    out: list[Share] = []
    cur: list[PartMeta] = []
    cur_slices: list[tuple[str, int, int]] = []
    filled = 0.0

    def flush() -> None:
        nonlocal cur, cur_slices, filled
        out.append((tuple(cur), tuple(cur_slices)))
        cur, cur_slices, filled = [], [], 0.0

    for p in sorted(parts, key=lambda p: (p.min_time, p.id)):
        s = p.stats
        sizes = s.batch_rows if isinstance(s, stats.PartStats) and s.batch_rows else (p.rows,)
        first = 0
        for i, n in enumerate(sizes):
            filled += n
            if filled >= quota and len(out) < k - 1:
                cur.append(p)
                if not (first == 0 and i == len(sizes) - 1):
                    cur_slices.append((p.id, first, i + 1))
                flush()
                first = i + 1
        if first < len(sizes):
            cur.append(p)
            if first > 0:
                cur_slices.append((p.id, first, len(sizes)))
    if cur or not out:
        flush()
    return out


@dataclass(frozen=True)
class Scan:
    """A planned read: a snapshot as of ``hi - 1`` or the changes ``[lo, hi)`` of one
    collection, as serializable part handles (:attr:`parts`) or tasks (:meth:`tasks`).

    ``kept`` and ``skipped_parts`` are the engine's own part records (``PartMeta``, the
    storage format's fields, not an API); their public views are :attr:`parts` and
    :attr:`skipped` (``PartHandle``), counted by :attr:`counts`.
    """

    info: CollectionInfo
    schema_version: int
    kind: Literal["snapshot", "changes"]
    lo: int
    hi: int
    filter: Filter | None
    kept: tuple[PartMeta, ...]
    skipped_parts: tuple[PartMeta, ...]
    audit: bool
    #: The filter as the planner bound it to the scan's types (reads in this process reuse it).
    bound: Bound | None = field(default=None, repr=False, compare=False)

    @property
    def as_of(self) -> int:
        """A snapshot's as-of time (``hi - 1``)."""
        return self.hi - 1

    @property
    def schema(self) -> pa.Schema:
        """The schema every table of this scan has (``key, value, time, diff``)."""
        return self.info.schema(self.schema_version)

    def _handle(self, p: PartMeta) -> PartHandle:
        return PartHandle(address=self.info.address, collection=stripped(self.info.meta),
                          schema_version=self.schema_version, part=p, lo=self.lo, hi=self.hi)

    @property
    def parts(self) -> tuple[PartHandle, ...]:
        """The parts the read needs, each readable on its own
        (:func:`persist.distributed.read_part`)."""
        return tuple(self._handle(p) for p in self.kept)

    @property
    def skipped(self) -> tuple[PartHandle, ...]:
        """The parts whose stats prove that none of their rows matches the filter."""
        return tuple(self._handle(p) for p in self.skipped_parts)

    @property
    def rows(self) -> int:
        """Rows stored in the planned parts (an upper bound on what the read returns)."""
        return sum(p.rows for p in self.kept)

    @property
    def counts(self) -> tuple[int, int]:
        """How many parts the read needs, and how many the filter's stats pruned."""
        return len(self.kept), len(self.skipped_parts)

    @property
    def layers(self) -> Layers:
        """A snapshot's parts split into its base and the runs on top (:func:`layers`): what
        its consolidated read passes through and what it applies. Its consolidated tasks
        (:meth:`tasks`) each split their own parts by the same rule.

        Raises:
            InvalidUsage: a range of changes (it has no base).
        """
        if self.kind != "snapshot":
            raise InvalidUsage("a range of changes is read raw: it has no base")
        return layers(self.kept, self.as_of, evolve.View.of(self.info.meta,
                                                             self.schema_version))

    def _common(self) -> dict[str, Any]:
        """What every task of this scan carries."""
        return {"address": self.info.address, "collection": stripped(self.info.meta),
                "schema_version": self.schema_version, "lo": self.lo, "hi": self.hi,
                "filter": cast("AnyFilter | None", self.filter), "audited": self._audited}

    @property
    def _audited(self) -> bool:
        return self.audit and self.filter is not None

    def task(self, *, consolidated: bool = False) -> ReadTask:
        """The whole read as one task, its parts in the collection's order: the raw updates
        (a snapshot's times forwarded to its as-of time), or (``consolidated``) a snapshot's
        contents over every key, one bucket, which :func:`read_task` can also read sorted.

        Raises:
            InvalidUsage: ``consolidated`` for a range of changes.
        """
        if consolidated and self.kind != "snapshot":
            raise InvalidUsage("a range of changes is read raw, not consolidated")
        kind: TaskKind = "consolidated" if consolidated else (
            "changes" if self.kind == "changes" else "snapshot")
        return ReadTask(kind=kind, parts=self.kept,
                        audit=self.skipped_parts if self._audited else (), **self._common())

    def tasks(self, *, consolidated: bool = False, n: int | None = None,
              rows_per_task: int | None = None) -> list[ReadTask]:
        """The read split into tasks whose outputs are disjoint and together are the read.

        Args:
            consolidated: a snapshot's contents (each ``(key, value)`` once, diffs summed) in
                up to ``n`` disjoint key ranges (default: one per ``ROWS_PER_RANGE`` rows):
                as many as keep the bytes all tasks decode within 1.5 times the bytes stored
                (:func:`persist.indexed.read.split.plan`), one task for keys without a range
                order (records); else raw updates, parts grouped up to ``rows_per_task`` rows
                (default ``ROWS_PER_TASK``; at least one task, possibly empty).

        Raises:
            InvalidUsage: ``consolidated`` for a range of changes; ``n`` below 1.
        """
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidUsage(f"tasks: n must be an int >= 1, not {n!r}")
        rows = ROWS_PER_TASK if rows_per_task is None else rows_per_task
        audited = self._audited
        common = self._common()
        if consolidated:
            if self.kind != "snapshot":
                raise InvalidUsage("a range of changes is read raw, not consolidated")
            key_type = self.info.types(self.schema_version)[0]
            want = n or max(1, math.ceil(self.rows / ROWS_PER_RANGE))
            # NB: as many key ranges as keep the bytes decoded within split.MAX_AMPLIFICATION
            # times those stored (fewer than asked when the parts' order does not allow
            # more); keys without a range order (records) get one task: hash buckets would
            # have every task decode every part.
            ranges = split.plan(self.kept, want, key_type) if want > 1 else None
            if ranges is not None and len(ranges) > 1:
                return [ReadTask(kind="consolidated", key_range=r, bucket=i, buckets=len(ranges),
                                 parts=tuple(p for p in self.kept
                                             if split.part_in(p, r, key_type)),
                                 audit=_share(self.skipped_parts, i, len(ranges))
                                 if audited else (), **common)
                        for i, r in enumerate(ranges)]
            return [ReadTask(kind="consolidated", parts=self.kept, bucket=0, buckets=1,
                             audit=self.skipped_parts if audited else (), **common)]
        kind: TaskKind = "changes" if self.kind == "changes" else "snapshot"
        if self.filter is None:
            shares = balanced(self.kept, rows)
            return [ReadTask(kind=kind, parts=g, slices=sl, **common) for g, sl in shares]
        groups = group(self.kept, rows) or [()]
        return [ReadTask(kind=kind, parts=g,
                         audit=_share(self.skipped_parts, i, len(groups)) if audited else (),
                         **common)
                for i, g in enumerate(groups)]


# -- reading (any machine) --------------------------------------------------------------------


def read_part(reader: PartReader, h: PartHandle, *, filter: Filter | None = None,
              audit: bool = False, counts: PruneCounts | None = None) -> pa.Table:
    """The rows of part ``h`` with ``lo <= time < hi`` (original times), migrated to its
    schema version; with a ``filter``, only those matching it, decoding only the record
    batches whose stats may match (``counts``: where to count what was read and skipped).

    Raises:
        PartMissing: GC removed the part.
        SchemaMismatch: the filter does not fit the types.
        Corruption: the bytes are damaged (an inline part's included), or decode to invalid
            Arrow data; (``audit``) pruning skipped a match.
    """
    pr = _pruner(filter, h.collection, h.schema_version, audit=audit, counts=counts)
    view = evolve.View.of(h.collection, h.schema_version)
    _check_inline((h.part,), view)
    t = _load(reader, view, pr, h.part, h.lo, h.hi)
    if t is None:
        return view.schema.empty_table()
    try:
        # NB: cheap (~20 ms per million W10 records, a tenth of decoding them), and what a
        # caller is handed must be data Arrow's kernels can trust.
        t.validate(full=True)
    except pa.ArrowException as e:
        raise Corruption(h.part.blob_key or f"inline part {h.id}",
                         f"invalid Arrow data: {e}") from None
    return t


def _check_inline(parts: Iterable[PartMeta], view: evolve.View) -> None:
    """Checks every inline part of ``parts`` (whose Arrow payload travelled inside a task or
    a handle) before anything reads it: the payload decodes as its schema version's part
    schema, validates fully, and holds what its metadata says
    (:func:`persist.indexed.format.transfer.check_inline`).

    Raises:
        Corruption: it does not (never other rows, nor a crash in a compute kernel that was
            handed invalid arrays).
    """
    for p in parts:
        if p.inline is None:
            continue
        try:
            transfer.check_inline(p, view.schemas.part_schema(evolve.part_version(p)))
        except PersistError:
            raise
        except Exception as e:
            # NB: these bytes come from outside the checksummed store: whatever a decoder
            # raises on them (a ValueError from a damaged tag, an IndexError...) means they
            # are not what they claim to be.
            raise Corruption(f"inline part {p.id}",
                             f"undecodable payload ({type(e).__name__}: {e})") from e


def _in_range(t: pa.Table, part: PartMeta, lo: int, hi: int) -> pa.Table:
    """The rows of ``t`` (rows of ``part``) with ``lo <= time < hi``."""
    if not len(t) or (part.min_time >= lo and part.max_time < hi):
        return t
    tc = t.column("time")
    keep = pc.less(tc, pa.scalar(hi, pa.uint64()))
    if lo > 0:
        keep = pc.and_(keep, pc.greater_equal(tc, pa.scalar(lo, pa.uint64())))
    return t.filter(keep)


def _load(reader: PartReader, view: evolve.View, pr: Pruner | None, part: PartMeta,
          lo: int, hi: int, *, current: bool = False) -> pa.Table | None:
    """``part``'s rows with ``lo <= time < hi`` matching ``pr``'s filter (None: its stats rule
    it out), migrated to the view's target version; or (``current``) migrated to the current
    version and not yet filtered row by row (the filter is bound to the target's types).

    NB: filtering rows before consolidating them is exact. Consolidation sums the diffs of
    rows with equal ``(key, value)``, across parts; the filter is a function of ``(key, value)``
    alone, and records persist treats as equal (null = null, NaN = NaN) get the same answer
    from it. So every group of rows that consolidates together is kept whole or dropped whole:
    the kept groups sum as they would unfiltered, and filtering the consolidated result would
    drop exactly the groups dropped here.
    """
    if pr is None:
        t = view.read_current(reader, part) if current else view.read(reader, part)
    else:
        loaded = pr.load(reader, part, current=current)
        if loaded is None:
            return None
        t = loaded
    t = _in_range(t, part, lo, hi)
    if pr is not None and len(t) and not current:
        t = t.filter(pr.bound.mask(t))
    return t


def _slice(reader: PartReader, view: evolve.View, part: PartMeta, first: int, end: int,
           lo: int, hi: int) -> pa.Table:
    """Record batches ``first <= i < end`` of ``part``, migrated, rows with ``lo <= time <
    hi``.

    Raises:
        Corruption: the part has no per-batch counts, or not that many batches.
    """
    s = part.stats
    if not isinstance(s, stats.PartStats) or not 0 <= first < end <= len(s.batch_rows):
        raise Corruption(part.blob_key or f"inline part {part.id}",
                         f"a task reads its record batches [{first}, {end}), which its stats "
                         f"do not count")
    keep = [first <= i < end for i in range(len(s.batch_rows))]
    sid = evolve.part_version(part)
    t = reader.read_batches(part, view.schemas.part_schema(sid), keep, s.batch_rows)
    t = evolve.migrate(t, view.schemas, sid, view.target, view.name)
    return _in_range(t, part, lo, hi)


def _audit(reader: PartReader, pr: Pruner | None, parts: Sequence[PartMeta]) -> None:
    """Re-reads ``parts`` (which the planner's pruning skipped) and checks that none holds a
    row matching the filter (raising Corruption if one does)."""
    if pr is None:
        return
    for part in parts:
        pr.check_skipped_part(reader, part)


def read_task(reader: PartReader, task: ReadTask, fresh: Callable[[], State] | None = None,
              *, ordered: bool = False, counts: PruneCounts | None = None
              ) -> Iterator[pa.Table]:
    """Reads ``task``, yielding tables of ``task.schema`` (see :class:`ReadTask`).

    Args:
        fresh: for a consolidated task, a callable returning the location's newest
            :class:`~persist.indexed.format.meta.State`, to re-plan on when a part was
            collected (:func:`retrying`).
        ordered: a consolidated task over every key (:meth:`Scan.task`) read as one table
            sorted by ``(key, value)``; read as an older schema version, it is consolidated at
            the current version first, so a record that cancels out never has to fit the older
            one (DESIGN.md §14). What a client's snapshot returns.
        counts: with a filter, where to count the parts and record batches read and skipped.

    Raises:
        PartMissing: GC removed a part (a consolidated task re-plans on a newer state first,
            :data:`READ_ATTEMPTS` tries in all).
        InvalidUsage: (consolidated retry) since passed the as-of time meanwhile; ``ordered``
            for a task that is not one consolidated task over every key.
        SchemaMismatch: (consolidated retry) the schema evolved meanwhile.
        Corruption: the bytes of a part (an inline one's included) are damaged.
    """
    _check_inline((*task.parts, *task.audit), task.view)
    return _read(reader, task, fresh, ordered=ordered, counts=counts)


def _read(reader: PartReader, task: ReadTask, fresh: Callable[[], State] | None = None,
          *, ordered: bool = False, counts: PruneCounts | None = None,
          bound: Bound | None = None) -> Iterator[pa.Table]:
    """:func:`read_task`; ``bound``: the task's filter as its planner (in this process) bound
    it, not bound again."""
    if ordered and (task.kind != "consolidated" or task.buckets != 1
                    or task.key_range is not None):
        raise InvalidUsage("only a consolidated task over every key (Scan.task(consolidated="
                           "True)) can be read ordered")
    if task.kind == "consolidated":
        read = _contents if ordered else _bucket

        def attempt(state: State | None) -> pa.Table:
            return read(reader, task if state is None else _replanned(task, state, counts),
                        counts, bound)

        yield retrying(attempt, fresh)
        return
    view = task.view
    pr = _pruner(task.filter, task.collection, task.schema_version, audit=task.audited,
                 counts=counts, bound=bound)
    _audit(reader, pr, task.audit)
    as_of = task.as_of
    sliced = {pid: (a, b) for pid, a, b in task.slices}
    for part in task.parts:
        if part.id in sliced:
            t: pa.Table | None = _slice(reader, view, part, *sliced[part.id], task.lo, task.hi)
        else:
            t = _load(reader, view, pr, part, task.lo, task.hi)
        if t is None or not len(t):
            continue
        if task.kind == "snapshot":
            t = t.set_column(2, view.schema.field(2), columnar.constant_times(as_of, len(t)))
        yield t


def _replanned(task: ReadTask, state: State, counts: PruneCounts | None) -> ReadTask:
    """``task`` planned again on ``state`` (a part it read was collected): the same as-of
    time, filter, schema version and keys; the collection's newest parts and schema history.

    NB: sound because the contents as of ``as_of`` are definite: every state with ``as_of``
    in ``[since, upper)`` yields the same rows for the same keys.

    Raises:
        InvalidUsage: since passed the as-of time.
        SchemaMismatch: the task's schema version is not what it was (a replaced location).
    """
    c = collection(state.collections, task.collection.name)
    if task.as_of < effective_since(c):
        raise InvalidUsage(
            f"read of {c.name!r} as of {task.as_of}: since passed it "
            f"({effective_since(c)}) while the read ran; read as of a later time")
    if evolve.version(c) < task.schema_version or \
            evolve.View.of(c, task.schema_version).schema != task.schema:
        raise SchemaMismatch(
            f"read of {c.name!r}: its schema changed while the read ran (now version "
            f"{evolve.version(c)}); run it again")
    parts, skipped = _prune(snapshot_parts(c, task.as_of), task.filter, c, task.schema_version)
    if task.key_range is not None:
        key_type = task.schema.field("key").type
        parts = tuple(p for p in parts if split.part_in(p, task.key_range, key_type))
    if counts is not None:
        counts.parts_pruned += len(skipped)
    # NB: the newest schema history too: a part written since may be of a newer version,
    # which the task's old history could not migrate.
    return msgspec.structs.replace(
        task, collection=stripped(c), parts=parts,
        audit=_share(skipped, task.bucket, task.buckets) if task.audited else ())


def _contents(reader: PartReader, task: ReadTask, counts: PruneCounts | None,
              bound: Bound | None) -> pa.Table:
    """An ordered read of a consolidated task over every key (see :func:`read_task`)."""
    view = task.view
    pr = _pruner(task.filter, task.collection, task.schema_version, audit=task.audited,
                 counts=counts, bound=bound)
    _audit(reader, pr, task.audit)
    # NB: as an older version, consolidated at the current one first, then migrated back and
    # consolidated again (dropping a field may make two records equal): consolidating first
    # is what makes the read definite, since compaction (which migrates to the current
    # version) cannot then change what it returns.
    older = not view.current
    loaded = [(p, t) for p in task.parts
              if (t := _load(reader, view, pr, p, 0, task.hi, current=older)) is not None]
    if not loaded:
        return view.schema.empty_table()
    if not older and not _nested(view.schema):
        return _applied(loaded, task, ordered=True)
    out = columnar.contents_at(pa.concat_tables([t for _, t in loaded]), task.as_of)
    if not older:
        return out
    out = columnar.contents_at(view.from_current(out), task.as_of)
    return out if pr is None or not len(out) else out.filter(pr.bound.mask(out))


def _nested(schema: pa.Schema) -> bool:
    """Whether the key or value is a record or list (sorted by their frame, not by Arrow)."""
    return any(records.is_nested(schema.field(i).type) for i in (0, 1))


def _bucket(reader: PartReader, task: ReadTask, counts: PruneCounts | None,
            bound: Bound | None) -> pa.Table:
    """An unordered read of a consolidated task: its key range (:func:`_ranged`), or every
    key.

    Raises:
        InvalidUsage: a task of one hash bucket of several (planned by an older persist:
            plans split by key range now).
    """
    view = task.view
    pr = _pruner(task.filter, task.collection, task.schema_version, audit=task.audited,
                 counts=counts, bound=bound)
    _audit(reader, pr, task.audit)
    if task.key_range is not None:
        return _ranged(reader, task, view, pr)
    if task.buckets > 1:
        raise InvalidUsage(f"a consolidated task of hash bucket {task.bucket} of "
                           f"{task.buckets}: planned by an older persist (reads split by key "
                           f"range now); plan and read with the same persist version")
    loaded = [(part, t) for part in task.parts
              if (t := _load(reader, view, pr, part, 0, task.hi)) is not None]
    return _applied(loaded, task)


def _ranged(reader: PartReader, task: ReadTask, view: evolve.View, pr: Pruner | None
            ) -> pa.Table:
    """A key-range task's consolidation: each part's record batches that may hold a key of the
    range (and, with a filter, may match it) are decoded, and only the range's rows kept."""
    r = task.key_range
    assert r is not None
    loaded: list[tuple[PartMeta, pa.Table]] = []
    for part in task.parts:
        if pr is not None:
            # NB: the filter's own batch pruning decides what is decoded; the range's rows are
            # then cut exactly (both only ever drop rows that are not wanted).
            t = _load(reader, view, pr, part, 0, task.hi)
            if t is None:
                continue
            t = split.rows_in(t, r)
        else:
            stored = view.schemas.part_schema(evolve.part_version(part))
            t, _ = split.load(reader, part, stored, r)
            t = evolve.migrate(t, view.schemas, evolve.part_version(part), view.target,
                               view.name)
            t = _in_range(t, part, 0, task.hi)
        if len(t):
            loaded.append((part, t))
    return _applied(loaded, task)


def settled(task: ReadTask) -> bool:
    """Whether a consolidated task's parts, times forwarded to its as-of time, are its contents
    already: they are all its base, no run on top (:attr:`ReadTask.layers`: consolidated, one
    time each, key-disjoint, each read as the version it was written with, since a migration
    could make two records equal). Its read then sums nothing."""
    return task.layers.settled


def _applied(loaded: Sequence[tuple[PartMeta, pa.Table]], task: ReadTask, *,
             ordered: bool = False) -> pa.Table:
    """A consolidated task's contents from its parts' rows (``loaded``: each part's rows at or
    before the as-of time, filtered): the runs applied to the base (:attr:`ReadTask.layers`).

    A base row whose key no run holds is an answer row already (the base is settled: one row
    per ``(key, value)``, no zero diff): it passes with its time forwarded. Only the base rows
    whose key a run holds (``is_in`` of the runs' keys, NaNs made one NaN first, null equal to
    null) are summed with the runs' rows. Exact: every group of rows consolidation sums has
    one key, so a group is either wholly passed (no run row in it, one base row) or wholly
    summed. ``ordered``: sorted by ``(key, value)``, as ``contents_at`` sorts (flat types).
    Keys without a range order (records) are summed whole.
    """
    schema = task.view.schema
    as_of = task.as_of

    def summed(t: pa.Table) -> pa.Table:
        return columnar.contents_at(t, as_of) if ordered else buckets.consolidate(t, as_of)

    ids = {p.id for p in task.layers.base}
    base = [t for p, t in loaded if p.id in ids and len(t)]
    runs = [t for p, t in loaded if p.id not in ids and len(t)]
    if not base and not runs:
        return schema.empty_table()
    key_type = schema.field("key").type
    if runs and (not base or not split.splittable(key_type)):
        return summed(pa.concat_tables(base + runs))
    b = pa.concat_tables(base)
    pieces: list[pa.Table] = []
    if runs:
        r = pa.concat_tables(runs)
        keys = pc.unique(records.one_nan(r.column("key")))
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        touched = pc.is_in(records.one_nan(b.column("key")), value_set=keys)
        pieces.append(summed(pa.concat_tables([b.filter(touched), r])))
        b = b.filter(pc.invert(touched))
    if ordered:
        # NB: contents_at's one NaN, so that a passed row is the row the sum would return
        b = b.set_column(0, schema.field(0), records.one_nan(b.column(0)))
        b = b.set_column(1, schema.field(1), records.one_nan(b.column(1)))
    pieces.append(b.set_column(2, schema.field(2), columnar.constant_times(as_of, len(b))))
    out = pa.concat_tables(pieces)
    return out.sort_by([("key", "ascending"), ("value", "ascending")]) if ordered else out


class SnapshotRead:
    """A snapshot scan (:meth:`CollectionInfo.snapshot`) read in this process through one part
    reader, whose cache its reads share: a client's snapshot, or ``persist snapshot``.

    :meth:`to_arrow` reads it as one ordered consolidated task (re-planned on a newer state
    from ``fresh`` when GC removed a part meanwhile); :meth:`batches` as one raw task.
    """

    def __init__(self, scan: Scan, reader: PartReader,
                 fresh: Callable[[], State] | None = None) -> None:
        """Reads nothing yet.

        Raises:
            InvalidUsage: ``scan`` is a range of changes.
        """
        if scan.kind != "snapshot":
            raise InvalidUsage("a range of changes is not a snapshot")
        self.scan = scan
        self._reader = reader
        self._fresh = fresh
        self._counts = None if scan.filter is None else PruneCounts()

    @property
    def as_of(self) -> int:
        """The time the snapshot reads as of."""
        return self.scan.as_of

    @property
    def schema(self) -> pa.Schema:
        """The schema of its rows: ``key, value, time, diff``."""
        return self.scan.schema

    @property
    def parts(self) -> tuple[PartMeta, ...]:
        """The parts holding every update at or before the as-of time, pruned or not, as of
        the state the snapshot was planned on."""
        return snapshot_parts(self.scan.info.meta, self.scan.as_of)

    @property
    def pruning(self) -> PruneCounts | None:
        """With a filter, the parts and record batches its reads fetched and those pruning
        skipped, over every read so far (a retry's re-plan included); else None."""
        return self._counts

    def _planned_skips(self) -> None:
        if self._counts is not None:
            self._counts.parts_pruned += len(self.scan.skipped_parts)

    def to_arrow(self) -> pa.Table:
        """The consolidated contents: one row per ``(key, value)`` with a nonzero summed diff,
        sorted by ``(key, value)``, time the as-of time; filtered, if the scan has a filter.

        Raises:
            PartMissing: a part was gone on every try (see :func:`retrying`).
            InvalidUsage, SchemaMismatch: as :func:`read_task`'s retry.
            SchemaMismatch: a live record does not fit the older version read.
            Corruption, ExternalError: damaged bytes; storage failed.
        """
        self._planned_skips()
        task = self.scan.task(consolidated=True)
        return next(_read(self._reader, task, self._fresh, ordered=True, counts=self._counts,
                          bound=self.scan.bound))

    def to_python(self) -> list[tuple[tuple[Any, Any], int, int]]:
        """:meth:`to_arrow` as ``((key, value), time, diff)`` tuples, keys and values decoded
        to Python objects by the version's codecs (msgpack-coded ones to their class)."""
        types = evolve.Types.of(self.scan.info.meta, self.scan.schema_version)
        return columnar.rows(self.to_arrow(), types.key, types.value, self.as_of)

    def batches(self) -> Iterator[pa.Table]:
        """The raw updates part by part (bounded memory), times forwarded to the as-of time,
        filtered. Their sum per ``(key, value)`` is the definite contents; the rows are not
        (compaction consolidates them), so this never retries: a part GC removed meanwhile
        raises ``PartMissing``."""
        self._planned_skips()
        yield from _read(self._reader, self.scan.task(), counts=self._counts,
                         bound=self.scan.bound)


def rows_per_time(reader: PartReader, info: CollectionInfo, lo: int, hi: int) -> Counter[int]:
    """How many updates each time in ``[lo, hi)`` has (admission control of streams).

    Parts at one time are counted from metadata alone; a part spanning several times is read
    (as stored: only its times are counted). From 0, every time at or below since is one
    indivisible step (compaction may have merged them into time since), counted at since.
    """
    c = info.meta
    counts: Counter[int] = Counter()
    lo_s, hi_s = pa.scalar(lo, pa.uint64()), pa.scalar(hi, pa.uint64())
    view = evolve.View.of(c)
    for p in range_parts(c, lo, hi):
        if p.min_time == p.max_time:
            counts[p.min_time] += p.rows
            continue
        tc = view.stored(reader, p).column("time")
        tc = tc.filter(pc.and_(pc.greater_equal(tc, lo_s), pc.less(tc, hi_s)))
        vc = pc.value_counts(tc)
        for t, k in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(),
                        strict=True):
            counts[int(t)] += int(k)
    if lo == 0:
        since = info.since
        low = sum(k for t, k in counts.items() if t <= since)
        counts = Counter({t: k for t, k in counts.items() if t > since})
        counts[since] += low
    return counts
