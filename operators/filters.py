"""Spark's pushed filters in persist's filter form (:mod:`persist.indexed.read.filter`).

Spark (pyspark >= 4.1, with ``spark.sql.python.filterPushdown.enabled=true``) hands a batch
reader the conjuncts of a query's ``WHERE`` that it can express as
``pyspark.sql.datasource.Filter`` objects: a comparison of one column path (a tuple of names,
``("value", "amount")``) with a literal, ``IN``, ``IS [NOT] NULL``, ``LIKE`` prefixes,
suffixes and infixes, and the negation of any of these. ``OR`` and ``AND`` below the top level
never arrive (Spark keeps them itself). :func:`push` turns each into a persist filter where it
can do so **exactly**, and returns the rest for Spark to apply after the scan:

======================================  ==========================================
Spark                                   persist
======================================  ==========================================
``EqualTo(p, v)`` ... ``LessThanOrEqual``  ``col(p) == v`` ... ``col(p) <= v``
``EqualNullSafe(p, v)``                 ``col(p) == v`` (``is_null`` for ``v`` None)
``Not(EqualNullSafe(p, v))``            ``col(p).is_null() | (col(p) != v)``
``In(p, vs)`` (no null among ``vs``)    ``col(p).isin(vs)``
``IsNull(p)``, ``IsNotNull(p)``         ``col(p).is_null()``, ``col(p).is_not_null()``
``StringStartsWith(p, s)``              ``(col(p) >= s) & (col(p) < s')``, ``s'`` the least
                                        string above every string starting with ``s``
``Not(f)``                              ``~f`` (three-valued, as Spark's ``NOT``)
======================================  ==========================================

Not pushed (returned to Spark): filters on ``time`` or ``diff`` (a consolidated row's time is
``as_of`` and its diff a sum, neither known before consolidating; a raw row's time is forwarded
to ``as_of``), ``StringEndsWith``/``StringContains``, a comparison with a struct or an array
literal, ``IN`` with a null, a path that names no field or a field of a msgpack-stored column,
and any literal that does not convert *exactly* to the field's stored type (a microsecond
timestamp against a ``timestamp[s]`` field, a negative number against a ``uint8``, ...): persist
never pushes a lossy version of a filter.

Why pushing is sound for every read mode: a persist filter reads only ``(key, value)``, and
gives equal records the same answer (see ``_load`` in :mod:`persist.indexed.read.scan`), so
every group of rows that consolidates together is kept whole or dropped whole; filtering
before consolidating equals filtering after. Raw rows are filtered
one by one. Spark's semantics and persist's agree on every pushed form: SQL's three-valued
logic, a field of a null struct is null, strings and binaries compare bytewise (code point
order), floats with ``-0.0 == 0.0`` and NaN equal to NaN and above every number, timestamps as
instants (Spark's literals arrive as UTC-aware datetimes; persist compares them with the
stored zone's instants) and ``timestamp_ntz`` as naive wall-clock values.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import datasource as sds

import persist
from persist import Column, Filter, InvalidUsage, SchemaMismatch, col

log = logging.getLogger("persist.spark")

#: The columns whose fields a pushed filter may name (``time`` and ``diff`` are Spark's).
FILTERABLE = ("key", "value")

#: Spark's comparison filters by class name (the classes exist from pyspark 4.1 on: this
#: module is imported on 4.0 too, where nothing is ever pushed).
_COMPARE: dict[str, str] = {
    "EqualTo": "==",
    "GreaterThan": ">",
    "GreaterThanOrEqual": ">=",
    "LessThan": "<",
    "LessThanOrEqual": "<=",
}

#: A persist comparison per operator (``persist.col`` overloads them).
_OPS: dict[str, Callable[[Column, Any], Filter]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge,
    "<": operator.lt, "<=": operator.le,
}

#: The Python types a literal may have to be pushed (what pyspark's filter deserializer
#: yields for Spark's atomic types; dicts, lists and ``VariantVal``s are not literals here).
_LITERAL = (bool, int, float, str, bytes, decimal.Decimal, datetime.date, datetime.datetime)

# Unicode's surrogates, which no valid str holds: the successor of U+D7FF is U+E000.
_SURROGATES = range(0xD800, 0xE000)
_MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class Pushed:
    """What a reader accepted: the persist filter (the conjunction of every accepted Spark
    filter; None if none was) and a readable form of each accepted Spark filter."""

    filter: Filter | None
    accepted: tuple[str, ...]


def _column(path: Sequence[str]) -> Column | None:
    if len(path) == 0 or path[0] not in FILTERABLE:
        return None
    if not all(isinstance(s, str) and s for s in path):
        return None
    return col(*path) if len(path) > 1 else col(path[0])


def _literal(v: Any) -> bool:
    # NB: bool is an int; both are literals. A dict (a struct literal) or a list (an array
    # literal) is not: persist compares leaves only.
    return isinstance(v, _LITERAL) and not isinstance(v, (list, dict))


def _successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix`` (non-empty), in
    code point order: the prefix with its last code point incremented (skipping surrogates);
    None if that code point is already the greatest."""
    last = ord(prefix[-1])
    if last >= _MAX_CODE_POINT:
        return None
    nxt = last + 1
    if nxt in _SURROGATES:
        nxt = _SURROGATES.stop
    return prefix[:-1] + chr(nxt)


