"""Schema evolution without rewrite: schema versions, the evolution rules, and migration on read.

A collection starts with one schema, version 0 (its registered key and value types). Each
:class:`~persist.indexed.format.meta.EvolveSchema` op adds the next version; ``CollectionMeta.schemas``
keeps them all and ``key_type``/``value_type`` are always the newest, the *current* version.
Which changes are allowed is :func:`persist.indexed.format.records.evolution_problems` (on Arrow types)
plus :func:`problems` here (msgpack-coded columns cannot evolve).

**Parts are never rewritten by an evolution.** Each keeps the schema it was written with
(``PartMeta.schema_id``) and is migrated when read:

* *Forward* (an older version to a newer one) always succeeds: added fields are null, dropped
  fields removed, widened values cast exactly.
* *Backward* (a newer version to an older one, for a handle opened with an older schema): fields
  added later are removed, fields dropped later are null (a typed error if the old version
  declares them non-nullable and a record needs one), widened values are narrowed only if they
  fit exactly (else :class:`~persist.errors.SchemaMismatch` naming the field and value: never a
  truncation).

**What a collection holds is always its current version's records.** A read as of version
``s`` migrates every part to the current version, consolidates there, and migrates the result
back to ``s`` (consolidating again: a projection may make two records equal). Compaction
migrates the parts it merges to the current version; since reads always pass through it, no
merge can change what any reader sees, and every reader of one state sees the same records at
the same version. A later evolution changes what an older version reads only by dropping a
field (that is what dropping means: its values are gone for every reader).

Migration works in steps between adjacent versions (fields matched by name: a field dropped
and later added again under the same name is a new field, as it must be), over the Arrow
buffers: a struct is rebuilt from its children, so an added field costs one null column and a
dropped one nothing.

**Old-schema writers** (a handle opened with an older version, say a replica's blue deployment
still writing): their updates are normalized to their version and migrated forward to the
current one when the runtime commits them (parts staged by other processes keep their version
and are migrated on read). That loses nothing while every change since their version added
fields, widened types or relaxed nullability; once a later version dropped a field of theirs,
their writes are refused (:class:`~persist.errors.SchemaMismatch`) instead of losing its values.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import Corruption, InvalidUsage, SchemaMismatch
from persist.indexed.format import columnar, records
from persist.indexed.format.columnar import Codec
from persist.indexed.format.meta import CollectionMeta, EvolveSchema, PartMeta, SchemaVersion

_Live = npt.NDArray[np.bool_]
#: A stored column: its Arrow type and its codec name (``CollectionMeta.key_codec``).
_Column = tuple[pa.DataType, str | None]

# -- versions ---------------------------------------------------------------------------------


def history(c: CollectionMeta) -> tuple[SchemaVersion, ...]:
    """Every schema version of ``c``, oldest first (``history(c)[i].id == i``); a collection
    that never evolved has one, version 0, its registered types."""
    if c.schemas is msgspec.UNSET:
        return (SchemaVersion(id=0, key_type=c.key_type, value_type=c.value_type,
                              key_codec=c.key_codec, value_codec=c.value_codec),)
    return c.schemas


def version(c: CollectionMeta) -> int:
    """The current (newest) schema version of ``c``."""
    return 0 if c.schemas is msgspec.UNSET else len(c.schemas) - 1


def part_version(p: PartMeta) -> int:
    """The schema version ``p`` was written with (0 for parts that do not say)."""
    return 0 if p.schema_id is msgspec.UNSET else p.schema_id


def tag(p: PartMeta, schema_id: int) -> PartMeta:
    """``p`` recording that it was written with schema version ``schema_id`` (version 0 is
    left unsaid, so such parts keep their version-1/2 bytes)."""
    if schema_id == part_version(p):
        return p
    return msgspec.structs.replace(p, schema_id=schema_id if schema_id else msgspec.UNSET)


def codecs(s: SchemaVersion) -> tuple[Codec, Codec]:
    """The key and value codecs of schema version ``s`` (see ``Codec.from_meta``).

    Raises:
        Corruption: a type that does not decode.
    """
    return Codec.from_meta(s.key_type, s.key_codec), Codec.from_meta(s.value_type, s.value_codec)


@dataclass(frozen=True)
class Types:
    """The decoded types of one schema version of a collection: its key and value codecs and
    its part schema (``key, value, time, diff``)."""

    key: Codec
    value: Codec
    schema: pa.Schema

    @classmethod
    def of(cls, c: CollectionMeta, schema_id: int | None = None) -> Types:
        """The codecs and part schema ``c``'s metadata records (see ``Codec.from_meta``) for
        its schema version ``schema_id`` (None: the current one; an index into
        :func:`history`).

        Raises:
            Corruption: a stored type does not decode.
        """
        if schema_id is None or schema_id == version(c):
            k = Codec.from_meta(c.key_type, c.key_codec)
            v = Codec.from_meta(c.value_type, c.value_codec)
        else:
            k, v = codecs(history(c)[schema_id])
        return cls(k, v, columnar.part_schema(k.arrow_type, v.arrow_type))


def evolved(c: CollectionMeta, s: SchemaVersion) -> CollectionMeta:
    """``c`` with ``s`` registered as its newest version (an :class:`EvolveSchema` applied)."""
    return msgspec.structs.replace(c, schemas=(*history(c), s), key_type=s.key_type,
                                   value_type=s.value_type, key_codec=s.key_codec,
                                   value_codec=s.value_codec)


@dataclass(frozen=True)
class Schemas:
    """The decoded Arrow types of every schema version of a collection. Picklable."""

    #: ``(key type, value type)`` per version, oldest first.
    types: tuple[tuple[pa.DataType, pa.DataType], ...]

    @classmethod
    def of(cls, c: CollectionMeta) -> Schemas:
        """``c``'s versions (cached per history).

        Raises:
            Corruption: a stored type does not decode.
        """
        return _schemas(history(c))

    @property
    def current(self) -> int:
        """The newest version."""
        return len(self.types) - 1

    def part_schema(self, schema_id: int) -> pa.Schema:
        """The schema of parts written with version ``schema_id``."""
        return columnar.part_schema(*self.types[schema_id])


@functools.lru_cache(maxsize=256)
def _schemas(versions: tuple[SchemaVersion, ...]) -> Schemas:
    return Schemas(tuple((columnar.deserialize_type(s.key_type),
                          columnar.deserialize_type(s.value_type)) for s in versions))


# -- the rules ------------------------------------------------------------------------------


def problems(old: tuple[_Column, _Column], new: tuple[_Column, _Column]) -> list[str]:
    """Why a collection whose (key, value) columns are ``old`` may not evolve to ``new``
    (each a ``(arrow type, codec name)`` pair); ``[]`` if it may. Pure.

    The Arrow types follow :func:`persist.indexed.format.records.evolution_problems`. A column stored
    as msgpack (a Python class that does not map to an Arrow struct) cannot change at all, nor
    become or stop being msgpack: persist cannot see inside its bytes. A change of the codec
    name alone (another ``msgspec.Struct`` class of the same shape) is allowed.
    """
    out: list[str] = []
    for column, (ot, on), (nt, nn) in (("key", old[0], new[0]), ("value", old[1], new[1])):
        if ot == nt and on == nn:
            continue
        coded = [name for t, name in ((ot, on), (nt, nn))
                 if name is not None and pa.types.is_binary(t)]
        if coded:
            out.append(f"{column}: {coded[0]} is stored as msgpack, which persist cannot "
                       f"evolve (only Arrow types and msgspec.Structs stored as Arrow structs "
                       f"evolve): keep the {column} type as it is")
            continue
        out.extend(records.evolution_problems(ot, nt, column))
    return out


def _columns(s: SchemaVersion) -> tuple[_Column, _Column]:
    return ((columnar.deserialize_type(s.key_type), s.key_codec),
            (columnar.deserialize_type(s.value_type), s.value_codec))


def plan(c: CollectionMeta, key: Codec | None, value: Codec | None,
         expect: int | None = None) -> EvolveSchema | None:
    """The op that evolves ``c`` to ``key``/``value`` (None: keep that column), or None if
    that is the current schema already.

    Args:
        expect: the version the caller believes current (compare-and-set); None: any.

    Raises:
        SchemaMismatch: ``expect`` is not the current version (a concurrent evolution), or the
            change is not allowed (naming each field and why). Nothing changes.
    """
    cur = version(c)
    if expect is not None and expect != cur:
        raise SchemaMismatch(
            f"schema of {c.name!r} is at version {cur}, not the expected {expect} (evolved "
            f"concurrently); nothing changed")
    now = history(c)[-1]
    (kt, kn), (vt, vn) = _columns(now)
    new_k = (kt, kn) if key is None else (key.arrow_type, key.name)
    new_v = (vt, vn) if value is None else (value.arrow_type, value.name)
    if new_k == (kt, kn) and new_v == (vt, vn):
        return None
    found = problems(((kt, kn), (vt, vn)), (new_k, new_v))
    if found:
        raise SchemaMismatch(f"cannot evolve the schema of {c.name!r} (version {cur}): "
                             f"{'; '.join(found)}; nothing changed")
    return EvolveSchema(name=c.name, schema=SchemaVersion(
        id=cur + 1, key_type=columnar.serialize_type(new_k[0]),
        value_type=columnar.serialize_type(new_v[0]), key_codec=new_k[1], value_codec=new_v[1]))


def check(c: CollectionMeta, op: EvolveSchema) -> None:
    """Checks that ``op`` may follow ``c`` (the state machine's rule; see :func:`plan`).

    Raises:
        SchemaMismatch: ``op`` was planned against another version, changes nothing, or makes
            a change that is not allowed.
    """
    cur = version(c)
    s = op.schema
    if s.id != cur + 1:
        raise SchemaMismatch(
            f"schema of {c.name!r} is at version {cur}: an evolution to version {s.id} was "
            f"planned against another version (a concurrent evolution); nothing changed")
    try:
        new = _columns(s)
        records.check_type(new[0][0], "key")
        records.check_type(new[1][0], "value")
    except Corruption as e:
        raise SchemaMismatch(f"evolution of {c.name!r}: its types do not decode ({e})") from e
    old = _columns(history(c)[-1])
    if old == new:
        raise SchemaMismatch(f"evolution of {c.name!r} to version {s.id} changes nothing")
    found = problems(old, new)
    if found:
        raise SchemaMismatch(f"cannot evolve the schema of {c.name!r} (version {cur}): "
                             f"{'; '.join(found)}; nothing changed")


def schema_id_for(c: CollectionMeta, key: Codec, value: Codec) -> int:
    """The newest schema version of ``c`` a handle asking for ``key``/``value`` reads and
    writes as (see ``Codec.accepts``: structural, whatever the classes are named).

    Raises:
        SchemaMismatch: no version of ``c`` has these types: naming, against the current
            version, each field that differs and how to go on (evolve the collection, or a
            msgpack column's ``persist.msgpack``).
    """
    versions = history(c)
    for s in reversed(versions):
        k, v = codecs(s)
        if k.accepts(key) and v.accepts(value):
            return s.id
    k, v = codecs(versions[-1])
    earlier = ""
    if len(versions) > 1:
        listed = ", ".join(f"{s.id}: key {_name(codecs(s)[0])}, value {_name(codecs(s)[1])}"
                           for s in versions[:-1])
        earlier = f" (schema version {len(versions) - 1}; earlier versions: {listed})"
    why = [w for column, have, asked in (("key", k, key), ("value", v, value))
           for w in _mismatch(c.name, column, have, asked)]
    raise SchemaMismatch(
        f"collection {c.name!r} is registered as key {_name(k)}, value {_name(v)}{earlier}; "
        f"asked for key {_name(key)}, value {_name(value)}: {'; '.join(why)}")


def _mismatch(name: str, column: str, have: Codec, asked: Codec) -> list[str]:
    """Why a ``column`` stored as ``have`` does not open as ``asked``, and what to do."""
    if have.accepts(asked):
        return []
    if have.msgpack:
        cls = have.name.rpartition(":")[2] if have.name else "T"
        return [f"the {column} is stored as opaque msgpack of {have.name}, which persist "
                f"cannot see into, so it is matched by class name: open it with "
                f"{column}_type=persist.msgpack({cls}) of a class named {have.name}"]
    if asked.msgpack:
        return [f"the {column} is stored as {have.arrow_type}, not as msgpack: open it with "
                f"its Arrow type or a msgspec.Struct of that structure"]
    diffs = records.differences(have.arrow_type, asked.arrow_type, column)
    found = records.evolution_problems(have.arrow_type, asked.arrow_type, column)
    how = (f"client.evolve_schema({name!r}, {column}_type=...) with the new type changes the "
           f"collection's type (that change is allowed)" if not found else
           f"that change is not an allowed evolution ({'; '.join(found)}): register a new "
           f"collection for the new type")
    return [*diffs, how]


def _name(codec: Codec) -> str:
    if codec.msgpack:
        return f"{codec.name} (msgpack)"
    return codec.name or str(codec.arrow_type)


def _paths(t: pa.DataType, path: str) -> list[str]:
    out = [path]
    if pa.types.is_struct(t):
        for f in t:
            out.extend(_paths(f.type, f"{path}.{f.name}"))
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        out.extend(_paths(t.value_type, f"{path}[]"))
    return out


def dropped_since(schemas: Schemas, schema_id: int) -> list[str]:
    """The fields of version ``schema_id`` that a later version dropped (outermost ones only,
    e.g. ``value.address``): writing as ``schema_id`` would lose their values."""
    def paths(i: int) -> set[str]:
        k, v = schemas.types[i]
        return {*_paths(k, "key"), *_paths(v, "value")}

    later = [paths(i) for i in range(schema_id + 1, schemas.current + 1)]
    mine = _paths(schemas.types[schema_id][0], "key") + _paths(schemas.types[schema_id][1],
                                                               "value")
    gone = [p for p in mine if any(p not in ps for ps in later)]
    return [p for p in gone if not any(p.startswith(g + ".") or p.startswith(g + "[")
                                      for g in gone if g != p)]


def check_writer(c: CollectionMeta, schema_id: int, what: str) -> None:
    """Checks that ``what`` (updates, a staged part) written with schema version
    ``schema_id`` of ``c`` may be added now (see the module docstring).

    Raises:
        InvalidUsage: ``schema_id`` is not a version of ``c``.
        SchemaMismatch: a later version dropped a field of ``schema_id``.
    """
    cur = version(c)
    if not 0 <= schema_id <= cur:
        raise InvalidUsage(f"{what} of {c.name!r} was written with schema version {schema_id}; "
                           f"the collection has versions 0 to {cur}")
    if schema_id == cur:
        return
    gone = dropped_since(Schemas.of(c), schema_id)
    if gone:
        raise SchemaMismatch(
            f"{what} of {c.name!r} written with schema version {schema_id} refused: a later "
            f"version dropped {', '.join(gone)}, so its values there would be lost; reopen the "
            f"collection with its current types (version {cur}) to write")


def for_write(c: CollectionMeta, table: pa.Table, schema_id: int | None) -> pa.Table:
    """Updates normalized to ``c``'s schema version ``schema_id`` (None: the current one),
    checked (:func:`check_writer`) and migrated to the current version.

    Raises:
        InvalidUsage, SchemaMismatch: as :func:`check_writer`; or ``table`` does not have the
            columns of that version (it was normalized to another schema).
    """
    if c.schemas is msgspec.UNSET and not schema_id:
        return table  # one version: nothing to check or migrate (the common case)
    cur = version(c)
    sid = cur if schema_id is None else schema_id
    check_writer(c, sid, "a write")
    schemas = Schemas.of(c)
    want = schemas.part_schema(sid)
    if not table.schema.equals(want):
        raise SchemaMismatch(f"updates for {c.name!r} have columns {table.schema}, not those "
                             f"of its schema version {sid}: {want}")
    return migrate(table, schemas, sid, cur, c.name) if sid != cur else table


# -- migration ------------------------------------------------------------------------------


class PartSource(Protocol):
    """Decodes a part in the schema it was written with (``PartReader``)."""

    def read(self, part: PartMeta, schema: pa.Schema) -> pa.Table:
        """``part``'s table, checked against ``schema``."""
        ...


@dataclass(frozen=True)
class View:
    """Reading a collection's parts as one schema version, ``target`` (picklable: Spark
    tasks carry one)."""

    schemas: Schemas
    target: int
    name: str = ""

    @classmethod
    def of(cls, c: CollectionMeta, schema_id: int | None = None) -> View:
        """Reads of ``c`` as version ``schema_id`` (None: the current one).

        Raises:
            InvalidUsage: ``schema_id`` is not a version of ``c``.
        """
        schemas = Schemas.of(c)
        target = schemas.current if schema_id is None else schema_id
        if isinstance(target, bool) or not isinstance(target, int) or \
                not 0 <= target <= schemas.current:
            raise InvalidUsage(f"{c.name!r} has schema versions 0 to {schemas.current}, not "
                               f"{schema_id!r}")
        return cls(schemas, target, c.name)

    @property
    def schema(self) -> pa.Schema:
        """The part schema of the target version: what every read through this view has."""
        return self.schemas.part_schema(self.target)

    @property
    def current(self) -> bool:
        """True if the target is the collection's current version."""
        return self.target == self.schemas.current

    def stored(self, reader: PartSource, part: PartMeta) -> pa.Table:
        """``part`` as written (its own schema version), not migrated.

        Raises:
            Corruption: the part names a version the collection does not have, or its data
                has another schema.
        """
        sid = part_version(part)
        if not 0 <= sid <= self.schemas.current:
            raise Corruption(part.blob_key or f"inline part {part.id}",
                             f"written with schema version {sid}; {self.name!r} has versions 0 "
                             f"to {self.schemas.current}")
        return reader.read(part, self.schemas.part_schema(sid))

    def read(self, reader: PartSource, part: PartMeta) -> pa.Table:
        """``part`` migrated to the target version (through the current one).

        Raises:
            SchemaMismatch: a value does not fit the target version (backward only).
        """
        return migrate(self.stored(reader, part), self.schemas, part_version(part),
                       self.target, self.name)

    def read_current(self, reader: PartSource, part: PartMeta) -> pa.Table:
        """``part`` migrated to the current version (never fails for valid data)."""
        return migrate(self.stored(reader, part), self.schemas, part_version(part),
                       self.schemas.current, self.name)

    def from_current(self, table: pa.Table) -> pa.Table:
        """A table of the current version migrated to the target version.

        Raises:
            SchemaMismatch: a value does not fit the target version.
        """
        if self.current:
            return table
        return migrate(table, self.schemas, self.schemas.current, self.target, self.name)


def migrate(table: pa.Table, schemas: Schemas, frm: int, to: int, name: str = "") -> pa.Table:
    """``table`` (a part of version ``frm``) as version ``to``: migrated forward to the
    current version, then back to ``to`` (see the module docstring).

    Raises:
        SchemaMismatch: a value does not fit ``to`` (naming the field, the value and why).
    """
    cur = schemas.current
    steps = [*range(frm, cur + 1), *range(cur - 1, to - 1, -1)]
    for a, b in itertools.pairwise(steps):
        try:
            table = _step(table, schemas, a, b)
        except SchemaMismatch as e:
            raise SchemaMismatch(
                f"{name!r} cannot be read as schema version {to}: {e}; read it as version "
                f"{b + 1} or newer") from None
    return table


def _step(table: pa.Table, schemas: Schemas, a: int, b: int) -> pa.Table:
    (ka, va), (kb, vb) = schemas.types[a], schemas.types[b]
    if ka == kb and va == vb:
        return table
    key = _column(table.column(0), kb, "key")
    value = _column(table.column(1), vb, "value")
    return pa.Table.from_arrays([key, value, table.column(2), table.column(3)],
                                schema=schemas.part_schema(b))


def _column(col: pa.ChunkedArray, to: pa.DataType, path: str) -> pa.ChunkedArray:
    if col.type == to:
        return col
    return pa.chunked_array([_convert(c, to, path, None) for c in col.chunks], type=to)


def _convert(arr: pa.Array, to: pa.DataType, path: str, live: _Live | None) -> pa.Array:
    """``arr`` as type ``to`` (an adjacent schema version's), fields matched by name.

    ``live``: which slots are visible (not hidden by a null record or list above them; None:
    all). Only visible slots must fit: a null record's hidden field slots may hold anything.
    """
    t = arr.type
    if t == to:
        return arr
    mask = pc.is_null(arr) if arr.null_count else None
    inner = _live(arr, live)
    if pa.types.is_struct(to) and pa.types.is_struct(t):
        children = []
        for f in to:
            i = t.get_field_index(f.name)
            where = f"{path}.{f.name}"
            child = pa.nulls(len(arr), f.type) if i < 0 else \
                _convert(arr.field(i), f.type, where, inner)
            if not f.nullable and (i < 0 or t.field(i).nullable):
                _no_visible_nulls(child, inner, where, "a field dropped by a later version"
                                  if i < 0 else "a null written by a later version")
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(to), mask=mask)
    if _is_list(to) and _is_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        start = int(offsets[0])
        offsets -= start
        items = arr.values.slice(start, int(offsets[-1]))
        item_live = None if inner is None else np.repeat(inner, np.diff(offsets))
        items = _convert(items, to.value_type, f"{path}[]", item_live)
        if not to.value_field.nullable and t.value_field.nullable:
            _no_visible_nulls(items, item_live, f"{path}[]", "a null written by a later version")
        if pa.types.is_large_list(to):
            return pa.LargeListArray.from_arrays(pa.array(offsets), items, type=to, mask=mask)
        if offsets[-1] > np.iinfo(np.int32).max:
            raise SchemaMismatch(f"{path}: {int(offsets[-1])} list items do not fit a list's "
                                 f"32-bit offsets")
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items, type=to,
                                        mask=mask)
    return _cast_leaf(arr, to, path, live)


