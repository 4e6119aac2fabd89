"""Part format 4: a blob part is a plain Parquet file that any Parquet reader opens.

Stored at its usual key (``data/<cid>/<part id>``) with no envelope
(:meth:`persist.blob.base.Blob.set_plain`), so Spark's own reader, pyarrow or DuckDB read it at
the store's URL (:meth:`persist.blob.base.BlobRead.external_url`). Its integrity is persist's
crc32c of the whole file, kept in ``PartMeta.checksum`` and verified before a byte is decoded,
plus Parquet page checksums for readers that verify those (Spark with
``parquet.page.verify-checksum.enabled=true``): zstd alone does not protect data (measured:
5,971 of 6,071 single-bit flips in a zstd Parquet page decoded silently wrong).

The file:

* columns ``key, value, time, diff`` of the part's Arrow schema
  (:func:`persist.indexed.format.columnar.part_schema`), the Arrow schema stored in the footer
  (``ARROW:schema``) so pyarrow restores every type exactly (``large_string``, zones, unsigned
  widths); only ``time`` and seconds timestamps are stored otherwise (below);
* one row group per record batch of ``batch_rows`` rows (``Options.batch_rows``): per-batch
  stats (:mod:`persist.indexed.format.stats`) describe row groups, and a pruned or key-range
  read decodes only the row groups it keeps (:func:`decode` with ``keep``);
* sorted by ``(key, value, time)`` in consolidation's order when ``sorted`` (every part
  persist writes: :mod:`persist.indexed.format.sorting`), declared as ``sorting_columns`` for
  the leading columns whose Parquet order is that order (primitive ones);
* zstd (level 1), integer columns ``DELTA_BINARY_PACKED`` (measured on W1's 1 M rows of four
  int64 columns: 45 ms to encode and 7.9 MB, against 75 ms and 16.7 MB plain and 105 ms with
  dictionaries; sorted keys pack to 5.6 MB), strings and binaries dictionary-encoded (Parquet's
  usual choice; it falls back to plain by itself), floats plain (bits kept: NaN payloads and
  ``-0.0``); Parquet statistics, a page index and page checksums on;
* footer key-value metadata ``persist.part = 4``, ``persist.schema_id``, ``persist.time``.

**Parts Spark wrote** (``operators.write``, the native write path). Spark's own Parquet
writer (parquet-mr) cannot add key-value metadata of the caller's to a footer (its
``WriteSupport`` sets the footer's map; no Hadoop option reaches it: checked in parquet-hadoop
1.17). A part file that lacks ``persist.part`` but carries Spark's schema key
(:data:`SPARK_SCHEMA`) is therefore read as format 4 with ``persist.time = int64`` (Spark's
``long``). It is only ever read through a ``PartMeta`` that persist made after reading that
very file once, whole: the record's crc32c pins every byte (footer included), and the staging
step checked the columns, the row counts and that every time is ``>= 0`` before recording it
(:mod:`persist.distributed.adopt`). Such a part has no ``ARROW:schema``, so only the key and
value types Spark and Arrow's Parquet reader map one to one are written this way
(:data:`persist.distributed.adopt.NATIVE_TYPES`); the others go through persist's own writer.
An older persist refuses such a part loudly (Corruption: no format tag), never misreads it.

**Types as Spark's reader sees them.** ``time`` and ``diff`` are Spark ``long``s
(``operators/schema.py``): ``time`` is written as a signed INT64 whenever every time is below
2**63 (always, in practice; ``persist.time = int64``) and read back as the same uint64 bits;
a part with a larger time keeps uint64 (``persist.time = uint64``; Spark would read
``decimal(20, 0)``). Parquet has no seconds unit: a ``timestamp[s]`` is stored in milliseconds
(exact), or, if a value does not fit in milliseconds, as its int64 seconds; both read back as
the ``timestamp[s]`` they were. Every other type is stored as Arrow's Parquet writer maps it.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from persist.errors import Corruption, IncompatibleFormat

#: The part format of a Parquet part (also the metadata format of a record referencing one).
PART_FORMAT = 4
#: Footer key-value metadata.
TAG = b"persist.part"
SCHEMA_ID = b"persist.schema_id"
TIME = b"persist.time"
_SIGNED, _UNSIGNED = b"int64", b"uint64"
#: The footer key Spark's Parquet writer stores its schema under: marks a part Spark wrote
#: (see the module docstring).
SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"
#: The largest time stored as a signed INT64 (Spark's ``long``).
MAX_SIGNED_TIME = (1 << 63) - 1

_ZSTD_LEVEL = 1


@dataclass(frozen=True)
class Encoded:
    """A part's Parquet file, the row count of each of its row groups, in order, where its
    tail starts (:func:`tail_offset`), and where each row group starts (:func:`group_offsets`;
    None: not laid out one after the other)."""

    data: pa.Buffer
    batch_rows: tuple[int, ...]
    tail: int
    groups: tuple[int, ...] | None = None


def tail_offset(md: pq.FileMetaData) -> int:
    """Where the tail of a Parquet file starts: the end of its last column chunk's pages
    (``dictionary or data page offset + total_compressed_size``, which counts the page
    headers), 4 (after the leading magic) if it has none. From there to the end lie the bloom
    filters, the page index (column and offset indexes), the footer, its length and the
    magic: everything a reader trusts to choose and find pages, and no page checksum covers.
    """
    end = 4
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            start = c.data_page_offset
            if c.has_dictionary_page and c.dictionary_page_offset:
                start = min(start, c.dictionary_page_offset)
            end = max(end, start + c.total_compressed_size)
    return end


def _chunk_span(c: pq.ColumnChunkMetaData) -> tuple[int, int]:
    """The bytes of a column chunk: its first page (dictionary or data) and its pages with
    their headers (``total_compressed_size``)."""
    start = c.data_page_offset
    if c.has_dictionary_page and c.dictionary_page_offset:
        start = min(start, c.dictionary_page_offset)
    return start, start + c.total_compressed_size


def group_offsets(md: pq.FileMetaData) -> tuple[int, ...] | None:
    """Where each row group of a Parquet file starts, then where its tail starts
    (:func:`tail_offset`): ``stats.Groups.offsets``. None when the row groups do not lie one
    after the other from byte 4 to the tail (each row group's column chunks back to back),
    which is how Arrow's writer lays them out; a ranged read then has nothing to rely on."""
    at = 4
    out = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        out.append(at)
        for j in range(rg.num_columns):
            start, end = _chunk_span(rg.column(j))
            if start != at:
                return None
            at = end
    if at != tail_offset(md):
        return None
    return (*out, at)


def encode(table: pa.Table, *, batch_rows: int, schema_id: int, sorted: bool,
           max_time: int) -> Encoded:
    """The Parquet file of a part (see the module docstring).

    Args:
        table: the part's rows, of its part schema (``time`` uint64).
        batch_rows: rows per row group.
        schema_id: the schema version the rows are of (recorded in the footer).
        sorted: ``table`` is sorted by ``(key, value, time)`` (declared in the footer).
        max_time: the largest time in ``table`` (0 if empty): decides how ``time`` is stored.

    NB: returned as the Arrow buffer itself: the store writes it as it is.
    """
    signed = max_time <= MAX_SIGNED_TIME
    columns = []
    fields = []
    for i, field in enumerate(table.schema):
        col = table.column(i)
        if field.name == "time":
            if signed:
                # NB: a view, not a cast: the same 8 bytes per row, checked < 2**63 above.
                col = pa.chunked_array([c.view(pa.int64()) for c in col.chunks], pa.int64())
                field = field.with_type(pa.int64())
        else:
            stored = _stored_type(field.type)
            if stored != field.type:
                col, stored = _to_stored(col, field.type, stored)
                field = field.with_type(stored)
        columns.append(col)
        fields.append(field)
    schema = pa.schema(fields, metadata={
        TAG: str(PART_FORMAT).encode(), SCHEMA_ID: str(schema_id).encode(),
        TIME: _SIGNED if signed else _UNSIGNED})
    out = pa.Table.from_arrays(columns, schema=schema)
    dictionary, encodings = _encodings(schema)
    sink = pa.BufferOutputStream()
    collected: list[pq.FileMetaData] = []
    pq.write_table(
        out, sink, row_group_size=max(1, batch_rows), compression="zstd",
        compression_level=_ZSTD_LEVEL, use_dictionary=dictionary, column_encoding=encodings,
        write_statistics=True, write_page_index=True, write_page_checksum=True,
        sorting_columns=_sorting_columns(schema) if sorted else None,
        metadata_collector=collected)
    md = collected[0]
    rows = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    return Encoded(sink.getvalue(), rows, tail_offset(md), group_offsets(md))


@dataclass(frozen=True)
class Decoded:
    """What :func:`decode` read: the rows, the stored bytes of the row groups decoded, and
    the row count of every row group of the part."""

    table: pa.Table
    nbytes: int
    row_groups: tuple[int, ...]


class Stretches:
    """Some stretches of a Parquet file, each verified by the caller: its tail (footer and
    page index, from ``tail`` to ``size``) and the row groups a ranged read fetched. What
    :func:`decode` reads them through fails on a read of any byte outside them, so a decode
    can only ever use verified bytes.

    Args:
        size: the file's length.
        pieces: ``(offset, bytes)`` of each stretch, the tail's last (ending at ``size``).
    """

    def __init__(self, size: int, pieces: Sequence[tuple[int, bytes | memoryview]]) -> None:
        self.size = size
        runs: list[tuple[int, list[bytes | memoryview]]] = []
        end = -1
        for at, b in sorted(pieces, key=lambda x: x[0]):
            if at == end:
                runs[-1][1].append(b)  # adjacent: one stretch (a read may span both)
            else:
                runs.append((at, [b]))
            end = at + len(b)
        self.pieces = [(at, bytes(bs[0]) if len(bs) == 1 else b"".join(bs)) for at, bs in runs]
        if not self.pieces or self.pieces[-1][0] + len(self.pieces[-1][1]) != size:
            raise ValueError("the stretches of a Parquet file end with its tail")

    @property
    def tail(self) -> bytes:
        """The last stretch (the tail and any row groups right before it)."""
        return self.pieces[-1][1]


class _Guarded(io.RawIOBase):
    """A read-only file over :class:`Stretches`: a read outside them is an ``OSError``."""

    def __init__(self, stretches: Stretches) -> None:
        super().__init__()
        self._s = stretches
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._s.size)[whence]
        self._pos = base + pos
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._s.size if n is None or n < 0 else min(self._s.size, self._pos + n)
        if end <= self._pos:
            return b""
        for at, b in self._s.pieces:
            if at <= self._pos and end <= at + len(b):
                out = b[self._pos - at:end - at]
                self._pos = end
                return out
        raise OSError(f"a read of bytes {self._pos}-{end}, which were not fetched and verified")

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        got = self.read(len(buf))
        memoryview(buf)[:len(got)] = got
        return len(got)


