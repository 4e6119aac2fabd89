"""Distributed writes by a foreign writer: Parquet files another engine wrote, adopted as staged
parts.

Spark's own Parquet writer (the native write path, ``operators.write``) writes a batch's part
files from its executors, in the JVM, without handing a row to Python. This module is the
engine's half of that path:

1. :func:`staging` gives the job a fresh *staging directory* under its stager's lease,
   ``data/<cid>/staged-<lease id>-<uuid>/`` (:func:`persist.layout.staged_dir`), and the URL
   the foreign writer writes there at. Every key below it, whatever the writer names it (its
   temporary files too), counts as a data blob staged under the lease: the leaked-blob sweeps
   leave it alone while the lease lives and reclaim what no commit references once it is
   revoked. A driver killed between the write and the commit therefore leaks nothing past its
   lease.
2. :func:`adopt` reads each Parquet file the writer left there once, whole: persist's crc32c
   of the file (kept in ``PartMeta.checksum`` and verified before every later decode), the
   footer (columns and types, row groups), and the ``time`` and ``diff`` columns decoded
   (exact min and max time, no nulls, every time ``>= 0`` and not below the collection's
   upper, the diff sums); where the writer sorted the file, its ``key`` too (and its ``value``
   if adjacent keys tie), and the part is recorded sorted only if its rows are checked to be in persist's full
   ``(key, value, time)`` order (:func:`persist.indexed.format.sorting.in_order`). It returns a ``StagedPart`` per file, which a
   :class:`~persist.distributed.commit.Committer` commits as it commits any staged part (once,
   under its token). A file small enough to ride inline is re-staged inline by the stager
   (and its file is left to :func:`clean_staging`).
3. :func:`clean_staging` deletes what is left in the directory once the commit is decided: files no
   commit references (all of them, after a failed or declined commit) and the writer's
   bookkeeping files (``_SUCCESS``, ``.crc`` files).

The files keep Spark's footer: parquet-mr cannot add persist's footer key-value metadata, so
the part reader recognises them by Spark's own footer key (:mod:`persist.indexed.format.parquet`,
"Parts Spark wrote"). Only key and value types that Spark's writer and Arrow's Parquet reader
map one to one (:data:`NATIVE_TYPES`) are adopted; a caller routes other collections through
the ``Stager``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persist import crashpoints
from persist.blob.envelope import checksum
from persist.distributed.stage import Stager
from persist.distributed.stores import load_state, writable
from persist.errors import Corruption, InvalidUsage, SchemaMismatch
from persist.indexed.format import columnar, evolve, parquet, sorting, stats, write
from persist.indexed.format.meta import PartMeta
from persist.indexed.format.transfer import StagedPart
from persist.indexed.maintenance import gc
from persist.layout import staged_dir, staged_part_id

log = logging.getLogger("persist.distributed")

#: Key and value types a foreign (Spark) writer's part files may have: those Spark writes and
#: Arrow's Parquet reader reads back as exactly this type without an ``ARROW:schema`` in the
#: footer, and whose order Spark's ascending sort (nulls last) shares with persist's
#: consolidation order (signed integers, booleans and dates by value; strings and binaries by
#: their unsigned bytes; the order is checked at adoption all the same, never trusted). Not
#: floats (NaN and ``-0.0`` ordering), timestamps (Spark writes microseconds in its session
#: zone), decimals, unsigned integers, ``large_*``, records or lists: those go through
#: persist's own writer.
NATIVE_TYPES: frozenset[pa.DataType] = frozenset({
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.string(), pa.binary(),
    pa.date32(),
})

#: The Parquet column types a foreign part file must have for ``time`` and ``diff``.
_TIME, _DIFF = pa.int64(), pa.int64()


def native_types(key: pa.DataType, value: pa.DataType) -> bool:
    """Whether a collection of these key and value types takes part files Spark wrote."""
    return key in NATIVE_TYPES and value in NATIVE_TYPES


@dataclass(frozen=True)
class Staging:
    """A staging directory of one job: where a foreign writer writes its part files."""

    stager: Stager
    #: The directory's key prefix (ends in ``/``).
    prefix: str
    #: The directory's URL for the foreign writer (``file:///...``, ``s3://...``).
    url: str
    #: Rows per row group the writer should cut (persist's record batch, the unit per-batch
    #: stats and a filtered read work in).
    batch_rows: int = columnar.BATCH_ROWS


def staging(stager: Stager) -> Staging:
    """A fresh staging directory under ``stager``'s lease (renewed here).

    Raises:
        InvalidUsage: the collection's types are not :data:`NATIVE_TYPES`, or the location's
            store cannot be reached by another program (a memory store).
        LeaseRevoked: the stager's lease was revoked (start a new stager).
        ExternalError: storage failed.
    """
    schema = stager.schema
    if not native_types(schema.field("key").type, schema.field("value").type):
        raise InvalidUsage(
            f"collection {stager.collection.name!r} has key {schema.field('key').type} and "
            f"value {schema.field('value').type}: a foreign writer's part files take only "
            f"{sorted(str(t) for t in NATIVE_TYPES)}; stage its rows with the Stager")
    blob = writable(stager.address)
    prefix = staged_dir(stager.collection.id, stager.lease_id)
    url = blob.external_url(prefix.rstrip("/"))
    if url is None:
        raise InvalidUsage(f"location {stager.address.url!r} is not reachable by another "
                           f"program (a memory store): nothing can write part files into it")
    stager.renew(at_most_every=0)
    return Staging(stager, prefix, url)


def _is_part_file(prefix: str, key: str) -> bool:
    """A data file the writer committed: directly in the directory, not hidden or temporary."""
    name = key[len(prefix):]
    return "/" not in name and not name.startswith((".", "_")) and name.endswith(".parquet")


def adopt(st: Staging, *, replay: bool = False, ordered: bool = True) -> list[StagedPart]:
    """The part files in ``st``'s directory as staged parts (see the module docstring); files
    with no rows are skipped (left to :func:`clean_staging`).

    Call it once the writer's job succeeded (its output committed), before the stager's lease
    could lapse (it is renewed here).

    Args:
        replay: the rows may be a replay of a batch that already landed (as
            :meth:`Stager.stage`): times below the collection's upper are left to the commit's
            token.
        ordered: the writer sorted each file (by its key at least): each file's rows are
            checked, and the part is recorded sorted (``PartMeta.sorted``) only if they are
            in persist's full ``(key, value, time)`` order (:func:`sorting.in_order`); False:
            no order is checked or recorded. A part without a recorded order is read and
            compacted exactly all the same: readers and compaction sort it themselves, as an
            older persist's.

    Raises:
        SchemaMismatch: a file's columns or types are not the collection's.
        InvalidUsage: a null ``time`` or ``diff``, a negative time, or (unless ``replay``) a
            time below the collection's upper.
        Corruption: a file that is not a readable Parquet file Spark wrote.
        ExternalError: storage failed.
    """
    stager = st.stager
    stager.renew(at_most_every=0)
    blob = writable(stager.address)
    out: list[StagedPart] = []
    keys = iter([k for k in blob.list_keys(st.prefix) if _is_part_file(st.prefix, k)])
    # NB: the next files' GETs overlap this one's checks (on S3 each is a round trip and a
    # transfer): at most READS_AHEAD files are read or held at once, the one being checked
    # among them; the checks (and any inline staging) run here, one file at a time, in key
    # order.
    with concurrent.futures.ThreadPoolExecutor(READS_AHEAD,
                                               thread_name_prefix="persist-adopt") as pool:
        ahead: collections.deque[tuple[str, concurrent.futures.Future[memoryview | None]]] = (
            collections.deque())
        try:
            for key in keys:
                ahead.append((key, pool.submit(blob.get_foreign, key)))
                if len(ahead) < READS_AHEAD:
                    continue
                _adopt_next(stager, ahead, out, replay, ordered)
            while ahead:
                _adopt_next(stager, ahead, out, replay, ordered)
        finally:
            for _, fut in ahead:
                fut.cancel()
    crashpoints.hit("adopt.adopted")  # staged and adopted, not committed
    return out


#: How many part files :func:`adopt` reads or holds at once (the one it checks and the next
#: ones, read meanwhile).
READS_AHEAD = 3


def _adopt_next(stager: Stager,
                ahead: collections.deque[tuple[str, concurrent.futures.Future[memoryview | None]]],
                out: list[StagedPart], replay: bool, ordered: bool) -> None:
    key, fut = ahead.popleft()
    data = fut.result()
    if data is None:
        raise Corruption(key, "a part file Spark wrote vanished before it was adopted")
    staged = _adopt(stager, key, data, replay, ordered)
    if staged is not None:
        out.append(staged)


def _adopt(stager: Stager, key: str, data: memoryview, replay: bool,
           ordered: bool) -> StagedPart | None:
    crc = checksum(data)
    want = stager.schema
    try:
        f = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        md = f.metadata
        kv = md.metadata or {}
        have = f.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise Corruption(key, f"not a readable Parquet file: {e}") from e
    if parquet.SPARK_SCHEMA not in kv or parquet.TAG in kv:
        raise Corruption(key, "not a Parquet file Spark's writer wrote (its footer lacks "
                              f"{parquet.SPARK_SCHEMA.decode()})")
    expected = [("key", want.field("key").type), ("value", want.field("value").type),
                ("time", _TIME), ("diff", _DIFF)]
    got = [(fl.name, fl.type) for fl in have]
    if got != expected:
        raise SchemaMismatch(f"part file {key} has columns {got}; collection "
                             f"{stager.collection.name!r} takes {expected}")
    if md.num_rows == 0:
        return None
    cols = _read(f, key, ["key", "time", "diff"] if ordered else ["time", "diff"])
    name = stager.collection.name
    for col in ("time", "diff"):
        if cols.column(col).null_count:
            raise InvalidUsage(f"a row of {name!r} has a null {col}: every update needs one")
    times = cols.column("time")
    lo, hi = pc.min_max(times).values()
    lo_t, hi_t = int(lo.as_py()), int(hi.as_py())
    if lo_t < 0:
        raise InvalidUsage(f"a row of {name!r} has time {lo_t}: times are >= 0")
    if not replay and lo_t < stager.collection.upper:
        raise InvalidUsage(
            f"a row of {name!r} at time {lo_t} is below its upper {stager.collection.upper}: "
            f"times below upper are sealed")
    if len(data) <= stager.inline_bytes:
        # NB: a tiny batch belongs inline, in the commit itself (as the Stager would have put
        # it): decoded once and staged again; its file is left to clean_staging().
        table = parquet.decode(key, data, want).table
        return stager.stage(table, replay=True)
    inserted, retracted = write.diff_sums(cols)
    # NB: the order is recorded only where it was checked on the rows themselves: a part
    # recorded sorted that is not would make consolidated and key-range reads wrong silently.
    # NB: the value column is decoded only if some adjacent keys tie (unique keys never need it).
    in_order = ordered and sorting.ordered_by(
        lambda c: _read(f, key, [c], len(cols)).column(c) if c == "value" else cols.column(c),
        len(cols))
    sid = stager.schema_version
    # NB: the tail (page index, footer with its statistics) from the same bytes the whole-file
    # checksum was taken of: a native read hands Spark only files whose tail it verified.
    offset = parquet.tail_offset(md)
    tail = stats.Tail(offset, checksum(data[offset:]))
    part = PartMeta(id=staged_part_id(stager.lease_id), rows=md.num_rows, nbytes=len(data),
                    min_time=lo_t, max_time=hi_t, consolidated=False, blob_key=key,
                    inserted=inserted, retracted=retracted, checksum=crc,
                    sorted=True if in_order else msgspec.UNSET,
                    stats=stats.PartStats(tail=tail))
    return StagedPart(location=stager.address.url, collection=name,
                      collection_id=stager.collection.id,
                      schema=evolve.history(stager.collection)[sid], part=evolve.tag(part, sid))


def _read(f: pq.ParquetFile, key: str, columns: list[str], rows: int | None = None
          ) -> pa.Table:
    """``columns`` of the part file ``f`` (stored at ``key``), decoded (``rows`` of them, if
    given: as many as the columns decoded before)."""
    try:
        table = f.read(columns=columns)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise Corruption(key, f"undecodable Parquet part: {e}") from e
    if rows is not None and len(table) != rows:
        raise Corruption(key, f"columns {columns} decode {len(table)} rows, the others {rows}")
    return table


def clean_staging(st: Staging) -> list[str]:
    """Deletes every key in ``st``'s directory that no commit references (call it once the
    commit is decided: all of them after a failed or declined one); returns the keys deleted.

    NB: checked against the location's current state, as :func:`persist.distributed.discard`
    does: a file some commit references is never deleted.

    Raises:
        ExternalError: storage failed (what is left is reclaimed once the lease is revoked).
    """
    blob = writable(st.stager.address)
    keys = blob.list_keys(st.prefix)
    if not keys:
        return []
    referenced = gc.referenced(load_state(st.stager.address, must_exist=False))
    gone = [k for k in keys if k not in referenced]
    for k in gone:
        blob.delete(k)
    return gone


__all__ = ["NATIVE_TYPES", "Staging", "adopt", "clean_staging", "native_types", "staging"]
