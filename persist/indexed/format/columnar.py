"""Columnar parts: Arrow tables of updates ``key, value, time, diff`` and their stored form.

A part is an Arrow IPC stream compressed with zstd, its schema tagged with
``persist.part=<version>``: 1 for a collection of version-1 types, 2 for one with records or
other version-2 types (:mod:`persist.indexed.format.records`), so that a reader that predates them
refuses the part instead of misreading it. Types: ``key``/``value`` as registered
(Python-object codecs store msgpack in ``binary``; a mapped ``msgspec.Struct`` its Arrow
struct), ``time`` uint64, ``diff`` int64. Every conversion here is vectorized: the Arrow input
path never touches rows as Python objects.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal

import crc32c
import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import (
    Corruption,
    DiffOverflow,
    IncompatibleFormat,
    InvalidUsage,
    SchemaMismatch,
)
from persist.indexed.format import objects, records

#: The newest part format this persist reads (and writes for collections with records).
PART_FORMAT_VERSION = 2
#: The part format of collections whose types are all version-1 types.
BASE_PART_FORMAT_VERSION = 1
_PART_TAG = b"persist.part"
MIN_DIFF = -(1 << 63)
MAX_DIFF = (1 << 63) - 1
MAX_TIME = 2**64 - 1

#: The primitive key/value types of format version 1. Version 2 adds every type
#: :func:`persist.indexed.format.records.check_type` accepts (records: structs, lists, decimals, ...).
SUPPORTED_TYPES = records.V1_TYPES


@dataclass(frozen=True)
class Codec:
    """How one column (key or value) is stored: an Arrow type, or a Python type as msgpack."""

    arrow_type: pa.DataType
    #: A msgspec-encodable Python type when set: stored as msgpack in ``binary``
    #: (:func:`persist.msgpack`), or, when ``arrow_type`` is a struct, a ``msgspec.Struct``
    #: class stored as that struct.
    py_type: Any = None
    name: str | None = None  # dotted name of py_type, recorded in metadata

    @classmethod
    def of(cls, spec: Any, column: str = "value") -> Codec:
        """The codec for a user's key or value type.

        Args:
            spec: an Arrow type :func:`records.check_type` accepts (stored as is); a
                ``msgspec.Struct`` class whose fields all map (:func:`records.struct_type`:
                stored as that Arrow struct); or ``persist.msgpack(T)``
                (:func:`records.msgpack`: stored as msgpack in ``binary``, the explicit
                opt-in). A class is named ``module:qualname`` in the metadata.
            column: ``key`` or ``value``, to name the field of an unsupported type.

        Raises:
            SchemaMismatch: an unsupported Arrow type, a Struct field that does not map or
                cannot be stored (naming the field path and the fix), another class (naming
                what to use instead), or not a type at all.
        """
        if isinstance(spec, pa.DataType):
            records.check_type(spec, column)
            return cls(spec)
        if isinstance(spec, records.MsgpackType):
            bad = records.unencodable(spec.type, column)
            if bad:
                raise SchemaMismatch("; ".join(bad))
            return cls(pa.binary(), spec.type, _type_name(spec.type))
        if isinstance(spec, type) and issubclass(spec, msgspec.Struct):
            return cls(records.struct_type(spec, column), spec, _type_name(spec))
        if isinstance(spec, type):
            raise SchemaMismatch(_not_a_record(spec, column))
        raise SchemaMismatch(f"{column}: the type must be a pyarrow DataType, a "
                             f"msgspec.Struct or persist.msgpack(T), not {spec!r}")

    @property
    def mapped(self) -> bool:
        """True for a ``msgspec.Struct`` class stored as an Arrow struct (not msgpack)."""
        return self.name is not None and not pa.types.is_binary(self.arrow_type)

    @property
    def msgpack(self) -> bool:
        """True for a Python type stored as opaque msgpack (``persist.msgpack(T)``)."""
        return self.name is not None and pa.types.is_binary(self.arrow_type)

    def accepts(self, asked: Codec) -> bool:
        """True if a collection stored with this codec may be opened asking for ``asked``.

        Identity is structural: the same Arrow type (for a struct: field names, types and
        nullability), whatever class, if any, was named when it was registered (that name is
        for information), so a ``msgspec.Struct`` defined in a script opens from a module, or
        with the plain Arrow type. A msgpack column has no structure persist can see: it
        opens only with ``persist.msgpack`` of a class of the same name.
        """
        if self.msgpack or asked.msgpack:
            return self.msgpack and asked.msgpack and self.name == asked.name
        return bool(self.arrow_type == asked.arrow_type)

    @classmethod
    def from_meta(cls, type_bytes: bytes, codec: str | None) -> Codec:
        """The codec a collection's metadata records (``CollectionMeta.key_type``/``key_codec``).

        A ``codec`` name that does not import here gives a codec without ``py_type``: its
        values read as the stored msgpack bytes. Malformed ``type_bytes`` raise Corruption.
        """
        arrow_type = deserialize_type(type_bytes)
        if codec is None:
            return cls(arrow_type)
        py_type = _resolve(codec)
        if py_type is not None and not pa.types.is_binary(arrow_type) and \
                records.struct_type_of(py_type) != arrow_type:
            py_type = None  # the class no longer maps to the stored struct: read dicts
        return cls(arrow_type, py_type, codec)

    def encode_values(self, values: list[Any], column: str = "value") -> pa.Array:
        """``values`` as an array of ``arrow_type`` (msgpack-encoded ``binary`` for a Python
        type; None stays null for an Arrow type, encodes as msgpack nil for a Python type).

        Every value is checked against the type first: pyarrow alone converts silently (1.5
        into an int64 column is stored as 1, True into float64 as 1.0), and msgpack encodes any
        object whatever ``py_type`` says, which would then fail on every read.

        Raises:
            SchemaMismatch: a value does not fit the Arrow type or ``py_type``, naming it.
        """
        if self.mapped or records.is_v2_type(self.arrow_type):
            return self._encode_records(values, column)
        if self.py_type is None:
            fits = _python_check(self.arrow_type)
            # NB: values all exactly of a type the kind takes need no closer look
            kinds = set(map(type, values))
            kinds.discard(type(None))
            exact = _EXACT_KINDS.get(_kind(self.arrow_type), frozenset())
            for v in values if not kinds <= exact else ():
                if v is not None and not fits(v):
                    raise SchemaMismatch(f"{column}: {v!r} ({type(v).__name__}) does not fit "
                                         f"{self.arrow_type}")
            try:
                return pa.array(values, type=self.arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                raise SchemaMismatch(f"{column}: values do not fit {self.arrow_type}: "
                                     f"{e}") from e
        enc = msgspec.msgpack.Encoder()
        dec = msgspec.msgpack.Decoder(self.py_type)
        try:
            encoded = [enc.encode(v) for v in values]
            for v, b in zip(values, encoded, strict=True):
                if v is not None:
                    dec.decode(b)
        except (TypeError, msgspec.EncodeError, msgspec.DecodeError) as e:
            raise SchemaMismatch(f"{column}: a value does not encode as {self.name}: "
                                 f"{e}") from e
        return pa.array(encoded, type=pa.binary())

    def _encode_records(self, values: list[Any], column: str) -> pa.Array:
        """``encode_values`` for version-2 types: a mapped ``msgspec.Struct``'s instances
        column by column (:func:`objects.encode`), else, or where that gives up,
        :meth:`encode_checked`."""
        if self.mapped and self.py_type is not None:
            p = objects.plan(self.py_type, self.arrow_type)
            if p is not None:
                with objects.gc_paused():
                    fast = objects.encode(p, values)
                if fast is not None:
                    return fast
        return self.encode_checked(values, column)

    def encode_checked(self, values: list[Any], column: str) -> pa.Array:
        """``encode_values`` for version-2 types, value by value: each value checked against
        the type, recursively (the path of a misfit is named), then converted by pyarrow.

        Raises:
            SchemaMismatch: a value does not fit, naming the field and the value.
        """
        t = self.arrow_type
        cls = self.py_type if self.mapped else None
        check = records.checker(t)
        out = values
        try:
            if cls is not None or records.is_nested(t):
                out = []
                for v in values:
                    if cls is not None and v is not None and not isinstance(v, cls):
                        raise SchemaMismatch(f"{column}: {v!r} ({type(v).__name__}) is not a "
                                             f"{self.name}")
                    out.append(records.to_builtin(v))
            for v in out:
                if v is not None:
                    check(v, column)
        except SchemaMismatch as e:
            if self.name is None:
                raise
            raise SchemaMismatch(f"a {column} does not encode as {self.name}: {e}") from e
        try:
            return pa.array(out, type=t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise SchemaMismatch(f"{column}: values do not fit {t}: {e}") from e

    def decode_values(self, array: pa.Array | pa.ChunkedArray) -> list[Any]:
        """``array`` as Python values: msgpack decoded into ``py_type`` when set (nulls stay
        None), a mapped ``msgspec.Struct`` built again from its struct, else Arrow's own
        conversion.

        NB: msgspec's DecodeError / ValidationError (bytes that no longer fit ``py_type``)
        propagate untranslated.
        """
        if self.py_type is None:
            if records.is_nested(self.arrow_type):
                return list(array.to_pylist())
            chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
            return [v for c in chunks for v in objects.leaf_values(c)]
        if self.mapped:
            p = objects.plan(self.py_type, self.arrow_type)
            if p is not None:
                with objects.gc_paused():
                    return objects.decode(p, array)
            decode = records.struct_decoder(self.py_type)
            return [decode(d) for d in array.to_pylist()]
        dec = msgspec.msgpack.Decoder(self.py_type)
        return [None if b is None else dec.decode(b) for b in array.to_pylist()]


def rows(table: pa.Table, key: Codec, value: Codec,
         time: int | None = None) -> list[tuple[tuple[Any, Any], int, int]]:
    """``table``'s rows as ``((key, value), time, diff)`` tuples, keys and values decoded by
    the codecs (:meth:`Codec.decode_values`); every time ``time`` if given."""
    with objects.gc_paused():
        keys = key.decode_values(table.column("key"))
        values = value.decode_values(table.column("value"))
        diffs = table.column("diff").to_pylist()
        kv = zip(keys, values, strict=True)
        if time is not None:
            return list(zip(kv, repeat(time), diffs, strict=False))  # repeat is endless
        return list(zip(kv, table.column("time").to_pylist(), diffs, strict=True))


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return str(t)


#: The exact Python types a value of each kind may have without a closer check (see
#: ``_python_check``, which decides for every other type).
_EXACT_KINDS = {"integer": frozenset({int}), "float": frozenset({float, int}),
                "string": frozenset({str}), "binary": frozenset({bytes}),
                "bool": frozenset({bool})}


def _castable_kind(have: pa.DataType, want: pa.DataType) -> bool:
    """True if a column of ``have`` may be cast (safely, values checked) to ``want``: a null
    column, or one of the same kind (int32 to int64, string to large_string, ...). Other casts
    (bool to int, float to int, int to string) change what a value means and are refused.
    Records: a struct with the same field names, each castable; a list of castable items;
    decimals; timestamps both zoned or both naive."""
    if pa.types.is_null(have):
        return True
    if pa.types.is_struct(want):
        if not pa.types.is_struct(have) or [f.name for f in have] != [f.name for f in want]:
            return False
        return all(_castable_kind(h.type, w.type) for h, w in zip(have, want, strict=True))
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return ((pa.types.is_list(have) or pa.types.is_large_list(have))
                and _castable_kind(have.value_type, want.value_type))
    if pa.types.is_timestamp(want):
        return bool(pa.types.is_timestamp(have) and (have.tz is None) == (want.tz is None))
    if pa.types.is_decimal(want):
        return bool(pa.types.is_decimal(have))
    if pa.types.is_date32(want) or pa.types.is_boolean(want):
        return bool(have == want)
    return _kind(have) == _kind(want)


def _python_check(t: pa.DataType) -> Callable[[Any], bool]:
    """What a Python value must be to go into a column of ``t`` without a silent conversion."""
    if pa.types.is_integer(t):
        return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if pa.types.is_floating(t):
        return lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: isinstance(v, str)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return lambda v: isinstance(v, (bytes, bytearray, memoryview))
    if pa.types.is_boolean(t):
        return lambda v: isinstance(v, bool)
    return lambda v: True  # null: only None, which never reaches the check


def _resolve(name: str) -> Any:
    module, _, qual = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for attr in qual.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError):
        return None  # readers without the type still see the msgpack bytes
    return obj


def _type_name(t: type) -> str:
    return f"{t.__module__}:{t.__qualname__}"


def _not_a_record(t: type, column: str) -> str:
    """Why class ``t`` (not a ``msgspec.Struct``) is no key or value type, and what to use."""
    arrow = records.simple_arrow_type(t)
    if arrow is not None:
        return (f"{column}: {t.__qualname__} is a Python type: use the Arrow type "
                f"(pa.{_PA_NAMES.get(str(arrow), str(arrow))}), or persist.msgpack("
                f"{t.__qualname__}) to store it as opaque msgpack")
    bad = records.unencodable(t, column)
    if bad:
        return "; ".join(bad)
    return (f"{column}: {t.__qualname__} is not a msgspec.Struct: use an Arrow type, a "
            f"msgspec.Struct whose fields map, or persist.msgpack({t.__qualname__}) to store "
            f"it as opaque msgpack (it then cannot be filtered or evolved, and Spark sees "
            f"binary)")


_PA_NAMES = {"int64": "int64()", "double": "float64()", "string": "string()",
             "binary": "binary()", "bool": "bool_()", "date32[day]": "date32()",
             "timestamp[us, tz=UTC]": 'timestamp("us", tz="UTC")'}


def serialize_type(t: pa.DataType) -> bytes:
    """``t`` as stored in metadata: the IPC bytes of a one-field schema (see
    :func:`deserialize_type`)."""
    return bytes(pa.schema([pa.field("t", t)]).serialize().to_pybytes())


# NB: both are pure and called for every write and read (via ``Types.of``); parsing an IPC schema
# costs tens of microseconds, a noticeable share of a small append.
@functools.lru_cache(maxsize=1024)
def deserialize_type(data: bytes) -> pa.DataType:
    """The type :func:`serialize_type` stored in ``data``. Cached.

    Raises:
        Corruption: ``data`` is not a serialized type (the metadata was checksummed, so only a
            writer bug or a hand-made record gets here).
    """
    try:
        return pa.ipc.read_schema(pa.py_buffer(data)).field("t").type
    # NB: damaged flatbuffers raise OSError ("Invalid flatbuffers message") or
    # ArrowNotImplementedError (a 3-bit int) as well as ArrowInvalid
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise Corruption("metadata", f"a collection's type does not decode: {e}") from e


@functools.lru_cache(maxsize=1024)
def part_schema(key: pa.DataType, value: pa.DataType) -> pa.Schema:
    """The schema of a collection's parts: ``key, value`` as given, ``time`` uint64 and
    ``diff`` int64 (both non-null), tagged with :data:`PART_FORMAT_VERSION`. Cached."""
    return pa.schema(
        [
            pa.field("key", key),
            pa.field("value", value),
            pa.field("time", pa.uint64(), nullable=False),
            pa.field("diff", pa.int64(), nullable=False),
        ],
        metadata={_PART_TAG: str(part_version(key, value)).encode()},
    )


def part_version(key: pa.DataType, value: pa.DataType) -> int:
    """The part format of a collection of these types: 2 if either is a version-2 type (a
    record, a decimal, ...), else 1 (version-1 parts stay byte-for-byte as they were)."""
    if records.is_v2_type(key) or records.is_v2_type(value):
        return PART_FORMAT_VERSION
    return BASE_PART_FORMAT_VERSION


def from_updates(updates: Any, schema: pa.Schema, key: Codec, value: Codec) -> pa.Table:
    """Normalizes user input to a table of ``schema``.

    Accepts a pyarrow Table/RecordBatch with columns key, value, time, diff (cast vectorized) or
    an iterable of ``((key, value), time, diff)`` tuples.

    Raises:
        SchemaMismatch: missing columns, uncastable types, malformed tuples.
        InvalidUsage: negative times or times beyond uint64.
    """
    if isinstance(updates, pa.RecordBatch):
        updates = pa.Table.from_batches([updates])
    if isinstance(updates, pa.Table):
        return _from_arrow(updates, schema)
    if isinstance(updates, (str, bytes)) or not isinstance(updates, Iterable):
        raise SchemaMismatch(
            f"updates must be a pyarrow Table/RecordBatch or an iterable of "
            f"((key, value), time, diff) tuples, not {type(updates).__name__}"
        )
    keys: list[Any] = []
    values: list[Any] = []
    times: list[int] = []
    diffs: list[int] = []
    try:
        for (k, v), t, d in updates:
            keys.append(k)
            values.append(v)
            times.append(t)
            diffs.append(d)
    except (TypeError, ValueError) as e:
        raise SchemaMismatch(f"each update must be ((key, value), time, diff): {e}") from e
    # NB: when every one is exactly an int (as usual), min and max decide in C
    if not _ints_within(times, 0, MAX_TIME):
        for t in times:
            if not _is_integer(t) or not 0 <= t <= MAX_TIME:
                raise InvalidUsage(f"time {t!r} is not an integer in [0, 2**64)")
    # NB: checked here, not left to pyarrow: pa.array([1.5], type=pa.int64()) truncates to 1
    # without a word, and a diff of True would count as 1.
    if not _ints_within(diffs, MIN_DIFF, MAX_DIFF):
        for d in diffs:
            if not _is_integer(d) or not MIN_DIFF <= d <= MAX_DIFF:
                raise SchemaMismatch(f"diff {d!r} is not an int64 (a whole number of copies)")
    diff_arr = pa.array(diffs, type=pa.int64())
    return pa.Table.from_arrays(
        [key.encode_values(keys, "key"), value.encode_values(values, "value"),
         pa.array(times, type=pa.uint64()), diff_arr],
        schema=schema,
    )


def _ints_within(xs: list[Any], lo: int, hi: int) -> bool:
    """True if every one of ``xs`` is exactly an ``int`` in ``[lo, hi]`` (False: look
    closer)."""
    return not xs or (set(map(type, xs)) == {int} and lo <= min(xs) and max(xs) <= hi)


def _is_integer(x: Any) -> bool:
    """True for Python and numpy integers; False for bools, floats and everything else."""
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def _from_arrow(table: pa.Table, schema: pa.Schema) -> pa.Table:
    have = table.schema.names  # NB: a fifth of ``column_names``' cost (0.4 against 2.5 µs)
    missing = [n for n in ("key", "value", "time", "diff") if n not in have]
    if missing:
        raise SchemaMismatch(f"updates table lacks columns {missing}; has {have}")
    # NB: time first, so a negative time is reported as such whatever else is wrong.
    order, names = _field_order(schema)
    cols: dict[str, Any] = {}
    for field in order:
        col = table.column(field.name)
        if field.name == "time" and col.type == pa.int64():
            col = _int64_times(col)
        elif col.type != field.type:
            if not _castable_kind(col.type, field.type):
                raise SchemaMismatch(f"column {field.name!r} of type {col.type} is not "
                                     f"{field.type} (only widening within one kind is cast)")
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                if field.name == "time" and pa.types.is_signed_integer(col.type):
                    lo = pc.min(col).as_py()
                    if lo is not None and lo < 0:
                        raise InvalidUsage(f"negative time {lo} in updates") from None
                raise SchemaMismatch(
                    f"column {field.name!r} of type {col.type} does not cast to {field.type}: {e}"
                ) from e
        if not field.nullable and col.null_count:
            raise SchemaMismatch(f"column {field.name!r} has nulls")
        cols[field.name] = col
    return pa.Table.from_arrays([cols[n] for n in names], schema=schema)


def _int64_times(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """An int64 ``time`` column as uint64: checked for negative values, then viewed, not cast.

    NB: the usual input (numpy and pandas default to int64). A safe cast allocates and fills a
    new 8 MB buffer per million rows; on the write path that memory is fresh pages more often
    than not, and the cast cost 2-45 ms where the minimum and the view cost ~0.4 ms.
    """
    if col.num_chunks == 1 and 0 < len(col) <= _PY_MIN_ROWS and not col.null_count:
        # NB: the usual small append, one chunk: its minimum through numpy (no compute call,
        # and no Python list of the values as ``small_ints`` makes): 4.5 against 8-11 µs
        chunk = col.chunk(0)
        low = int(np.frombuffer(chunk.buffers()[1], np.int64, len(chunk), chunk.offset * 8).min())
        if low < 0:
            raise InvalidUsage(f"negative time {low} in updates")
        return pa.chunked_array([chunk.view(pa.uint64())], type=pa.uint64())
    small = small_ints(col, pa.int64(), "q")  # see ``min_time``
    lo = min(small) if small is not None else pc.min(col).as_py()  # None: empty or all null
    if lo is not None and lo < 0:
        raise InvalidUsage(f"negative time {lo} in updates")
    return pa.chunked_array([c.view(pa.uint64()) for c in col.chunks], type=pa.uint64())


#: ``_field_order``'s answers by the identity of the schema (held, so the id stays its own).
_ORDERS: dict[int, tuple[pa.Schema, tuple[pa.Field, ...], tuple[str, ...]]] = {}


def _field_order(schema: pa.Schema) -> tuple[tuple[pa.Field, ...], tuple[str, ...]]:
    """``schema``'s fields with ``time`` first, and its column names in order.

    NB: cached by identity: a collection's part schema is one object (``part_schema`` is
    cached), and hashing a schema for ``lru_cache`` took 3.5 µs of every append."""
    hit = _ORDERS.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1], hit[2]
    fields = list(schema)
    order = tuple(sorted(fields, key=lambda f: f.name != "time"))
    names = tuple(f.name for f in fields)
    if len(_ORDERS) >= 256:
        _ORDERS.clear()
    _ORDERS[id(schema)] = (schema, order, names)
    return order, names


# -- stored form ---------------------------------------------------------------------------

_WRITE_OPTS = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
_PLAIN_OPTS = pa.ipc.IpcWriteOptions()
#: Tables smaller than this (Arrow bytes) are stored uncompressed.
#: NB: Arrow compresses every buffer separately with a fresh zstd context: for a 100-row part
#: that is ~0.4 ms to encode and ~0.8 ms to decode, against ~0.03 ms each uncompressed, to save
#: ~2 KiB. Readers need nothing: an IPC stream records per batch whether it is compressed.
COMPRESS_MIN_BYTES = 64 << 10
#: A table of several chunks (a group commit's writes, a merge) below this size is made one
#: chunk first: every chunk would otherwise become its own record batch, with per-batch (and,
#: compressed, per-buffer) overhead.
_COMBINE_MAX_BYTES = 16 << 20


#: Rows per Arrow record batch of a stored part: a filtered read decodes only the batches
#: whose stats may match (:mod:`persist.indexed.format.stats`). Measured on 1 M rows of an int64 key
#: and a 4-field struct value: 64 Ki-row batches encode faster than 1 Mi-row ones (97 against
#: 172 ms), decode as fast (41 against 44 ms) and compress as well (22.0 MB both).
BATCH_ROWS = 1 << 16


def arrow_nbytes(table: pa.Table) -> int:
    """The bytes ``table``'s rows take in Arrow (``Table.nbytes``: a slice counts as sliced),
    found from the schema, the row count and the null counts when every column is of a
    fixed-width type (within a byte per chunk of a boolean column or a validity bitmap);
    ``Table.nbytes`` otherwise.

    NB: ``Table.nbytes`` visits every buffer of every chunk and collects them in a set (buffers
    shared between columns count once): 11 µs for a 100-row table of four int64 columns, and
    152 µs for a group commit of 11 such appends (11 chunks), which the commit path paid twice
    (the inline probe and the encoder's choices) on the runtime thread, holding the GIL the
    writers' threads wait for. Every use is a size threshold, which these bytes decide alike.
    """
    widths = _fixed_widths(table.schema)
    if widths is None:
        return int(table.nbytes)
    rows = table.num_rows
    total = 0
    for i, width in enumerate(widths):
        total += (rows * width + 7) // 8
        if table.column(i).null_count:
            total += (rows + 7) // 8
    return total


@functools.lru_cache(maxsize=256)
def _fixed_widths(schema: pa.Schema) -> tuple[int, ...] | None:
    """The bit width of each of ``schema``'s columns, or None if one is not of a fixed-width
    type (strings, lists, structs, null), or is a dictionary (whose ``bit_width`` is its
    indices', not what its rows take) or an extension type (what its storage takes, left to
    ``Table.nbytes`` rather than reasoned about type by type)."""
    widths = []
    for t in schema.types:
        if pa.types.is_dictionary(t) or isinstance(t, pa.BaseExtensionType):
            return None
        try:
            widths.append(t.bit_width)
        except ValueError:
            return None
    return tuple(widths)


#: The frame of a compressed inline part (:func:`pack_inline`): these 4 bytes, the stream's
#: length and its crc32c (uint32s, little-endian), then the stream as one LZ4 block. An Arrow
#: IPC stream starts with its continuation marker ``ff ff ff ff`` (every persist writes one),
#: so the two are told apart by their first bytes.
INLINE_MAGIC = b"PLZ4"
_INLINE_HEAD = struct.Struct("<4sII")
_LZ4 = pa.Codec("lz4_raw")
#: A compressed inline part is kept only if it is at most this share of the stream: a part
#: that hardly compresses (random ids) keeps its plain stream, which every persist reads.
INLINE_PACK_SHARE = 0.875
#: LZ4's largest ratio is 255:1; a frame claiming more is damaged, refused before allocating.
_LZ4_MAX_RATIO = 255


def pack_inline(data: pa.Buffer) -> bytes:
    """The stored bytes of an inline part whose Arrow IPC stream is ``data``: the stream
    compressed into an :data:`INLINE_MAGIC` frame when that saves at least an eighth, else the
    stream itself.

    NB: LZ4 on the whole stream, not Arrow's per-buffer compression: that starts a fresh
    codec per buffer (120 µs to encode and 119 µs to decode a 100-row part of four int64
    columns, zstd 248/197 µs), where one LZ4 block of the stream takes 5 µs and 2 µs (3,784
    bytes to 1,657 for the benchmarks' rows). Inline parts live in every log entry and rollup
    until compaction moves them out, so they are most of the metadata's bytes. The crc32c
    (0.3 µs) is of the stream itself: pyarrow's LZ4 block decoder hands back as many bytes as it
    is told to, so a frame whose length is damaged would otherwise decode with a tail of
    whatever the buffer held, and an inline part that travelled in a task or a staged handle
    is checked by nothing else (the store's envelope covers only what was read from it).
    """
    packed: bytes = _LZ4.compress(data, asbytes=True)
    if _INLINE_HEAD.size + len(packed) > INLINE_PACK_SHARE * data.size:
        plain: bytes = data.to_pybytes()
        return plain
    return _INLINE_HEAD.pack(INLINE_MAGIC, data.size, crc32c.crc32c(data)) + packed


def is_packed(data: bytes) -> bool:
    """Whether the inline part ``data`` is an :data:`INLINE_MAGIC` frame (a reader before
    metadata format 9 cannot read it)."""
    return data[:4] == INLINE_MAGIC


def unpack_inline(key: str, data: bytes | memoryview) -> bytes | memoryview:
    """The Arrow IPC stream of the stored part ``data``: decompressed from its frame and
    verified if it is one (:func:`pack_inline`), else ``data`` itself.

    Raises:
        Corruption: a frame that does not decompress to the length and crc32c it gives.
    """
    if bytes(data[:4]) != INLINE_MAGIC:
        return data
    view = memoryview(data)
    if len(view) < _INLINE_HEAD.size:
        raise Corruption(key, f"compressed inline part of {len(view)} bytes lacks its header")
    _, size, crc = _INLINE_HEAD.unpack_from(view)
    body = view[_INLINE_HEAD.size:]
    if size > _LZ4_MAX_RATIO * len(body) + 16:
        raise Corruption(key, f"compressed inline part claims {size} bytes from {len(body)}")
    try:
        out: bytes = _LZ4.decompress(body, decompressed_size=size, asbytes=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise Corruption(key, f"compressed inline part does not decompress: {e}") from e
    if len(out) != size or crc32c.crc32c(out) != crc:
        raise Corruption(key, f"compressed inline part does not decompress to the {size} "
                              f"bytes of crc32c {crc:#010x} its header gives")
    return out


def encode_part(table: pa.Table) -> pa.Buffer:
    """The part's stored form: an Arrow IPC stream (zstd unless small) of record batches of
    at most :data:`BATCH_ROWS` rows (see :func:`encode_batches`)."""
    return encode_batches(table)[0]


def encode_batches(table: pa.Table, batch_rows: int = BATCH_ROWS
                   ) -> tuple[pa.Buffer, tuple[int, ...]]:
    """The part's stored form, and the row count of each record batch in it, in order.

    NB: returned as the Arrow buffer itself, not copied into ``bytes``: the envelope copies it
    once on its way to storage, and a second copy of ~10 MB per million rows, into fresh pages,
    cost more than the checksum.
    """
    sink = pa.BufferOutputStream()
    nbytes = arrow_nbytes(table)
    if table.num_columns and table.column(0).num_chunks > 1 and nbytes <= _COMBINE_MAX_BYTES:
        table = table.combine_chunks()
    opts = _WRITE_OPTS if nbytes >= COMPRESS_MIN_BYTES else _PLAIN_OPTS
    batches = table.to_batches(max_chunksize=batch_rows)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        for b in batches:
            w.write_batch(b)
    buf: pa.Buffer = sink.getvalue()
    return buf, tuple(b.num_rows for b in batches)


def decode_part(key: str, data: bytes | memoryview, schema: pa.Schema) -> pa.Table:
    """Decodes a stored part (an inline one possibly compressed, :func:`pack_inline`),
    checking its format tag and schema.

    Raises:
        Corruption: not an Arrow stream, or columns other than ``schema``'s.
        IncompatibleFormat: a newer part format.
    """
    data = unpack_inline(key, data)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise Corruption(key, f"undecodable Arrow part: {e}") from e
    _check_part_schema(key, table.schema, schema)
    return table


def _check_part_schema(key: str, have: pa.Schema, schema: pa.Schema) -> None:
    tag = (have.metadata or {}).get(_PART_TAG)
    if tag is None:
        raise Corruption(key, "Arrow part lacks the persist.part format tag")
    if int(tag) > PART_FORMAT_VERSION:
        raise IncompatibleFormat(
            f"part {key!r} has format version {int(tag)}; this persist reads up to "
            f"{PART_FORMAT_VERSION}"
        )
    if not have.equals(schema, check_metadata=False):
        raise Corruption(key, f"part schema {have} differs from the collection's {schema}")


def decode_batches(key: str, data: bytes | memoryview, schema: pa.Schema,
                   keep: list[bool], rows: tuple[int, ...] | None = None) -> pa.Table:
    """Decodes only the record batches ``i`` of a stored part with ``keep[i]`` (checked like
    :func:`decode_part`); the others are skipped undecoded (not decompressed).

    Raises:
        Corruption: not an Arrow stream, another schema, not ``len(keep)`` batches, or a
            decoded batch ``i`` of other than ``rows[i]`` rows (when given).
        IncompatibleFormat: a newer part format.
    """
    out: list[pa.RecordBatch] = []
    data = unpack_inline(key, data)
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
        have = pa.ipc.read_schema(reader.read_next_message())
        _check_part_schema(key, have, schema)
        i = 0
        for message in reader:
            if message.type != "record batch":
                raise Corruption(key, f"unexpected {message.type} message in a part")
            if i < len(keep) and keep[i]:
                batch = pa.ipc.read_record_batch(message, have)
                if rows is not None and batch.num_rows != rows[i]:
                    raise Corruption(key, f"record batch {i} has {batch.num_rows} rows, its "
                                          f"stats say {rows[i]}")
                out.append(batch)
            i += 1
    except (pa.ArrowInvalid, pa.ArrowException, OSError, StopIteration) as e:
        raise Corruption(key, f"undecodable Arrow part: {e}") from e
    if i != len(keep):
        raise Corruption(key, f"part has {i} record batches, its stats say {len(keep)}")
    return pa.Table.from_batches(out, schema=have)


# -- consolidation -------------------------------------------------------------------------


_UINT64 = pa.uint64()
_FILL_FORMATS = {_UINT64: "<Q", pa.int64(): "<q"}


#: The largest filled buffer ``constant_times`` keeps for reuse (2 Mi rows of 8 bytes).
_FILL_KEEP_BYTES = 16 << 20
#: ``(pattern, buffer)``: the last buffer ``constant_times`` filled (replaced as a whole, so
#: threads never see a torn pair).
_fill_cache: tuple[bytes, pa.Buffer] = (b"", pa.py_buffer(b""))


def constant_times(value: int, n: int, typ: pa.DataType = _UINT64) -> pa.Array:
    """An array of ``n`` copies of ``value`` (a uint64 or int64 time column).

    NB: built from one repeated 8-byte pattern (``pa.repeat`` takes ~10 ms per million rows),
    and a snapshot rewrites the time column of every part it reads, all to the same ``as_of``:
    the parts share one filled buffer (Arrow buffers are immutable), so a read of ten 1 M-row
    parts allocates and fills 8 MB once instead of ten times, each fresh allocation costing
    page faults that made this ~20% of a raw snapshot read.
    """
    global _fill_cache
    pattern = struct.pack(_FILL_FORMATS[typ], value)
    size = 8 * n
    cached_pattern, buf = _fill_cache
    if cached_pattern != pattern or buf.size < size:
        buf = pa.py_buffer(pattern * n)
        if size <= _FILL_KEEP_BYTES:
            _fill_cache = (pattern, buf)
    return pa.Array.from_buffers(typ, n, [None, buf.slice(0, size)])


def forward(table: pa.Table, frontier: int) -> pa.Table:
    """Advances every time below ``frontier`` to ``frontier``."""
    if frontier <= 0 or len(table) == 0:
        return table
    t = table.column("time")
    f = pa.scalar(frontier, pa.uint64())
    return table.set_column(2, table.schema.field(2), pc.max_element_wise(t, f))


_CONSOLIDATED_ORDER = [("key", "ascending"), ("value", "ascending"), ("time", "ascending")]


def sort_indices(table: pa.Table) -> pa.Array:
    """The permutation that sorts ``table`` by ``(key, value, time)`` in the order
    :func:`consolidate` sorts in (records by their frame columns). Parts are stored in it
    (:mod:`persist.indexed.format.sorting`)."""
    if _framed(table):
        return _order(_frame_table(table, time=True)[0])
    return pc.sort_indices(table, sort_keys=_CONSOLIDATED_ORDER)


def consolidate(table: pa.Table) -> pa.Table:
    """Sums diffs per (key, value, time), drops zeros, sorts by (key, value, time).

    Records (struct or list keys/values) are compared as whole records, field by field
    (:func:`records.frame`): their order is that of their frame columns.
    """
    if len(table) == 0:
        return table
    if _framed(table):
        return _consolidate_framed(table, time=True)
    table = _one_nan(table)
    distinct = _sorted_if_distinct(table)
    if distinct is not None:
        return distinct.filter(pc.not_equal(distinct.column("diff"), 0))
    return consolidate_grouped(table)


def consolidate_grouped(table: pa.Table) -> pa.Table:
    """``consolidate`` by hash-grouping: the general path, for any input."""
    schema = table.schema
    if _framed(table):
        return _sorted_framed(_grouped_framed(table, time=True))
    table = _one_nan(table)
    agg = _group_sums(table, ["key", "value", "time"], "diff")
    agg = agg.filter(pc.not_equal(agg.column("diff_sum"), 0))
    out = pa.Table.from_arrays(
        [agg.column("key"), agg.column("value"), agg.column("time"), agg.column("diff_sum")],
        schema=schema,
    )
    return out.sort_by(_CONSOLIDATED_ORDER)


def _one_nan(table: pa.Table) -> pa.Table:
    """``table`` with every NaN of a float key or value made one NaN (:func:`records.one_nan`).

    NB: hash-grouping compares floats by their bits, so NaNs written with other payloads
    (``float("nan")`` and ``0.0 * inf``) would stay apart, +1 and -1, where DESIGN §4 says
    NaN equals NaN whatever its payload (records consolidate so through their frame). The
    result keeps the one NaN: which payload a NaN has is not part of its value.
    """
    for i in (0, 1):
        col = table.column(i)
        if pa.types.is_floating(col.type):
            one = records.one_nan(col)
            if one is not col:
                table = table.set_column(i, table.schema.field(i), one)
    return table


def _sorted_if_distinct(table: pa.Table) -> pa.Table | None:
    """``table`` sorted by (key, value, time) if no two rows share all three, else None.

    NB: most merges (appends of new keys or later times) have nothing to sum. Sorting and
    comparing neighbours is ~3x cheaper than hash-grouping all rows and then sorting the groups,
    and when it finds a duplicate the caller takes the general path. Columns with nulls or NaNs
    go the general path too: ``equal`` does not see those as equal, but grouping does.
    """
    for name in ("key", "value"):
        col = table.column(name)
        if col.null_count or (pa.types.is_floating(col.type) and pc.any(pc.is_nan(col)).as_py()):
            return None
    ordered = table.take(pc.sort_indices(table, sort_keys=_CONSOLIDATED_ORDER))
    if len(ordered) < 2:
        return ordered
    later, earlier = ordered.slice(1), ordered.slice(0, len(ordered) - 1)
    try:
        same = pc.and_(
            pc.and_(pc.equal(later.column("key"), earlier.column("key")),
                    pc.equal(later.column("value"), earlier.column("value"))),
            pc.equal(later.column("time"), earlier.column("time")),
        )
    except pa.ArrowNotImplementedError:  # a type without an equality kernel
        return None
    return None if pc.any(same).as_py() else ordered


def contents_at(table: pa.Table, as_of: int) -> pa.Table:
    """The consolidated contents as of ``as_of``: rows with time <= as_of, times set to as_of,
    diffs summed per (key, value), zeros dropped, sorted by (key, value)."""
    schema = table.schema
    if len(table):
        table = table.filter(pc.less_equal(table.column("time"), pa.scalar(as_of, pa.uint64())))
    if len(table) == 0:
        return schema.empty_table()
    if _framed(table):
        out = _consolidate_framed(table, time=False)
        return out.set_column(2, schema.field(2), constant_times(as_of, len(out)))
    agg = _group_sums(_one_nan(table), ["key", "value"], "diff")
    agg = agg.filter(pc.not_equal(agg.column("diff_sum"), 0))
    out = pa.Table.from_arrays(
        [agg.column("key"), agg.column("value"),
         constant_times(as_of, len(agg)),
         agg.column("diff_sum")],
        schema=schema,
    )
    return out.sort_by([("key", "ascending"), ("value", "ascending")])


def sum_by_key_value(table: pa.Table) -> pa.Table:
    """Diffs summed per (key, value), in no particular order, zero sums kept: columns ``key``,
    ``value``, ``diff_sum``. Works for every key/value type (records included)."""
    if not _framed(table):
        return _group_sums(_one_nan(table), ["key", "value"], "diff")
    out = _grouped_framed(table, time=False, drop_zeros=False)
    return pa.table({"key": out.column("key"), "value": out.column("value"),
                     "diff_sum": out.column("diff")})


# -- checked sums of diffs -----------------------------------------------------------------------
#
# NB: Arrow's hash_sum and numpy's add wrap an int64 sum silently, and a wrapped multiplicity is
# a wrong answer. A sum of n diffs whose largest magnitude is m stays within int64 when
# n * m < 2**63, which one min_max pass tells (diffs of +-1 pass it below 2**63 rows); only
# otherwise are the diffs summed in decimal128(38, 0), exact for any 2**63 rows, and the sums
# range-checked on the way back to int64.

_INT64 = (-(2**63), 2**63 - 1)
_WIDE = pa.decimal128(38, 0)


def may_overflow(diffs: pa.Array | pa.ChunkedArray) -> bool:
    """Whether some sum of ``diffs`` (int64) might leave int64 (never False when one can)."""
    n = len(diffs)
    if n < 2:
        return False
    lo, hi = pc.min_max(diffs).values()
    m = max(abs(lo.as_py() or 0), abs(hi.as_py() or 0))
    return bool(n * m > _INT64[1])


def _group_sums(table: pa.Table, keys: list[str], diff: str,
                *more: tuple[str, str]) -> pa.Table:
    """``table.group_by(keys).aggregate([(diff, "sum"), *more])``, its ``<diff>_sum`` int64 and
    exact.

    Raises:
        DiffOverflow: some group's diffs sum outside int64.
    """
    wide = may_overflow(table.column(diff))
    if wide:
        i = table.schema.get_field_index(diff)
        table = table.set_column(i, pa.field(diff, _WIDE), table.column(diff).cast(_WIDE))
    agg = table.group_by(keys, use_threads=False).aggregate([(diff, "sum"), *more])
    if not wide:
        return agg
    name = f"{diff}_sum"
    sums = agg.column(name)
    out = pc.or_(pc.less(sums, pa.scalar(_INT64[0], _WIDE)),
                 pc.greater(sums, pa.scalar(_INT64[1], _WIDE)))
    if pc.any(out).as_py():
        at = pc.index(out, True).as_py()
        group = {k: agg.column(k)[at].as_py() for k in keys if k in ("key", "value")}
        raise _overflow(int(sums[at].as_py()), group)
    i = agg.schema.get_field_index(name)
    return agg.set_column(i, pa.field(name, pa.int64()), sums.cast(pa.int64()))


def _run_sums(diffs: pa.ChunkedArray, first: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The sums of ``diffs`` over the runs starting at ``first`` (``np.add.reduceat``), exact.

    Raises:
        DiffOverflow: some run's diffs sum outside int64.
    """
    values = diffs.to_numpy()
    if not may_overflow(diffs):
        sums: npt.NDArray[np.int64] = np.add.reduceat(values, first)
        return sums
    exact = np.add.reduceat(values.astype(object), first)  # Python ints: no wrapping
    lo, hi = _INT64
    for s in exact:
        if not lo <= s <= hi:
            raise _overflow(int(s), {})
    return exact.astype(np.int64)


def _overflow(total: int, group: dict[str, Any]) -> DiffOverflow:
    where = ", ".join(f"{k} {_short(v)}" for k, v in group.items())
    return DiffOverflow(
        f"the diffs of one (key, value){' (' + where + ')' if where else ''} sum to {total}, "
        f"outside int64 [-2**63, 2**63 - 1]: persist does not wrap a sum; append updates "
        f"that bring it back within int64 (read raw updates, or as of an earlier time, "
        f"meanwhile)")


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


# -- consolidation of records --------------------------------------------------------------


def _framed(table: pa.Table) -> bool:
    """True if the key or value needs comparing through :func:`records.frame`."""
    schema = table.schema
    return records.is_nested(schema.field(0).type) or records.is_nested(schema.field(1).type)


def _frame_table(table: pa.Table, time: bool) -> tuple[pa.Table, int]:
    """The frame columns of key and value (and ``time``, last), named ``c0, c1, ...``, and
    how many of them are the key's."""
    key = records.frame(table.column("key"))
    cols = key + records.frame(table.column("value"))
    if time:
        cols.append(table.column("time"))
    return pa.Table.from_arrays(cols, names=[f"c{i}" for i in range(len(cols))]), len(key)


def _order(frame: pa.Table) -> pa.Array:
    return pc.sort_indices(frame, sort_keys=[(n, "ascending") for n in frame.column_names])


def _sorted_framed(table: pa.Table, time: bool = True) -> pa.Table:
    if len(table) < 2:
        return table
    return table.take(_order(_frame_table(table, time)[0]))


def _consolidate_framed(table: pa.Table, *, time: bool) -> pa.Table:
    """``consolidate`` (``time``) or ``contents_at`` before its times are set (not ``time``)
    for records: sorted by the frame columns of key, value (and time), nulls last.

    Rows that tie a neighbour in every frame column (:func:`records.weak_equal`, which is
    exactly "tied by the sort": null with null, NaN with NaN, ``-0.0`` with ``0.0``) are
    grouped exactly (hash-grouping their frame columns: ``-0.0`` and ``0.0`` apart); each group
    keeps the sorted position of its first row. Every other row has no partner and nothing
    to sum.

    NB: the grouping costs in proportion to the rows with a possible partner, not to the
    table; hash-grouping every row instead cost ~3x the sort on 1 M records.
    """
    frame, _ = _frame_table(table, time)
    names = frame.column_names
    order = _order(frame)
    # NB: the rows are moved once, at the end, to their sorted and kept positions: taking the
    # whole table in order and then filtering it moved every record twice (10-20% of the
    # total on W10's records).
    diffs = table.column("diff").take(order)
    dup = _tied_positions(frame, order, _check_order(names, time))
    if dup is None:
        nonzero = pc.not_equal(diffs, 0)
        if pc.all(nonzero).as_py():
            return table.take(order)
        return table.take(order.filter(nonzero))
    if not any(_negative_zeros(frame.column(n)) for n in names):
        # NB: without a -0.0 the sort's ties are exactly the equal rows (weak_equal is then
        # equality), so the groups are the runs of tied neighbours: sum each run in place
        # rather than hash-grouping every row that has a partner (~2x faster on W10's records
        # with a quarter retracted).
        starts = np.ones(len(table), dtype=bool)
        starts[dup] = False
        first = np.flatnonzero(starts)
        sums = _run_sums(diffs, first)
        live = sums != 0
        out = table.take(order.take(pa.array(first[live])))
        return out.set_column(3, table.schema.field(3), pa.array(sums[live]))
    involved = np.zeros(len(table), dtype=bool)
    involved[dup] = True
    involved[dup - 1] = True
    grp = np.flatnonzero(involved)
    sub = frame.take(order.take(pa.array(grp)))
    sub = sub.append_column("__diff", diffs.take(pa.array(grp))).append_column(
        "__row", pa.array(np.arange(len(grp), dtype=np.int64)))
    agg = _group_sums(sub, names, "__diff", ("__row", "min"))
    keep = ~involved
    summed = diffs.to_numpy().copy()
    firsts = grp[agg.column("__row_min").to_numpy()]
    keep[firsts] = True
    summed[firsts] = agg.column("__diff_sum").to_numpy()
    keep &= summed != 0
    out = table.take(order.filter(pa.array(keep)))
    return out.set_column(3, table.schema.field(3), pa.array(summed[keep]))


def _negative_zeros(col: pa.ChunkedArray) -> bool:
    """True if the float frame column ``col`` holds a ``-0.0`` (which sorts tied with ``0.0``
    but is another value)."""
    if not pa.types.is_floating(col.type):
        return False
    values = pc.fill_null(col, 1.0).to_numpy()
    return bool(np.any((values == 0) & np.signbit(values)))


def _check_order(names: list[str], time: bool) -> list[str]:
    """The frame columns in the order neighbours are compared: the first (the key's first
    leaf), then ``time``, then the rest; each narrows the pairs the next one looks at."""
    if not time or len(names) < 3:
        return names
    return [names[0], names[-1], *names[1:-1]]


def _tied_positions(frame: pa.Table, order: pa.Array,
                    names: list[str]) -> npt.NDArray[np.int64] | None:
    """Positions ``p`` of ``order`` whose row ties the row at ``p - 1`` in every column of
    ``names`` (:func:`records.weak_equal`), or None if there are none.

    NB: compared column by column on the pairs still tied: the first column tells most
    pairs apart, so the others are compared on a few rows only.
    """
    n = len(order)
    if n < 2:
        return None
    first = frame.column(names[0]).take(order)
    same = records.weak_equal(first.slice(1), first.slice(0, n - 1))
    positions = np.flatnonzero(_numpy_bools(same)) + 1
    for c in names[1:]:
        if not len(positions):
            return None
        col = frame.column(c)
        later = order.take(pa.array(positions))
        earlier = order.take(pa.array(positions - 1))
        same = records.weak_equal(col.take(later), col.take(earlier))
        positions = positions[_numpy_bools(same)]
    return positions if len(positions) else None


def _numpy_bools(a: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = a.to_numpy(zero_copy_only=False)
    return out


def _grouped_framed(table: pa.Table, *, time: bool, drop_zeros: bool = True) -> pa.Table:
    """Diffs summed per equal (key, value[, time]) by hash-grouping the frame columns; each
    group is represented by its first row. Unsorted."""
    frame, _ = _frame_table(table, time)
    names = frame.column_names
    frame = frame.append_column("__diff", table.column("diff")).append_column(
        "__row", pa.array(np.arange(len(table), dtype=np.int64)))
    agg = _group_sums(frame, names, "__diff", ("__row", "min"))
    if drop_zeros:
        agg = agg.filter(pc.not_equal(agg.column("__diff_sum"), 0))
    out = table.take(agg.column("__row_min"))
    return out.set_column(3, table.schema.field(3), agg.column("__diff_sum"))


#: Time columns up to this long get their minimum in Python (see ``min_time``).
_PY_MIN_ROWS = 4096


def min_time(col: pa.ChunkedArray) -> int:
    """The smallest value of a non-empty ``time`` column (uint64, no nulls).

    NB: a short column is scanned in Python through the buffer protocol rather than with
    ``pc.min``. Compute functions release the GIL, and on the runtime thread every release can
    cost a wait of up to the interpreter's switch interval (5 ms) to get it back from the
    client threads that are busy preparing the next group: per staged write, that was the
    largest single cost of group commit with many writer threads.
    """
    values = _small_times(col)
    if values is not None:
        return min(values)
    return int(pc.min(col).as_py())


def _small_times(col: pa.ChunkedArray) -> list[int] | None:
    """The values of a short, non-empty uint64 column without nulls (else None), read through
    the buffer protocol: no compute call, so the GIL is never released (see ``min_time``)."""
    return small_ints(col, pa.uint64(), "Q")


def small_ints(col: pa.ChunkedArray | pa.Array, typ: pa.DataType, fmt: Literal["q", "Q"]
               ) -> list[int] | None:
    """The values of a short (at most :data:`_PY_MIN_ROWS`), non-empty column of the 8-byte
    integer type ``typ`` (``fmt``: its ``struct`` code, ``Q`` or ``q``) without nulls, as
    Python ints read through the buffer protocol; None for any other column. No compute call:
    the GIL is never released (see ``min_time``), and a compute call's dispatch alone costs
    more than the scan of a few thousand values (measured: ``diff_sums`` of 100 rows with
    compute calls, 140 us; through this, under 10 us)."""
    if not 0 < len(col) <= _PY_MIN_ROWS or col.type != typ or col.null_count:
        return None
    out: list[int] = []
    for chunk in (col.chunks if isinstance(col, pa.ChunkedArray) else (col,)):
        n, off = len(chunk), chunk.offset
        if n:
            out.extend(memoryview(chunk.buffers()[1]).cast("B")[off * 8:(off + n) * 8].cast(fmt))
    return out


def time_range(table: pa.Table) -> tuple[int, int]:
    """``(min, max)`` of the ``time`` column of a non-empty table (an empty one raises
    TypeError). Short columns are read in Python, as in :func:`min_time`."""
    col = table.column("time")
    values = _small_times(col)
    if values is not None:
        return min(values), max(values)
    mm = pc.min_max(col)
    return int(mm["min"].as_py()), int(mm["max"].as_py())
