"""Filters: a small, immutable, serializable predicate on a collection's ``(key, value)``.

Built with :func:`col`::

    persist.col("key") == 5
    (persist.col("value.amount") > 10) & persist.col("value.note").is_not_null()
    persist.col("value.city").isin(["Oslo", "Bergen"]) | ~(persist.col("key") < 3)

**Paths** name ``key`` or ``value`` and, for struct columns, a field below them, dotted
(``value.address.city``); ``col("value", "a.b")`` names a field whose own name holds a dot.
Lists cannot be entered: a list (and a struct) can only be tested for null.

**Operations**: ``== != < <= > >=`` against a literal, :meth:`Column.isin`,
:meth:`Column.is_null`, :meth:`Column.is_not_null`, ``&`` (and), ``|`` (or), ``~`` (not).
Python's ``and``/``or``/``not`` and chained comparisons (``1 < col("key") < 5``) cannot be
overloaded: a filter refuses to be used as a bool (``InvalidUsage``) so that they fail loudly.

**Semantics** (SQL's, exactly): a comparison with a null is unknown, ``~`` of unknown is
unknown, ``&``/``|`` are Kleene's, and a row is kept only if the filter is *true*. A field of
a null struct is null. Floats compare numerically (``-0.0 == 0.0``), and NaN equals NaN and is
greater than every other value, including infinity (Spark's rule, and the order persist sorts
in). A literal must fit the field's type by the same rules as a written value
(:func:`persist.indexed.format.records.checker`: no int for a string, no bool for an int, a decimal
within its precision and scale, an aware datetime for a zoned timestamp...); None is not a
literal (use :meth:`Column.is_null`).

**Validation** happens when a filter is used on a collection (:func:`bind`): an unknown path,
a literal that does not fit, or an order comparison of a list raise ``SchemaMismatch`` naming
the path; a collection stored as msgpack (a Python class that is not a mapped
``msgspec.Struct``) cannot be filtered (its bytes have no fields).

**Serialization**: a filter is a tree of frozen ``msgspec.Struct`` records of builtins
(:meth:`Filter.encode` / :func:`decode`, msgpack; they also pickle), so a driver can build one
and ship it to executors. Every literal a field can hold travels exactly, an int past msgpack's
64 bits (a ``decimal128(38, 0)``'s) as a ``"bigint"`` literal of decimal digits; a decoded
literal that is not in its kind's one form is refused.

A bound filter answers two questions: :meth:`Bound.mask` (which rows of a part's table match,
exactly) and :meth:`Bound.may_match` (from :mod:`persist.indexed.format.stats` bounds, whether some
row of a part or batch *may* match: conservative, unknown means yes).
"""

from __future__ import annotations

import datetime
import decimal
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import InvalidUsage, SchemaMismatch
from persist.indexed.format import records
from persist.indexed.format.stats import Bounds, Phys, orderable, path_key, physical

# -- literals ---------------------------------------------------------------------------------

LitKind: TypeAlias = Literal["int", "bigint", "float", "str", "bytes", "bool", "decimal",
                             "date", "datetime"]

#: The ints msgpack carries as ints; an int literal outside them is a ``"bigint"``.
_MSGPACK_INTS = (-(2**63), 2**64 - 1)