def decode(key: str, data: bytes | memoryview | pa.Buffer | Stretches, schema: pa.Schema, *,
           keep: Sequence[bool] | None = None,
           rows: Sequence[int] | None = None) -> Decoded:
    """Decodes a Parquet part (its bytes already verified against its checksum), or some of
    its row groups from :class:`Stretches` of it (each verified; the row groups ``keep``
    keeps must be among them).

    Args:
        schema: the part schema its rows must have (``time`` uint64).
        keep: decode only the row groups ``i`` with ``keep[i]`` (None: all).
        rows: the row count of each row group, as the part's stats record them.

    Raises:
        Corruption: not a Parquet part of persist, other columns than ``schema``'s, another
            number of row groups or rows than ``keep``/``rows`` say, or undecodable.
        IncompatibleFormat: a newer part format.
    """
    try:
        if isinstance(data, Stretches):
            # NB: the footer from the verified tail, so the reader never reads the file's end
            # itself (it would read 64 KiB: row groups' bytes that may not be fetched)
            f = pq.ParquetFile(_Guarded(data), pre_buffer=False,
                               metadata=pq.read_metadata(pa.BufferReader(data.tail)))
        else:
            f = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        md = f.metadata
        kv = md.metadata or {}
        tag = kv.get(TAG)
        time = kv.get(TIME)
        if tag is None and SPARK_SCHEMA in kv:
            tag, time = str(PART_FORMAT).encode(), _SIGNED  # a part Spark wrote (see above)
        if tag is None:
            raise Corruption(key, "Parquet part lacks the persist.part format tag")
        if int(tag) > PART_FORMAT:
            raise IncompatibleFormat(f"part {key!r} has format version {int(tag)}; this "
                                     f"persist reads up to {PART_FORMAT}")
        if int(tag) != PART_FORMAT:
            raise Corruption(key, f"a Parquet part tagged persist.part={int(tag)} (Parquet "
                                  f"parts are format {PART_FORMAT})")
        groups = md.num_row_groups
        have = [md.row_group(i).num_rows for i in range(groups)]
        if rows is not None and [n for n in have if n] != [n for n in rows if n]:
            raise Corruption(key, f"row groups of {have} rows, its stats say {list(rows)}")
        if keep is None:
            chosen = list(range(groups))
        else:
            if len(keep) != groups:
                raise Corruption(key, f"part has {groups} row groups, its stats say "
                                      f"{len(keep)}")
            chosen = [i for i, k in enumerate(keep) if k]
        table = f.read_row_groups(chosen) if chosen else f.schema_arrow.empty_table()
        nbytes = sum(md.row_group(i).column(j).total_compressed_size
                     for i in chosen for j in range(md.num_columns))
    except (pa.ArrowInvalid, pa.ArrowException, OSError, ValueError) as e:
        raise Corruption(key, f"undecodable Parquet part: {e}") from e
    return Decoded(_restored(key, table, schema, time), nbytes, tuple(have))


