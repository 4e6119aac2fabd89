"""Python objects to Arrow and back, column by column: the ``msgspec.Struct`` path at a speed
near the Arrow path's.

Converting records one by one (a Struct to a dict, the dict checked field by field, pyarrow's
conversion of dicts; on the way back Arrow's ``to_pylist`` of dicts, each turned into an
instance) cost ~10x the Arrow path to write and ~35x to read (issue 21 #8). Here a Struct
column is taken apart into one Python list per field (``operator.attrgetter``), each checked by
the set of its values' exact types and converted by pyarrow in one call, and put together
again as a ``StructArray``; reading builds each field's list from Arrow buffers (numpy where
pyarrow's own conversion is slow: zoned timestamps, dates, decimals) and the instances with
one positional constructor call each.

**Writing is only ever an optimization.** :func:`encode` vouches for what it converts (every
value of exactly a type the field takes, decimals and timestamps as strict as
:func:`persist.indexed.format.records.checker`) and gives up (None) on anything else: a
subclass, a number of another type, an out-of-range value, a naive datetime. The caller then
takes the checked path, which accepts what it may and names the field of what it may not,
exactly as before. ``tests/indexed/test_objects.py`` checks, with random records valid and
not, that both paths give the same array or both refuse.

**The collector is paused while converting** (:func:`gc_paused`). Each conversion makes
millions of container objects, none part of a cycle; CPython starts a collection every 700 of
them and a full one whenever the survivors grew by a quarter, each walking every live object,
so the collector's share grew with the data (on 1 M records of W10 it was most of
``to_python``). Pauses nest across threads: the last one to end re-enables it, if it was
enabled when the first began.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import functools
import operator
import threading
import types
import typing
import zoneinfo
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise, repeat
from typing import Any, TypeAlias

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persist.indexed.format.records import ArrowAnnotation

_NONE = type(None)


# -- pausing the collector ------------------------------------------------------------------

_pause_lock = threading.Lock()
_pauses = 0
_reenable = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector for the block (see the module docstring)."""
    import gc

    global _pauses, _reenable
    with _pause_lock:
        if _pauses == 0:
            _reenable = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _reenable:
                gc.enable()


# -- plans: a Struct class's fields, their Arrow types and Python types ----------------------


@dataclass(frozen=True)
class _Leaf:
    type: pa.DataType
    #: The exact Python types a value may have (anything else: give up).
    kinds: frozenset[type]
    #: A value standing in under a null parent for a non-nullable field (what pyarrow stores
    #: there when it converts a null record).
    filler: Any


@dataclass(frozen=True)
class _List:
    type: pa.ListType | pa.LargeListType
    item: Plan
    filler: Any


@dataclass(frozen=True)
class _Struct:
    type: pa.StructType
    cls: type
    fields: tuple[Plan, ...]
    #: Each field's value of an instance.
    getters: tuple[Callable[[Any], Any], ...]
    positional: bool
    #: An instance standing in for a null record (its non-nullable fields filled).
    filler: Any = None


Plan: TypeAlias = _Leaf | _List | _Struct


class _Unplanned(Exception):
    """A field the plans do not cover (an Arrow-annotated nested type given as builtins)."""


@functools.lru_cache(maxsize=256)
def plan(cls: type, t: pa.StructType) -> _Struct | None:
    """How to convert instances of the mapped ``msgspec.Struct`` class ``cls`` to ``t`` (its
    struct, :func:`persist.indexed.format.records.struct_type`) and back, or None if some
    field needs the record-by-record path."""
    try:
        return _struct_plan(cls, t)
    except _Unplanned:
        return None


