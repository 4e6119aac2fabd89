"""Records: the Arrow types a key or value may have, the ``msgspec.Struct`` mapping, strict
checks of Python values, and equality of whole records for consolidation.

**Types.** Version 1 of the format stores ten primitive types (:data:`V1_TYPES`). Version 2 adds
every type that Parquet and Spark can both represent: bool; int8/16/32/64; uint8/16/32/64;
float32/64; decimal128; string, large_string; binary, large_binary; date32; timestamp (every
unit, with or without a zone); list/large_list and struct of these, nested to any depth, with
nullable or non-nullable fields. ``null`` stays a top-level type only. A collection using any
type outside :data:`V1_TYPES` is format version 2 (see ``meta.required_version``).

**The msgspec mapping** (:func:`struct_type`). A ``msgspec.Struct`` class whose fields all map
is stored as the matching Arrow struct: ``int`` -> int64, ``float`` -> float64, ``str`` ->
string, ``bytes`` -> binary, ``bool`` -> bool, ``datetime.date`` -> date32,
``datetime.datetime`` -> timestamp[us, UTC] (aware values only: a naive datetime is refused on
write), ``Annotated[Decimal, persist.decimal(p, s)]`` -> decimal128(p, s),
``Annotated[T, persist.arrow(t)]`` -> ``t`` (any allowed Arrow type, e.g. int32 or a naive
timestamp), ``list[T]`` -> list<T>, ``T | None`` -> a nullable field (every other field is
non-nullable), a nested Struct -> struct. Field names are the attribute names. Any other field
type (a dict, a tuple, a bare ``Decimal``, ...) is refused, naming the field and the fix; opaque
msgpack storage is the explicit opt-in :func:`msgpack` (it was once the silent fallback).
Types no encoding can store (``complex``, ``object``: :func:`unencodable`) are refused either way.
Which fields differ between two types, for messages: :func:`differences`.

**Equality** (:func:`frame`): two records are equal iff every field is: null equals null (and
differs from every value, a null record differs from a record of nulls, a null list from an
empty one), NaN equals NaN whatever its payload, and floats are otherwise compared by their bits,
so ``-0.0`` and ``0.0`` are different values (as hash-grouping has always treated version-1 float
columns: a retraction cancels exactly the value that was written).
"""

from __future__ import annotations

import datetime
import decimal as _decimal
import functools
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec
import msgspec.inspect
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import SchemaMismatch

#: The key/value types of storage format version 1.
V1_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.int64(),
            pa.int32(), pa.uint64(), pa.float64(), pa.bool_(), pa.null())
_V1 = frozenset(V1_TYPES)

_U8 = np.uint8
_Bytes = npt.NDArray[np.uint8]
_Offsets = npt.NDArray[np.int64]


# -- type rules ----------------------------------------------------------------------------


def is_v2_type(t: pa.DataType) -> bool:
    """True if ``t`` needs storage format version 2 (anything outside :data:`V1_TYPES`)."""
    return t not in _V1


def is_nested(t: pa.DataType) -> bool:
    """True for struct and list types: equality, sorting and grouping go through :func:`frame`."""
    return bool(pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t))


def check_type(t: pa.DataType, path: str) -> None:
    """Checks that ``t`` may be a key or value type (``path`` is ``key`` or ``value``).

    Raises:
        SchemaMismatch: naming the field path and the type, e.g.
            ``value.items[].price: halffloat is not supported``.
    """
    if pa.types.is_null(t):
        return
    _check_nested(t, path)


def _check_nested(t: pa.DataType, path: str) -> None:
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            raise SchemaMismatch(f"{path}: a struct needs at least one field")
        names = [t.field(i).name for i in range(t.num_fields)]
        if len(set(names)) != len(names):
            raise SchemaMismatch(f"{path}: duplicate field names {names}")
        for i in range(t.num_fields):
            f = t.field(i)
            if not f.name:
                raise SchemaMismatch(f"{path}: a struct field needs a name")
            _check_nested(f.type, f"{path}.{f.name}")
        return
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        _check_nested(t.value_type, f"{path}[]")
        return
    if _is_primitive(t):
        return
    raise SchemaMismatch(f"{path}: {t} is not supported (persist stores bool, (u)int8-64, "
                         f"float32/64, decimal128, string, binary, date32, timestamp, and "
                         f"lists and structs of these)")