class Lit(msgspec.Struct, frozen=True, array_like=True):
    """A literal in its serialized form: ``kind`` and builtin ``data`` (a decimal, date or
    datetime as its ISO string, a datetime keeping its UTC offset, a NaN as ``"nan"``; an int
    that msgpack cannot carry, outside ``-2**63 .. 2**64 - 1``, as its decimal string of kind
    ``"bigint"``; bytes in ``raw``).

    Every literal has exactly one form, checked when it is made or decoded (a decoded filter
    whose literal does not parse is refused, never read as another value).
    """

    kind: LitKind
    data: int | float | str | bool | None = None
    raw: bytes | None = None

    def __post_init__(self) -> None:
        """Checks that ``data`` (and ``raw``) are the form of ``kind``.

        Raises:
            InvalidUsage: they are not (msgspec reports it as a decode error).
        """
        if not _well_formed(self.kind, self.data, self.raw):
            raise InvalidUsage(f"not a filter literal of kind {self.kind!r}: data "
                               f"{self.data!r}, raw {self.raw!r}")

    @classmethod
    def of(cls, v: Any) -> Lit:
        """The literal of a Python value.

        Raises:
            InvalidUsage: None (use ``is_null``), or a type no field has.
        """
        if v is None:
            raise InvalidUsage("None is not a filter literal: use col(...).is_null() or "
                               "is_not_null()")
        if isinstance(v, (bool, np.bool_)):
            return cls("bool", bool(v))
        if isinstance(v, numbers.Integral):
            i = int(v)
            lo, hi = _MSGPACK_INTS
            if lo <= i <= hi:
                return cls("int", i)
            if i.bit_length() > 256:  # wider than any field (and str() refuses 4300 digits)
                raise InvalidUsage(f"an int of {i.bit_length()} bits is not a filter literal: "
                                   f"no field holds it")
            return cls("bigint", str(i))
        if isinstance(v, float):
            return cls._float(v)
        if isinstance(v, str):
            return cls("str", v)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return cls("bytes", raw=bytes(v))
        if isinstance(v, decimal.Decimal):
            if not v.is_finite():
                raise InvalidUsage(f"{v!r} is not a filter literal: decimals are finite")
            return cls("decimal", str(v))
        if isinstance(v, datetime.datetime):
            return cls("datetime", v.isoformat())
        if isinstance(v, datetime.date):
            return cls("date", v.isoformat())
        if isinstance(v, numbers.Real):
            return cls._float(float(v))
        raise InvalidUsage(f"{v!r} ({type(v).__name__}) is not a filter literal: use a bool, "
                           f"int, float, str, bytes, Decimal, date or datetime")

    @classmethod
    def _float(cls, v: float) -> Lit:
        # NB: NaN is stored as the string "nan": a NaN field would make a filter unequal to
        # itself (and to its own decoded copy), and filters are values.
        return cls("float", "nan" if v != v else float(v))

    def value(self) -> Any:
        """The Python value this literal stands for."""
        if self.kind == "float":
            return float(self.data)  # type: ignore[arg-type]
        if self.kind == "bigint":
            assert isinstance(self.data, str)
            return int(self.data)
        if self.kind == "decimal":
            assert isinstance(self.data, str)
            return decimal.Decimal(self.data)
        if self.kind == "datetime":
            assert isinstance(self.data, str)
            return datetime.datetime.fromisoformat(self.data)
        if self.kind == "date":
            assert isinstance(self.data, str)
            return datetime.date.fromisoformat(self.data)
        if self.kind == "bytes":
            return self.raw
        return self.data


_BIGINT = re.compile(r"-?[1-9][0-9]*")


def _well_formed(kind: str, data: object, raw: object) -> bool:
    """Whether ``(kind, data, raw)`` is the one form :meth:`Lit.of` gives a value of ``kind``."""
    if kind == "bytes":
        return data is None and isinstance(raw, bytes)
    if raw is not None:
        return False
    if kind == "bool":
        return isinstance(data, bool)
    if kind == "int":
        return isinstance(data, int) and not isinstance(data, bool)
    if kind == "float":
        return (isinstance(data, float) and data == data) or data == "nan"
    if not isinstance(data, str):
        return False
    if kind == "str":
        return True
    try:
        if kind == "bigint":
            lo, hi = _MSGPACK_INTS
            return _BIGINT.fullmatch(data) is not None and not lo <= int(data) <= hi
        if kind == "decimal":
            return decimal.Decimal(data).is_finite() and str(decimal.Decimal(data)) == data
        if kind == "date":
            datetime.date.fromisoformat(data)
        else:  # "datetime"
            datetime.datetime.fromisoformat(data)
    except (ValueError, decimal.InvalidOperation):  # int() of over 4300 digits included
        return False
    return True