def _struct_plan(cls: type, t: pa.StructType) -> _Struct:
    hints = typing.get_type_hints(cls, include_extras=True)
    names: tuple[str, ...] = cls.__struct_fields__  # type: ignore[attr-defined]
    fields = tuple(_plan(hints[n], t.field(i).type) for i, n in enumerate(names))
    row = tuple(None if t.field(i).nullable else p.filler for i, p in enumerate(fields))
    positional = tuple(getattr(cls, "__match_args__", ())) == names
    try:
        filler = cls(*row) if positional else cls(**dict(zip(names, row, strict=True)))
    except Exception as e:  # a __post_init__ that refuses it: convert record by record
        raise _Unplanned(cls) from e
    return _Struct(t, cls, fields, tuple(map(operator.attrgetter, names)), positional,
                   filler)


def _plan(hint: Any, t: pa.DataType) -> Plan:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(hint) if a is not _NONE]
        return _plan(arg, t)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(hint)
        if any(isinstance(e, ArrowAnnotation) for e in extras):
            return _leaf(t)
        return _plan(base, t)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return _List(t, _plan(item, t.value_type), [])
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return _struct_plan(hint, t)
    return _leaf(t)


def _leaf(t: pa.DataType) -> _Leaf:
    if pa.types.is_boolean(t):
        return _Leaf(t, frozenset({bool}), False)
    if pa.types.is_integer(t):
        return _Leaf(t, frozenset({int}), 0)
    if pa.types.is_floating(t):
        return _Leaf(t, frozenset({float, int}), 0.0)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _Leaf(t, frozenset({str}), "")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _Leaf(t, frozenset({bytes}), b"")
    if pa.types.is_decimal128(t):
        return _Leaf(t, frozenset({decimal.Decimal}), decimal.Decimal(0))
    if pa.types.is_date32(t):
        return _Leaf(t, frozenset({datetime.date}), datetime.date(1970, 1, 1))
    if pa.types.is_timestamp(t) and t.unit in ("us", "ns"):
        epoch = datetime.datetime(1970, 1, 1)
        return _Leaf(t, frozenset({datetime.datetime}),
                     epoch if t.tz is None else epoch.replace(tzinfo=datetime.UTC))
    raise _Unplanned(t)  # nested Arrow types given as builtins, coarse timestamps


# -- Python objects to Arrow ----------------------------------------------------------------


#: Rows converted at a time (see :func:`encode`).
_SLICE_ROWS = 4096


class _GiveUp(Exception):
    """Something :func:`encode` does not vouch for: the checked path decides."""


def encode(p: _Struct, values: Sequence[Any]) -> pa.Array | None:
    """``values`` (instances of ``p.cls`` or None) as an array of ``p.type``, or None if some
    value is not exactly what a field takes (the caller's checked path then accepts it or
    names what does not fit)."""
    # NB: a slice at a time: each field's pass over a slice's objects then finds them in the
    # CPU's cache, where whole columns of a million objects did not fit (~25% less time).
    try:
        pieces = [_encode_struct(p, values[i:i + _SLICE_ROWS])
                  for i in range(0, len(values), _SLICE_ROWS)] or [_encode_struct(p, values)]
    except _GiveUp:
        return None
    return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)


def _kinds(values: Sequence[Any]) -> set[type]:
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    return kinds


def _mask(values: Sequence[Any], nulls: int) -> pa.Array | None:
    if not nulls:
        return None
    return pa.array(np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool,
                                count=len(values)))


def _encode_any(p: Plan, values: Sequence[Any], nullable: bool) -> pa.Array:
    if isinstance(p, _Struct):
        out = _encode_struct(p, values)
    elif isinstance(p, _List):
        out = _encode_list(p, values)
    else:
        out = _encode_leaf(p, values)
    if not nullable and out.null_count:
        raise _GiveUp
    return out


def _encode_struct(p: _Struct, values: Sequence[Any]) -> pa.Array:
    if not _kinds(values) <= {p.cls}:
        raise _GiveUp
    nulls = values.count(None)
    # NB: one list per field, each made by one map in C (transposing rows of tuples with
    # zip cost 5x as much)
    src = [p.filler if v is None else v for v in values] if nulls else values
    children = [_encode_any(fp, list(map(get, src)), field.nullable)
                for fp, get, field in zip(p.fields, p.getters, p.type, strict=True)]
    return pa.StructArray.from_arrays(children, fields=list(p.type), mask=_mask(values, nulls))