def _is_primitive(t: pa.DataType) -> bool:
    return (pa.types.is_boolean(t) or pa.types.is_integer(t)
            or t in (pa.float32(), pa.float64())
            or pa.types.is_decimal128(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_date32(t)
            or pa.types.is_timestamp(t))


# -- strict Python values ------------------------------------------------------------------

#: ``check(value, path)`` raises SchemaMismatch if ``value`` does not fit, naming ``path``.
Checker = Callable[[Any, str], None]


def _misfit(v: Any, t: pa.DataType, path: str, why: str = "") -> SchemaMismatch:
    extra = f" ({why})" if why else ""
    return SchemaMismatch(f"{path}: {v!r} ({type(v).__name__}) does not fit {t}{extra}")


@functools.lru_cache(maxsize=256)
def checker(t: pa.DataType) -> Checker:
    """A function that checks a non-null Python value against ``t``, recursively, before
    pyarrow converts it: pyarrow alone would store 1.5 as 1 in an int64, drop a dict's unknown
    keys, truncate microseconds into a ms timestamp and read a naive datetime as UTC."""
    if pa.types.is_struct(t):
        return _struct_checker(t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _list_checker(t)
    return _leaf_checker(t)


def _leaf_checker(t: pa.DataType) -> Checker:
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)

        def check_int(v: Any, path: str) -> None:
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise _misfit(v, t, path)
            if not lo <= int(v) <= hi:
                raise _misfit(v, t, path, "out of range")
        return check_int
    if pa.types.is_floating(t):
        def check_float(v: Any, path: str) -> None:
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise _misfit(v, t, path)
        return check_float
    if pa.types.is_boolean(t):
        def check_bool(v: Any, path: str) -> None:
            if not isinstance(v, (bool, np.bool_)):
                raise _misfit(v, t, path)
        return check_bool
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        def check_str(v: Any, path: str) -> None:
            if not isinstance(v, str):
                raise _misfit(v, t, path)
        return check_str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        def check_bytes(v: Any, path: str) -> None:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise _misfit(v, t, path)
        return check_bytes
    if pa.types.is_decimal(t):
        scale, digits = t.scale, t.precision

        def check_decimal(v: Any, path: str) -> None:
            if isinstance(v, numbers.Integral) and not isinstance(v, bool):
                v = _decimal.Decimal(int(v))
            if not isinstance(v, _decimal.Decimal) or not v.is_finite():
                raise _misfit(v, t, path)
            exp = v.as_tuple().exponent
            assert isinstance(exp, int)
            if -exp > scale and v != v.quantize(_decimal.Decimal(1).scaleb(-scale)):
                raise _misfit(v, t, path, f"more than {scale} decimal places")
            if v.adjusted() + 1 > digits - scale:
                raise _misfit(v, t, path, f"more than {digits - scale} integer digits")
        return check_decimal
    if pa.types.is_date32(t):
        def check_date(v: Any, path: str) -> None:
            if not isinstance(v, datetime.date) or isinstance(v, datetime.datetime):
                raise _misfit(v, t, path)
        return check_date
    if pa.types.is_timestamp(t):
        zoned = t.tz is not None
        step = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 1}[t.unit]

        def check_timestamp(v: Any, path: str) -> None:
            if not isinstance(v, datetime.datetime):
                raise _misfit(v, t, path)
            if (v.tzinfo is not None and v.utcoffset() is not None) != zoned:
                raise _misfit(v, t, path, "an aware datetime is needed" if zoned
                              else "a naive datetime is needed")
            if v.microsecond % step:
                raise _misfit(v, t, path, f"finer than {t.unit}")
        return check_timestamp
    return lambda v, path: None  # null: only None reaches it, and None is never checked


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _struct_checker(t: pa.StructType) -> Checker:
    fields = [(f.name, f.nullable, checker(f.type)) for f in (t.field(i)
                                                             for i in range(t.num_fields))]
    names = frozenset(n for n, _, _ in fields)

    def check_struct(v: Any, path: str) -> None:
        if not isinstance(v, Mapping):
            raise _misfit(v, t, path, "a record is a dict or a msgspec.Struct")
        unknown = [k for k in v if k not in names]
        if unknown:
            raise SchemaMismatch(f"{path}: unknown field {unknown[0]!r} (the record has "
                                 f"{', '.join(sorted(names))})")
        for name, nullable, check in fields:
            x = v.get(name)
            if x is None:
                if not nullable:
                    raise SchemaMismatch(f"{path}.{name}: null in a non-nullable field")
            else:
                check(x, f"{path}.{name}")
    return check_struct


def _list_checker(t: pa.ListType | pa.LargeListType) -> Checker:
    item = t.value_field
    check, nullable = checker(item.type), item.nullable

    def check_list(v: Any, path: str) -> None:
        if not isinstance(v, (list, tuple)):
            raise _misfit(v, t, path, "a list is a list or a tuple")
        for i, x in enumerate(v):
            if x is None:
                if not nullable:
                    raise SchemaMismatch(f"{path}[{i}]: null in a non-nullable list")
            else:
                check(x, f"{path}[{i}]")
    return check_list