# -- the expression form ----------------------------------------------------------------------

CompareOp: TypeAlias = Literal["==", "!=", "<", "<=", ">", ">="]
_NEGATED: dict[str, CompareOp] = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=",
                                  ">=": "<"}


class Filter(msgspec.Struct, frozen=True, tag_field="op"):
    """A predicate on ``(key, value)``: combine with ``&``, ``|``, ``~``; see the module
    docstring. Immutable and hashable; equal filters compare equal."""

    def __and__(self, other: Filter) -> Filter:
        """Both hold (Kleene: false wins over unknown)."""
        return And(cast("tuple[AnyFilter, ...]", (*_items(self, And), *_items(_checked(other), And))))

    def __or__(self, other: Filter) -> Filter:
        """Either holds (Kleene: true wins over unknown)."""
        return Or(cast("tuple[AnyFilter, ...]", (*_items(self, Or), *_items(_checked(other), Or))))

    def __invert__(self) -> Filter:
        """The negation (unknown stays unknown)."""
        return Not(cast("AnyFilter", self))

    def __bool__(self) -> bool:
        """Refused: ``and``/``or``/``not`` and chained comparisons would silently drop a part
        of the filter.

        Raises:
            InvalidUsage: always.
        """
        raise InvalidUsage("a persist filter has no truth value: combine filters with & | ~ "
                           "(not and/or/not), and write 1 < x < 5 as (x > 1) & (x < 5)")

    def encode(self) -> bytes:
        """The filter as msgpack bytes; :func:`decode` reads them back."""
        return _ENC.encode(self)

    def paths(self) -> list[tuple[str, ...]]:
        """The field paths the filter reads, in order of appearance (with repeats)."""
        return list(_paths(self))


class Compare(Filter, frozen=True, tag="cmp"):
    """``path <cmp> value``."""

    path: tuple[str, ...]
    cmp: CompareOp
    value: Lit


class IsIn(Filter, frozen=True, tag="in"):
    """``path`` equals one of ``values`` (an empty list matches nothing)."""

    path: tuple[str, ...]
    values: tuple[Lit, ...]


class IsNull(Filter, frozen=True, tag="null"):
    """``path`` is null (a field of a null struct is null)."""

    path: tuple[str, ...]


class IsNotNull(Filter, frozen=True, tag="notnull"):
    """``path`` is not null."""

    path: tuple[str, ...]


class And(Filter, frozen=True, tag="and"):
    """Every one of ``items`` holds (true when empty)."""

    items: tuple[AnyFilter, ...]


class Or(Filter, frozen=True, tag="or"):
    """Some one of ``items`` holds (false when empty)."""

    items: tuple[AnyFilter, ...]


class Not(Filter, frozen=True, tag="not"):
    """``item`` does not hold (unknown when it is unknown)."""

    item: AnyFilter


AnyFilter: TypeAlias = Compare | IsIn | IsNull | IsNotNull | And | Or | Not
_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(AnyFilter)


def decode(data: bytes) -> Filter:
    """The filter :meth:`Filter.encode` made.

    Raises:
        InvalidUsage: ``data`` is not an encoded filter.
    """
    try:
        f: Filter = _DEC.decode(data)
    except (msgspec.DecodeError, TypeError) as e:
        raise InvalidUsage(f"not an encoded persist filter: {e}") from e
    _check_tree(f)
    return f


def _items(f: Filter, kind: type[And] | type[Or]) -> tuple[Filter, ...]:
    """``f``'s items if it is a ``kind`` (so ``a & b & c`` is one And of three), else ``(f,)``."""
    return f.items if isinstance(f, kind) else (f,)


def _checked(f: object) -> Filter:
    if not isinstance(f, Filter):
        raise InvalidUsage(f"{f!r} is not a persist filter (build one with persist.col)")
    return f


def _check_tree(f: Filter) -> None:
    """Checks what msgspec's types cannot: paths start at key or value, and are not empty."""
    for p in _paths(f):
        _check_path(p)