def _encode_list(p: _List, values: Sequence[Any]) -> pa.Array:
    if not _kinds(values) <= {list}:
        raise _GiveUp
    if isinstance(p.item, _Leaf):
        # NB: pyarrow converts lists of builtins itself; their items are checked as a leaf
        # column's would be
        # NB: filter(None, ...) drops the Nones (and empty lists, which hold nothing)
        items = chain.from_iterable(filter(None, values))
        if pa.types.is_timestamp(p.item.type):
            null_items = _check_leaf(p.item, list(items))  # (the zones take a second look)
        else:
            null_items = _check_kinds(p.item, items)  # NB: no list of the items made (~2%)
        if null_items and not p.type.value_field.nullable:
            raise _GiveUp
        return _convert(values, p.type)
    nulls = values.count(None)
    lengths = np.fromiter(map(len, values) if not nulls else
                          (0 if v is None else len(v) for v in values), dtype=np.int64,
                          count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = pa.types.is_large_list(p.type)
    if not large and offsets[-1] > np.iinfo(np.int32).max:
        raise _GiveUp
    flat = list(chain.from_iterable(filter(None, values)))
    items = _encode_any(p.item, flat, p.type.value_field.nullable)
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets, pa.int64() if large else pa.int32()), items,
                           type=p.type, mask=_mask(values, nulls))


#: Zones whose aware datetimes always have an offset (another tzinfo's ``utcoffset`` may be
#: None, which makes its datetime naive).
_WELL_BEHAVED = (datetime.timezone, zoneinfo.ZoneInfo)
_TZINFO = operator.attrgetter("tzinfo")


def _encode_leaf(p: _Leaf, values: Sequence[Any]) -> pa.Array:
    if pa.types.is_timestamp(p.type):
        nulls = _check_kinds(p, values)
        zone = _zone(p.type, values)
        if zone is not _MIXED and (zone is None or _zero_offset(zone)):
            return _timestamps(p.type, values, zone, nulls)
    else:
        _check_leaf(p, values)
    return _convert(values, p.type)


def _check_leaf(p: _Leaf, values: Sequence[Any]) -> bool:
    """Gives up unless every value is exactly a kind the leaf takes (and, for a timestamp,
    aware or naive as it must be). Returns whether some value is None."""
    nulls = _check_kinds(p, values)
    if pa.types.is_timestamp(p.type):
        _zone(p.type, values)
    return nulls


def _check_kinds(p: _Leaf, values: Iterable[Any]) -> bool:
    """Gives up unless every value is exactly a kind the leaf takes. Returns whether some
    value is None."""
    kinds = set(map(type, values))
    nulls = _NONE in kinds
    kinds.discard(_NONE)
    if not kinds <= p.kinds:
        raise _GiveUp
    return nulls


#: What :func:`_zone` returns for datetimes of more than one tzinfo.
_MIXED = object()


def _zone(t: pa.TimestampType, values: Sequence[Any]) -> Any:
    """The one tzinfo of the datetimes ``values`` (None: naive, or no datetime at all), or
    :data:`_MIXED`; gives up unless every one is aware or naive as ``t`` must be."""
    # NB: pyarrow reads a naive datetime into a zoned column as UTC (and converts an
    # aware one into a naive column), where persist refuses both.
    # NB: a datetime is never false, so filter(None, ...) drops exactly the Nones
    zones = set(map(_TZINFO, filter(None, values)))
    if t.tz is None:
        fits = zones <= {None}
    elif None in zones:
        fits = False
    else:
        fits = all(isinstance(z, _WELL_BEHAVED) for z in zones) or all(
            v.utcoffset() is not None for v in values if v is not None)
    if not fits:
        raise _GiveUp
    if len(zones) > 1:
        return _MIXED
    return next(iter(zones), None)


_ZERO = datetime.timedelta(0)


