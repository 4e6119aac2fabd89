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
from collections.abc import Callable

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import BlobRead
from persist.distributed.stores import read_half
from persist.errors import InvalidUsage, SchemaMismatch
from persist.indexed.format import evolve
from persist.indexed.format.meta import PartMeta
from persist.indexed.format.parquet import MAX_SIGNED_TIME
from persist.indexed.read import buckets, split, tail
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import ReadTask, Scan
from persist.indexed.read.scan import read_task as _read_task

#: How many parts' tails are verified at once while a read is planned (each is one ranged
#: read of the store, the first time this process hands the part out).
TAIL_READS = 16


def _readable(blob: BlobRead, target: int, as_of: int) -> Callable[[PartMeta], str | None]:
    """The URL another program reads part ``p`` at, for a snapshot as of ``as_of`` as version
    ``target``'s types, or None."""
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

    def url(p: PartMeta) -> str | None:
        # NB: a part of another schema version holds that version's types: migrating it
        # (added fields, widened types) is persist's. A time beyond 2**63 - 1 is stored as
        # uint64, which Spark reads as decimal(20, 0), not its long.
        if (not p.parquet or p.blob_key is None or evolve.part_version(p) != target
                or p.max_time > MAX_SIGNED_TIME):
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
    reader = PartReader(read_half(task.address), cache_bytes=0)  # read once: no cache
    tables = [t for t in _read_task(reader, task) if len(t)]
    if len(rows):
        tables.append(rows)
    if not tables:
        return schema.empty_table()
    return buckets.consolidate(pa.concat_tables(tables), task.as_of)


__all__ = ["consolidate", "parquet_files", "parquet_task"]