def _check_path(p: tuple[str, ...]) -> None:
    if not p or p[0] not in ("key", "value") or not all(isinstance(s, str) and s for s in p):
        raise InvalidUsage(f"filter path {'.'.join(map(str, p))!r} must start at 'key' or "
                           f"'value' and name non-empty fields")


def _paths(f: Filter) -> Iterable[tuple[str, ...]]:
    if isinstance(f, (Compare, IsIn, IsNull, IsNotNull)):
        yield f.path
    elif isinstance(f, (And, Or)):
        for x in f.items:
            yield from _paths(x)
    elif isinstance(f, Not):
        yield from _paths(f.item)


class Column:
    """A field of ``key`` or ``value`` to build a filter on (made by :func:`col`)."""

    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    def __init__(self, path: tuple[str, ...]) -> None:
        """Names the field at ``path`` (segments; see :func:`col`)."""
        _check_path(path)
        self.path = path

    def __repr__(self) -> str:
        return f"col({'.'.join(self.path)!r})"

    def _cmp(self, op: CompareOp, other: Any) -> Compare:
        if isinstance(other, (Column, Filter)):
            raise InvalidUsage(f"{self!r} {op} {other!r}: a field is compared with a literal, "
                               f"not with another field or filter")
        return Compare(self.path, op, Lit.of(other))

    def __eq__(self, other: Any) -> Compare:  # type: ignore[override]
        """``field == other`` (a literal)."""
        return self._cmp("==", other)

    def __ne__(self, other: Any) -> Compare:  # type: ignore[override]
        """``field != other`` (a literal; unknown for a null field)."""
        return self._cmp("!=", other)

    def __lt__(self, other: Any) -> Compare:
        """``field < other`` (a literal)."""
        return self._cmp("<", other)

    def __le__(self, other: Any) -> Compare:
        """``field <= other`` (a literal)."""
        return self._cmp("<=", other)

    def __gt__(self, other: Any) -> Compare:
        """``field > other`` (a literal)."""
        return self._cmp(">", other)

    def __ge__(self, other: Any) -> Compare:
        """``field >= other`` (a literal)."""
        return self._cmp(">=", other)

    def isin(self, values: Iterable[Any]) -> IsIn:
        """The field equals one of ``values`` (literals; an empty list matches nothing).

        Raises:
            InvalidUsage: a string or bytes given as the whole list, or a value that is not a
                literal.
        """
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise InvalidUsage(f"{self!r}.isin takes a list of literals, not {values!r}")
        return IsIn(self.path, tuple(Lit.of(v) for v in values))

    def is_null(self) -> IsNull:
        """The field is null (or lies in a null struct)."""
        return IsNull(self.path)

    def is_not_null(self) -> IsNotNull:
        """The field is not null."""
        return IsNotNull(self.path)

    def __bool__(self) -> bool:
        """Refused (see ``Filter.__bool__``).

        Raises:
            InvalidUsage: always.
        """
        raise InvalidUsage(f"{self!r} has no truth value: compare it to build a filter")


def col(*path: str) -> Column:
    """The field to filter on: ``col("key")``, ``col("value.amount")`` (dotted into struct
    fields), or segments given one by one (``col("value", "a.b")`` for a field named ``a.b``).

    Raises:
        InvalidUsage: no path, or one that does not start at ``key`` or ``value``.
    """
    if not path or not all(isinstance(p, str) for p in path):
        raise InvalidUsage(f"col() takes a field path such as 'value.amount', not {path!r}")
    segments = tuple(path[0].split(".")) if len(path) == 1 else tuple(path)
    return Column(segments)


# -- binding to a collection's types ----------------------------------------------------------

_Leaf: TypeAlias = Literal["==", "!=", "<", "<=", ">", ">=", "in", "notin", "null", "notnull"]