def translate(f: sds.Filter) -> Filter | None:
    """The persist filter that holds for exactly the rows ``f`` holds for, under SQL's
    three-valued logic; None if there is none (persist cannot express it, or not exactly).

    Types are not checked here: :func:`push` binds the result to the collection's types, and
    a literal that does not fit its field exactly is refused there.

    NB: ``s`` starts with ``p`` iff ``p <= s < successor(p)`` in code point order, which is
    the bytewise order of UTF-8 that both Spark and Arrow compare strings in: such an ``s``
    agrees with ``p`` up to its last character, where it holds exactly ``p``'s last one.
    """
    try:
        return _translate(f)
    except InvalidUsage:  # a literal persist's filters do not take (Lit.of refused it)
        return None


def _translate(f: sds.Filter) -> Filter | None:
    if isinstance(f, sds.Not):
        child = f.child
        if isinstance(child, sds.EqualNullSafe):
            c = _column(child.attribute)
            if c is None:
                return None
            if child.value is None:
                return c.is_not_null()
            if not _literal(child.value):
                return None
            # NB: NOT (a <=> v) is true when a is null (null-safe), unlike NOT (a = v).
            return c.is_null() | _compare(c, "!=", child.value)
        inner = _translate(child)
        return None if inner is None else ~inner
    if isinstance(f, (sds.IsNull, sds.IsNotNull)):
        c = _column(f.attribute)
        if c is None:
            return None
        return c.is_null() if isinstance(f, sds.IsNull) else c.is_not_null()
    if isinstance(f, sds.EqualNullSafe):
        c = _column(f.attribute)
        if c is None:
            return None
        if f.value is None:
            return c.is_null()
        # NB: with a non-null literal, a <=> v is false where a = v is unknown (a null);
        # either way the row is not kept, and under NOT it is handled above.
        return _compare(c, "==", f.value) if _literal(f.value) else None
    op = _COMPARE.get(type(f).__name__)
    if op is not None:
        c = _column(f.attribute)  # type: ignore[attr-defined]
        value = f.value  # type: ignore[attr-defined]
        if c is None or not _literal(value):
            return None
        return _compare(c, op, value)
    if isinstance(f, sds.In):
        c = _column(f.attribute)
        values = tuple(f.value)
        # NB: a null among the values makes a miss unknown rather than false, which only NOT
        # could tell apart; not worth a special case.
        if c is None or not all(v is not None and _literal(v) for v in values):
            return None
        return c.isin(values)
    if isinstance(f, sds.StringStartsWith):
        c = _column(f.attribute)
        prefix = f.value
        if c is None or not isinstance(prefix, str):
            return None
        if prefix == "":
            return c.is_not_null()
        nxt = _successor(prefix)
        if nxt is None:
            return None
        return _compare(c, ">=", prefix) & _compare(c, "<", nxt)
    return None  # StringEndsWith, StringContains, and anything newer


def _compare(c: Column, op: str, v: Any) -> Filter:
    """``c <op> v``; raises InvalidUsage for a value persist's literals do not take."""
    return _OPS[op](c, v)


def pushdown_safe() -> bool:
    """Whether this pyspark plans each scan's pushed read on its own, so that what one query
    pushed cannot leak into another: the condition for ``filterPushdown=auto`` to push.

    NB: pyspark 4.1-4.3 keep the read plan made while pushing filters (partitions and the
    pickled reader) on the DataFrame's *data source* (``PythonDataSourceV2.readInfo`` on the
    JVM side), and reuse it for every later scan of that DataFrame that has no filter Spark
    hands to Python (none at all, only ``OR``s, ...). Checked on 4.3.0: after
    ``df.where("value.label = 'l3'").count()``, ``df.count()`` counted only the ``l3`` rows.
    SPARK-58551 (the Python data source limit pushdown, which added
    ``DataSourceReader.pushLimit``) scoped that plan to each scan; its presence is the sign
    looked for here.
    """
    return hasattr(sds.DataSourceReader, "pushLimit")


def push(filters: Iterable[sds.Filter], info: persist.distributed.CollectionInfo, schema_version: int
         ) -> tuple[Pushed, list[sds.Filter]]:
    """Splits Spark's pushed ``filters`` into what persist applies exactly (returned as
    :class:`Pushed`) and what Spark must still apply (the returned list, the very objects it
    passed, as ``pushFilters`` requires).

    Each filter is translated (:func:`translate`) and bound to the collection's stored types
    on its own (``CollectionInfo.check_filter``), so one that names no field or carries a
    literal that does not fit is returned to Spark without affecting the others.
    """
    accepted: list[Filter] = []
    names: list[str] = []
    rest: list[sds.Filter] = []
    for f in filters:
        pf = translate(f)
        if pf is not None:
            try:
                info.check_filter(pf, schema_version)
            except (SchemaMismatch, InvalidUsage) as e:
                log.debug("not pushing %r into persist: %s", f, e)
                pf = None
        if pf is None:
            rest.append(f)
            continue
        accepted.append(pf)
        names.append(repr(f))
    if not accepted:
        return Pushed(None, ()), rest
    return Pushed(functools.reduce(operator.and_, accepted), tuple(names)), rest


__all__ = ["FILTERABLE", "Pushed", "push", "pushdown_safe", "translate"]
