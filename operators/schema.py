"""Types across the boundary: a collection's Arrow types <-> Spark's schema and Arrow layout.

A persist collection stores ``key, value, time, diff`` with ``time`` uint64 and ``diff`` int64;
Spark sees ``key, value`` as the Spark type of their Arrow type (:func:`spark_type_of`), ``time``
and ``diff`` as non-null ``long``. Spark checks every ``pyarrow.RecordBatch`` a Python data
source yields against the Arrow form of its declared schema *exactly* (``string`` is not
``large_string``, timestamps are ``us`` and zoned ones ``UTC``, nullability counts, nested
fields included), so every batch leaves through :func:`to_spark`.

The mapping is exact wherever Spark has the type; where it does not, it is either a lossless
conversion checked value by value, or a loud refusal naming the field:

* ``int8/16/32/64`` are ``byte/short/int/long``; ``uint8/16/32`` the next wider signed type
  (``short/int/long``, exact). ``uint64`` is ``long`` with a checked cast (a value at or
  above 2**63 fails the read, naming the field): ``decimal(20, 0)`` would be exact but
  surprises every join and arithmetic on the column, and top-level ``uint64`` (and ``time``)
  has always read as ``long``.
* ``float32/64`` are ``float/double``; ``decimal128(p, s)`` is ``decimal(p, s)`` (refused if
  ``s < 0`` or ``s > p``, which Spark cannot declare).
* ``string/large_string`` are ``string`` and ``binary/large_binary`` ``binary`` (the batches
  carry the 32-bit-offset forms); ``date32`` is ``date``.
* ``timestamp`` with a zone is ``timestamp`` (instants: the batch carries ``timestamp[us,
  UTC]``, the same instants whatever zone was stored), without one ``timestamp_ntz``. Units
  ``s``/``ms``/``us`` widen to Spark's microseconds exactly; ``ns`` is refused (Spark holds
  microseconds, and a stored nanosecond would be truncated).
* ``list``/``large_list`` are ``array`` (``containsNull`` = the item field's nullability);
  ``struct`` is ``struct``, field names, order and nullability kept.

Written from Spark (:func:`arrow_type_for`, a collection the sink creates), every Spark type
maps back to the Arrow type that reads as it again (``timestamp`` -> ``timestamp[us, UTC]``,
``array`` -> ``list``, ...); types persist cannot store (``map``, intervals, ``variant``, ...)
are refused naming the field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import persist
from persist import InvalidUsage, SchemaMismatch

#: The largest time (or uint64 key/value) Spark's signed ``long`` can hold.
MAX_LONG = 2**63 - 1

#: The zone of the ``timestamp`` (zoned) columns of the batches Spark accepts from a data source.
SPARK_ZONE = "UTC"

# Arrow primitive -> (Spark type, the Arrow type Spark expects for it).
_PRIMITIVE: dict[pa.DataType, tuple[DataType, pa.DataType]] = {
    pa.bool_(): (BooleanType(), pa.bool_()),
    pa.int8(): (ByteType(), pa.int8()),
    pa.int16(): (ShortType(), pa.int16()),
    pa.int32(): (IntegerType(), pa.int32()),
    pa.int64(): (LongType(), pa.int64()),
    pa.uint8(): (ShortType(), pa.int16()),
    pa.uint16(): (IntegerType(), pa.int32()),
    pa.uint32(): (LongType(), pa.int64()),
    # NB: Spark has no unsigned types. uint64 maps to long with a checked cast (values >= 2**63
    # fail); decimal(20, 0) would be exact but surprises every user who joins on the column.
    pa.uint64(): (LongType(), pa.int64()),
    pa.float32(): (FloatType(), pa.float32()),
    pa.float64(): (DoubleType(), pa.float64()),
    pa.string(): (StringType(), pa.string()),
    pa.large_string(): (StringType(), pa.string()),
    pa.binary(): (BinaryType(), pa.binary()),
    pa.large_binary(): (BinaryType(), pa.binary()),
    pa.date32(): (DateType(), pa.date32()),
}


class _NoSpark(Exception):
    def __init__(self, path: str, t: pa.DataType, why: str) -> None:
        super().__init__(path, t, why)
        self.path, self.t, self.why = path, t, why


def _convert(t: pa.DataType, path: str) -> tuple[DataType, pa.DataType]:
    """``(Spark type, Arrow type of Spark's batches)`` of stored type ``t`` at ``path``."""
    hit = _PRIMITIVE.get(t)
    if hit is not None:
        return hit
    if pa.types.is_decimal128(t):
        if not 0 <= t.scale <= t.precision <= 38:
            raise _NoSpark(path, t, "Spark decimals have 0 <= scale <= precision <= 38")
        return DecimalType(t.precision, t.scale), pa.decimal128(t.precision, t.scale)
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            raise _NoSpark(path, t, "Spark timestamps hold microseconds; store timestamp[us]")
        if t.tz is None:
            return TimestampNTZType(), pa.timestamp("us")
        return TimestampType(), pa.timestamp("us", tz=SPARK_ZONE)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_field
        s, a = _convert(item.type, f"{path}[]")
        return (ArrayType(s, containsNull=item.nullable),
                pa.list_(pa.field("element", a, nullable=item.nullable)))
    if pa.types.is_struct(t):
        sfields, afields = [], []
        for i in range(t.num_fields):
            f = t.field(i)
            s, a = _convert(f.type, f"{path}.{f.name}")
            sfields.append(StructField(f.name, s, nullable=f.nullable))
            afields.append(pa.field(f.name, a, nullable=f.nullable))
        return StructType(sfields), pa.struct(afields)
    raise _NoSpark(path, t, "Spark has no such type")


@functools.lru_cache(maxsize=256)
def _converted(t: pa.DataType, column: str) -> tuple[DataType, pa.DataType] | _NoSpark:
    if pa.types.is_null(t):
        return NullType(), pa.null()
    try:
        return _convert(t, column)
    except _NoSpark as e:
        return e


def spark_type_of(t: pa.DataType, *, name: str, column: str) -> DataType:
    """The Spark type collection ``name``'s ``column`` (``key``/``value``) of Arrow type ``t``
    reads as.

    Raises:
        SchemaMismatch: ``t`` (or a field in it) has no exact Spark equivalent, naming the field.
    """
    return _lookup(t, name, column)[0]


def _lookup(t: pa.DataType, name: str, column: str) -> tuple[DataType, pa.DataType]:
    hit = _converted(t, column)
    if isinstance(hit, _NoSpark):
        where = f"collection {name!r}: " if name else ""
        raise SchemaMismatch(
            f"{where}{hit.path} is {hit.t}, which has no exact Spark equivalent "
            f"({hit.why})"
        )
    return hit


@dataclass(frozen=True)
class CollectionTypes:
    """A collection's stored types at one schema version, picklable, as Spark needs them.

    Python-object codecs are deliberately not resolved here: Spark sees their msgpack bytes as
    ``binary`` and executors never import the user's classes (a ``msgspec.Struct`` stored as an
    Arrow struct reads as that struct).

    The types are the collection's current schema version (when made by :meth:`of`); the
    engine migrates parts written with older versions to it when they are read.
    """

    name: str
    cid: int
    #: The stored Arrow types of ``key`` and ``value`` (``binary`` for a Python-object codec).
    key: pa.DataType
    value: pa.DataType
    #: The schema version these types are (the parts a sink stages are tagged with it).
    schema_id: int = 0

    @classmethod
    def of(cls, info: persist.distributed.CollectionInfo) -> CollectionTypes:
        """``info``'s name, id and current stored types (codecs left unresolved)."""
        key, value = info.types()
        return cls(info.name, info.id, key, value, info.schema_version)

    @property
    def part_schema(self) -> pa.Schema:
        """The schema the engine reads and stages these types as: ``key, value, time
        (uint64), diff (int64)``."""
        return pa.schema([pa.field("key", self.key), pa.field("value", self.value),
                          pa.field("time", pa.uint64(), nullable=False),
                          pa.field("diff", pa.int64(), nullable=False)])

    @property
    def spark_schema(self) -> StructType:
        """``key, value, time, diff`` as Spark declares them.

        Raises:
            SchemaMismatch: the key or value has no exact Spark equivalent (naming the field).
        """
        return StructType([
            StructField("key", spark_type_of(self.key, name=self.name, column="key"),
                        nullable=True),
            StructField("value", spark_type_of(self.value, name=self.name, column="value"),
                        nullable=True),
            StructField("time", LongType(), nullable=False),
            StructField("diff", LongType(), nullable=False),
        ])

    @property
    def arrow_schema(self) -> pa.Schema:
        """The exact Arrow schema Spark expects of every batch (``to_arrow_schema`` of
        :attr:`spark_schema` with zone ``UTC``, as pyspark checks it)."""
        return pa.schema([
            pa.field("key", _lookup(self.key, self.name, "key")[1], nullable=True),
            pa.field("value", _lookup(self.value, self.name, "value")[1], nullable=True),
            pa.field("time", pa.int64(), nullable=False),
            pa.field("diff", pa.int64(), nullable=False),
        ])


def _nested(t: pa.DataType) -> bool:
    """Struct and list types: cast field by field (``_cast_nested``)."""
    return bool(pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t))


