"""Types across the boundary: a collection's Arrow types <-> Spark's schema and Arrow layout.

A persist collection stores ``key, value, time, diff`` with ``time`` uint64 and ``diff`` int64;
Spark sees ``key, value`` as the Spark type of their Arrow type, ``time`` and ``diff`` as
non-null ``long``. Spark checks every ``pyarrow.RecordBatch`` a Python data source yields
against the Arrow form of its declared schema *exactly* (``string`` is not ``large_string``,
nullability counts), so every batch leaves through :func:`to_spark`.

Two conversions are checked rather than assumed: ``uint64`` (times, and uint64 keys/values)
becomes a signed ``long``, and a value at or above 2**63 fails loudly instead of wrapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from persist.errors import InvalidUsage, SchemaMismatch
from persist.indexed import columnar
from persist.indexed.meta import CollectionMeta

#: The largest time (or uint64 key/value) Spark's signed ``long`` can hold.
MAX_LONG = 2**63 - 1

# Arrow type stored by persist -> (Spark type, the Arrow type Spark expects for it).
_SPARK: dict[pa.DataType, tuple[DataType, pa.DataType]] = {
    pa.string(): (StringType(), pa.string()),
    pa.large_string(): (StringType(), pa.string()),
    pa.binary(): (BinaryType(), pa.binary()),
    pa.large_binary(): (BinaryType(), pa.binary()),
    pa.int64(): (LongType(), pa.int64()),
    pa.int32(): (IntegerType(), pa.int32()),
    # NB: Spark has no unsigned types. uint64 maps to long with a checked cast (values >= 2**63
    # fail); decimal(20, 0) would be exact but surprises every user who joins on the column.
    pa.uint64(): (LongType(), pa.int64()),
    pa.float64(): (DoubleType(), pa.float64()),
    pa.bool_(): (BooleanType(), pa.bool_()),
    pa.null(): (NullType(), pa.null()),
}

# Spark type name -> the Arrow type a new collection gets when created from a DataFrame.
_ARROW_OF_SPARK: dict[str, pa.DataType] = {
    "string": pa.string(),
    "binary": pa.binary(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "void": pa.null(),
}


@dataclass(frozen=True)
class CollectionTypes:
    """A collection's stored types, picklable, as a Spark task needs them.

    Python-object codecs are deliberately not resolved here: Spark sees their msgpack bytes as
    ``binary`` and executors never import the user's classes.
    """

    name: str
    cid: int
    key_type: bytes
    value_type: bytes

    @classmethod
    def of(cls, c: CollectionMeta) -> CollectionTypes:
        """``c``'s name, id and stored types (codecs left unresolved)."""
        return cls(c.name, c.id, c.key_type, c.value_type)

    @property
    def key(self) -> pa.DataType:
        """The stored Arrow type of ``key`` (``binary`` for a Python-object codec)."""
        return columnar.deserialize_type(self.key_type)

    @property
    def value(self) -> pa.DataType:
        """The stored Arrow type of ``value`` (``binary`` for a Python-object codec)."""
        return columnar.deserialize_type(self.value_type)

    @property
    def part_schema(self) -> pa.Schema:
        """The schema of this collection's stored parts."""
        return columnar.part_schema(self.key, self.value)

    @property
    def spark_schema(self) -> StructType:
        """``key, value, time, diff`` as Spark declares them."""
        return StructType([
            StructField("key", _spark_type(self.name, "key", self.key), nullable=True),
            StructField("value", _spark_type(self.name, "value", self.value), nullable=True),
            StructField("time", LongType(), nullable=False),
            StructField("diff", LongType(), nullable=False),
        ])

    @property
    def arrow_schema(self) -> pa.Schema:
        """The exact Arrow schema Spark expects of every batch (see ``to_arrow_schema``)."""
        return pa.schema([
            pa.field("key", _SPARK[self.key][1], nullable=True),
            pa.field("value", _SPARK[self.value][1], nullable=True),
            pa.field("time", pa.int64(), nullable=False),
            pa.field("diff", pa.int64(), nullable=False),
        ])


def _spark_type(name: str, column: str, t: pa.DataType) -> DataType:
    try:
        return _SPARK[t][0]
    except KeyError:
        raise SchemaMismatch(
            f"collection {name!r} has {column} type {t}, which has no Spark equivalent"
        ) from None


def to_spark(table: pa.Table, target: pa.Schema, *, time: int | None = None) -> pa.Table:
    """Converts a table of updates (a part's schema) to ``target``, Spark's exact layout.

    Args:
        table: columns ``key, value, time (uint64), diff``.
        target: :attr:`CollectionTypes.arrow_schema`.
        time: when given, every row's time is this (a snapshot's as_of) instead of its own.

    Raises:
        InvalidUsage: a time, key or value does not fit Spark's signed long.
    """
    n = len(table)
    if time is not None:
        if time > MAX_LONG:
            raise InvalidUsage(f"time {time} does not fit Spark's long (max {MAX_LONG})")
        times: pa.Array | pa.ChunkedArray = columnar.constant_times(time, n, pa.int64())
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
    if col.type == to:
        return col
    if pa.types.is_unsigned_integer(col.type) and len(col):
        hi = pc.max(col).as_py()
        if hi is not None and hi > MAX_LONG:
            raise InvalidUsage(
                f"{what} {hi} does not fit Spark's long (max {MAX_LONG}); persist times and "
                f"uint64 columns read through Spark must stay below 2**63"
            )
    return col.cast(to, safe=True)


def arrow_type_for(spark_type: DataType, *, column: str) -> pa.DataType:
    """The Arrow type a new collection's ``column`` gets for a DataFrame column's Spark type.

    Raises:
        SchemaMismatch: a Spark type persist cannot store.
    """
    name = spark_type.simpleString()
    try:
        return _ARROW_OF_SPARK[name]
    except KeyError:
        raise SchemaMismatch(
            f"cannot store a Spark {name} {column} column; persist keys and values are "
            f"{', '.join(sorted(_ARROW_OF_SPARK))} (set the key_type/value_type options to "
            f"store another Arrow type the column casts to)"
        ) from None


def parse_arrow_type(alias: str, *, option: str) -> pa.DataType:
    """An Arrow type from its alias (``string``, ``int64``, ``large_binary``, ...)."""
    try:
        t = pa.type_for_alias(alias.strip().lower())
    except (ValueError, KeyError):
        raise InvalidUsage(f"option {option}={alias!r} is not an Arrow type name") from None
    if t not in _SPARK:
        raise InvalidUsage(
            f"option {option}={alias!r}: persist stores {', '.join(sorted(map(str, _SPARK)))}"
        )
    return t


def check_sink_schema(schema: StructType, types: CollectionTypes | None) -> None:
    """Checks a DataFrame's schema against the collection it is written to.

    Raises:
        SchemaMismatch: missing or extra columns, non-integer time/diff, or key/value columns
            whose Spark types are not those the collection reads back as.
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
        if have != want[col].dataType and not widening and not isinstance(have, NullType):
            raise SchemaMismatch(
                f"collection {types.name!r} reads its {col} as {want[col].dataType.simpleString()}"
                f", but the DataFrame's {col} is {fields[col].simpleString()}"
            )