def to_builtin(v: Any) -> Any:
    """``v`` with every ``msgspec.Struct`` in it (at any depth, in lists too) turned into a dict
    of its attributes; other values as they are."""
    if isinstance(v, msgspec.Struct):
        return {name: to_builtin(getattr(v, name)) for name in v.__struct_fields__}
    if isinstance(v, (list, tuple)):
        return [to_builtin(x) for x in v]
    return v


# -- the msgspec mapping -------------------------------------------------------------------


@dataclass(frozen=True)
class ArrowAnnotation:
    """Stores a ``msgspec.Struct`` field as ``type``: use ``Annotated[T, persist.arrow(t)]``
    or ``Annotated[Decimal, persist.decimal(p, s)]``."""

    type: pa.DataType


def arrow(t: pa.DataType) -> ArrowAnnotation:
    """The annotation that stores a ``msgspec.Struct`` field as Arrow type ``t``
    (``Annotated[int, persist.arrow(pa.int32())]``)."""
    check_type(t, "annotation")
    return ArrowAnnotation(t)


def decimal(precision: int, scale: int) -> ArrowAnnotation:
    """The annotation of a ``Decimal`` field of a ``msgspec.Struct``:
    ``Annotated[Decimal, persist.decimal(12, 2)]`` is stored as decimal128(12, 2)."""
    return ArrowAnnotation(pa.decimal128(precision, scale))


_SIMPLE: dict[Any, pa.DataType] = {
    bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string(),
    bytes: pa.binary(), datetime.date: pa.date32(),
    datetime.datetime: pa.timestamp("us", tz="UTC"),
}

def simple_arrow_type(t: Any) -> pa.DataType | None:
    """The Arrow type a ``msgspec.Struct`` field of Python type ``t`` maps to (``int`` ->
    int64, ``float`` -> float64, ...), or None for other types."""
    return _SIMPLE.get(t)


#: What a ``msgspec.Struct`` field may be, for the messages that refuse one.
_MAPPED = ("int, float, str, bytes, bool, date, aware datetime, "
           "Annotated[Decimal, persist.decimal(p, s)], Annotated[T, persist.arrow(t)], list[T], "
           "T | None and nested msgspec.Structs")


def struct_type_of(cls: type) -> pa.DataType | None:
    """The Arrow struct a ``msgspec.Struct`` class is stored as, or None if it is not one or
    a field does not map (:func:`struct_type` says why)."""
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        return None
    try:
        return struct_type(cls, "value")
    except SchemaMismatch:
        return None


def struct_type(cls: type[msgspec.Struct], path: str) -> pa.StructType:
    """The Arrow struct the ``msgspec.Struct`` class ``cls`` is stored as (see the module
    docstring), for the key or value ``path``.

    Raises:
        SchemaMismatch: naming every field that does not map and the fix, e.g.
            ``value.amount: Decimal needs Annotated[Decimal, persist.decimal(p, s)]``; a field
            that cannot be stored at all (``complex``, ``object``) is named as such. Where only
            the mapping fails, the message also names the explicit opt-in to opaque storage,
            ``persist.msgpack(cls)``.
    """
    problems: list[_Unmapped] = []
    t = _struct_of(cls, frozenset(), path, problems)
    if not problems:
        assert isinstance(t, pa.StructType)
        return t
    why = "; ".join(p.why for p in problems)
    if any(p.unmapped for p in problems):
        why += f" (a field maps if it is {_MAPPED})"
    hint = ""
    if all(p.opaque_ok for p in problems):
        hint = (f". Or store the whole {path.split('.')[0]} as opaque msgpack, "
                f"persist.msgpack({cls.__qualname__}): it then cannot be filtered or evolved, "
                f"and Spark sees binary")
    raise SchemaMismatch(f"{path}: {cls.__qualname__} does not map to an Arrow struct: "
                         f"{why}{hint}")


@dataclass(frozen=True)
class _Unmapped:
    """Why one field does not map; ``opaque_ok``: msgpack could still store it."""

    why: str
    opaque_ok: bool = True
    #: A type outside the mapping (the message then lists what maps).
    unmapped: bool = False