def to_spark(table: pa.Table, target: pa.Schema, *, time: int | None = None) -> pa.Table:
    """Converts a table of updates (a part's schema) to ``target``, Spark's exact layout.

    Args:
        table: columns ``key, value, time (uint64), diff``.
        target: :attr:`CollectionTypes.arrow_schema`.
        time: when given, every row's time is this (a snapshot's as_of) instead of its own.

    Raises:
        InvalidUsage: a time, key or value (or a field of one) does not fit Spark's type:
            a uint64 at or above 2**63, a timestamp beyond Spark's microsecond range.
    """
    n = len(table)
    if time is not None:
        if time > MAX_LONG:
            raise InvalidUsage(f"time {time} does not fit Spark's long (max {MAX_LONG})")
        times: pa.Array | pa.ChunkedArray = pa.repeat(pa.scalar(time, pa.int64()), n)
    else:
        times = _checked_cast(table.column("time"), pa.int64(), "time")
    cols = [
        _checked_cast(table.column("key"), target.field("key").type, "key"),
        _checked_cast(table.column("value"), target.field("value").type, "value"),
        times,
        table.column("diff"),
    ]
    return pa.Table.from_arrays(cols, schema=target)


def _checked_cast(
    col: pa.ChunkedArray, to: pa.DataType, what: str
) -> pa.ChunkedArray | pa.Array:
    # NB: type equality ignores list item names; Spark's are "element", the engine's "item".
    if col.type == to and (not _nested(to) or str(col.type) == str(to)):
        return col
    if pa.types.is_unsigned_integer(col.type) and len(col):
        hi = pc.max(col).as_py()
        if hi is not None and hi > MAX_LONG:
            raise InvalidUsage(
                f"{what} {hi} does not fit Spark's long (max {MAX_LONG}); persist times and "
                f"uint64 columns read through Spark must stay below 2**63"
            )
    try:
        if _nested(to):
            return pa.chunked_array([_cast_nested(c, to) for c in col.chunks], type=to)
        return col.cast(to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        path, have, want, why = _misfit(col, to, what)
        raise InvalidUsage(
            f"{path}: a stored {have} does not fit Spark's {want} ({why or e}); uint64 values "
            f"read through Spark must stay below 2**63, timestamps within Spark's range"
        ) from e


def _cast_nested(arr: pa.Array, to: pa.DataType, path: str = "",
                 live: npt.NDArray[np.bool_] | None = None) -> pa.Array:
    """``arr`` cast to ``to`` (the same shape), children cast one by one (checked, ``safe``).

    ``live``: which slots are visible (not hidden by a null record or list above them); when
    given, a visible null in a field or list item that ``to`` declares non-nullable raises
    SchemaMismatch naming ``path`` (the sink's input; stored data needs no check).

    NB: not ``Array.cast``: Arrow refuses to cast a struct with a non-nullable field when a
    *null record* has a null in that field's slot ("nulls in input cannot be viewed as
    non-nullable"), though the record's nullness hides the slot (and Spark's Arrow writer puts
    nulls there). Here each child is taken as stored (``field(i)``, not ``flatten()``) and the
    parent's nulls are kept as its own mask.
    """
    if arr.type == to and str(arr.type) == str(to):
        return arr
    mask = pc.is_null(arr) if arr.null_count else None
    valid = None
    if live is not None:
        valid = live & ~mask.to_numpy(zero_copy_only=False) if mask is not None else live
    if pa.types.is_struct(to):
        children = []
        for i in range(to.num_fields):
            f, child = to.field(i), arr.field(i)
            _check_nulls(child, f.nullable, valid, f"{path}.{f.name}")
            children.append(_cast_nested(child, f.type, f"{path}.{f.name}", valid))
        return pa.StructArray.from_arrays(children, fields=list(to), mask=mask)
    if pa.types.is_list(to) or pa.types.is_large_list(to):
        # NB: the offsets as stored (a null list's span included) over the whole child array;
        # large_list's 64-bit offsets are checked into 32 bits by the safe cast.
        offsets, values = arr.offsets, arr.values
        item_live = None
        if valid is not None:
            o = offsets.to_numpy(zero_copy_only=False).astype(np.int64)
            item_live = np.zeros(len(values), dtype=bool)
            item_live[o[0]:o[-1]] = np.repeat(valid, np.diff(o))
        _check_nulls(values, to.value_field.nullable, item_live, f"{path}[]")
        items = _cast_nested(values, to.value_type, f"{path}[]", item_live)
        if pa.types.is_list(to):
            return pa.ListArray.from_arrays(offsets.cast(pa.int32(), safe=True), items,
                                            type=to, mask=mask)
        return pa.LargeListArray.from_arrays(offsets.cast(pa.int64()), items, type=to,
                                             mask=mask)
    return arr.cast(to, safe=True)


def _check_nulls(child: pa.Array, nullable: bool, live: npt.NDArray[np.bool_] | None,
                 path: str) -> None:
    if nullable or live is None or not child.null_count:
        return
    if (live & pc.is_null(child).to_numpy(zero_copy_only=False)).any():
        raise SchemaMismatch(f"{path}: null in a non-nullable field")


def _misfit(col: pa.ChunkedArray | pa.Array, to: pa.DataType,
            path: str) -> tuple[str, pa.DataType, pa.DataType, str]:
    """The innermost field of ``col`` whose cast to ``to`` fails: its path, stored type,
    Spark's Arrow type and the error (empty if none is found). Only on the error path."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_struct(t) and pa.types.is_struct(to):
        for i, child in enumerate(arr.flatten()):
            found = _misfit(child, to.field(i).type, f"{path}.{t.field(i).name}")
            if found[3]:
                return found
        return path, t, to, ""
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            (pa.types.is_list(to) or pa.types.is_large_list(to)):
        return _misfit(arr.flatten(), to.value_type, f"{path}[]")
    try:
        arr.cast(to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        return path, t, to, str(e)
    return path, t, to, ""


# -- Spark -> Arrow (the sink) ----------------------------------------------------------------


def from_spark(table: pa.Table, types: CollectionTypes) -> pa.Table:
    """A sink task's rows with record keys/values cast to the collection's stored types.

    Flat columns are left to the engine's own checked casts. Records are cast here
    (:func:`_cast_nested`): Spark's Arrow writer leaves nulls in the slots of null records,
    which Arrow's struct cast refuses for non-nullable fields; a visible null in a
    non-nullable field is refused, naming it.

    Raises:
        SchemaMismatch: a null in a non-nullable field, or a value that does not fit its
            field's stored type (a negative ``long`` into a ``uint32``, ...), naming the field.
    """
    for name, stored in (("key", types.key), ("value", types.value)):
        i = table.schema.get_field_index(name)
        if i < 0 or not _nested(stored):
            continue
        col = table.column(i)
        if col.type == stored and str(col.type) == str(stored):
            continue
        try:
            cast = pa.chunked_array([_cast_nested(c, stored, name, np.ones(len(c), dtype=bool))
                                     for c in col.chunks], type=stored)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            path, have, want, why = _misfit(col, stored, name)
            raise SchemaMismatch(f"{path}: a {have} does not fit the stored {want} "
                                 f"({why or e})") from e
        table = table.set_column(i, pa.field(name, stored), cast)
    return table


_ARROW_OF_SPARK: dict[type[DataType], pa.DataType] = {
    BooleanType: pa.bool_(),
    ByteType: pa.int8(),
    ShortType: pa.int16(),
    IntegerType: pa.int32(),
    LongType: pa.int64(),
    FloatType: pa.float32(),
    DoubleType: pa.float64(),
    StringType: pa.string(),
    BinaryType: pa.binary(),
    DateType: pa.date32(),
    TimestampType: pa.timestamp("us", tz=SPARK_ZONE),
    TimestampNTZType: pa.timestamp("us"),
}


def arrow_type_for(spark_type: DataType, *, column: str) -> pa.DataType:
    """The Arrow type a new collection's ``column`` gets for a DataFrame column's Spark type:
    the one that reads back as exactly ``spark_type`` (:func:`spark_type_of`).

    Raises:
        SchemaMismatch: a Spark type persist cannot store (``map``, intervals, ``variant``,
            ...), naming the field.
    """
    if isinstance(spark_type, NullType):
        return pa.null()
    return _arrow_of(spark_type, column)


def _arrow_of(dt: DataType, path: str) -> pa.DataType:
    t = _ARROW_OF_SPARK.get(type(dt))
    if t is not None:
        return t
    if isinstance(dt, DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, ArrayType):
        return pa.list_(pa.field("item", _arrow_of(dt.elementType, f"{path}[]"),
                                 nullable=dt.containsNull))
    if isinstance(dt, StructType) and dt.fields:
        return pa.struct([pa.field(f.name, _arrow_of(f.dataType, f"{path}.{f.name}"),
                                   nullable=f.nullable) for f in dt.fields])
    raise SchemaMismatch(
        f"cannot store the Spark {dt.simpleString()} at {path}: persist stores boolean, "
        f"byte/short/int/long, float/double, decimal, string, binary, date, timestamp, "
        f"timestamp_ntz, and arrays and (non-empty) structs of these (set the key_type/"
        f"value_type options to store another Arrow type the column casts to)"
    )


def parse_arrow_type(alias: str, *, option: str) -> pa.DataType:
    """An Arrow type from its alias (``string``, ``int64``, ``large_binary``, ``date32``,
    ``timestamp[us]``, ...) that persist stores and Spark reads."""
    try:
        t = pa.type_for_alias(alias.strip().lower())
    except (ValueError, KeyError):
        raise InvalidUsage(f"option {option}={alias!r} is not an Arrow type name") from None
    try:
        persist.distributed.check_type(t, option)
        _lookup(t, "", option)
    except SchemaMismatch as e:
        raise InvalidUsage(f"option {option}={alias!r}: {e}") from None
    return t


def merged_types(schema: StructType, types: CollectionTypes) -> tuple[pa.DataType, pa.DataType]:
    """The key and value types a ``mergeSchema`` write evolves the collection to: its stored
    types with the struct fields the DataFrame adds (at any depth, where the DataFrame has
    them), each nullable and of the Arrow type that reads back as its Spark type. Nothing else
    is merged: a DataFrame that lacks a stored field, orders the stored fields differently or
    has another type for one leaves that struct as stored (:func:`check_sink_schema` then
    says what differs).

    Raises:
        SchemaMismatch: a new field of a Spark type persist cannot store.
    """
    fields = {f.name: f.dataType for f in schema.fields}
    return (_merged(types.key, fields["key"], "key"),
            _merged(types.value, fields["value"], "value"))


def _merged(stored: pa.DataType, have: DataType, path: str) -> pa.DataType:
    if pa.types.is_struct(stored) and isinstance(have, StructType):
        names = [f.name for f in stored]
        if [n for n in have.names if n in names] != names:
            return stored
        out = []
        for f in have.fields:
            i = stored.get_field_index(f.name)
            where = f"{path}.{f.name}"
            if i < 0:
                out.append(pa.field(f.name, arrow_type_for(f.dataType, column=where),
                                    nullable=True))
            else:
                out.append(stored.field(i).with_type(_merged(stored.field(i).type, f.dataType,
                                                             where)))
        return pa.struct(out)
    if (pa.types.is_list(stored) or pa.types.is_large_list(stored)) and \
            isinstance(have, ArrayType):
        item = stored.value_field
        merged = item.with_type(_merged(item.type, have.elementType, f"{path}[]"))
        return pa.large_list(merged) if pa.types.is_large_list(stored) else pa.list_(merged)
    return stored


def _fits(have: DataType, want: DataType) -> bool:
    """True if a DataFrame column of ``have`` writes into a collection reading as ``want``:
    the same type up to nullability (a null in a non-nullable field fails the write)."""
    if isinstance(have, StructType) and isinstance(want, StructType):
        return (have.names == want.names
                and all(_fits(h.dataType, w.dataType)
                        for h, w in zip(have.fields, want.fields, strict=True)))
    if isinstance(have, ArrayType) and isinstance(want, ArrayType):
        return _fits(have.elementType, want.elementType)
    return have == want


def check_sink_schema(schema: StructType, types: CollectionTypes | None) -> None:
    """Checks a DataFrame's schema against the collection it is written to.

    Raises:
        SchemaMismatch: missing or extra columns, non-integer time/diff, or key/value columns
            whose Spark types are not those the collection reads back as (up to nullability,
            plus ``int`` into ``long``).
    """
    names = [f.name for f in schema.fields]
    if sorted(names) != ["diff", "key", "time", "value"]:
        raise SchemaMismatch(
            f"a DataFrame written to persist has exactly the columns key, value, time, diff; "
            f"this one has {names}"
        )
    fields = {f.name: f.dataType for f in schema.fields}
    for col in ("time", "diff"):
        if not isinstance(fields[col], (LongType, IntegerType)):
            raise SchemaMismatch(f"column {col!r} must be an integer, not {fields[col]}")
    if types is None:
        return
    want = types.spark_schema
    for col in ("key", "value"):
        have = fields[col]
        widening = isinstance(have, IntegerType) and isinstance(want[col].dataType, LongType)
        if not _fits(have, want[col].dataType) and not widening and \
                not isinstance(have, NullType):
            raise SchemaMismatch(
                f"collection {types.name!r} reads its {col} as {want[col].dataType.simpleString()}"
                f", but the DataFrame's {col} is {fields[col].simpleString()} (option "
                f"mergeSchema=true adds the DataFrame's new struct fields to the collection)"
            )