def _restored(key: str, table: pa.Table, schema: pa.Schema, time: bytes | None) -> pa.Table:
    """``table`` as read, with the columns stored otherwise than the part schema says turned
    back, checked to be ``schema``."""
    if table.column_names != schema.names:
        raise Corruption(key, f"part columns {table.column_names} are not {schema.names}")
    columns = []
    for i, field in enumerate(schema):
        col = table.column(i)
        if field.name == "time":
            if time == _SIGNED and col.type == pa.int64():
                col = pa.chunked_array([c.view(pa.uint64()) for c in col.chunks], pa.uint64())
            elif time != _UNSIGNED:
                raise Corruption(key, f"time stored as {col.type} under persist.time={time!r}")
        elif col.type != field.type:
            col = _from_stored(key, col, field.type)
        columns.append(col)
    try:
        return pa.Table.from_arrays(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise Corruption(key, f"part schema {table.schema} differs from the collection's "
                              f"{schema}: {e}") from e


# -- types stored otherwise ---------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _stored_type(t: pa.DataType, seconds: pa.DataType | None = None) -> pa.DataType:
    """The type a key or value column of ``t`` is written as: ``t`` with every seconds
    timestamp in milliseconds (Parquet has no seconds), or as ``seconds`` when given."""
    if pa.types.is_timestamp(t) and t.unit == "s":
        return seconds if seconds is not None else pa.timestamp("ms", tz=t.tz)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_stored_type(f.type, seconds)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_stored_type(t.value_type, seconds)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_stored_type(t.value_type, seconds)))
    return t