def _struct_of(cls: type, seen: frozenset[type], path: str,
               problems: list[_Unmapped]) -> pa.DataType:
    """``cls``'s struct, recording every field that does not map in ``problems`` (a
    placeholder type stands in for each, so the walk goes on and names them all)."""
    if cls in seen:  # a recursive Struct has no finite Arrow type
        problems.append(_Unmapped(f"{path}: {cls.__qualname__} contains itself (a recursive "
                                  f"record has no Arrow type)"))
        return pa.null()
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as e:
        problems.append(_Unmapped(f"{path}: the annotations of {cls.__qualname__} do not "
                                  f"resolve ({type(e).__name__}: {e})", opaque_ok=False))
        return pa.null()
    fields = []
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        t, nullable = _field_of(hints[name], seen | {cls}, f"{path}.{name}", problems)
        fields.append(pa.field(name, t, nullable=nullable))
    if not fields:
        problems.append(_Unmapped(f"{path}: {cls.__qualname__} has no fields (a struct needs "
                                  f"at least one)"))
        return pa.null()
    return pa.struct(fields)


def _field_of(hint: Any, seen: frozenset[type], path: str,
              problems: list[_Unmapped]) -> tuple[pa.DataType, bool]:
    """``(arrow type, nullable)`` of a field annotation (problems recorded, see
    :func:`_struct_of`)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            problems.append(_unmapped(hint, path, "is a union: a field has one type "
                                                  "(T | None makes it nullable)"))
            return pa.null(), True
        return _field_of(args[0], seen, path, problems)[0], True
    if origin is typing.Annotated:
        base, *extras = typing.get_args(hint)
        marks = [e for e in extras if isinstance(e, ArrowAnnotation)]
        if marks:
            return marks[-1].type, _is_optional(base)
        return _field_of(base, seen, path, problems)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        t, nullable = _field_of(item, seen, f"{path}[]", problems)
        return pa.list_(pa.field("item", t, nullable=nullable)), False
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        t = _struct_of(hint, seen, path, problems)
        return t, pa.types.is_null(t)  # null: a placeholder (Arrow refuses it non-nullable)
    t = _SIMPLE.get(hint)
    if t is None:
        if hint is _decimal.Decimal:
            problems.append(_Unmapped(f"{path}: Decimal needs "
                                      f"Annotated[Decimal, persist.decimal(p, s)] (its "
                                      f"precision and scale)"))
        else:
            problems.append(_unmapped(hint, path, "has no Arrow mapping"))
        return pa.null(), True
    return t, False


def _unmapped(hint: Any, path: str, why: str) -> _Unmapped:
    bad = unencodable(hint, path)
    if bad:
        return _Unmapped("; ".join(bad), opaque_ok=False)
    return _Unmapped(f"{path}: {_hint_name(hint)} {why}", unmapped=True)


def _hint_name(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _is_optional(hint: Any) -> bool:
    return (typing.get_origin(hint) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(hint))


# -- opaque msgpack --------------------------------------------------------------------------


@dataclass(frozen=True)
class MsgpackType:
    """Stores a key or value as opaque msgpack of ``type`` (made by :func:`msgpack`)."""

    type: type


def msgpack(t: type) -> MsgpackType:
    """The explicit opt-in to storing a key or value as opaque msgpack of class ``t``:
    ``create_or_load(name, key_type=pa.string(), value_type=persist.msgpack(Event))``.

    Any class msgspec encodes will do (a ``msgspec.Struct`` with a dict field, a dataclass, a
    dict, ...); values are checked against ``t`` on write and decoded into ``t`` on read. The
    column is Arrow ``binary``: persist cannot see into it, so it cannot be filtered or evolved,
    Spark sees the bytes, and a collection so stored is matched by ``t``'s name
    (``module:qualname``), not by its fields. Prefer a ``msgspec.Struct`` whose fields map to
    Arrow (stored as a struct); this is for what cannot.

    Raises:
        SchemaMismatch: ``t`` is not a class, or neither it nor some field of it can be
            encoded at all (``complex``, ``object``), naming the field.
    """
    if not isinstance(t, type):
        raise SchemaMismatch(f"persist.msgpack takes a class (a msgspec.Struct, a dataclass, "
                             f"dict, ...), not {t!r}")
    bad = unencodable(t, t.__qualname__)
    if bad:
        raise SchemaMismatch(f"persist.msgpack({t.__qualname__}): {'; '.join(bad)}")
    return MsgpackType(t)


def unencodable(t: Any, path: str) -> list[str]:
    """Why values of type ``t`` cannot be encoded at all, not even as msgpack (``[]``: they
    can): each a field path and its type, e.g. ``value.x: complex cannot be stored``."""
    try:
        info = msgspec.inspect.type_info(t)
    except Exception as e:  # unresolvable annotations, a type msgspec refuses outright
        return [f"{path}: {_hint_name(t)} cannot be stored ({type(e).__name__}: {e})"]
    out: list[str] = []
    _custom(info, path, out, set())
    return out


def _custom(info: Any, path: str, out: list[str], seen: set[int]) -> None:
    """Records in ``out`` the paths below ``info`` (a ``msgspec.inspect`` type) whose type
    msgspec cannot encode without a hook of its own (``CustomType``)."""
    mi = msgspec.inspect
    if id(info) in seen:  # a recursive type
        return
    seen.add(id(info))
    if isinstance(info, mi.CustomType):
        name = info.cls.__qualname__
        why = "has no type to check values against" if info.cls is object else \
            "msgspec cannot encode it"
        out.append(f"{path}: {name} cannot be stored ({why})")
    elif isinstance(info, (mi.StructType, mi.DataclassType, mi.TypedDictType,
                           mi.NamedTupleType)):
        for f in info.fields:
            _custom(f.type, f"{path}.{f.name}", out, seen)
    elif isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        _custom(info.item_type, f"{path}[]", out, seen)
    elif isinstance(info, mi.TupleType):
        for i, x in enumerate(info.item_types):
            _custom(x, f"{path}[{i}]", out, seen)
    elif isinstance(info, mi.DictType):
        _custom(info.key_type, f"{path}{{key}}", out, seen)
        _custom(info.value_type, f"{path}{{}}", out, seen)
    elif isinstance(info, mi.UnionType):
        for x in info.types:
            _custom(x, path, out, seen)
    elif isinstance(info, mi.Metadata):
        _custom(info.type, path, out, seen)


@functools.lru_cache(maxsize=256)
def struct_decoder(cls: type) -> Callable[[Any], Any]:
    """A function turning what Arrow's ``to_pylist`` gives for ``cls``'s struct back into an
    instance of ``cls`` (nested Structs and lists of them included)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    conv = [(name, _value_decoder(hints[name])) for name in cls.__struct_fields__]  # type: ignore[attr-defined]

    def decode(d: Any) -> Any:
        if d is None:
            return None
        return cls(**{name: f(d[name]) if f is not None else d[name] for name, f in conv})
    return decode