@dataclass(frozen=True)
class _Pred:
    """One test of one field, negation already pushed into it."""

    op: _Leaf
    segments: tuple[str, ...]
    key: str  # stats.path_key(segments)
    type: pa.DataType
    #: The literal(s) as scalars of the field's type (float64 for any float field).
    scalars: tuple[pa.Scalar, ...] = ()
    #: The same in stats form (stats.physical); NaN marked separately.
    phys: tuple[Phys, ...] = ()
    nan: bool = False  # a float literal that is NaN (or, for in/notin, NaN is among them)


@dataclass(frozen=True)
class _Junction:
    all: bool  # True: and; False: or
    items: tuple[_Node, ...]


_Node: TypeAlias = _Pred | _Junction


@dataclass(frozen=True)
class Bound:
    """A filter checked against a collection's key and value types (:func:`bind`), in negation
    normal form: negations pushed down into the tests (exact under SQL's three-valued logic).
    Thread-safe and reusable across parts."""

    filter: Filter
    root: _Node

    def mask(self, table: pa.Table) -> pa.Array:
        """Which rows of ``table`` (a part's columns ``key, value, ...``) the filter holds for:
        a boolean array without nulls (unknown counts as not matching)."""
        n = len(table)
        out = _mask(self.root, table, n)
        return out

    def may_match(self, bounds: Callable[[str], Bounds | None]) -> bool:
        """Whether some row described by ``bounds`` (a field's stats name to what is known of
        it over those rows, None: nothing) may match. False only when the bounds prove that
        no row does."""
        return _may(self.root, bounds)

    def paths(self) -> set[str]:
        """The stats names (``stats.path_key``) of the fields the filter reads."""
        out: set[str] = set()
        _collect(self.root, out)
        return out


def _collect(node: _Node, out: set[str]) -> None:
    if isinstance(node, _Pred):
        out.add(node.key)
    else:
        for x in node.items:
            _collect(x, out)


def bind(f: Filter, key_type: pa.DataType, value_type: pa.DataType, *,
         key_codec: str | None = None, value_codec: str | None = None) -> Bound:
    """Checks ``f`` against a collection's types and compiles it for :meth:`Bound.mask` and
    :meth:`Bound.may_match`.

    Args:
        f: the filter.
        key_type, value_type: the collection's stored Arrow types.
        key_codec, value_codec: the class name of a column stored as msgpack or as a mapped
            ``msgspec.Struct`` (``CollectionMeta.key_codec``), if any.

    Raises:
        InvalidUsage: ``f`` is not a filter.
        SchemaMismatch: a path names no field, a literal does not fit its field, an order
            comparison or ``isin`` on a list or struct, or a filter on a msgpack column;
            naming the path.
    """
    f = _checked(f)
    cols = {"key": (key_type, key_codec), "value": (value_type, value_codec)}
    return Bound(f, _compile(f, cols, negate=False))


def _compile(f: Filter, cols: Mapping[str, tuple[pa.DataType, str | None]], *,
             negate: bool) -> _Node:
    if isinstance(f, Not):
        return _compile(f.item, cols, negate=not negate)
    if isinstance(f, (And, Or)):
        is_and = isinstance(f, And) != negate  # De Morgan
        return _Junction(is_and, tuple(_compile(x, cols, negate=negate) for x in f.items))
    if isinstance(f, IsNull):
        return _pred("notnull" if negate else "null", f.path, cols, ())
    if isinstance(f, IsNotNull):
        return _pred("null" if negate else "notnull", f.path, cols, ())
    if isinstance(f, Compare):
        return _pred(_NEGATED[f.cmp] if negate else f.cmp, f.path, cols, (f.value,))
    if isinstance(f, IsIn):
        return _pred("notin" if negate else "in", f.path, cols, f.values)
    raise InvalidUsage(f"{f!r} is not a persist filter")