def _cast_leaf(arr: pa.Array, to: pa.DataType, path: str, live: _Live | None) -> pa.Array:
    t = arr.type
    narrowing = not records.widens(t, to) and not pa.types.is_null(t)
    if narrowing and live is not None and not live.all():
        # NB: hidden slots (under a null record) may hold values that do not fit; they are
        # not part of any record, so they are nulled rather than checked.
        arr = pc.if_else(pa.array(live), arr, pa.scalar(None, t))
    try:
        out = arr.cast(to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaMismatch(f"{path}: {_misfit(arr, to)} does not fit {to} ({e})") from None
    if narrowing and pa.types.is_floating(t):
        # NB: Arrow's safe cast rounds float64 to float32 without a word; a value is narrowed
        # only if it comes back exactly (NaN as NaN).
        back = out.cast(t)
        same = pc.fill_null(pc.or_(pc.equal(back, arr), pc.and_(pc.is_nan(back),
                                                                pc.is_nan(arr))), True)
        bad = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
        if len(bad):
            raise SchemaMismatch(f"{path}: the {t} value {arr[int(bad[0])].as_py()!r} does not "
                                 f"fit {to} exactly")
    return out


def _misfit(arr: pa.Array, to: pa.DataType) -> str:
    """Names the first value of ``arr`` that does not cast to ``to`` (only on the error
    path)."""
    for i in range(len(arr)):
        v = arr[i]
        if not v.is_valid:
            continue
        try:
            v.cast(to, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return f"the {arr.type} value {v.as_py()!r}"
    return f"a {arr.type} value"


def _live(arr: pa.Array, live: _Live | None) -> _Live | None:
    if not arr.null_count:
        return live
    valid: _Live = pc.is_valid(arr).to_numpy(zero_copy_only=False)
    return valid if live is None else live & valid


def _no_visible_nulls(child: pa.Array, live: _Live | None, path: str, why: str) -> None:
    if not child.null_count:
        return
    nulls: _Live = pc.is_null(child).to_numpy(zero_copy_only=False)
    if live is not None:
        nulls &= live
    if nulls.any():
        raise SchemaMismatch(f"{path}: a record needs a value in this non-nullable field, "
                             f"and has none ({why})")


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))