@functools.cache
def _zoneinfo_utc() -> Any:
    """``ZoneInfo("UTC")`` (the cached instance, which pyarrow's own UTC datetimes carry), or
    None where the system has no tz database."""
    try:
        return zoneinfo.ZoneInfo("UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def _zero_offset(zone: Any) -> bool:
    """True for a tzinfo whose offset is 0 at every instant: ``datetime.UTC`` (or another
    ``datetime.timezone`` of offset 0; the class cannot be subclassed) and ``ZoneInfo("UTC")``."""
    if type(zone) is datetime.timezone:
        return bool(zone.utcoffset(None) == _ZERO)
    return zone is _zoneinfo_utc() and zone is not None


_EPOCH = datetime.datetime(1970, 1, 1)
_DURATION_US = pa.duration("us")


def _timestamps(t: pa.TimestampType, values: Sequence[Any], zone: Any,
                nulls: bool) -> pa.Array:
    """Datetimes all naive, or all of one tzinfo ``zone`` of offset 0 (checked by the caller),
    as an array of ``t``: what ``pa.array(values, type=t)`` makes, at a third of its cost.

    NB: pyarrow converts each aware datetime through its ``utcoffset`` (~240 ns each, ~120 ns
    naive). A datetime less an epoch of the same tzinfo object is its wall-clock difference
    (CPython consults no offset when both tzinfos are the same object), which for a zone of
    offset 0 is the instant's; pyarrow converts the timedeltas at ~20 ns each.
    """
    epoch = _EPOCH if zone is None else _EPOCH.replace(tzinfo=zone)
    deltas = ([None if v is None else v - epoch for v in values] if nulls else
              list(map(operator.sub, values, repeat(epoch))))
    try:
        out = pa.array(deltas, type=_DURATION_US).view(pa.timestamp("us", tz=t.tz))
        return out if t.unit == "us" else out.cast(t)  # NB: safe: out of range raises
    except (pa.ArrowException, OverflowError):
        raise _GiveUp from None


def _convert(values: Sequence[Any], t: pa.DataType) -> pa.Array:
    try:
        # NB: pyarrow refuses an int out of range, a decimal beyond its precision or one
        # that would lose digits; the exact kinds checked before keep out what it would
        # convert silently (True into a float, 1.5 into an int, a datetime into a date).
        return pa.array(values, type=t)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise _GiveUp from None


# -- Arrow to Python objects ----------------------------------------------------------------


def decode(p: _Struct, col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of ``col`` (of ``p.type``) as instances of ``p.cls`` (None where null): what
    ``records.struct_decoder`` makes of Arrow's ``to_pylist``, equal and of the same types."""
    if isinstance(col, pa.ChunkedArray):
        return list(chain.from_iterable(_decode_struct(p, c) for c in col.chunks))
    return _decode_struct(p, col)


def _decode_any(p: Plan, arr: pa.Array) -> list[Any]:
    if isinstance(p, _Struct):
        return _decode_struct(p, arr)
    if isinstance(p, _List):
        return _decode_list(p, arr)
    return leaf_values(arr)


def _decode_struct(p: _Struct, arr: pa.Array) -> list[Any]:
    # NB: null records are never built (a __post_init__ may refuse their null fields)
    return _with_nulls(arr, functools.partial(_instances, p), scalars=False)


def _instances(p: _Struct, arr: pa.Array) -> list[Any]:
    """The records of ``arr`` (no nulls) as instances of ``p.cls``."""
    # NB: flatten, not field(i): it applies the array's offset
    children = [_decode_any(fp, c) for fp, c in zip(p.fields, arr.flatten(), strict=True)]
    if p.positional:
        return list(map(p.cls, *children)) if children else [p.cls() for _ in range(len(arr))]
    names = p.cls.__struct_fields__
    return [p.cls(**dict(zip(names, row, strict=True))) for row in zip(*children, strict=True)]


def _decode_list(p: _List, arr: pa.Array) -> list[Any]:
    items = _decode_any(p.item, arr.flatten())
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
    offsets = [0, *np.cumsum(lengths).tolist()]
    out: list[Any] = [items[a:b] for a, b in pairwise(offsets)]
    if arr.null_count:
        for i in np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False)).tolist():
            out[i] = None
    return out