def _pred(op: _Leaf, segments: tuple[str, ...],
          cols: Mapping[str, tuple[pa.DataType, str | None]], lits: tuple[Lit, ...]) -> _Pred:
    _check_path(segments)
    name = ".".join(segments)
    t, codec = cols[segments[0]]
    if codec is not None and pa.types.is_binary(t):
        raise SchemaMismatch(f"{name}: the {segments[0]} is stored as msgpack ({codec}); "
                             f"filters need Arrow-typed fields")
    for i, s in enumerate(segments[1:], start=1):
        if not pa.types.is_struct(t):
            where = ".".join(segments[:i])
            raise SchemaMismatch(f"{name}: no such field ({where} is {t}, not a struct)")
        idx = t.get_field_index(s)
        if idx < 0:
            have = ", ".join(t.field(j).name for j in range(t.num_fields))
            raise SchemaMismatch(f"{name}: no such field ({'.'.join(segments[:i])} has "
                                 f"{have})")
        t = t.field(idx).type
    key = path_key(segments)
    if op in ("null", "notnull"):
        return _Pred(op, segments, key, t)
    if not orderable(t):
        raise SchemaMismatch(f"{name}: a {t} field cannot be compared (only is_null and "
                             f"is_not_null apply to it)")
    check = records.checker(t)
    scalars: list[pa.Scalar] = []
    phys: list[Phys] = []
    nan = False
    for lit in lits:
        v = lit.value()
        check(v, name)
        if pa.types.is_floating(t):
            x = float(v)
            if x != x:
                nan = True
                continue
            # NB: -0.0 == 0.0 for every test; one zero lets isin's hash lookup agree.
            s = pa.scalar(0.0 if x == 0 else x, pa.float64())
        else:
            try:
                s = pa.scalar(v, type=t)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
                raise SchemaMismatch(f"{name}: {v!r} does not fit {t}: {e}") from e
        scalars.append(s)
        p = physical(s)
        assert p is not None
        phys.append(p)
    return _Pred(op, segments, key, t, tuple(scalars), tuple(phys), nan)


# -- evaluating on rows -----------------------------------------------------------------------


def _field(table: pa.Table, segments: tuple[str, ...]) -> pa.ChunkedArray:
    """The field at ``segments``, nulls of the structs above it folded in."""
    c = table.column(segments[0])
    for s in segments[1:]:
        c = pc.struct_field(c, s)
    return c


def _mask(node: _Node, table: pa.Table, n: int) -> pa.Array:
    if isinstance(node, _Junction):
        if not node.items:
            return pa.array(np.full(n, node.all))
        out = _mask(node.items[0], table, n)
        for x in node.items[1:]:
            out = pc.and_(out, _mask(x, table, n)) if node.all else pc.or_(out, _mask(x, table, n))
        return out
    c = _field(table, node.segments)
    return _combined(pc.fill_null(_test(node, c), False))