def _value_decoder(hint: Any) -> Callable[[Any], Any] | None:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value_decoder(arg)
    if origin is typing.Annotated:
        return _value_decoder(typing.get_args(hint)[0])
    if origin is list:
        inner = _value_decoder((typing.get_args(hint) or (Any,))[0])
        if inner is None:
            return None
        return lambda xs: None if xs is None else [None if x is None else inner(x) for x in xs]
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return struct_decoder(hint)
    return None


# -- equality of whole records ---------------------------------------------------------------

_NAN_BITS = {8: np.array([np.nan], dtype=np.float64).view(np.uint8),
             4: np.array([np.nan], dtype=np.float32).view(np.uint8)}

Col: TypeAlias = pa.ChunkedArray | pa.Array


@functools.cache
def _nan(t: pa.DataType) -> pa.Scalar:
    """The one NaN of float type ``t`` that :func:`frame` makes every NaN of ``t`` into."""
    # NB: built on first use, not at import: pyarrow's first conversion of a Python object
    # imports pandas (~150 ms), which every Spark worker that imports persist would pay.
    return pa.scalar(float("nan"), t)


def frame(col: Col) -> list[Col]:
    """Flat columns that are equal, row by row, iff the records of ``col`` are (see the module
    docstring), and on which ``sort_indices``, ``equal`` and ``group_by`` all work.

    A struct becomes its leaves (its validity first, when it has nulls), depth first; a list
    becomes the canonical bytes of its elements (:func:`list_bytes`, null for a null list); a
    float has its NaNs made one NaN. Other leaves are themselves.
    """
    t = col.type
    if pa.types.is_struct(t):
        out: list[Col] = []
        if col.null_count:
            out.append(pc.is_valid(col))
        for child in col.flatten():  # NB: flatten folds the struct's nulls into its children
            out.extend(frame(child))
        return out
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if isinstance(col, pa.ChunkedArray):
            return [pa.chunked_array([list_bytes(c) for c in col.chunks], pa.large_binary())]
        return [list_bytes(col)]
    return [one_nan(col)]


def one_nan(col: Col) -> Col:
    """``col`` with every NaN made one NaN (the same bits), if it is a float column; else
    ``col`` itself. Hash-grouping and byte comparisons then see NaN equal to NaN, whatever
    payload each was written with."""
    t = col.type
    if pa.types.is_floating(t) and pc.any(pc.is_nan(col)).as_py():
        return pc.if_else(pc.is_nan(col), _nan(t), col)
    return col


def weak_equal(a: Col, b: Col) -> pa.Array | pa.ChunkedArray:
    """Row-wise equality of two frame columns that may only err towards equal: null equals
    null, NaN equals NaN, and ``-0.0`` equals ``0.0`` (sorting ties them, so neighbours that
    may be equal are found; the caller then groups exactly). Never null."""
    eq = pc.equal(a, b)
    if a.null_count or b.null_count:
        eq = pc.if_else(pc.is_null(eq), pc.and_(pc.is_null(a), pc.is_null(b)), eq)
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return eq