def _to_stored(col: pa.ChunkedArray, t: pa.DataType, stored: pa.DataType
               ) -> tuple[pa.ChunkedArray, pa.DataType]:
    """``col`` cast to ``stored`` (seconds to milliseconds, checked), or, when a seconds value
    does not fit in milliseconds (|t| > 2.9e8 years, values of null records included), every
    seconds timestamp as its int64 seconds."""
    try:
        return col.cast(stored, safe=True), stored
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raw = _stored_type(t, pa.int64())
        return col.cast(raw, safe=True), raw


def _from_stored(key: str, col: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    """A column read back as ``t`` from the form :func:`_to_stored` gave it."""
    if col.type not in (_stored_type(t), _stored_type(t, pa.int64())):
        raise Corruption(key, f"a column stored as {col.type} cannot be {t}")
    try:
        # NB: milliseconds that were seconds divide exactly (a safe cast checks it); int64
        # seconds are a reinterpretation.
        return col.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise Corruption(key, f"a column stored as {col.type} does not read as {t}: {e}") from e


# -- writer options -----------------------------------------------------------------------------


def _leaves(t: pa.DataType, path: str) -> list[tuple[str, pa.DataType]]:
    """The Parquet leaf columns of an Arrow column: ``(dotted path, leaf type)``, in order.

    NB: the paths Arrow's writer gives them (``use_compliant_nested_type``: a list's items
    are ``<list>.list.element``); the writer refuses options for paths it does not have.
    """
    if pa.types.is_struct(t):
        return [leaf for f in t for leaf in _leaves(f.type, f"{path}.{f.name}")]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _leaves(t.value_type, f"{path}.list.element")
    return [(path, t)]


def _delta(t: pa.DataType) -> bool:
    """Leaves stored as Parquet INT32/INT64 (integers, dates, timestamps)."""
    return bool(pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t))


def _bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


@functools.lru_cache(maxsize=256)
def _encodings(schema: pa.Schema) -> tuple[list[str], dict[str, str]]:
    """The dictionary-encoded leaves and the explicit encodings of the others."""
    dictionary: list[str] = []
    encodings: dict[str, str] = {}
    for field in schema:
        for path, t in _leaves(field.type, field.name):
            if _bytes(t):
                dictionary.append(path)
            elif _delta(t):
                encodings[path] = "DELTA_BINARY_PACKED"
    return dictionary, encodings


@functools.lru_cache(maxsize=256)
def _sorting_columns(schema: pa.Schema) -> tuple[pq.SortingColumn, ...]:
    """The leading columns of ``(key, value, time)`` whose Parquet order is persist's sort
    order: primitive ones, up to the first struct or list (a record's order is its frame's,
    which no single Parquet column states)."""
    out: list[pq.SortingColumn] = []
    for leaf, field in enumerate(schema):
        leaves = _leaves(field.type, field.name)
        if field.name == "diff" or len(leaves) != 1 or leaves[0][1] != field.type:
            break
        # NB: while every column so far is primitive, leaf i is column i.
        out.append(pq.SortingColumn(leaf, descending=False, nulls_first=False))
    return tuple(out)


__all__ = ["PART_FORMAT", "SPARK_SCHEMA", "Decoded", "Encoded", "Stretches", "decode", "encode",
           "group_offsets", "tail_offset"]
