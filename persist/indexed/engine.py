"""The engine: named collections over a Blob, with one conditional metadata commit per step.

``Indexed`` is single-threaded and synchronous: the runtime thread owns one and feeds it groups
of commands, staged on a :class:`Txn` and committed with :meth:`Indexed.commit`; its
maintenance thread runs :meth:`Indexed.maintain_round` rounds, whose results it commits through the
same queue. Reads are planned and read by :mod:`persist.indexed.read.scan` on any ``State``,
from any thread, through the engine's part reader (:attr:`Indexed.reader`).

Commit pipeline for one step (a ``Txn``)::

    stage ops against a working copy (each command checked alone; a refused one changes nothing)
    -> one part per written collection: inline in the commit when small, else one data blob
    -> one metadata commit: set_if_absent(meta/log/<seq+1>)
    -> new state = apply(old state, commit)   (the readers' replay code, so writer == reader)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa

from persist import crashpoints, layout, metrics
from persist.blob.base import Blob, BlobRead
from persist.errors import (
    CommitDeadline,
    Corruption,
    Determinate,
    DiffOverflow,
    ExternalError,
    Fenced,
    Indeterminate,
    InvalidUsage,
    PersistError,
    ReadOnly,
)
from persist.indexed.format import columnar, evolve, stats
from persist.indexed.format.columnar import Codec
from persist.indexed.format.meta import (
    AddPart,
    CollectionMeta,
    EvolveSchema,
    Op,
    PartMeta,
    Register,
    ReplaceParts,
    Restore,
    Seal,
    State,
    check_op,
    decode_commit,
    log_from,
)
from persist.indexed.format.write import new_parts
from persist.indexed.maintenance import compact, gc, offload, pending
from persist.indexed.read.parts import CACHE_BYTES, PartReader
from persist.indexed.state.machine import GC_GRACE_SECONDS, CommitConflict, Machine
from persist.indexed.state.transitions import (
    Overlay,
    apply,
    apply_op,
    check,
    collection,
    effective_since,
    plan,
    touched,
    touches_retired,
)

replace = msgspec.structs.replace
log = logging.getLogger("persist.indexed")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Txn:
    """Ops staged against a working copy of ``base``; committed together as one step.

    The working copy copies nothing up front: ``collections`` is an :class:`Overlay` of the
    names staged over the base's map, and the retired blobs are copied only for an op that
    reads or changes them, so staging costs what the commands touch, not the location's size.
    """

    base: State
    collections: Overlay = field(init=False)
    ops: list[Op] = field(default_factory=list)
    writes: dict[str, list[pa.Table]] = field(default_factory=dict)
    #: The ``(min, max)`` time of each table of ``writes``, in the same order: found once,
    #: when it is staged (a short table in Python, see ``columnar.min_time``), so the commit
    #: never scans the group's concatenation for them again.
    write_times: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: ``time.monotonic()`` when the oldest data blob this commit will reference was written
    #: (parts made by compaction off-thread, or by the commit itself); see ``check_deadline``.
    blobs_written_at: float | None = None
    _retired: list[Any] | None = field(default=None, init=False, repr=False)
    #: The lowest id no collection of the base uses (computed at the first registration).
    _free_cid: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.collections = Overlay(self.base.collections)

    @property
    def retired(self) -> list[Any]:
        """The working copy of the retired blobs (made at the first use)."""
        if self._retired is None:
            self._retired = list(self.base.retired)
        return self._retired

    @retired.setter
    def retired(self, value: list[Any]) -> None:
        """Replaces the working copy of the retired blobs (an op that rewrites the list)."""
        self._retired = value

    def stage(self, op: Op) -> None:
        """Checks ``op`` (its types, then against the working copy) and applies it, or raises
        InvalidUsage and changes nothing."""
        if isinstance(op, Register) and not op.collection.name:
            raise InvalidUsage("a collection name must be a non-empty string")
        if isinstance(op, (EvolveSchema, Restore)) and not self.empty:
            raise InvalidUsage(f"a {'restore' if isinstance(op, Restore) else 'schema evolution'}"
                               f" commits alone: stage it in a commit of its own")
        self._not_after_evolution()
        retired: list[Any] = self.retired if touches_retired(op) else []
        try:
            check(self.collections, op, retired)  # the rules, with their own messages
        except TypeError:  # a field of a type the rules cannot even compare: name it
            check_op(op)
            raise
        check_op(op)
        # NB: the working copy's clock is now; the commit's own is a moment later. (A renewal
        # of a named hold staged here must not look ancient to a lapse planned after it.)
        apply_op(self.collections, retired, op, seq=self.base.seq + 1, wall_ms=_now_ms())
        self.ops.append(op)

    def free_cid(self) -> int:
        """An id that no collection of the base or of the working copy uses."""
        if self._free_cid is None:
            # NB: once per transaction, not per registration (a group of registrations at a
            # location of 10,000 collections scanned them all for each one)
            self._free_cid = max([self.base.next_cid,
                                  *(c.id + 1 for c in self.base.collections.values())])
        return max([self._free_cid, *(self.collections[n].id + 1
                                      for n in self.collections.changed()
                                      if n in self.collections)])

    def register(self, name: str, key: Codec, value: Codec) -> None:
        """Stages the registration of ``name`` with codecs ``key``/``value``, or, if it exists,
        checks them against its schema versions and stages nothing (create_or_load).

        Raises:
            SchemaMismatch: it exists with other types.
            InvalidUsage: ``name`` is not a non-empty string.
        """
        existing = self.collections.get(name)
        if existing is not None:
            check_types(existing, key, value)
        else:
            self.stage(Register(new_collection(self.base, self, name, key, value)))

    def evolve(self, name: str, key: Codec | None, value: Codec | None,
               expect: int | None = None) -> bool:
        """Stages the evolution of ``name``'s schema to ``key``/``value`` (None: keep that
        one); False, staging nothing, if they are its current types already. It commits alone.

        Raises:
            SchemaMismatch: a change :mod:`persist.indexed.format.evolve` does not allow, or
                ``expect`` is not the current version.
            UnknownCollection: no such collection.
            InvalidUsage: something was staged before it.
        """
        op = evolve.plan(collection(self.collections, name), key, value, expect)
        if op is None:
            return False
        self.stage(op)
        return True

    def stage_write(self, name: str, table: pa.Table, schema_id: int | None = None) -> None:
        """Stages updates (already normalized to the collection's schema version
        ``schema_id``, None: its current one; migrated to the current one, see
        :func:`persist.indexed.format.evolve.for_write`)."""
        c = collection(self.collections, name)
        if len(table):
            self._not_after_evolution()
            table = evolve.for_write(c, table, schema_id)
            lo, hi = columnar.time_range(table)
            if lo < c.upper:
                raise InvalidUsage(
                    f"write to {name!r} at time {lo} is below its upper {c.upper}: "
                    f"times below upper are sealed"
                )
            self.writes.setdefault(name, []).append(table)
            self.write_times.setdefault(name, []).append((lo, hi))

    def _not_after_evolution(self) -> None:
        # NB: a commit lists the parts of its writes before its other ops (so that its seals
        # follow them), which would put them before an evolution staged ahead of them; an
        # evolution is therefore alone in its commit (the runtime commits it on its own).
        if self.ops and isinstance(self.ops[0], (EvolveSchema, Restore)):
            raise InvalidUsage("a schema evolution (a restore) commits alone: nothing may "
                               "follow it in its commit")

    def wrote_blobs(self, at: float) -> None:
        """Notes that a data blob this commit will reference was written at ``at``."""
        if self.blobs_written_at is None or at < self.blobs_written_at:
            self.blobs_written_at = at

    def atomically(self) -> _Savepoint:
        """``with txn.atomically(): ...`` stages several ops all or nothing."""
        return _Savepoint(self)

    @property
    def empty(self) -> bool:
        """True if nothing was staged: committing it would change nothing."""
        return not self.ops and not self.writes


class _Savepoint:
    def __init__(self, txn: Txn) -> None:
        self.txn = txn

    def __enter__(self) -> None:
        t = self.txn
        # NB: O(what the transaction changed), not O(collections): the overlay and, if one
        # was made, the retired blobs' copy.
        self._saved = (t.collections.copy(), None if t._retired is None else list(t._retired),
                       len(t.ops),
                       {k: len(v) for k, v in t.writes.items()})

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            return
        t = self.txn
        collections, retired, n_ops, writes = self._saved
        t.collections, t._retired = collections, retired
        del t.ops[n_ops:]
        for k in list(t.writes):
            if k not in writes:
                del t.writes[k]
                t.write_times.pop(k, None)
            else:
                del t.writes[k][writes[k]:]
                del t.write_times[k][writes[k]:]


#: A writer's stop rolls up if at least this many commits followed the last rollup: one is
#: the writer's own fence (see :meth:`Indexed.rollup_at_stop`).
STOP_ROLLUP_MIN = 2


#: The largest ``Options.inline_threshold``: a commit record carries its inline parts and every
#: rollup carries every inline part, so past this a "small" commit is no longer small.
MAX_INLINE_THRESHOLD = 16 << 20


@dataclass(frozen=True)
class Options:
    """Engine options. Every one is *behaviour-preserving*: it changes cost (files, fsyncs,
    bytes, read amplification), never contents, frontiers or errors a caller can observe. The
    test suites run under several sets of them (the knob matrix, ``tests/knobs.py``).

    A writer reads its options at each use from ``Indexed.options``, which
    ``Client.set_options`` replaces between two commits (linearized like a write). Only
    ``cache_bytes`` is fixed at open (the part cache is sized once); ``gc_grace_seconds`` also
    sets how long the writer's own reloads trust a missing log entry.

    Raises:
        InvalidUsage: (on construction) a value of the wrong type or out of range.
    """

    #: Parts encoding to at most this many bytes ride inside the metadata commit (one file,
    #: one fsync per commit for small writes); larger ones get their own blob. 0: every
    #: non-empty part is a blob; at most ``MAX_INLINE_THRESHOLD``.
    inline_threshold: int = 64 << 10
    #: Write a rollup (whole state) after this many commits, bounding replay on open (>= 1).
    rollup_every: int = 64
    gc_grace_seconds: float = GC_GRACE_SECONDS
    #: A data blob is referenced by a commit sent within this long of writing it, or never: a
    #: later commit fails with ``CommitDeadline`` (a ``Determinate``) instead. ``persist verify
    #: --delete-leaked`` relies on it: a blob unreferenced for longer than its ``--grace``
    #: (default 300 s) plus a commit's latency is abandoned, not in flight (DESIGN.md §9).
    commit_deadline_seconds: float = 60.0
    compaction: compact.CompactionPolicy = field(default_factory=compact.CompactionPolicy)
    #: The part cache's budget, in decoded bytes (fixed at open).
    cache_bytes: int = CACHE_BYTES
    #: Group commit: the runtime commits every command queued behind the one it takes as one
    #: step. False: one command per commit (an fsync each; for tests and for measuring).
    group_commit: bool = True
    #: The maintenance thread merges parts after commits. False: only an explicit
    #: ``Client.maintain()`` compacts (GC and rollups still run in the background); reads then
    #: touch every part written since.
    background_compaction: bool = True
    #: The maintenance thread deletes data blobs that no commit references (left by a crash
    #: between writing a part and committing it) once they have stayed unreferenced this long
    #: (DESIGN.md §9). At least twice ``commit_deadline_seconds``: a blob younger than the
    #: deadline may still be claimed by a commit in flight. None: never (operators then run
    #: ``persist verify --delete-leaked``).
    leak_grace_seconds: float | None = 600.0
    #: The budget of each blob part's stats (:mod:`persist.indexed.format.stats`: per-field null
    #: counts and bounds, what filtered reads prune by), in encoded bytes; every rollup holds
    #: every part's. 0: no stats (filtered reads then read every part), but for a base part's
    #: key bounds (``compact.KEY_STATS_BYTES``, what the base relies on); at most
    #: ``stats.MAX_STATS_BYTES``.
    stats_bytes: int = stats.STATS_BYTES
    #: Rows per Arrow record batch of a stored part (>= 1): the unit a filtered read skips
    #: within a part that may match (by per-batch stats).
    batch_rows: int = columnar.BATCH_ROWS
    #: Filtered reads also read every part and record batch their stats let them skip, and
    #: raise ``Corruption`` if one held a matching row (:mod:`persist.indexed.read.prune`). Costs
    #: what pruning saves; for tests and for checking a location's stats.
    audit_pruning: bool = False
    #: A merge (or rewrite) of this many input rows or more runs in the writer's merge worker
    #: process (:mod:`persist.indexed.maintenance.offload`), outside the GIL of the process
    #: that appends; smaller ones run in the maintenance thread. Only a writer of a file or S3
    #: location has a worker (``persist.open`` starts it on its first such merge; a memory
    #: store cannot be shared with another process). None: every merge in-process.
    merge_worker_rows: int | None = offload.WORKER_ROWS

    def __post_init__(self) -> None:
        _check_int("inline_threshold", self.inline_threshold, 0, MAX_INLINE_THRESHOLD)
        _check_int("stats_bytes", self.stats_bytes, 0, stats.MAX_STATS_BYTES)
        _check_int("batch_rows", self.batch_rows, 1)
        _check_int("rollup_every", self.rollup_every, 1)
        _check_int("cache_bytes", self.cache_bytes, 0)
        if self.merge_worker_rows is not None:
            _check_int("merge_worker_rows", self.merge_worker_rows, 0)
        for name in ("gc_grace_seconds", "commit_deadline_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidUsage(f"Options.{name} must be a number >= 0, not {value!r}")
        if not isinstance(self.compaction, compact.CompactionPolicy):
            raise InvalidUsage(f"Options.compaction must be a CompactionPolicy, "
                               f"not {self.compaction!r}")
        leak = self.leak_grace_seconds
        if leak is not None and (isinstance(leak, bool) or not isinstance(leak, (int, float))
                                 or not leak >= 2 * self.commit_deadline_seconds):
            raise InvalidUsage(
                f"Options.leak_grace_seconds must be None or a number of seconds at least twice "
                f"commit_deadline_seconds ({self.commit_deadline_seconds:g}), not {leak!r}: a "
                f"younger unreferenced blob may belong to a commit still in flight")
        for name in ("group_commit", "background_compaction", "audit_pruning"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidUsage(f"Options.{name} must be a bool, not {getattr(self, name)!r}")


def _checked_options(options: object) -> Options:
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise InvalidUsage(f"options must be a persist.Options, not {options!r}")
    return options


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> None:
    if (isinstance(value, bool) or not isinstance(value, int) or value < lo
            or (hi is not None and value > hi)):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InvalidUsage(f"Options.{name} must be an integer {bound}, not {value!r}")


#: How a maintenance round makes its ops durable: ``commit(ops, written_at)`` commits ``ops``
#: as one step, all or nothing, refusing it with ``CommitDeadline`` if the data blobs written
#: (``time.monotonic()``) at ``written_at`` are past the commit deadline. The runtime sends them
#: through its queue (linearized with every other command); a caller that owns the engine
#: alone commits them directly (:meth:`Indexed.commit_ops`).
Committer = Callable[[Sequence[Op], float | None], object]

#: Compaction plans per maintenance round at most (merges cascade up the levels).
MAX_CASCADE = 16


def _no_hold(name: str) -> int | None:
    return None


def _always() -> bool:
    return True


def _never() -> bool:
    return False


class Indexed:
    """Named, definite collections at one location. Not thread-safe for writing."""

    def __init__(
        self,
        machine: Machine,
        state: State,
        *,
        epoch: int = 0,
        writer: str = "",
        options: Options | None = None,
    ) -> None:
        """Wraps an already loaded ``state`` of ``machine``'s location. Does no IO.

        Use :meth:`open` to load a location; this constructor is for callers that loaded (or
        made) the state themselves.
        """
        self.machine = machine
        #: The store the engine was opened on: a writer's whole store, or a replica's
        #: read-only view (which has no method that writes).
        self.store: BlobRead = machine.blob
        self.epoch = epoch
        self.writer = writer
        self.options = _checked_options(options)
        self.reader = PartReader(self.store, cache_bytes=self.options.cache_bytes)
        self.state = state
        loaded = machine.loaded
        # NB: counted from the rollup the state was loaded from, not from the state: a writer
        # that opens on a log tail of ``rollup_every`` entries or more rolls up at its first
        # round, so the tail every open reads stays bounded however short each session is.
        self._last_rollup_seq = self.state.seq if loaded is None else loaded.rollup
        #: The metadata trim (by seq; its progress is recorded in each rollup).
        self._trim = gc.MetaTrim()
        self._trim.observe(loaded)
        #: The trim's progress was found by a LIST (:meth:`MetaTrim.survey`) and is not yet
        #: recorded in a rollup: the next round writes one, so no later writer LISTs again.
        self._surveyed = False
        #: Held by the rollups, the metadata trim and the orphan-piece sweep
        #: (:meth:`metadata_lock`): a maintenance round runs them, and so does the runtime
        #: beside a round that waits on a long merge.
        self._meta_lock = threading.Lock()
        #: No budgeted rewrite of an old part starts before this (monotonic): see rewrite.
        self._next_rewrite = 0.0
        #: Which collections a maintenance round must look at (DESIGN.md §8).
        self.work = pending.WorkIndex()
        #: Merges (and rewrites) refused because a diff sum left int64, by collection: the ids
        #: of their parts, not planned again (see _refused).
        self._overflowed: dict[str, set[frozenset[str]]] = {}
        self._leaks: gc.LeakSweeper | None = None
        self._next_leak_sweep = 0.0
        self._pins = gc.PinGuard(0.0)
        #: The writer's merge worker process (set by ``persist.open`` for file and S3
        #: locations): merges of ``Options.merge_worker_rows`` rows or more run there.
        self.merger: offload.MergeWorker | None = None

    @classmethod
    def open(
        cls,
        blob: BlobRead,
        *,
        epoch: int = 0,
        writer: str = "",
        options: Options | None = None,
    ) -> Indexed:
        """Loads the newest state of the location in ``blob`` (a rollup and the log after it).

        Args:
            blob: the location's store; a read-only view makes a read-only engine.
            epoch: the writer's lock generation, stamped on its commits (0 for readers).
            writer: the writer's reentrance id, stamped on its commits.
            options: engine options (defaults: :class:`Options`).

        Raises:
            Corruption: the metadata cannot be decoded, or the log has a gap.
            IncompatibleFormat: the location was written by a newer format.
            ExternalError: the store failed.
        """
        options = _checked_options(options)
        # NB: each piece of a manifest is decoded at the first use of one of its collections
        # (DESIGN.md §4, "Lazy pieces"): the open reads every piece but decodes only those the
        # log after the rollup touches; a corrupt piece raises at its first use.
        machine = Machine(blob, gc_grace_seconds=options.gc_grace_seconds, lazy=True)
        return cls(machine, machine.load(), epoch=epoch, writer=writer, options=options)

    def set_options(self, options: Options) -> None:
        """Replaces the options; every later use reads the new ones (the runtime calls this
        between two commits, see ``Client.set_options``).

        Raises:
            InvalidUsage: not an ``Options``, or ``cache_bytes`` differs (fixed at open).
        """
        if not isinstance(options, Options):
            raise InvalidUsage(f"options must be a persist.Options, not {options!r}")
        if options.cache_bytes != self.options.cache_bytes:
            raise InvalidUsage("Options.cache_bytes is fixed when a location is opened "
                               f"({self.options.cache_bytes}); reopen to change it")
        # NB: one reference swap: a reader on another thread (the maintenance thread plans
        # compaction with ``options.compaction``) sees the old options or the new, never a mix
        # within one read of the attribute. Every option is behaviour-preserving, so a step
        # that reads it twice across a swap is still correct.
        self.options = options
        self.machine.gc_grace_seconds = options.gc_grace_seconds

    @property
    def writable(self) -> bool:
        """False for an engine opened on a read-only view (a replica)."""
        return isinstance(self.store, Blob)

    @property
    def blob(self) -> Blob:
        """The store, to write to (data parts, GC's deletes, leases' checks).

        Raises:
            ReadOnly: the engine was opened on a read-only view (a replica).
        """
        if not isinstance(self.store, Blob):
            raise ReadOnly("this location was opened read-only; it cannot write")
        return self.store

    # -- commits ---------------------------------------------------------------------------

    def fence(self, *, reload: bool = True) -> State:
        """Claims the log for this writer's epoch with an empty commit (see machine.py).

        Args:
            reload: load the newest state first. ``False`` (a writer that has just opened,
                after taking the lock) commits after the state it holds, and loads only if
                another commit came first: an open then reads the log once, not twice.
        """
        while True:
            if reload:
                self.reload()
            reload = True
            try:
                return self.commit(Txn(self.state), force=True)
            except CommitConflict:
                continue

    def commit(self, txn: Txn, *, force: bool = False) -> State:
        """Makes ``txn`` durable as one step and returns the new state.

        Raises:
            Fenced: a newer writer took over; nothing was committed.
            CommitConflict / Determinate: nothing was committed; the state is unchanged.
            InvalidUsage: the commit record would not decode; nothing was committed.
            Indeterminate: the commit may have landed; the caller must reload before going on.

        Whenever nothing was committed, the data blobs this commit wrote are deleted again.
        """
        if txn.base is not self.state:
            raise InvalidUsage("txn was staged against an old state")
        if txn.empty and not force:
            return self.state
        blob = self.blob
        ops: list[Op] = [op for op in txn.ops if isinstance(op, Register)]
        written: list[str] = []
        for name, tables in txn.writes.items():
            c = txn.collections[name]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            ranges = txn.write_times.get(name, ())
            times = ((min(r[0] for r in ranges), max(r[1] for r in ranges))
                     if len(ranges) == len(tables) else None)
            started = time.monotonic()
            parts = new_parts(blob, c, table, inline_threshold=self.options.inline_threshold,
                              times=times,
                              final_rows=self.options.compaction.final_rows,
                              stats_bytes=self.options.stats_bytes,
                              batch_rows=self.options.batch_rows, schema_id=evolve.version(c))
            for part in parts:
                part = evolve.tag(part, evolve.version(c))
                if part.blob_key is not None:
                    txn.wrote_blobs(started)
                    written.append(part.blob_key)
                ops.append(AddPart(name=name, part=part))
        crashpoints.hit("commit.data_written")
        for op in txn.ops:
            if isinstance(op, Register):
                continue
            # NB: a group commit of N appends to one collection stages N seals in a row; only
            # the last is observable (the commit is atomic, and each was checked against the
            # one before it when staged, so the last is the highest). Keeping one makes the
            # commit smaller and its replay (here and on every reader) O(1) instead of O(N).
            last = ops[-1] if ops else None
            if isinstance(op, Seal) and isinstance(last, Seal) and last.name == op.name:
                ops[-1] = op
            else:
                ops.append(op)
        try:
            commit = plan(self.state, ops, epoch=self.epoch, writer=self.writer,
                          wall_ms=_now_ms())
            new_state = apply(self.state, commit)
            self.check_deadline(txn.blobs_written_at)
            self.machine.commit(commit, log_from(self.state))
        except (Determinate, Fenced, InvalidUsage):
            # NB: each of these means the commit definitely did not land (refused before it
            # was sent, lost the race for its log key, or the store refused it), so nothing
            # will ever reference the blobs it wrote: delete them now rather than leave them
            # for a sweep. An Indeterminate keeps them: the commit may have landed. If a delete
            # fails, the maintenance sweep (or `persist verify --delete-leaked`) finds the blob.
            for key in written:
                with contextlib.suppress(PersistError):
                    blob.delete(key)
            raise
        if txn.blobs_written_at is not None:
            late = time.monotonic() - txn.blobs_written_at
            if late > self.options.commit_deadline_seconds:
                log.warning("commit seq %d landed %.3gs after its data blobs were written, past "
                            "the commit deadline of %gs", commit.seq, late,
                            self.options.commit_deadline_seconds)
        crashpoints.hit("commit.meta_written")
        names: list[str] = []
        for op in commit.ops:
            some = touched(op)
            if some is None:
                self.work.everything(commit.seq)
                break
            names.extend(some)
        self.work.touched(names, commit.seq)
        self.state = new_state
        return new_state

    def check_deadline(self, written_at: float | None, *, fraction: float = 1.0) -> None:
        """Refuses to send a commit referencing data blobs written (``time.monotonic()``) at
        ``written_at``, if that is longer ago than the commit deadline (times ``fraction``:
        the runtime admits a merge into a group only with half the deadline left).

        Raises:
            CommitDeadline: (a Determinate) the commit must not be sent.
        """
        if written_at is None:
            return
        age = time.monotonic() - written_at
        deadline = self.options.commit_deadline_seconds * fraction
        if age > deadline:
            raise CommitDeadline(
                f"not committing: its data blobs were written {age:.3g}s ago, past the commit "
                f"deadline of {deadline:g}s (a leaked-blob sweep may have deleted them); "
                f"nothing was committed, retry"
            )

    def reload(self) -> State:
        """Reads the truth from storage (after an indeterminate commit, or to follow a writer)."""
        self.state = self.machine.load()
        self._trim.observe(self.machine.loaded)
        self.work.everything(self.state.seq)
        return self.state

    def refresh(self) -> State:
        """Follows the log cheaply (read-only replicas)."""
        self.state = self.machine.refresh(self.state)
        return self.state

    def added_since(self, lo_seq: int, hi_seq: int, part_ids: set[str]) -> bool:
        """Whether a commit with ``lo_seq < seq <= hi_seq`` added any part in ``part_ids`` (by an
        append or a compaction's ``ReplaceParts``).

        NB: reads the log rather than the state: compaction may already have replaced the
        parts. An entry trimmed from the log (after a rollup) counts as not found.

        Raises:
            ExternalError, Corruption: reading the log failed.
        """
        sharded = log_from(self.state)
        for s in range(lo_seq + 1, hi_seq + 1):
            key = layout.log_key(s, sharded)
            data = self.store.get(key)
            if data is None:
                continue
            entry = decode_commit(key, data)
            if any((isinstance(op, AddPart) and op.part.id in part_ids)
                   or (isinstance(op, ReplaceParts) and any(p.id in part_ids for p in op.added))
                   for op in entry.ops):
                return True
        return False

    def commit_ops(self, ops: Sequence[Op], written_at: float | None = None) -> State:
        """Stages ``ops`` against the newest state, all or nothing, and commits them as one
        step (a caller that owns the engine alone: a hold setter, a maintenance round run
        without a runtime). ``written_at``: when the data blobs they reference were written
        (``time.monotonic()``; see :meth:`check_deadline`).

        Raises:
            InvalidUsage: an op the state refuses (nothing committed).
            CommitDeadline, Fenced, Determinate, Indeterminate: as :meth:`commit`.
        """
        txn = Txn(self.state)
        if written_at is not None:
            txn.wrote_blobs(written_at)
        with txn.atomically():
            for op in ops:
                txn.stage(op)
        return self.commit(txn)

    # -- maintenance: compaction, GC, rollups, leaked blobs -------------------------------------

    def maintain_round(self, state: Callable[[], State], commit: Committer, *,
                       held: Callable[[str], int | None] = _no_hold, compaction: bool = True,
                       now_ms: int | None = None, budgeted: bool = False,
                       idle: Callable[[], bool] = _always,
                       stop: Callable[[], bool] = _never) -> bool:
        """Runs one maintenance round: compaction and the rewrite of one old part (unless
        ``compaction`` is False), GC of retired blobs, a rollup and the metadata trim, the
        leaked-blob sweep. Returns True if any of them did something (more may be ready:
        cascading merges, more old parts).

        Args:
            state: returns the newest state (the runtime's published one); read anew by each
                step, since each commits.
            commit: makes a step's ops durable (see :data:`Committer`).
            held: the lowest in-process read hold on a collection (a listener's), if any:
                compaction forwards times no further.
            now_ms: GC's wall clock (default: now).
            budgeted: rewrite old parts and run big merges within their budget
                (:meth:`rewrite`, :meth:`compact`): a background round's; an explicit one
                does whatever the budget.
            idle: whether no command waits (budgeted work starts only then).
            stop: whether the writer is stopping: no further step or merge starts (one under
                way finishes and is committed, so that it leaves no blob behind).

        Raises:
            ExternalError, InvalidUsage, Corruption: the first step that failed (a storage
                error, a merge refused by a concurrent change, bytes persist cannot trust);
                the others still had their turn.
        """
        # NB: the steps are independent, and each runs even if an earlier one failed (its
        # error is raised after the others had their turn). Under a steady trickle of storage
        # errors, a GC that failed one delete among many used to end every round before the
        # rollup: the log after the newest rollup then grew without bound, and so did the
        # GETs a reopen needs (the slow nemesis found a writer that could no longer reopen).
        steps: list[Callable[[], bool]] = [
            lambda: self.collect_retired(state, commit, now_ms=now_ms),
            lambda: self.rollup_and_trim(state()),
            lambda: self.reclaim_leaked(state)]
        if compaction:
            steps[:0] = [lambda: self.compact(state, commit, held=held, budgeted=budgeted,
                                              idle=idle, stop=stop),
                         lambda: self.rewrite(state, commit, held=held, budgeted=budgeted,
                                              idle=idle)]
        did = False
        first: BaseException | None = None
        for step in steps:
            if stop():
                break
            try:
                did = step() or did
            except (ExternalError, InvalidUsage, Corruption) as e:
                # NB: Corruption too: a piece found corrupt at its first use (a round after
                # an open plans every collection, DESIGN.md §4 "Lazy pieces") or a part found
                # corrupt by a merge must not stop the rollups that bound the log.
                first = first or e
        if first is not None:
            raise first
        return did

    def rewrite(self, state: Callable[[], State], commit: Committer, *,
                held: Callable[[str], int | None] = _no_hold, budgeted: bool = False,
                idle: Callable[[], bool] = _always) -> bool:
        """Rewrites one old blob part into part format 4 (``compact.plan_rewrite``: a merge of
        that one part), committed on its own; returns whether it rewrote one.

        ``budgeted`` (the background's rounds): not while a command waits (``idle``), and at
        most ``CompactionPolicy.rewrite_share`` of the time, a rewrite that took ``d`` seconds
        being followed by ``d (1 / share - 1)`` seconds without one (module docstring of
        :mod:`persist.indexed.maintenance.compact`).

        Raises:
            CommitDeadline: the rewrite waited past the commit deadline (its parts are deleted
                again; a later round plans it anew).
            ExternalError, InvalidUsage: as ``commit``.
        """
        share = self.options.compaction.rewrite_share
        started = time.monotonic()
        if budgeted and (share <= 0 or started < self._next_rewrite or not idle()):
            return False
        newest = state()
        planned = self.plan_rewrite(newest)
        if planned is None:
            return False
        name, part = planned
        hold = held(name)
        c = newest.collections[name]
        frontier = effective_since(c) if hold is None else min(hold, effective_since(c))
        try:
            try:
                op = self.run_compaction(newest, name, (part,), frontier)
            except DiffOverflow as e:
                self._refused(name, (part,), e)
                raise
            try:
                commit((op,), started)
            except CommitDeadline:
                self._discard(op)  # refused before sending: nothing references its parts
                raise
        finally:
            self._budget(started)
        return True

    def compact(self, state: Callable[[], State], commit: Committer, *,
                held: Callable[[str], int | None] = _no_hold, budgeted: bool = False,
                idle: Callable[[], bool] = _always, stop: Callable[[], bool] = _never) -> bool:
        """Plans and runs merges, each committed on its own, until nothing is planned (at
        most :data:`MAX_CASCADE` plans) or ``stop()`` says the writer is stopping; returns
        whether it merged anything.

        ``budgeted`` (the background's rounds): a merge of ``compact.BUDGETED_ROWS``
        rows or more runs under the same budget as a rewrite (:meth:`rewrite`): only while no
        command waits, within ``rewrite_share`` of the time, at most one per round. One held
        back gives way to ``compact.interim``'s merge of that collection (never big: its
        ready inline runs flushed into a blob, its runs tiered), so they do not pile up in
        the metadata meanwhile.

        Raises:
            CommitDeadline: a merge waited past the commit deadline (its parts are deleted
                again; the next round plans it anew).
            DiffOverflow: a merge would have summed diffs outside int64: it wrote nothing and
                is not planned again until its collection's parts change; the others ran.
            ExternalError, InvalidUsage: as ``commit``.
        """
        refused: DiffOverflow | None = None
        # NB: plan again after merging: a merge can fill the next level up (cascading), and a
        # round per interval must not leave those for later rounds, in which the lowest level
        # (refilled by new writes meanwhile) would always be chosen first.
        did = False
        big_done = False
        for _ in range(MAX_CASCADE):
            if stop():
                break
            newest = state()
            planned = self.plan_compaction(newest, held=held)
            ran = False
            for name, parts in planned:
                if stop():
                    break
                policy = self.options.compaction
                big = sum(p.rows for p in parts) >= compact.BUDGETED_ROWS
                started = time.monotonic()
                hold = held(name)
                c = newest.collections[name]
                frontier = effective_since(c) if hold is None else min(hold, effective_since(c))
                flush = False
                if budgeted and big and (big_done or policy.rewrite_share <= 0
                                         or started < self._next_rewrite or not idle()):
                    # NB: the big merge waits for its budget; meanwhile the runs it would
                    # take must not pile up (ready inline ones ride in every rollup):
                    # compact.interim, never big itself
                    parts = compact.interim(c, policy, frontier)
                    if not parts or self._skipped(name, parts) \
                            or sum(p.rows for p in parts) >= compact.BUDGETED_ROWS:
                        continue
                    big, flush = False, compact.flushes(c, parts, frontier)
                try:
                    op = self.run_compaction(newest, name, parts, frontier, flush=flush)
                except DiffOverflow as e:
                    self._refused(name, parts, e)
                    refused = refused or e
                    continue
                finally:
                    if big:
                        big_done = True
                        self._budget(started)
                try:
                    commit((op,), started)
                except CommitDeadline:
                    # NB: refused before sending, so nothing references the merged parts:
                    # delete them now rather than leave them for a leaked-blob sweep. (Not on
                    # other Determinate errors: if one were ever wrong, deleting would lose
                    # data.)
                    self._discard(op)
                    raise
                did = ran = True
            if not ran:
                break
        if refused is not None:
            raise refused
        return did

    def _refused(self, name: str, parts: tuple[PartMeta, ...], e: DiffOverflow) -> None:
        """Notes a merge of ``parts`` of ``name`` refused by ``e``, and logs it once.

        NB: the merge consolidated before it wrote anything, so there is nothing to clean up
        and nothing changed: the parts stay as they are, readable raw and as of times before
        the overflow. Planning it again would fail the same way every round (reading its
        parts each time), so it is skipped until the collection's parts change (an append
        that brings the sum back, say), when the planner chooses anew. Not fail-stop: the
        state is sound and every other collection, merge and write goes on.
        """
        ids = frozenset(p.id for p in parts)
        refused = self._overflowed.setdefault(name, set())
        if ids not in refused:
            log.warning("compaction of %r refused a merge of %d parts: %s", name, len(parts), e)
        refused.add(ids)

    def _skipped(self, name: str, parts: tuple[PartMeta, ...]) -> bool:
        """Whether ``parts`` are a merge of ``name`` refused by a diff sum (see ``_refused``)."""
        refused = self._overflowed.get(name)
        return refused is not None and frozenset(p.id for p in parts) in refused

    def _budget(self, started: float) -> None:
        """After a big merge or a rewrite begun at ``started``: none other starts for
        ``d (1 / share - 1)`` seconds, ``d`` the time it took."""
        share = self.options.compaction.rewrite_share
        if share > 0:
            took = time.monotonic() - started
            self._next_rewrite = time.monotonic() + took * (1 / share - 1)

    def plan_compaction(self, state: State, *, held: Callable[[str], int | None] = _no_hold
                        ) -> list[tuple[str, tuple[Any, ...]]]:
        """The merges the compaction policy wants now in ``state`` (the engine's, or one its
        runtime published): ``(collection, parts)`` pairs (``held``: the in-process hold of a
        collection, how far its merges may forward)."""
        # NB: maintenance plans after every commit, but a commit changes few collections: the
        # work index re-plans only the collections changed since it last looked, and keeps the
        # non-empty plans (with 10,000 collections a pass over them all took ~1 ms of the GIL,
        # up to MAX_CASCADE times a round, after every commit).
        policy = self.options.compaction
        self.work.sync(state, policy)
        out = []
        for name, chosen in self.work.compactions(state):
            hold = held(name)
            if hold is not None:
                # NB: the index plans at the effective since; a read in flight in this process
                # may hold a collection lower, and a merge forwards no further: plan it again
                # under the hold (one collection, only while it is held).
                chosen = compact.plan(state.collections[name], policy, hold)
            if chosen and not self._skipped(name, chosen):
                out.append((name, chosen))
        return out

    def plan_rewrite(self, state: State) -> tuple[str, PartMeta] | None:
        """One blob part to rewrite into part format 4 (``compact.plan_rewrite``), and its
        collection's name; None if every part is current."""
        self.work.sync(state, self.options.compaction)
        for name, part in self.work.rewrites(state):
            if not self._skipped(name, (part,)):
                return name, part
        return None

    def lapsing(self, state: State, now_ms: int) -> list[str]:
        """The collections of ``state`` with a consumer hold whose lease ran out by ``now_ms``
        (found by due time, not by a pass over every hold)."""
        self.work.sync(state, self.options.compaction)
        return self.work.lapsing(now_ms)

    def run_compaction(
        self, state: State, name: str, parts: tuple[Any, ...], frontier: int | None = None,
        *, flush: bool = False,
    ) -> ReplaceParts:
        """Merges ``parts`` (reads and blob writes; no commit). Safe off the commit thread.
        The output joins the base when it can (``compact.into_base``), else it is a run (a
        single full part, rewritten, stays full; ``flush``: a blob part whatever its size,
        ``compact.flushes``). A merge of ``Options.merge_worker_rows`` rows
        or more runs in the merge worker process when the writer has one (:attr:`merger`).

        Raises:
            DiffOverflow: a diff sum left int64 (nothing written).
            MergeWorkerLost: the merge worker died; the merge did not happen.
            CommitDeadline: the merge worker did not answer within the commit deadline.
            ExternalError: reading or writing a part failed.
        """
        c = state.collections[name]
        opts = self.options
        # NB: a merged part of the flush size or more goes to a blob whatever the inline
        # threshold: with a threshold above the flush size (say the largest one), the merge
        # that flushes inline parts made one inline part again, which the next round merged
        # with the next small part, rewriting all of the collection's inline data each round
        # (found while adding the knob set inline-max to the matrix).
        threshold = 0 if flush else min(opts.inline_threshold,
                                        max(opts.compaction.inline_flush_bytes - 1, 0))
        if not flush and compact.marking(c, parts, opts.compaction, frontier):
            # NB: in-process: its CPU is an is_in over the base's keys and one sum of the
            # touched keys, far below the merge it stands in for.
            return compact.mark(self.blob, self.reader, c, tuple(parts), frontier=frontier,
                                stats_bytes=opts.stats_bytes, batch_rows=opts.batch_rows)
        base = compact.into_base(c, parts, frontier,
                                 flush_bytes=opts.compaction.inline_flush_bytes)
        job = offload.MergeJob(collection=c, parts=tuple(parts), inline_threshold=threshold,
                               frontier=frontier, stats_bytes=opts.stats_bytes,
                               batch_rows=opts.batch_rows,
                               part_target_bytes=opts.compaction.part_target_bytes, base=base,
                               keep_full=len(parts) == 1 and parts[0].full is True)
        merger = self.merger
        if (merger is not None and merger.usable and opts.merge_worker_rows is not None
                and job.rows >= opts.merge_worker_rows):
            # NB: a merge whose answer comes later than the commit deadline would be refused
            # at its commit anyway: the worker is stopped then (CommitDeadline).
            return merger.merge(job, timeout=opts.commit_deadline_seconds)
        return job.run(self.blob, self.reader)

    def close(self) -> None:
        """Ends the merge worker process, if one runs (the runtime calls this once its
        maintenance has stopped). Later merges run in-process."""
        merger, self.merger = self.merger, None
        if merger is not None:
            merger.close()

    def _discard(self, op: ReplaceParts) -> None:
        """Deletes the blobs of a merge that was never committed (never the data blob a
        marks step's marked part shares with the part it replaces)."""
        for key in compact.written(op):
            try:
                self.blob.delete(key)
            except PersistError as e:  # left for `persist verify --delete-leaked`
                log.info("could not delete the uncommitted merge %s: %s", key, e)

    def collect_retired(self, state: Callable[[], State], commit: Committer, *,
                        now_ms: int | None = None) -> bool:
        """Deletes the retired blobs past the GC grace (at ``now_ms``, default now) and
        commits their ``Forget``; returns whether there were any.

        Raises:
            ExternalError: a delete failed (the ``Forget`` of those deleted before it is still
                committed) or the commit did.
        """
        grace_ms = int(self.options.gc_grace_seconds * 1000)
        keys = self.unpinned(gc.collectable(state(), now_ms=int(time.time() * 1000)
                                            if now_ms is None else now_ms, grace_ms=grace_ms))
        if not keys:
            return False
        commit((gc.delete_retired(self.blob, keys),), None)
        return True

    def rollup_and_trim(self, state: State) -> bool:
        """Trims the metadata a rollup made obsolete (:meth:`trim_metadata`) and writes a
        rollup of ``state`` if it is due (:meth:`maybe_rollup`), recording the trim's
        progress; returns whether it rolled up.

        Raises:
            ExternalError: a write or delete failed (the next round tries again).
        """
        # NB: the trim first, so the rollup records it; the rollup is written even if the
        # trim failed (a GC failing every delete must not stop rollups, which bound the log
        # an open replays), and the trim's error is raised after it.
        failed: ExternalError | None = None
        with self._meta_lock:
            try:
                self.trim_metadata()
            except ExternalError as e:
                failed = e
            did = self.maybe_rollup(state, force=self._surveyed)
        if failed is not None:
            raise failed
        return did

    def trim_beside(self) -> int:
        """:meth:`trim_metadata` under the metadata lock, for the runtime's thread beside a
        maintenance round that waits on a merge (it writes no rollup: one written then would
        carry the inline parts pending meanwhile, which the round flushes after its merge)."""
        with self._meta_lock:
            return self.trim_metadata()

    def rollup_at_stop(self) -> bool:
        """Writes a rollup of the newest state if anything but the writer's fence was committed
        since the last one (the writer's commits have all ended); returns whether it did.

        NB: rounds roll up every ``rollup_every`` commits, at most once a round, so a writer
        stopped in a burst of commits used to leave them all for the next open to replay:
        W12's writer at 10,000 collections left 1,767 commits after its last rollup, and the
        next open took 170 ms against 33 ms right after one. A clean stop now leaves the next
        open the log of no session but its own fence to replay: an open costs the same after
        any history (W12 compared opens whose tails, up to 63 entries, differed by chance),
        and on an object store each entry is a GET. The price is a rollup per stop: a
        manifest and the pieces changed, or a small location's whole state. A session that
        committed nothing but its fence writes none, so opens that write nothing cost no
        rollup each (they roll up every ``rollup_every`` sessions, as before).

        Raises:
            ExternalError: the write failed (the next writer replays the log instead).
        """
        with self._meta_lock:
            if self.state.seq - self._last_rollup_seq < STOP_ROLLUP_MIN:
                return False
            return self.maybe_rollup(self.state, force=True)

    def metadata_lock(self) -> threading.Lock:
        """The lock :meth:`rollup_and_trim` (and the orphan-piece sweep) holds: while it is
        held, no rollup is written and nothing of the metadata is deleted."""
        return self._meta_lock

    def unpinned(self, keys: tuple[str, ...]) -> tuple[str, ...]:
        """Of the retired ``keys`` the GC is about to delete, those no fork in another location
        reads (:class:`persist.indexed.maintenance.gc.PinGuard`; its pins are released once
        unread for ``max(gc grace, twice the commit deadline, twice the pin's recorded bound)``).

        With no ``keys``, now and then releases the pins nothing reads any more (a fork that
        never committed, or let go of the blobs before its source did).

        Raises:
            ExternalError: reading the pins failed (delete nothing).
        """
        opts = self.options
        grace = max(opts.gc_grace_seconds, 2 * opts.commit_deadline_seconds)
        # NB: a judgement is reused for a while (a LIST and a load of each pinning location
        # per round would be costly); only how soon a pin is released depends on it.
        self._pins.release_grace_seconds, self._pins.recheck_seconds = grace, min(5.0, grace / 4)
        keep = self._pins.protected(self.blob, keys, time.monotonic())
        return tuple(k for k in keys if k not in keep)

    def maybe_rollup(self, state: State | None = None, *, force: bool = False) -> bool:
        """Writes a rollup of ``state`` (default the newest) if ``rollup_every`` commits passed
        since the last one (``force``: if any did), recording the metadata trim's progress in
        it; returns whether it did.

        Raises:
            ExternalError: the write failed (the next call tries again).
        """
        state = state or self.state
        due = state.seq - self._last_rollup_seq
        if due < (1 if force else self.options.rollup_every):
            return False
        record = self._trim.record(state.seq, _now_ms())
        self.machine.write_rollup(state, record)
        crashpoints.hit("rollup.written")
        self._last_rollup_seq = state.seq
        self._trim.written(state.seq, _now_ms())
        if record is not None:
            self._surveyed = False
        return True

    def trim_metadata(self) -> int:
        """Deletes, by seq, the log entries up to the newest rollup that is at least ``grace``
        old and the rollups before it (:class:`~persist.indexed.maintenance.gc.MetaTrim`),
        then the superseded rollups younger than that which nothing needs (``MetaTrim.thin``);
        returns how many keys it deleted. Lists nothing, except once on a location whose trim
        progress no rollup records (an older persist's): then it LISTs the log once.

        Raises:
            ExternalError: a listing or delete failed; what was deleted stays deleted.
        """
        if self._trim.trimmed is None:
            self._trim.survey(self.blob)
            self._surveyed = True
        grace = self.options.gc_grace_seconds
        upto = self._trim.ripe(grace)
        n = 0
        if upto is not None:
            n = self._trim.trim(self.blob, upto, log_from(self.state))
            if (self._trim.trimmed or 0) >= upto:
                # NB: the rollups below ``upto`` are deleted now: so go the pieces only they
                # named.
                n += self.machine.pieces.collect(self.blob, upto)
        # NB: after the trim, so it never thins what the trim deletes anyway; then the pieces
        # only the thinned rollups named, half a grace after a newer rollup dropped them (a
        # reader's load trusts what it listed for half a grace, Machine.load)
        n += self._trim.thin(self.blob, grace)
        return n + self.machine.pieces.thin(self.blob, self._trim.known(), grace / 2)

    def reclaim_leaked(self, state: Callable[[], State]) -> bool:
        """Sweeps for leaked data blobs (:class:`~persist.indexed.maintenance.gc.LeakSweeper`)
        if ``Options.leak_grace_seconds`` allows and none ran in the last half grace; returns
        whether it deleted any.

        Raises:
            ExternalError: the listing or the first delete failed.
        """
        # NB: a LIST of every data blob is the one costly call here (on S3, one request per
        # 1,000 keys), so it runs at most twice per grace: a leaked blob is then deleted
        # between one and one and a half graces after it was first seen.
        grace = self.options.leak_grace_seconds
        now = time.monotonic()
        if grace is None or now < self._next_leak_sweep:
            return False
        if self._leaks is None or self._leaks.grace_seconds != grace:
            self._leaks = gc.LeakSweeper(grace)
        self._next_leak_sweep = now + grace / 2
        deleted = self._leaks.sweep(self.blob, state, now)
        # NB: never sooner than twice the metadata grace: a rollup whose manifest's write was
        # indeterminate (stored, but unknown to this writer) names its pieces until trimmed.
        with self._meta_lock:  # no rollup of ours in flight (``Pieces.sweep``)
            orphans = self.machine.pieces.sweep(
                self.blob, max(grace, 2 * self.options.gc_grace_seconds), now)
        if orphans:
            log.info("deleted %d orphan rollup pieces (named by no rollup for over %gs)",
                     len(orphans), grace)
        if deleted:
            log.info("deleted %d leaked data blobs (unreferenced for over %gs): %s",
                     len(deleted), grace, deleted[:5])
            metrics.leaked_blobs_reclaimed(len(deleted))
        return bool(deleted)


def new_collection(state: State, txn: Txn, name: str, k: Codec, v: Codec) -> CollectionMeta:
    """The metadata of a new collection ``name`` with codecs ``k``/``v``, under an id that no
    collection of ``state`` or of ``txn``'s working copy uses."""
    cid = txn.free_cid()
    return CollectionMeta(
        id=cid,
        name=name,
        key_type=columnar.serialize_type(k.arrow_type),
        value_type=columnar.serialize_type(v.arrow_type),
        key_codec=k.name,
        value_codec=v.name,
    )


def check_types(c: CollectionMeta, k: Codec, v: Codec) -> int:
    """Checks that ``c`` can be opened with key codec ``k`` and value codec ``v``: they are
    one of its schema versions. Returns that version (the newest one if several match).

    Raises:
        SchemaMismatch: it is registered with other types, naming both.
    """
    return evolve.schema_id_for(c, k, v)


__all__ = ["MAX_INLINE_THRESHOLD", "Indeterminate", "Indexed", "Options", "Txn"]