def list_bytes(arr: pa.Array) -> pa.Array:
    """A list array as large_binary: per row, the concatenated canonical encodings of its
    elements (:func:`encode_elements`); a null list is null, an empty list empty bytes."""
    n = len(arr)
    large = pa.types.is_large_list(arr.type)
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int64 if large else np.int32,
                         count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    base = int(offs[0])
    # NB: the raw offsets, not flatten(): a null list may span elements, but its row is null
    # whatever bytes it spans.
    eoff, edata = encode_elements(arr.values.slice(base, int(offs[-1]) - base))
    offsets = eoff[offs - base]
    validity = None
    if arr.null_count:
        valid = pc.is_valid(arr)
        validity = valid.buffers()[1] if valid.offset == 0 else pa.array(
            valid.to_numpy(zero_copy_only=False)).buffers()[1]
    return pa.Array.from_buffers(pa.large_binary(), n,
                                 [validity, pa.py_buffer(offsets), pa.py_buffer(edata)],
                                 null_count=arr.null_count)


def row_bytes(col: Col) -> pa.Array:
    """Every row of ``col`` (any type) as its canonical encoding, a large_binary array: equal
    rows (by the rules of the module docstring) give equal bytes, different rows different."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    off, data = encode_elements(arr)
    return pa.Array.from_buffers(pa.large_binary(), len(arr),
                                 [None, pa.py_buffer(off), pa.py_buffer(data)])


def encode_elements(arr: pa.Array) -> tuple[_Offsets, _Bytes]:
    """The canonical encoding of every element of ``arr``: ``(offsets, data)`` with element
    ``i`` in ``data[offsets[i]:offsets[i+1]]`` and ``offsets[0] == 0``.

    Each encoding is prefix-free (a reader could tell where it ends), so concatenations of them
    (a struct's fields, a list's elements) are equal iff their parts are: fixed-width values
    are a validity byte and the value's bytes (zero when null, NaN made one NaN); variable-width
    ones a validity byte, an 8-byte length and the bytes; a struct its validity byte and its
    fields' encodings; a list its validity byte, an 8-byte count and its elements' encodings.
    Vectorized over Arrow buffers with numpy; a type it does not know is encoded in Python
    from ``to_pylist`` (correct, slow).
    """
    m = len(arr)
    t = arr.type
    valid = _valid(arr)
    if pa.types.is_boolean(t):
        vals = pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(_U8)
        return _fixed(np.stack([valid, vals], axis=1))
    if pa.types.is_null(t):
        return _fixed(np.zeros((m, 1), dtype=_U8))
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or \
            pa.types.is_date(t) or pa.types.is_timestamp(t):
        w = t.bit_width // 8
        buf = arr.buffers()[1]
        raw = np.frombuffer(buf, dtype=_U8, count=(arr.offset + m) * w)[arr.offset * w:]
        mat = raw.reshape(m, w)
        if pa.types.is_floating(t):
            f = mat.view(np.float64 if w == 8 else np.float32 if w == 4 else np.float16)[:, 0]
            nan = np.isnan(f)
            if nan.any():
                mat = mat.copy()
                mat[nan] = _NAN_BITS[w]
        if arr.null_count:
            mat = mat * valid[:, None]
        return _fixed(np.concatenate([valid[:, None], mat], axis=1))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or \
            pa.types.is_large_binary(t):
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        _, obuf, dbuf = arr.buffers()
        offs = np.frombuffer(obuf, dtype=np.int64 if large else np.int32,
                             count=arr.offset + m + 1)[arr.offset:].astype(np.int64)
        lens = np.diff(offs)
        if arr.null_count:
            lens = lens * valid  # a null's bytes, if any, are not part of it
            keep = np.repeat(valid.astype(bool), np.diff(offs))
            data = np.frombuffer(dbuf, dtype=_U8)[offs[0]:offs[-1]][keep] if dbuf else \
                np.zeros(0, _U8)
        else:
            data = np.frombuffer(dbuf, dtype=_U8)[offs[0]:offs[-1]] if dbuf else \
                np.zeros(0, _U8)
        body = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lens, out=body[1:])
        return _concat([_header(valid, lens), (body, data)], m)
    if pa.types.is_struct(t):
        parts: list[tuple[_Offsets, _Bytes] | _Bytes] = [valid[:, None]]
        for child in arr.flatten():
            parts.append(encode_elements(child))
        return _concat(parts, m)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(
            zero_copy_only=False).astype(np.int64)
        starts = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        eoff, edata = encode_elements(arr.flatten())
        return _concat([_header(valid, lengths), (eoff[starts], edata)], m)
    return _python_encoding(arr)


def _valid(arr: pa.Array) -> _Bytes:
    if not arr.null_count:
        return np.ones(len(arr), dtype=_U8)
    out: _Bytes = pc.is_valid(arr).to_numpy(zero_copy_only=False).astype(_U8)
    return out


def _header(valid: _Bytes, lengths: _Offsets) -> _Bytes:
    """Per element: the validity byte and an 8-byte little-endian length."""
    return np.concatenate([valid[:, None],
                           lengths.astype("<i8").view(_U8).reshape(len(valid), 8)], axis=1)


def _fixed(mat: _Bytes) -> tuple[_Offsets, _Bytes]:
    m, w = mat.shape
    return np.arange(m + 1, dtype=np.int64) * w, np.ascontiguousarray(mat).reshape(-1)


def _concat(parts: list[tuple[_Offsets, _Bytes] | _Bytes], m: int) -> tuple[_Offsets, _Bytes]:
    """Row-wise concatenation of per-row encodings: fixed-width ones as ``(m, w)`` matrices,
    variable ones as ``(offsets, data)`` whose rows are contiguous and in order."""
    lens = [np.full(m, p.shape[1], dtype=np.int64) if isinstance(p, np.ndarray)
            else np.diff(p[0]) for p in parts]
    out_off = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(sum(lens), out=out_off[1:])
    out = np.empty(int(out_off[-1]), dtype=_U8)
    at = out_off[:-1].copy()
    for p, ln in zip(parts, lens, strict=True):
        if isinstance(p, np.ndarray):
            w = p.shape[1]
            if w:
                out[at[:, None] + np.arange(w)] = p
        else:
            off, data = p
            total = int(off[-1] - off[0])
            if total:
                shift = np.repeat(at - off[:-1], ln)
                out[np.arange(off[0], off[-1]) + shift] = data[off[0]:off[-1]]
        at += ln
    return out_off, out


def _python_encoding(arr: pa.Array) -> tuple[_Offsets, _Bytes]:
    enc = msgspec.msgpack.Encoder()
    pieces = [enc.encode(canonical(x)) for x in arr.to_pylist()]
    off = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=off[1:])
    return off, np.frombuffer(b"".join(pieces), dtype=_U8)


def canonical(x: Any) -> Any:
    """A hashable, msgpack-encodable form of a Python record value under the equality of the
    module docstring (NaN one value, ``-0.0`` not ``0.0``, containers as tuples)."""
    if isinstance(x, float):
        if x != x:
            return ("nan",)
        return ("f", x.hex())
    if isinstance(x, dict):
        return ("d", tuple((k, canonical(v)) for k, v in sorted(x.items())))
    if isinstance(x, (list, tuple)):
        return ("l", tuple(canonical(v) for v in x))
    if isinstance(x, (_decimal.Decimal, datetime.date, datetime.datetime)):
        return (type(x).__name__, str(x))
    return x


# -- schema evolution: which changes of a type are allowed -------------------------------------

_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
_ALLOWED = ("add a nullable field, drop a field, make a field nullable, widen int8->16->32->64 "
            "(uint likewise), float32->float64, string->large_string, binary->large_binary, "
            "list->large_list, or a decimal's precision up with the same scale")


def evolution_problems(old: pa.DataType, new: pa.DataType, path: str = "value") -> list[str]:
    """Why a key or value of type ``old`` may not evolve to ``new`` (``[]``: it may). Pure.

    Allowed, at any depth: adding a nullable struct field (anywhere among the others),
    dropping a field (a struct keeps at least one of its fields), making a field or list item
    nullable, and widening a type: int8 -> int16 -> int32 -> int64 and uint8 -> ... -> uint64
    (any number of steps), float32 -> float64, string -> large_string, binary ->
    large_binary, list -> large_list, decimal128(p, s) -> decimal128(q, s) with ``q >= p``.
    Every value of ``old`` then has exactly one value of ``new`` (a dropped field aside), which
    is what reading old parts as the new type relies on.

    Refused, each naming the field path (``value.items[].qty``) and why: narrowing a type,
    any other type change (primitive <-> struct or list included), a new non-nullable field,
    making a field or item non-nullable, reordering the fields a struct keeps, and dropping
    every field of a struct.
    """
    out: list[str] = []
    _evolution(old, new, path, out)
    return out


def _evolution(old: pa.DataType, new: pa.DataType, path: str, out: list[str]) -> None:
    # NB: Arrow's type equality ignores list item names, and so does this: a list read as a
    # list of the same items is the same type, whatever its item is called.
    if old == new:
        return
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        _struct_evolution(old, new, path, out)
        return
    if _is_list(old) and _is_list(new):
        if pa.types.is_large_list(old) and pa.types.is_list(new):
            out.append(f"{path}: {old} cannot narrow to {new} (a large_list's offsets may not "
                       f"fit a list's)")
        if old.value_field.nullable and not new.value_field.nullable:
            out.append(f"{path}[]: list items cannot become non-nullable (items written "
                       f"before may be null)")
        _evolution(old.value_type, new.value_type, f"{path}[]", out)
        return
    if widens(old, new):
        return
    if widens(new, old):
        out.append(f"{path}: {old} cannot narrow to {new} (values written as {old} may not "
                   f"fit); allowed: {_ALLOWED}")
        return
    kind = ""
    if pa.types.is_struct(new) != pa.types.is_struct(old) or _is_list(new) != _is_list(old):
        kind = " (a record's shape cannot change between primitive, struct and list)"
    out.append(f"{path}: {old} cannot change to {new}{kind}; allowed: {_ALLOWED}")


def differences(have: pa.DataType, asked: pa.DataType, path: str = "value") -> list[str]:
    """Where type ``asked`` differs from the stored ``have``, field by field (``[]``: the
    same): fields only one has, fields in another order, another nullability, another type.
    Pure; for messages (which changes are allowed is :func:`evolution_problems`)."""
    out: list[str] = []
    _differences(have, asked, path, out)
    return out


def _differences(have: pa.DataType, asked: pa.DataType, path: str, out: list[str]) -> None:
    if have == asked:
        return
    if pa.types.is_struct(have) and pa.types.is_struct(asked):
        hn, an = [f.name for f in have], [f.name for f in asked]
        out.extend(f"{path}.{n}: stored, not in the type asked for" for n in hn if n not in an)
        out.extend(f"{path}.{n}: asked for, not stored" for n in an if n not in hn)
        common = [n for n in hn if n in an]
        if common != [n for n in an if n in hn]:
            out.append(f"{path}: fields in another order (stored: {', '.join(hn)})")
        for n in common:
            h, a = have.field(n), asked.field(n)
            if h.nullable != a.nullable:
                out.append(f"{path}.{n}: stored {_nullable(h.nullable)}, asked for "
                           f"{_nullable(a.nullable)}")
            _differences(h.type, a.type, f"{path}.{n}", out)
        return
    if _is_list(have) and _is_list(asked) and type(have) is type(asked):
        h, a = have.value_field, asked.value_field
        if h.nullable != a.nullable:
            out.append(f"{path}[]: items stored {_nullable(h.nullable)}, asked for "
                       f"{_nullable(a.nullable)}")
        _differences(h.type, a.type, f"{path}[]", out)
        return
    out.append(f"{path}: stored as {have}, asked for as {asked}")


def _nullable(yes: bool) -> str:
    return "nullable" if yes else "non-nullable"


def _struct_evolution(old: pa.StructType, new: pa.StructType, path: str,
                      out: list[str]) -> None:
    old_names = [f.name for f in old]
    new_names = [f.name for f in new]
    kept = [n for n in new_names if n in old_names]
    if not kept:
        out.append(f"{path}: every field ({', '.join(old_names)}) would be dropped: a struct "
                   f"keeps at least one of its fields across an evolution (this is a new "
                   f"type: register a new collection)")
        return
    if kept != [n for n in old_names if n in new_names]:
        out.append(f"{path}: the fields it keeps change order ({', '.join(kept)}; were "
                   f"{', '.join(n for n in old_names if n in new_names)}): fields may be "
                   f"added anywhere and dropped, not reordered")
    for f in new:
        where = f"{path}.{f.name}"
        i = old.get_field_index(f.name)
        if i < 0:
            if not f.nullable:
                out.append(f"{where}: a new field must be nullable (records written before "
                           f"it have no value for it)")
            continue
        was = old.field(i)
        if was.nullable and not f.nullable:
            out.append(f"{where}: a field cannot become non-nullable (records written before "
                       f"may hold nulls)")
        _evolution(was.type, f.type, where, out)


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """True if every value of primitive ``old`` is exactly one value of ``new`` and ``new`` is
    one of the widenings :func:`evolution_problems` allows (``old != new``)."""
    if old == new:
        return False
    for chain in (_SIGNED, _UNSIGNED):
        if old in chain and new in chain:
            return chain.index(old) < chain.index(new)
    if (old, new) in ((pa.float32(), pa.float64()), (pa.string(), pa.large_string()),
                      (pa.binary(), pa.large_binary())):
        return True
    if pa.types.is_decimal128(old) and pa.types.is_decimal128(new):
        return bool(old.scale == new.scale and new.precision > old.precision)
    return False