def _combined(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


# NB: every test below is "definitely true": unknown (a null field) gives null, filled with
# false by the caller. That is exact because the compiled form is in negation normal form: and
# and or are monotone, so treating unknown as false at the tests gives what SQL's Kleene logic
# gives at the top, where unknown rows are dropped too.
def _test(p: _Pred, c: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    op = p.op
    if op == "null":
        return pc.is_null(c)
    if op == "notnull":
        return pc.is_valid(c)
    if pa.types.is_floating(p.type):
        return _float_test(p, c.cast(pa.float64()) if c.type != pa.float64() else c)
    if op in ("in", "notin"):
        hit = _isin(c, p)
        return hit if op == "in" else pc.and_(pc.is_valid(c), pc.invert(hit))
    return _CMP[op](c, p.scalars[0])


_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
    ">": pc.greater, ">=": pc.greater_equal,
}


def _isin(c: pa.ChunkedArray, p: _Pred) -> pa.ChunkedArray | pa.Array:
    if not p.scalars:
        return pc.if_else(pc.is_valid(c), False, None)
    return pc.is_in(c, value_set=pa.array(p.scalars, type=p.scalars[0].type))


def _float_test(p: _Pred, c: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """A float test under NaN-is-greatest, NaN-equals-NaN (see the module docstring)."""
    op = p.op
    valid = pc.is_valid(c)
    isnan = pc.fill_null(pc.is_nan(c), False)
    if op in ("in", "notin"):
        # NB: is_in looks values up by hash, that is by their bits, where -0.0 is not 0.0:
        # both sides get one zero (the literals did in _pred), so isin agrees with ==.
        c = pc.if_else(pc.equal(c, 0.0), 0.0, c)
        hit = _isin(c, p) if p.scalars else pc.fill_null(pc.is_in(c, value_set=pa.array(
            [], pa.float64())), False)
        if p.nan:
            hit = pc.or_(hit, isnan)
        return pc.and_(valid, hit) if op == "in" else pc.and_(valid, pc.invert(hit))
    if p.nan:  # the literal is NaN: the greatest value, equal only to NaN
        return {"==": isnan, "!=": pc.and_(valid, pc.invert(isnan)),
                "<": pc.and_(valid, pc.invert(isnan)), "<=": valid,
                ">": pc.and_(valid, False), ">=": isnan}[op]
    s = p.scalars[0]
    base = _CMP[op](c, s)
    if op in (">", ">="):
        return pc.or_(pc.fill_null(base, False), isnan)
    if op in ("<", "<=", "=="):
        return pc.fill_null(base, False)  # NaN compares false with a number: right here
    return base  # "!=": NaN != x is true, as wanted


# -- deciding from stats ----------------------------------------------------------------------


def _may(node: _Node, bounds: Callable[[str], Bounds | None]) -> bool:
    if isinstance(node, _Junction):
        if node.all:
            return all(_may(x, bounds) for x in node.items)
        return any(_may(x, bounds) for x in node.items)
    b = bounds(node.key)
    if b is None:
        return True
    try:
        return _may_pred(node, b)
    except TypeError:  # bounds of another kind than the literal (never stored so): unknown
        return True


def _may_pred(p: _Pred, b: Bounds) -> bool:
    """Conservative: False only if ``b`` proves that no row passes ``p``."""
    op = p.op
    if op == "null":
        return b.nulls is None or b.nulls > 0
    nonnull = b.nulls is None or b.nulls < b.rows
    if op == "notnull" or not nonnull:
        return nonnull  # every comparison of a null is unknown: an all-null field matches none
    if pa.types.is_floating(p.type):
        some_nan = b.nans is None or b.nans > 0
        some_number = b.nans is None or b.nulls is None or b.nulls + b.nans < b.rows
    else:
        some_nan, some_number = False, True
    lo, hi = b.lo, b.hi
    if op in ("==", "in"):
        return (p.nan and some_nan) or (some_number and any(_within(v, lo, hi) for v in p.phys))
    if op in ("!=", "notin"):
        # NB: a NaN row differs from every number; a number row from the literals unless the
        # bounds pin every number to one value that is among them.
        pinned = lo is not None and hi is not None and _eq(lo, hi) and \
            any(_eq(lo, v) for v in p.phys)
        return (some_nan and not p.nan) or (some_number and not pinned)
    if p.nan:  # compared with NaN, the greatest value
        return {"<": some_number, "<=": True, ">": False, ">=": some_nan}[op]
    v = p.phys[0]
    if op == "<":
        return some_number and (lo is None or _lt(lo, v))
    if op == "<=":
        return some_number and (lo is None or not _lt(v, lo))
    if op == ">":
        return some_nan or (some_number and (hi is None or _lt(v, hi)))
    return some_nan or (some_number and (hi is None or not _lt(hi, v)))  # ">="


def _lt(a: Phys, b: Phys) -> bool:
    return bool(a < b)  # type: ignore[operator]


def _eq(a: Phys, b: Phys) -> bool:
    return type(a) is type(b) and a == b


def _within(v: Phys, lo: Phys | None, hi: Phys | None) -> bool:
    return (lo is None or not _lt(v, lo)) and (hi is None or not _lt(hi, v))


__all__ = ["And", "Bound", "Column", "Compare", "Filter", "IsIn", "IsNotNull", "IsNull", "Lit",
           "Not", "Or", "bind", "col", "decode"]
