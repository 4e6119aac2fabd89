"""Reads shared with another engine's own Parquet reader (Spark's ``spark.read.parquet``, DuckDB,
...): which parts of a plan that reader can read as files, and persist's consolidation of what
it decoded.

A blob part of format 4 is a plain Parquet file (:mod:`persist.indexed.format.parquet`), so an
engine with a native Parquet reader reads it at the engine's own speed, with its column
pruning, predicate pushdown and page-checksum verification. Not every part is such a file:
inline parts live in the metadata, parts of formats 1-3 are enveloped Arrow IPC, and a part
written under another schema version holds other types than the read's. Those stay persist's
to read (:func:`persist.distributed.read_task`), and the two halves are put back together
here:

* raw reads: :func:`parquet_files` splits a :class:`~persist.indexed.read.scan.Scan` into the
  URLs of the files and a scan of the other parts (planned into tasks as usual);
* consolidated reads: :func:`parquet_task` splits each key-range task of
  ``Scan.tasks(consolidated=True)`` the same way, and :func:`consolidate`, in the engine's task
  for that range, sums what the native reader decoded of the files together with the task's
  other parts. Consolidation stays persist's job, range by range: a key lives in exactly one
  range, so no shuffle is needed.

The native reader must verify what persist's own readers verify, and it must fail on a
missing file rather than skip it (a part GC removed after the plan): a read that silently
skips one is wrong. Persist checks the part's whole-file crc32c; the other reader cannot, so
the bytes it trusts are covered in two halves:

* page bodies by Parquet's page checksums, which the reader must verify
  (``parquet.page.verify-checksum.enabled`` in Spark);
* the file's tail (page index, footer with its statistics and page offsets, footer length,
  magic), which no page checksum covers and which the reader trusts to skip row groups and
  pages, here, before a URL is handed out: each file's tail is checked against the tail
  checksum persist recorded when it wrote the part (:mod:`persist.indexed.read.tail`; one
  ranged read per file, once per process). A part without one (written before it was
  recorded) is not handed out: persist reads it, verifying the whole file.

What neither half covers are the page headers (sizes, counts, encodings, each page's own
statistics); DESIGN.md §11 (the native path's *Integrity and GC*) says what flipping them
does to Spark's reader.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import BlobRead
from persist.distributed.read import Watch, describe, record_reader
from persist.distributed.stores import read_half
from persist.errors import InvalidUsage, PartMissing, PersistError, SchemaMismatch
from persist.indexed.format import evolve, stats
from persist.indexed.format.meta import PartMeta
from persist.indexed.format.parquet import MAX_SIGNED_TIME
from persist.indexed.format.stats import Phys
from persist.indexed.read import buckets, split, tail
from persist.indexed.read import marks as marks_mod
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import READ_ATTEMPTS, CollectionInfo, Layers, ReadTask, Scan
from persist.indexed.read.scan import read_task as _read_task

#: How many parts' tails are verified at once while a read is planned (each is one ranged
#: read of the store, the first time this process hands the part out).
TAIL_READS = 16


def _stores(blob: BlobRead) -> Callable[[str | None], BlobRead | None]:
    """The store a part's blob lives in, by its reference's root (None: ``blob`` itself; a
    fork's part may live in another location), or None for a store that cannot name others."""
    siblings: dict[str, BlobRead | None] = {}

    def store(root: str | None) -> BlobRead | None:
        if root is None:
            return blob
        if root not in siblings:
            try:
                siblings[root] = blob.sibling(root)
            except InvalidUsage:
                siblings[root] = None  # a store that cannot name other locations
        return siblings[root]

    return store


def _readable(blob: BlobRead, target: int, as_of: int, *, marked: bool = False
              ) -> Callable[[PartMeta], str | None]:
    """The URL another program reads part ``p`` at, for a snapshot as of ``as_of`` as version
    ``target``'s types, or None. ``marked``: only marked parts (else: only unmarked ones)."""
    store = _stores(blob)

    def url(p: PartMeta) -> str | None:
        # NB: a part of another schema version holds that version's types: migrating it
        # (added fields, widened types) is persist's. A time beyond 2**63 - 1 is stored as
        # uint64, which Spark reads as decimal(20, 0), not its long.
        # NB: a marked part's file holds rows its marks hide (DESIGN.md §8): never handed
        # out as a bare file (plan_native hands it out with its marks, FileRead.marks).
        if (not p.parquet or p.blob_key is None or evolve.part_version(p) != target
                or p.max_time > MAX_SIGNED_TIME or (p.marks is not None) != marked):
            return None
        # NB: a fork's part may live in another location (its root) and hide rows past a
        # time cut (upto) that the file still holds: the other reader keeps only rows at or
        # before as_of, which hides them too when upto >= as_of; else persist reads it.
        root, key, upto = layout.parse_ref(p.blob_key)
        where = store(root)
        if where is None or (upto is not None and upto < as_of):
            return None
        found = where.external_url(key)
        if found is None or not _trusted(where, key, p):
            return None
        return found

    return url


def _trusted(blob: BlobRead, key: str, p: PartMeta) -> bool:
    """Whether another engine's reader may read part ``p`` (at ``key`` of ``blob``) as a
    file: its tail (the footer and page index that reader trusts to skip row groups and
    pages, which no page checksum covers) is verified against the checksum persist recorded
    (:func:`persist.indexed.read.tail.verify_tail`). A part that recorded none (written
    before tails were) is persist's to read: its reader verifies the whole file.

    Raises:
        ChecksumMismatch: the tail is damaged (naming the part).
        PartMissing: the part is gone (plan again).
    """
    return tail.verify_tail(blob, key, p)


def _split(parts: tuple[PartMeta, ...], url: Callable[[PartMeta], str | None]
           ) -> tuple[tuple[str, ...], tuple[PartMeta, ...]]:
    urls: list[str] = []
    rest: list[PartMeta] = []
    # NB: in parallel: each part's tail is one ranged read (once per process), which on S3
    # is a round trip.
    found = list(_pool().map(url, parts)) if len(parts) > 1 else [url(p) for p in parts]
    for p, u in zip(parts, found, strict=True):
        if u is None:
            rest.append(p)
        else:
            urls.append(u)
    return tuple(urls), tuple(rest)


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(TAIL_READS, thread_name_prefix="persist-tail")


def parquet_files(scan: Scan) -> tuple[tuple[str, ...], Scan]:
    """``scan``'s parts split into the Parquet files another engine's reader reads itself and
    a scan of the others (plan its tasks with :meth:`Scan.tasks`, read them with
    :func:`persist.distributed.read_task`).

    A file's rows are the part's raw updates with their own times: a snapshot as of ``t``
    keeps those with ``time <= t`` and forwards their time to ``t`` (as a raw task does). The
    scan's filter (if any) is not applied to the files: apply it in the other engine.

    Why here: only the engine knows which parts are such files (format 4, the read's schema
    version, times that fit a signed long) and where a store serves them
    (``BlobRead.external_url``); the other engine sees only the URLs.

    Every file's tail (its footer and page index, which the other reader trusts to skip rows
    and no page checksum covers) is verified first (see the module docstring).

    Returns:
        The URLs (``file://`` paths, ``s3://bucket/key``) and the scan of the other parts
        (inline parts, parts of formats 1-3, of other schema versions, of a store no other
        process can reach, a fork's parts whose cut hides rows at or before the as-of time,
        or parts that recorded no tail checksum).

    Raises:
        InvalidUsage: ``scan`` is not a snapshot's ``Scan``.
        ChecksumMismatch: a file's tail is not what persist wrote (naming the part).
        PartMissing: a file is gone (GC removed it after the plan: plan again).
        ExternalError: the store failed.
    """
    if not isinstance(scan, Scan):
        raise InvalidUsage(f"parquet_files takes a persist.distributed.Scan, not "
                           f"{type(scan).__name__}")
    if scan.kind != "snapshot":
        raise InvalidUsage("parquet_files plans a snapshot's files; a range of changes is read "
                           "with read_task")
    urls, rest = _split(scan.kept, _readable(read_half(scan.info.address), scan.schema_version,
                                             scan.as_of))
    return urls, dataclasses.replace(scan, kept=rest)


def parquet_task(task: ReadTask) -> tuple[tuple[str, ...], ReadTask]:
    """A consolidated task (one key range of ``Scan.tasks(consolidated=True)``) split into the
    Parquet files another engine's reader decodes for it and the task of its other parts.

    The files hold keys outside the range too, and updates after the as-of time: hand what the
    reader decodes, unfiltered or filtered by anything that keeps every row of the range at or
    before ``task.as_of``, to :func:`consolidate` with the returned task.

    Raises:
        InvalidUsage: ``task`` is not a consolidated ``ReadTask``.
        ChecksumMismatch, PartMissing, ExternalError: as :func:`parquet_files`.
    """
    if not isinstance(task, ReadTask) or task.kind != "consolidated":
        raise InvalidUsage(f"parquet_task takes a consolidated persist.distributed.ReadTask, "
                           f"not {task!r:.80}")
    urls, rest = _split(task.parts, _readable(read_half(task.address), task.view.target,
                                              task.as_of))
    return urls, msgspec.structs.replace(task, parts=rest)


# -- the residual: what another reader applies to the files' rows -----------------------------


@dataclass(frozen=True)
class KeyBounds:
    """A key range as a predicate another reader evaluates on the files' rows, with literals of
    the key's type: ``lo <= key < hi`` (``lo`` None: no lower bound; ``hi`` None: no upper
    bound), and ``key IS NULL`` too when ``nulls``.

    The comparisons are meant in the order where NaN is above every number and a null key
    satisfies no comparison (Spark's and DuckDB's): NaN and null keys belong to the last range
    only (``hi`` None, ``nulls`` True), as in persist's own ranges
    (:mod:`persist.indexed.read.split`). Strings compare by their UTF-8 bytes.

    ``exact``: the predicate is the range exactly. Else it is looser (a bound has no literal of
    the key's type here: a truncated string bound that is not UTF-8, a key of a type other than
    integers, floats and strings), and :func:`consolidate` cuts the range exactly.
    """

    lo: int | float | str | None
    hi: int | float | str | None
    nulls: bool
    exact: bool


@dataclass(frozen=True)
class Residual:
    """What another reader applies to the rows it decodes from a piece's files.

    * keep the rows with ``time <= as_of`` (push it down: the files hold later updates too),
      and, with ``keys``, the rows of that key range (push it down too);
    * every kept row's time becomes ``as_of`` (forwarded, as a snapshot's rows are);
    * ``consolidate``: the kept rows, together with the piece's other parts (``FileRead.rest``),
      must still be summed per ``(key, value)``, zero sums dropped (by :func:`consolidate`,
      or by the reader's own aggregation where it groups as persist does); False: they already
      are the answer (a raw read, or a consolidated read whose parts are settled,
      :func:`persist.indexed.read.split.settled`).
    """

    as_of: int
    keys: KeyBounds | None
    consolidate: bool


@dataclass(frozen=True)
class FileMarks:
    """The rows of one file of a :class:`FileRead` that the reader must drop: the file is a
    marked base part (DESIGN.md §8, the marks step), whose rows at the positions whose bit is
    set are hidden. ``words``: the bitmap as little-endian int64 words, ``ceil(rows / 64)``
    of them, position ``i`` (the row's index in the file, Spark's ``_metadata.row_index``)
    being bit ``i % 64`` of word ``i // 64``; ``rows``: the file's rows."""

    url: str
    words: bytes
    rows: int

    @property
    def bitmap(self) -> Any:
        """The words as a numpy int64 array."""
        import numpy as np

        return np.frombuffer(self.words, dtype="<i8").astype(np.int64)


@dataclass(frozen=True)
class FileRead:
    """One piece of a native read: ``urls`` for the other reader, what it applies to their
    rows (``residual``), and, for a consolidated key range, the task of the range's other
    parts (``rest``, None for a raw piece), summed with the files' rows by
    :func:`consolidate` (or read alone by it, ``consolidate(rest, <no rows>)``, for a reader
    that sums the two itself).

    ``runs`` (not None): the files are a snapshot's base (:attr:`Scan.layers`: consolidated,
    one time each, key-disjoint: their rows, times forwarded, are their own contents) and
    ``runs`` is a consolidated task of every other part, whose contents (read by persist:
    ``consolidate(runs, <no rows>)``) are applied to the base *by key*. The piece's rows are

    * the files' rows (``time <= as_of``, forwarded) whose key is no key of the runs'
      contents, as they are: e.g. an anti join against the runs' keys, broadcast;
    * the files' rows whose key is one of them (e.g. a semi join), summed per ``(key,
      value)`` with the runs' contents, zero sums dropped (by the reader's own aggregation
      where it groups as persist does, else ``consolidate(runs, <those rows>)``).

    Grouping the keys more coarsely than persist (Spark's joins make ``-0.0`` equal ``0.0``
    and every NaN one) only moves base rows into the summed half, which stays exact; a null
    key must count as a key of the runs when they hold one (an equi-join never matches null:
    treat every null-key row of the files as summed, which is exact too).
    """

    urls: tuple[str, ...]
    residual: Residual
    rest: ReadTask | None = None
    runs: ReadTask | None = None
    #: Each URL's length in bytes, as persist wrote the part (``PartMeta.nbytes``; a part's
    #: blob is never rewritten under its key, and its tail check read the file's end at that
    #: length): a reader that takes file statuses (Spark's file index) needs no listing or
    #: HEAD of its own to learn them. Empty: not known.
    sizes: tuple[int, ...] = ()
    #: The files among ``urls`` that are marked base parts, with the rows the reader drops
    #: (before anything else: positions are in the file's rows). Never left out: a marked
    #: file read without its marks reads rows that are gone.
    marks: tuple[FileMarks, ...] = ()


@dataclass(frozen=True)
class NativePlan:
    """A snapshot read planned for another engine's Parquet reader (:func:`plan_native`):
    ``files`` for that reader, ``tasks`` read by persist (:func:`persist.distributed.read_task`,
    one engine task each). The outputs of all pieces are disjoint and together are the read.
    """

    info: CollectionInfo
    as_of: int
    #: Whether the read is a snapshot's contents (True) or its raw updates.
    consolidated: bool
    files: tuple[FileRead, ...]
    tasks: tuple[ReadTask, ...]
    #: The parts the files are, to check that they are still there (:meth:`missing`).
    file_parts: tuple[PartMeta, ...] = field(default=(), repr=False)

    @property
    def later_rows(self) -> bool:
        """Whether a file of the plan may hold rows after ``as_of``, so that the other
        reader must apply the residuals' ``time <= as_of`` (False: every file's part records
        a ``max_time`` at or before ``as_of`` and hides no rows past a fork's cut, so the
        filter keeps every row; skipping it spares a Parquet reader the page index reads a
        pushed filter costs)."""
        if not self.file_parts:
            return bool(self.files)
        return any(p.max_time > self.as_of or p.blob_key is None
                   or layout.parse_ref(p.blob_key)[2] is not None for p in self.file_parts)

    def missing(self) -> tuple[str, ...]:
        """The blob keys of the plan's files that are gone from their store (GC removed them
        after the plan's state): empty while the plan is readable. Lists the store once per
        file; for a failure's diagnosis, not for every read.

        Raises:
            ExternalError: storage failed.
        """
        store = _stores(read_half(self.info.address))
        gone: list[str] = []
        for p in self.file_parts:
            assert p.blob_key is not None
            root, key, _ = layout.parse_ref(p.blob_key)
            where = store(root)
            if where is not None and key not in where.list_keys(key):
                gone.append(p.blob_key)
        return tuple(gone)


def _literal(v: Phys | None, key_type: pa.DataType) -> int | float | str | None:
    """A key range bound as a literal of ``key_type``, or None where none would be exact."""
    if v is None:
        return None
    if pa.types.is_integer(key_type) and isinstance(v, int) and not isinstance(v, bool):
        return v
    if pa.types.is_floating(key_type) and isinstance(v, float):
        return v
    if (pa.types.is_string(key_type) or pa.types.is_large_string(key_type)) \
            and isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return None  # a truncated stats bound
    return None


def key_bounds(task: ReadTask) -> KeyBounds | None:
    """The key range of a consolidated ``task`` as a predicate another reader evaluates
    (:class:`KeyBounds`); None for a task over every key."""
    r = task.key_range
    if r is None or r.whole:
        return None
    t = task.schema.field("key").type
    lo, hi = _literal(r.lo, t), _literal(r.hi, t)
    exact = (lo is None) == (r.lo is None) and (hi is None) == (r.hi is None)
    return KeyBounds(lo=lo, hi=hi, nulls=r.hi is None, exact=exact)


def settled(scan: Scan) -> bool:
    """Whether ``scan``'s parts, times forwarded to its as-of time, are its consolidated
    contents already, so that a consolidated read may skip summing them: every part is
    consolidated at one time at or before the as-of time, the parts are key-disjoint by their
    stats, and every part is of the scan's schema version (a migration could make two records
    equal): they are all its base, no run on top (:attr:`Scan.layers`; a marks step's delta
    with the base parts whose marks name it counts as key-disjoint from them, each marked
    part read minus its marks: :func:`parquet_files` never hands one out as a bare file).
    ``read_task`` of a consolidated task skips the sum by the same rule.

    Raises:
        InvalidUsage: ``scan`` is not a snapshot's ``Scan``.
    """
    if not isinstance(scan, Scan) or scan.kind != "snapshot":
        raise InvalidUsage(f"settled takes a snapshot's persist.distributed.Scan, not "
                           f"{scan!r:.80}")
    return scan.layers.settled


#: A consolidated read applies its runs to the base by key (:class:`FileRead`'s ``runs``)
#: while the runs hold at most this share of the base's rows; beyond it, it sums every row by
#: key range, as before there was a base. Measured on Spark (DESIGN.md §11a): runs of 0.2% of
#: the base cost 0.8x the JVM CPU of summing every row, runs of 2% the same, runs of 25% 2x.
RUNS_SHARE = 0.02


def layered(lay: Layers) -> bool:
    """Whether a consolidated native read applies ``lay``'s runs to its base by key: it has
    a base and runs, and the runs' rows are at most :data:`RUNS_SHARE` of the base's."""
    return bool(lay.base) and bool(lay.runs) and lay.run_rows <= RUNS_SHARE * lay.base_rows


def null_keys(task: ReadTask) -> bool:
    """Whether a part of ``task`` may hold a null key: its key stats count one, or it has no
    key stats (then nothing is known). An engine applying a base's runs by key with an
    equi-join (which never matches null) treats the base's null-key rows as touched only
    then (:class:`FileRead`)."""
    for p in task.parts:
        s = p.stats
        leaf = None if s is msgspec.UNSET else next(
            (x for x in s.leaves if x.path == stats.path_key(("key",))), None)
        if leaf is None or leaf.nulls:
            return True
    return False


def plan_native(scan: Scan, *, consolidated: bool = True, n: int | None = None,
                files: bool = True, rows_per_task: int | None = None) -> NativePlan:
    """``scan`` (a snapshot) planned for another engine's Parquet reader: which parts it reads
    as files, with what residual (:class:`Residual`), and the engine tasks of the rest.

    * raw (``consolidated=False``), and consolidated reads of :func:`settled` parts: one piece
      of every readable file (:func:`parquet_files`), residual ``time <= as_of``, forwarded,
      nothing to sum; the other parts in raw tasks (up to ``rows_per_task`` rows each; at
      least one task when there are no files);
    * consolidated, over a base with a few runs on top (:func:`layered`, from
      :attr:`Scan.layers`, the rule every consolidated read follows): one piece of the base's
      files, read raw, with the runs (and any base part that is not a file) as its ``runs``
      task, applied by key (:class:`FileRead`);
    * consolidated otherwise: per key range of ``scan.tasks(consolidated=True, n=n)``, a piece
      of the range's files (:func:`parquet_task`) with the range's bounds (:func:`key_bounds`)
      and its other parts (``rest``), or the whole task when none of its parts is a file.

    ``files=False``: no files at all (a reader that cannot read these types): every part in
    tasks.

    Raises:
        InvalidUsage: ``scan`` is not a snapshot's ``Scan``; its as-of time does not fit a
            signed 64-bit integer (the time type of a file's rows as such readers read them).
    """
    if not isinstance(scan, Scan) or scan.kind != "snapshot":
        raise InvalidUsage(f"plan_native takes a snapshot's persist.distributed.Scan, not "
                           f"{scan!r:.80}")
    as_of = scan.as_of
    if as_of > MAX_SIGNED_TIME:
        raise InvalidUsage(f"as_of {as_of} does not fit a signed 64-bit time (Spark's long): "
                           f"a native read's times are signed")
    pieces: list[FileRead] = []
    tasks: list[ReadTask] = []
    file_parts: list[PartMeta] = []
    marks: tuple[FileMarks, ...]
    read: tuple[PartMeta, ...]
    lay = scan.layers if consolidated else None
    if files and lay is not None and split.splittable(scan.schema.field("key").type) \
            and layered(lay):
        base_urls, rest, marks, read = _with_marks(dataclasses.replace(scan, kept=lay.base))
        if base_urls:
            others = {p.id for p in rest.kept}
            runs = dataclasses.replace(
                scan, kept=tuple(p for p in scan.kept if p.id in others
                                 or p.id not in {b.id for b in lay.base}))
            pieces.append(FileRead(base_urls, Residual(as_of, None, consolidate=False),
                                   runs=runs.task(consolidated=True), marks=marks,
                                   sizes=_sizes(read)))
            file_parts.extend(read)
            return NativePlan(scan.info, as_of, consolidated, tuple(pieces), (),
                              tuple(file_parts))
    if lay is None or lay.settled:
        urls: tuple[str, ...] = ()
        rest = scan
        marks = ()
        read = ()
        if files:
            urls, rest, marks, read = _with_marks(scan)
        if urls:
            pieces.append(FileRead(urls, Residual(as_of, None, consolidate=False),
                                   marks=marks, sizes=_sizes(read)))
            file_parts.extend(read)
        if rest.kept or not urls:
            tasks.extend(rest.tasks(rows_per_task=rows_per_task))
    else:
        for task in scan.tasks(consolidated=True, n=n):
            if not files:
                tasks.append(task)
                continue
            urls, left = parquet_task(task)
            if not urls:
                tasks.append(left)
                continue
            others = {p.id for p in left.parts}
            read = tuple(p for p in task.parts if p.id not in others)
            pieces.append(FileRead(urls, Residual(as_of, key_bounds(task), consolidate=True),
                                   left, sizes=_sizes(read)))
            file_parts.extend(read)
    return NativePlan(scan.info, as_of, consolidated, tuple(pieces), tuple(tasks),
                      tuple(file_parts))


def _sizes(parts: tuple[PartMeta, ...]) -> tuple[int, ...]:
    """The byte lengths of the files of ``parts`` (:attr:`FileRead.sizes`), in the order
    :func:`parquet_files` and :func:`parquet_task` hand out their URLs (the parts' order)."""
    return tuple(p.nbytes for p in parts)


def _with_marks(scan: Scan) -> tuple[tuple[str, ...], Scan, tuple[FileMarks, ...],
                                      tuple[PartMeta, ...]]:
    """:func:`parquet_files` of ``scan``, and its marked parts as files too, each with its
    marks (:class:`FileMarks`, read and verified here: a damaged marks blob is
    ``ChecksumMismatch`` naming the part, a missing one ``PartMissing``); last, the parts
    of the URLs handed out, in the URLs' order (what :func:`_sizes` measures).

    Raises:
        ChecksumMismatch, PartMissing, Corruption, ExternalError: as :func:`parquet_files`,
            and of a marks blob.
    """
    urls, rest = parquet_files(scan)
    left = {p.id for p in rest.kept}
    # NB: parquet_files hands out its URLs in the parts' order
    plain = tuple(p for p in scan.kept if p.id not in left)
    marked = tuple(p for p in rest.kept if p.marks is not None)
    if not marked:
        return urls, rest, (), plain
    blob = read_half(scan.info.address)
    url = _readable(blob, scan.schema_version, scan.as_of, marked=True)
    reader = PartReader(blob, cache_bytes=0)
    out: list[FileMarks] = []
    handed: dict[str, str] = {}
    # NB: in parallel, as parquet_files: each tail is one ranged read (once per process)
    found = list(_pool().map(url, marked)) if len(marked) > 1 else [url(p) for p in marked]
    for p, u in zip(marked, found, strict=True):
        if u is None:
            continue
        pos = reader.marks(p)
        assert pos is not None
        handed[p.id] = u
        if len(pos):  # NB: a part with no marked row is read as a plain file
            out.append(FileMarks(u, marks_mod.bitmap(pos, p.rows).astype("<i8").tobytes(),
                                 p.rows))
    return (urls + tuple(handed.values()),
            dataclasses.replace(rest, kept=tuple(p for p in rest.kept if p.id not in handed)),
            tuple(out), plain + tuple(p for p in marked if p.id in handed))


_T = TypeVar("_T")


def read_native(url: str, collection_name: str, build: Callable[[NativePlan], _T], *,
                as_of: int | None = None, consolidated: bool = True, n: int | None = None,
                files: bool | Callable[[CollectionInfo], bool] = True,
                storage_options: Mapping[str, Any] | None = None,
                watch: Watch | None = None) -> _T:
    """Plans a snapshot read for another engine's Parquet reader (:func:`plan_native`, on the
    latest metadata) and returns ``build(plan)``, planning again on newer metadata when a
    part went meanwhile, within the engine's one read budget (``READ_ATTEMPTS`` states).

    A part went when ``build`` raises ``PartMissing``, or raises anything but a
    ``PersistError`` (the other engine's error when it lists a file that is no longer there,
    whatever its wording) while :meth:`NativePlan.missing` names a file of the plan. Another
    failure propagates as it is.

    Args:
        files: whether the other reader reads files at all (a callable: decided from the
            collection as described, e.g. by its types).
        watch: the collection's metadata as a long-lived reader of it holds it (a
            :class:`Watch` of ``url`` and ``collection_name``): each plan starts from it,
            brought up to date (:meth:`Watch.current` with ``fresh``: one GET of the next log
            key when nothing changed) rather than read anew (a LIST of the rollups, the
            newest rollup, and a GET per log entry after it). None: read anew
            (:func:`describe`).

    Raises:
        InvalidUsage: as :meth:`CollectionInfo.snapshot` and :func:`plan_native`; a
            ``watch`` of another collection.
        PartMissing: parts kept disappearing for every attempt.
        MissingResource, UnknownCollection: as :func:`persist.distributed.describe`.
    """
    if watch is not None and watch.name != collection_name:
        raise InvalidUsage(f"read_native: the watch is of {watch.name!r}, not of "
                           f"{collection_name!r}")
    gone: BaseException | None = None
    for _ in range(READ_ATTEMPTS):
        info = (describe(url, collection_name, storage_options=storage_options)
                if watch is None else watch.current(fresh=True))
        use = files(info) if callable(files) else files
        try:
            # NB: planning verifies the files' tails (one read each): a part GC removed
            # since describe() is a PartMissing here, planned again like one gone later.
            plan = plan_native(info.snapshot(as_of), consolidated=consolidated, n=n,
                               files=use)
        except PartMissing as e:
            gone = e
            continue
        try:
            return build(plan)
        except PartMissing as e:
            gone = e
        except PersistError:
            raise
        except Exception as e:
            missing = plan.missing()
            if not missing:
                raise
            gone = PartMissing(f"{missing[0]} (and {len(missing) - 1} more) went after the "
                               f"plan" if len(missing) > 1 else f"{missing[0]} went after the "
                               f"plan")
            gone.__cause__ = e
    raise PartMissing(f"read of {collection_name!r}: parts kept disappearing while the read "
                      f"was planned ({READ_ATTEMPTS} plans): {gone}")


def consolidate(task: ReadTask, rows: pa.Table) -> pa.Table:
    """The contents of ``task``'s keys as of its as-of time: ``rows`` (the updates another
    reader decoded from the files :func:`parquet_task` took out of the task) and the task's
    own parts, each ``(key, value)`` once with its diffs summed (never 0), time ``as_of``.
    Runs in the engine's task for that key range, on any machine.

    Args:
        task: the task :func:`parquet_task` returned.
        rows: ``key, value, time, diff`` of ``task.schema``'s types or types that cast to
            them exactly (Arrow's safe cast: ``string`` to ``large_string``, Spark's
            microsecond timestamps to the stored unit, ``long`` times to ``uint64``). Rows
            outside the range or after the as-of time are dropped here.

    Raises:
        SchemaMismatch: ``rows`` does not cast exactly to the task's schema.
        PartMissing: GC removed one of the task's parts (plan the read again).
        DiffOverflow: a (key, value)'s diffs sum beyond int64 (never wrapped).
        Corruption, ExternalError: as :func:`persist.distributed.read_task`.
    """
    if not isinstance(task, ReadTask) or task.kind != "consolidated":
        raise InvalidUsage(f"consolidate takes a consolidated persist.distributed.ReadTask, "
                           f"not {task!r:.80}")
    schema = task.schema
    try:
        rows = rows.select(schema.names).cast(schema, safe=True)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaMismatch(f"rows for a consolidated read of {task.collection.name!r} do not "
                             f"cast exactly to {schema}: {e}") from e
    if len(rows):
        rows = rows.filter(pc.less_equal(rows.column("time"),
                                         pa.scalar(task.as_of, pa.uint64())))
        if task.key_range is not None:
            rows = split.rows_in(rows, task.key_range)
    # NB: no re-planning here (unlike read_task's consolidated retry): a re-planned task
    # would hold the files the other reader read as well, and count them twice.
    reader = record_reader(task)  # read once: no cache; an address that won't open: Corruption
    tables = [t for t in _read_task(reader, task) if len(t)]
    if len(rows):
        tables.append(rows)
    if not tables:
        return schema.empty_table()
    return buckets.consolidate(pa.concat_tables(tables), task.as_of)


__all__ = ["RUNS_SHARE", "FileMarks", "FileRead", "KeyBounds", "NativePlan", "Residual", "consolidate",
           "key_bounds", "layered", "null_keys", "parquet_files", "parquet_task", "plan_native",
           "read_native", "settled"]