def leaf_values(arr: pa.Array) -> list[Any]:
    """``arr.to_pylist()`` (the same values, of the same types), built faster where pyarrow's
    own conversion is slow: dates, microsecond timestamps (naive, or zoned ``UTC``) and
    decimals."""
    t = arr.type
    try:
        if pa.types.is_date32(t) and _within(arr, _MIN_DAY, _MAX_DAY):
            return _with_nulls(arr, lambda a: a.to_numpy(zero_copy_only=False)
                               .astype(object).tolist())
        if pa.types.is_timestamp(t) and t.unit == "us" and t.tz in (None, "UTC"):
            return _with_nulls(arr, _datetimes)
        if pa.types.is_decimal128(t) and t.scale >= 0:
            return _with_nulls(arr, lambda a: list(map(
                decimal.Decimal, pc.cast(a, pa.string()).to_numpy(zero_copy_only=False))))
    except (ValueError, OverflowError, pa.ArrowException):
        pass  # out of Python's range: to_pylist says so in its own words
    return list(arr.to_pylist())


#: The days of ``datetime.date``'s range since the epoch (numpy makes ints, not dates, of
#: days beyond it).
_MIN_DAY = (datetime.date.min - datetime.date(1970, 1, 1)).days
_MAX_DAY = (datetime.date.max - datetime.date(1970, 1, 1)).days


def _within(arr: pa.Array, lo: int, hi: int) -> bool:
    mm = pc.min_max(arr.cast(pa.int32()))
    least, most = mm["min"].as_py(), mm["max"].as_py()
    return least is None or (lo <= least and most <= hi)


def _with_nulls(arr: pa.Array, convert: Callable[[pa.Array], list[Any]], *,
                scalars: bool = True) -> list[Any]:
    """``convert`` of the non-null values of ``arr``, with None where it is null.

    Args:
        scalars: the values are dates, datetimes or decimals, which numpy scatters in bulk
            (~60 ns less per row than a Python loop); records are placed one by one, since
            numpy would take apart one that behaves as a sequence.
    """
    if not arr.null_count:
        return convert(arr)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    made = convert(arr.filter(pa.array(valid)))
    out = np.empty(len(arr), dtype=object)
    if scalars:
        out[valid] = np.array(made, dtype=object) if made else []
    else:
        deque(map(out.__setitem__, np.flatnonzero(valid).tolist(), made), maxlen=0)
    return list(out.tolist())


@functools.cache
def _utc() -> Any:
    """The tzinfo pyarrow gives a datetime of a ``UTC`` timestamp (its own, so the datetimes
    made here are the ones it makes; first use only: pyarrow's first conversion imports
    pandas)."""
    return pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py().tzinfo


def _datetimes(arr: pa.Array) -> list[datetime.datetime]:
    """Microsecond timestamps (no nulls) as datetimes, zoned ``UTC`` as pyarrow makes them.

    NB: pyarrow converts each zoned value through its zone (~10 us each), and a naive
    datetime's ``replace(tzinfo=...)`` costs ~2 us; the fields computed with numpy and one
    constructor call each cost a tenth of either.
    """
    us = arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype("M8[us]")
    days, months, years = us.astype("M8[D]"), us.astype("M8[M]"), us.astype("M8[Y]")
    rest = (us - days).astype(np.int64)
    fields = [(years.astype(np.int64) + 1970), (months - years).astype(np.int64) + 1,
              (days - months).astype(np.int64) + 1, rest // 3_600_000_000,
              rest // 60_000_000 % 60, rest // 1_000_000 % 60, rest % 1_000_000]
    tz = _utc() if arr.type.tz is not None else None
    return list(map(datetime.datetime, *(f.tolist() for f in fields), repeat(tz)))
