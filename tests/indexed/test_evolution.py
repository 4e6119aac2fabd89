"""Schema evolution without rewrite: the rules table, each allowed and refused change, state
unchanged on refusal, migration on read (forward and back to an older version), compaction
across schema versions, reopen, a read-only replica, old-schema handles and writers, exact
consolidation across an evolution, and a property test against a plain-Python model."""

from __future__ import annotations

import decimal
import itertools
import math
import re
import struct
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat, InvalidUsage, SchemaMismatch
from persist.indexed.engine import Options, Txn
from persist.indexed.format import columnar, evolve, meta, records
from persist.indexed.format.columnar import Codec
from persist.indexed.format.meta import AddPart
from persist.indexed.format.write import new_part
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.support.engine import Engine

# -- the rules, on their own -------------------------------------------------------------------

S = pa.string()


def st_(*fields: tuple[str, pa.DataType, bool]) -> pa.StructType:
    return pa.struct([pa.field(n, t, nullable=nullable) for n, t, nullable in fields])


A = ("a", pa.int32(), False)
B = ("b", S, True)

ALLOWED = [
    ("same", st_(A, B), st_(A, B)),
    ("add nullable last", st_(A, B), st_(A, B, ("c", pa.int64(), True))),
    ("add nullable first", st_(A, B), st_(("c", pa.int64(), True), A, B)),
    ("add nullable between", st_(A, B), st_(A, ("c", pa.int64(), True), B)),
    ("add nested", st_(A, ("s", st_(("x", pa.int8(), True)), True)),
     st_(A, ("s", st_(("x", pa.int8(), True), ("y", S, True)), True))),
    ("add in list of struct", pa.list_(st_(A)), pa.list_(st_(A, ("z", pa.bool_(), True)))),
    ("add a nullable struct", st_(A), st_(A, ("s", st_(("x", pa.int8(), False)), True))),
    ("drop", st_(A, B), st_(A)),
    ("drop non-nullable", st_(A, B), st_(B)),
    ("drop nested", st_(A, ("s", st_(("x", pa.int8(), True), ("y", S, True)), True)),
     st_(A, ("s", st_(("y", S, True)), True))),
    ("make nullable", st_(A, B), st_(("a", pa.int32(), True), B)),
    ("list item nullable", pa.list_(pa.field("item", pa.int8(), nullable=False)),
     pa.list_(pa.field("item", pa.int8(), nullable=True))),
    ("int8->16", pa.int8(), pa.int16()),
    ("int8->64", pa.int8(), pa.int64()),
    ("int32->64", pa.int32(), pa.int64()),
    ("uint8->16", pa.uint8(), pa.uint16()),
    ("uint16->64", pa.uint16(), pa.uint64()),
    ("float32->64", pa.float32(), pa.float64()),
    ("string->large", S, pa.large_string()),
    ("binary->large", pa.binary(), pa.large_binary()),
    ("list->large_list", pa.list_(pa.int8()), pa.large_list(pa.int8())),
    ("list of widened", pa.list_(pa.int8()), pa.large_list(pa.int32())),
    ("decimal precision up", pa.decimal128(5, 2), pa.decimal128(12, 2)),
    ("widen nested", st_(("a", pa.int8(), False)), st_(("a", pa.int16(), False))),
    ("list item names", pa.list_(pa.field("item", pa.int8())),
     pa.list_(pa.field("element", pa.int8()))),
]

REFUSED = [
    ("int64->32", pa.int64(), pa.int32(), r"value: int64 cannot narrow to int32"),
    ("float64->32", pa.float64(), pa.float32(), r"cannot narrow"),
    ("large_string->string", pa.large_string(), S, r"cannot narrow"),
    ("large_list->list", pa.large_list(pa.int8()), pa.list_(pa.int8()), r"cannot narrow"),
    ("int->string", pa.int64(), S, r"value: int64 cannot change to string"),
    ("int->float", pa.int32(), pa.float64(), r"cannot change"),
    ("uint->int", pa.uint8(), pa.int16(), r"cannot change"),
    ("int->uint", pa.int8(), pa.uint16(), r"cannot change"),
    ("decimal scale", pa.decimal128(5, 2), pa.decimal128(6, 3), r"cannot change"),
    ("decimal down", pa.decimal128(6, 2), pa.decimal128(5, 2), r"cannot narrow"),
    ("timestamp unit", pa.timestamp("ms"), pa.timestamp("us"), r"cannot change"),
    ("date->timestamp", pa.date32(), pa.timestamp("us"), r"cannot change"),
    ("primitive->struct", pa.int64(), st_(("a", pa.int64(), True)),
     r"shape cannot change"),
    ("struct->primitive", st_(A), pa.int32(), r"shape cannot change"),
    ("list->struct", pa.list_(pa.int8()), st_(A), r"shape cannot change"),
    ("new non-nullable", st_(A), st_(A, ("c", pa.int64(), False)),
     r"value\.c: a new field must be nullable"),
    ("make non-nullable", st_(A, B), st_(A, ("b", S, False)),
     r"value\.b: a field cannot become non-nullable"),
    ("list item non-nullable", pa.list_(pa.int8()),
     pa.list_(pa.field("item", pa.int8(), nullable=False)),
     r"value\[\]: list items cannot become non-nullable"),
    ("drop every field", st_(A, B), st_(("c", pa.int64(), True)),
     r"value: every field \(a, b\) would be dropped"),
    ("reorder", st_(A, B), st_(B, A), r"change order"),
    ("nested narrowing", st_(("s", st_(("x", pa.int16(), True)), True)),
     st_(("s", st_(("x", pa.int8(), True)), True)), r"value\.s\.x: int16 cannot narrow"),
    ("in a list", pa.list_(st_(A)), pa.list_(st_(("a", S, False))),
     r"value\[\]\.a: int32 cannot change to string"),
]


@pytest.mark.parametrize(("why", "old", "new"), ALLOWED, ids=[a[0] for a in ALLOWED])
def test_allowed_changes(why: str, old: pa.DataType, new: pa.DataType) -> None:
    assert records.evolution_problems(old, new) == []


@pytest.mark.parametrize(("why", "old", "new", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_changes_name_the_field_and_why(why: str, old: pa.DataType, new: pa.DataType,
                                               message: str) -> None:
    found = records.evolution_problems(old, new)
    assert found
    assert any(re.search(message, p) for p in found), found


def test_every_problem_is_reported() -> None:
    old = st_(A, B, ("c", pa.int64(), True))
    new = st_(("a", pa.int8(), False), ("b", S, False), ("d", pa.int8(), False))
    found = records.evolution_problems(old, new)
    assert len(found) == 3, found
    assert [p.split(":")[0] for p in found] == ["value.a", "value.b", "value.d"]


def test_msgpack_columns_cannot_evolve() -> None:
    coded = (pa.binary(), "mod:Thing")
    plain = (pa.int64(), None)
    assert evolve.problems((plain, coded), (plain, coded)) == []
    found = evolve.problems((plain, coded), (plain, (pa.binary(), "mod:Other")))
    assert found
    assert "msgpack" in found[0]
    found = evolve.problems((plain, coded), (plain, (st_(A), "mod:Thing")))
    assert found
    assert "value: mod:Thing is stored as msgpack" in found[0]
    # a codec name alone may change (another Struct class of the same shape)
    assert evolve.problems((plain, (st_(A), "mod:V1")), (plain, (st_(A), "mod:V2"))) == []


def test_dropped_since_names_the_outermost_fields() -> None:
    v0 = (pa.int32(), st_(A, ("s", st_(("x", pa.int8(), True)), True), B))
    v1 = (pa.int64(), st_(A, B, ("n", pa.int8(), True)))
    v2 = (pa.int64(), st_(A, ("n", pa.int8(), True)))
    schemas = evolve.Schemas((v0, v1, v2))
    assert evolve.dropped_since(schemas, 0) == ["value.s", "value.b"]
    assert evolve.dropped_since(schemas, 1) == ["value.b"]
    assert evolve.dropped_since(schemas, 2) == []


# -- through the engine -----------------------------------------------------------------------


def _options() -> Options:
    return Options(inline_threshold=400, rollup_every=3,
                   compaction=CompactionPolicy(fanin=2, inline_flush_bytes=800))


def engine(path: Path | str) -> Engine:
    ix = Engine.open(FileBlob(path), epoch=1, writer="w", options=_options())
    ix.fence()
    return ix


def snapshot(ix: Engine, name: str, as_of: int, schema_id: int | None = None) -> list[Any]:
    return [(k, v, d) for (k, v), _, d in
            ix.snapshot(name, as_of, schema_id=schema_id).to_python()]


V0 = st_(("id", pa.int32(), False), ("name", S, True))
V1 = st_(("id", pa.int64(), False), ("tag", S, True), ("name", S, True))


def test_add_and_widen_reads_old_parts_migrated(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int16(), V0)
    ix.write({"c": [((1, {"id": 1, "name": "a"}), 0, 1), ((2, {"id": 2, "name": None}), 0, 1)]})
    ix.seal("c", 1)
    assert ix.evolve_schema("c", key_type=pa.int32(), value_type=V1) == 1
    ix.write({"c": [((3, {"id": 2**40, "tag": "t", "name": "c"}), 1, 1)]})
    ix.seal("c", 2)
    assert snapshot(ix, "c", 1) == [
        (1, {"id": 1, "tag": None, "name": "a"}, 1),
        (2, {"id": 2, "tag": None, "name": None}, 1),
        (3, {"id": 2**40, "tag": "t", "name": "c"}, 1),
    ]
    # the old parts are as they were written: nothing was rewritten
    parts = ix.state.collections["c"].parts
    assert [evolve.part_version(p) for p in parts] == [0, 1]
    assert parts[0].schema_id is msgspec.UNSET
    # as version 0: the added field is gone, the widened one narrowed (it fits)
    assert snapshot(ix, "c", 0, schema_id=0) == [
        (1, {"id": 1, "name": "a"}, 1), (2, {"id": 2, "name": None}, 1)]
    # ... unless a value does not fit: a typed error naming it, never a truncation
    with pytest.raises(SchemaMismatch, match=r"value\.id: the int64 value 1099511627776 "
                                             r"does not fit int32"):
        ix.snapshot("c", 1, schema_id=0).to_arrow()
    assert ix.snapshot("c", 1).schema.field("key").type == pa.int32()
    assert ix.snapshot("c", 1, schema_id=0).schema.field("key").type == pa.int16()


def test_drop_a_field(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), V0)
    ix.write({"c": [((1, {"id": 1, "name": "a"}), 0, 1), ((2, {"id": 1, "name": "b"}), 0, 1)]})
    ix.seal("c", 1)
    ix.evolve_schema("c", value_type=st_(("id", pa.int32(), False)))
    ix.write({"c": [((1, {"id": 1}), 1, 1)]})
    ix.seal("c", 2)
    assert snapshot(ix, "c", 1) == [(1, {"id": 1}, 2), (2, {"id": 1}, 1)]
    # version 0 sees every record through the current one: the dropped field is null
    assert snapshot(ix, "c", 1, schema_id=0) == [(1, {"id": 1, "name": None}, 2),
                                                 (2, {"id": 1, "name": None}, 1)]


def test_a_dropped_non_nullable_field_cannot_be_read_as_the_old_version(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), V0)
    ix.write({"c": [((1, {"id": 1, "name": "a"}), 0, 1)]})
    ix.seal("c", 1)
    ix.evolve_schema("c", value_type=st_(("name", S, True)))
    with pytest.raises(SchemaMismatch, match=r"value\.id: a record needs a value in this "
                                             r"non-nullable field"):
        ix.snapshot("c", 0, schema_id=0).to_arrow()
    assert snapshot(ix, "c", 0) == [(1, {"name": "a"}, 1)]


def test_each_allowed_change_through_storage(tmp_path: Path) -> None:
    """Every allowed change of ALLOWED, applied to a stored collection: old parts read as the
    new type equal the values cast, and read back as the old type equal what was written."""
    for i, (_, old, new) in enumerate(ALLOWED):
        if old == new:
            continue
        ix = engine(tmp_path / str(i))
        ix.register("c", pa.int64(), old)
        rows = _sample_values(old)
        ix.write({"c": [((k, v), 0, 1) for k, v in enumerate(rows)]})
        ix.seal("c", 1)
        ix.evolve_schema("c", value_type=new)
        got = ix.snapshot("c", 0).to_arrow()
        assert got.schema.field("value").type == new
        try:
            expected_back = [_projected(v, old, new) for v in rows]
        except Misfit:  # a non-nullable field was dropped: version 0 cannot be read now
            with pytest.raises(SchemaMismatch, match="non-nullable"):
                ix.snapshot("c", 0, schema_id=0).to_arrow()
            continue
        back = ix.snapshot("c", 0, schema_id=0).to_python()
        assert [v for (_, v), _, _ in back] == expected_back, (i, old, new)


def _sample_values(t: pa.DataType) -> list[Any]:
    if pa.types.is_struct(t):
        out = []
        for j in range(2):
            out.append({f.name: (_sample_values(f.type)[j] if not f.nullable or j == 0
                                 else None) for f in t})
        return out
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _sample_values(t.value_type)
        return [item[:1], [] if t.value_field.nullable is False else [None, item[1]]]
    if pa.types.is_integer(t):
        return [1, 7]
    if pa.types.is_floating(t):
        return [1.5, -0.25]
    if pa.types.is_decimal(t):
        return [decimal.Decimal("1.25"), decimal.Decimal("-3.50")]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ["x", "yz"]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [b"x", b""]
    if pa.types.is_boolean(t):
        return [True, False]
    raise AssertionError(t)


def _projected(v: Any, old: pa.DataType, new: pa.DataType) -> Any:
    """``v`` (of ``old``) migrated to ``new`` and back to ``old``: fields ``new`` dropped are
    null (Misfit if such a field is not nullable)."""
    if v is None:
        return None
    if pa.types.is_struct(old):
        out = {}
        for f in old:
            i = new.get_field_index(f.name)
            if i < 0 and not f.nullable:
                raise Misfit(f.name)
            out[f.name] = None if i < 0 else _projected(v[f.name], f.type, new.field(i).type)
        return out
    if pa.types.is_list(old) or pa.types.is_large_list(old):
        return [_projected(x, old.value_type, new.value_type) for x in v]
    return v


def test_refused_evolutions_change_nothing(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), st_(A, B))
    ix.write({"c": [((1, {"a": 1, "b": "x"}), 0, 1)]})
    ix.seal("c", 1)
    before = ix.state
    files = sorted(str(p) for p in (tmp_path / "meta" / "log").rglob("*"))
    for _, old, new, message in REFUSED:
        if old != st_(A, B):
            continue
        with pytest.raises(SchemaMismatch, match=message):
            ix.evolve_schema("c", value_type=new)
    with pytest.raises(SchemaMismatch, match="key: int64 cannot narrow to int32"):
        ix.evolve_schema("c", key_type=pa.int32())
    with pytest.raises(SchemaMismatch, match="halffloat is not supported"):
        ix.evolve_schema("c", value_type=st_(A, B, ("h", pa.float16(), True)))
    with pytest.raises(SchemaMismatch, match="at version 0, not the expected 3"):
        ix.evolve_schema("c", value_type=st_(A), expect=3)
    assert ix.state is before
    assert sorted(str(p) for p in (tmp_path / "meta" / "log").rglob("*")) == files
    assert Engine.open(FileBlob(tmp_path).read_only()).state == before
    # nothing to change: no commit, the current version
    assert ix.evolve_schema("c", value_type=st_(A, B)) == 0
    assert ix.state is before


def test_compare_and_set_on_the_version(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), st_(A))
    assert ix.evolve_schema("c", value_type=st_(A, B), expect=0) == 1
    with pytest.raises(SchemaMismatch, match="at version 1, not the expected 0"):
        ix.evolve_schema("c", value_type=st_(A, B, ("c", S, True)), expect=0)
    assert ix.evolve_schema("c", value_type=st_(A, B, ("c", S, True)), expect=1) == 2
    # the state machine itself refuses an op planned against another version
    stale = evolve.plan(evolve.evolved(ix.state.collections["c"], meta.SchemaVersion(
        id=3, key_type=columnar.serialize_type(pa.int64()),
        value_type=columnar.serialize_type(st_(A)))), None, Codec(st_(A, B)), None)
    assert stale is not None
    assert stale.schema.id == 4
    with pytest.raises(SchemaMismatch, match="planned against another version"):
        Txn(ix.state).stage(stale)


def test_an_evolution_commits_alone(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), st_(A))
    op = evolve.plan(ix.state.collections["c"], None, Codec(st_(A, B)), None)
    assert op is not None
    txn = Txn(ix.state)
    txn.stage(op)
    with pytest.raises(InvalidUsage, match="commits alone"):
        txn.stage_write("c", ix.normalize("c", [((1, {"a": 1}), 0, 1)]))
    txn = Txn(ix.state)
    txn.stage_write("c", ix.normalize("c", [((1, {"a": 1}), 0, 1)]))
    with pytest.raises(InvalidUsage, match="commits alone"):
        txn.stage(op)


def test_consolidation_is_exact_across_an_evolution(tmp_path: Path) -> None:
    """A record written before a nullable field was added and retracted after it cancels:
    the added field is null in both."""
    ix = engine(tmp_path)
    ix.register("c", st_(("k", pa.int8(), False)), st_(A))
    ix.write({"c": [(({"k": 1}, {"a": 5}), 0, 1), (({"k": 2}, {"a": 6}), 0, 1)]})
    ix.seal("c", 1)
    ix.evolve_schema("c", key_type=st_(("k", pa.int16(), False), ("j", S, True)),
                     value_type=st_(A, B))
    ix.write({"c": [(({"k": 1, "j": None}, {"a": 5, "b": None}), 1, -1)]})
    ix.seal("c", 2)
    assert snapshot(ix, "c", 1) == [({"k": 2, "j": None}, {"a": 6, "b": None}, 1)]
    assert snapshot(ix, "c", 1, schema_id=0) == [({"k": 2}, {"a": 6}, 1)]
    ix.allow_compaction("c", 1)
    ix.maintain()
    c = ix.state.collections["c"]
    assert len(c.parts) == 1
    assert evolve.part_version(c.parts[0]) == 1
    assert snapshot(ix, "c", 1) == [({"k": 2, "j": None}, {"a": 6, "b": None}, 1)]


def test_compaction_migrates_every_part_to_the_current_version(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), st_(("a", pa.int8(), True)))
    versions = [st_(("a", pa.int8(), True)),
                st_(("a", pa.int16(), True), ("b", S, True)),
                st_(("a", pa.int32(), True), ("b", pa.large_string(), True)),
                st_(("b", pa.large_string(), True))]
    t = 0
    for vi, vt in enumerate(versions):
        if vi:
            ix.evolve_schema("c", value_type=vt)
        for _ in range(2):
            row = {f.name: (t if f.name == "a" else f"s{t}") for f in vt}
            ix.write({"c": [((t % 3, row), t, 1)]})
            t += 1
            ix.seal("c", t)
    c = ix.state.collections["c"]
    assert sorted({evolve.part_version(p) for p in c.parts}) == [0, 1, 2, 3]
    before = {v: snapshot(ix, "c", t - 1, schema_id=v) for v in (3, 1, 2)}
    ix.allow_compaction("c", t - 1)
    while ix.maintain():
        pass
    c = ix.state.collections["c"]
    assert {evolve.part_version(p) for p in c.parts} == {3}
    for v, rows in before.items():
        assert snapshot(ix, "c", t - 1, schema_id=v) == rows, v
    reopened = Engine.open(FileBlob(tmp_path).read_only())
    for v, rows in before.items():
        assert snapshot(reopened, "c", t - 1, schema_id=v) == rows, v
    # versions 0 and 1 never had values wider than they hold, but "a" was dropped by 3:
    assert all(r[1]["a"] is None for r in before[1])


def test_reopen_and_replica_follow_evolutions(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), V0)
    replica = Engine.open(FileBlob(tmp_path).read_only())
    ix.write({"c": [((1, {"id": 1, "name": "a"}), 0, 1)]})
    ix.seal("c", 1)
    ix.evolve_schema("c", value_type=V1)
    ix.write({"c": [((2, {"id": 2, "tag": "x", "name": None}), 1, 1)]})
    ix.seal("c", 2)
    replica.refresh()
    c = replica.state.collections["c"]
    assert evolve.version(c) == 1
    assert snapshot(replica, "c", 1) == snapshot(ix, "c", 1)
    assert snapshot(replica, "c", 1, schema_id=0) == [(1, {"id": 1, "name": "a"}, 1),
                                                      (2, {"id": 2, "name": None}, 1)]
    assert [t.to_pylist() for t in replica.updates_between("c", 1, 2, schema_id=0)] == [
        [{"key": 2, "value": {"id": 2, "name": None}, "time": 1, "diff": 1}]]
    # a writer reopening replays the evolution from the log, then from a rollup
    ix.maintain()
    again = engine(tmp_path)
    assert again.state.collections["c"] == ix.state.collections["c"]
    assert meta.required_version(again.state) >= meta.EVOLUTION_FORMAT_VERSION  # 4: its parts


def test_old_schema_writers(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), V0)
    ix.evolve_schema("c", value_type=V1)
    # an old-schema writer: normalized to version 0, migrated to 1 when committed
    txn = Txn(ix.state)
    txn.stage_write("c", ix.normalize("c", [((1, {"id": 1, "name": "a"}), 0, 1)], schema_id=0),
                    schema_id=0)
    ix.commit(txn)
    ix.seal("c", 1)
    part = ix.state.collections["c"].parts[-1]
    assert evolve.part_version(part) == 1
    assert snapshot(ix, "c", 0) == [(1, {"id": 1, "tag": None, "name": "a"}, 1)]
    # a table normalized to another version than it claims is refused
    txn = Txn(ix.state)
    with pytest.raises(SchemaMismatch, match="not those of its schema version 1"):
        txn.stage_write("c", ix.normalize("c", [((1, {"id": 1, "name": "a"}), 1, 1)],
                                          schema_id=0), schema_id=1)
    # once a later version dropped one of its fields, an old-schema writer is refused
    ix.evolve_schema("c", value_type=st_(("id", pa.int64(), False), ("tag", S, True)))
    before = ix.state
    txn = Txn(ix.state)
    with pytest.raises(SchemaMismatch, match=r"version 0 refused: a later version dropped "
                                             r"value\.name"):
        txn.stage_write("c", ix.normalize("c", [((1, {"id": 1, "name": "a"}), 1, 1)],
                                          schema_id=0), schema_id=0)
    assert txn.empty
    assert ix.state is before
    # ... and so is a part staged elsewhere (a Spark task) with that version
    old = ix.normalize("c", [((1, {"id": 1, "name": "a"}), 1, 1)], schema_id=1)
    staged = evolve.tag(new_part(ix.blob, ix.state.collections["c"], old,
                                 inline_threshold=1 << 20, consolidated=False), 1)
    with pytest.raises(SchemaMismatch, match=r"dropped value\.name"):
        Txn(ix.state).stage(AddPart(name="c", part=staged))


def test_a_staged_part_of_an_older_version_is_migrated_on_read(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("c", pa.int64(), V0)
    c0 = ix.state.collections["c"]
    table = ix.normalize("c", [((1, {"id": 7, "name": "a"}), 0, 1)])
    # a Spark task stages a part of version 0; the collection evolves before its commit
    staged = new_part(ix.blob, c0, table, inline_threshold=0, consolidated=False,
                      staged=True)
    ix.evolve_schema("c", value_type=V1)
    txn = Txn(ix.state)
    txn.stage(AddPart(name="c", part=staged))
    ix.commit(txn)
    ix.seal("c", 1)
    assert snapshot(ix, "c", 0) == [(1, {"id": 7, "tag": None, "name": "a"}, 1)]
    newer = evolve.tag(msgspec.structs.replace(staged, id="other", min_time=1, max_time=1), 5)
    with pytest.raises(InvalidUsage, match="written with schema version 5"):
        Txn(ix.state).stage(AddPart(name="c", part=newer))


class Coded(msgspec.Struct, frozen=True):
    """Does not map to an Arrow struct (``Any``): stored as msgpack."""

    id: int
    qty: Any = None


class Order(msgspec.Struct, frozen=True):
    id: int
    note: str | None = None


class OrderV2(msgspec.Struct, frozen=True):
    id: int
    note: str | None = None
    qty: float | None = None


def test_msgspec_structs_evolve_and_old_classes_read_old_versions(tmp_path: Path) -> None:
    ix = engine(tmp_path)
    ix.register("o", pa.int64(), Order)
    ix.write({"o": [((1, Order(1, "n")), 0, 1)]})
    ix.seal("o", 1)
    assert ix.evolve_schema("o", value_type=OrderV2) == 1
    ix.write({"o": [((2, OrderV2(2, None, 1.5)), 1, 1)]})
    ix.seal("o", 2)
    got = snapshot(ix, "o", 1)
    assert got == [(1, OrderV2(1, "n", None), 1), (2, OrderV2(2, None, 1.5), 1)]
    assert snapshot(ix, "o", 1, schema_id=0) == [(1, Order(1, "n"), 1), (2, Order(2, None), 1)]
    # a class that does not map (``Any``) is msgpack: it cannot be evolved to
    with pytest.raises(SchemaMismatch, match="msgpack"):
        ix.evolve_schema("o", value_type=Coded)
    # an old-schema handle is found by its types
    c = ix.state.collections["o"]
    assert evolve.schema_id_for(c, Codec(pa.int64()), Codec.of(Order)) == 0
    assert evolve.schema_id_for(c, Codec(pa.int64()), Codec.of(OrderV2)) == 1
    with pytest.raises(SchemaMismatch, match=r"earlier versions: 0: key int64, value "
                                             r"tests\.indexed"):
        evolve.schema_id_for(c, Codec(pa.int64()), Codec(pa.string()))


def unsharded(state: meta.State) -> meta.State:
    """``state`` as if its log were not sharded: what its collections need of the format."""
    return msgspec.structs.replace(state, log_from=msgspec.UNSET)


def test_format_version_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ix = engine(tmp_path)
    ix.register("plain", pa.int64(), pa.int64())
    ix.register("rec", pa.int64(), V0)
    ix.write({"plain": [((1, 1), 0, 1)], "rec": [((1, {"id": 1, "name": None}), 0, 1)]})
    # NB: 4 when the knobs put these parts in blobs (Parquet parts, format version 4)
    parquet = any(p.parquet for c in ix.state.collections.values() for p in c.parts)
    # NB: what the collections need; the state of a sharded log (format 7) is 7 as a whole
    assert meta.required_version(unsharded(ix.state)) == (4 if parquet else 2)
    ix.evolve_schema("rec", value_type=V1)
    ix.write({"plain": [((1, 1), 1, 1)], "rec": [((1, {"id": 1, "tag": None, "name": None}),
                                                  1, 1)]})
    blob = FileBlob(tmp_path)
    versions = []
    evolution = ""
    for key in blob.list_keys("meta/log/"):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        versions.append((commit.version, [type(op).__name__ for op in commit.ops]))
        if versions[-1][1] == ["EvolveSchema"]:
            evolution = key
    assert (3, ["EvolveSchema"]) in versions
    assert all(v != 3 for v, ops in versions if ops != ["EvolveSchema"])
    assert meta.required_version(unsharded(ix.state)) == (4 if parquet else 3)
    # an older persist (reading up to version 2) refuses the location instead of misreading,
    # at the fence that sharded the log (format 7), or at the evolution's commit
    monkeypatch.setattr(meta, "FORMAT_VERSION", 2)
    with pytest.raises(IncompatibleFormat, match="format version 7"):
        Engine.open(blob.read_only())
    with pytest.raises(IncompatibleFormat, match="format version 3"):
        meta.decode_commit(evolution, bytes(blob.get(evolution) or b""))


# -- the property: a random chain of evolutions against a model ------------------------------

LEAVES = [pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.float32(), S,
          pa.binary(), pa.decimal128(5, 2), pa.bool_(), pa.list_(pa.int8())]


def leaf_types() -> st.SearchStrategy[pa.DataType]:
    return st.sampled_from(LEAVES)


def struct_types(depth: int) -> st.SearchStrategy[pa.DataType]:
    inner = leaf_types() if depth == 0 else st.one_of(leaf_types(), struct_types(depth - 1))
    return st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=3).map(
        lambda fs: pa.struct([pa.field(f"f{i}", t, nullable=n)
                              for i, (t, n) in enumerate(fs)]))


_WIDER = {pa.int8(): pa.int16(), pa.int16(): pa.int32(), pa.int32(): pa.int64(),
          pa.uint8(): pa.uint16(), pa.uint16(): pa.uint32(), pa.uint32(): pa.uint64(),
          pa.float32(): pa.float64(), S: pa.large_string(), pa.binary(): pa.large_binary()}


def _evolutions(t: pa.DataType, fresh: list[int]) -> list[pa.DataType]:
    """Every type one allowed change away from ``t`` (with new field names from ``fresh``)."""
    out: list[pa.DataType] = []
    if t in _WIDER:
        out.append(_WIDER[t])
    if pa.types.is_decimal(t) and t.precision < 38:
        out.append(pa.decimal128(t.precision + 3, t.scale))
    if pa.types.is_list(t):
        out.append(pa.large_list(t.value_field))
        out += [pa.list_(pa.field("item", x, nullable=t.value_field.nullable))
                for x in _evolutions(t.value_type, fresh)]
    if pa.types.is_struct(t):
        fields = list(t)
        name = f"n{fresh[0]}"
        for at in range(len(fields) + 1):
            out.append(pa.struct([*fields[:at], pa.field(name, pa.int16(), nullable=True),
                                  *fields[at:]]))
        for i, f in enumerate(fields):
            if len(fields) > 1:
                out.append(pa.struct(fields[:i] + fields[i + 1:]))
            if not f.nullable:
                out.append(pa.struct([*fields[:i], f.with_nullable(True), *fields[i + 1:]]))
            out += [pa.struct([*fields[:i], f.with_type(x), *fields[i + 1:]])
                    for x in _evolutions(f.type, fresh)]
    return out


def value_of(t: pa.DataType, nullable: bool) -> st.SearchStrategy[Any]:
    """Small pools, so that records recur and retractions meet their insertions."""
    if pa.types.is_struct(t):
        base: st.SearchStrategy[Any] = st.fixed_dictionaries(
            {f.name: value_of(f.type, f.nullable) for f in t})
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        base = st.lists(value_of(t.value_type, t.value_field.nullable), max_size=2)
    elif pa.types.is_integer(t):
        lo, hi = records._int_range(t)
        base = st.sampled_from(sorted({0, 1, lo, hi}))
    elif pa.types.is_floating(t):
        base = st.sampled_from([0.5, -0.0, 2.0 ** 127]
                                + ([0.1, 1e300] if t.bit_width == 64 else []))
    elif pa.types.is_decimal(t):
        big = decimal.Decimal(10 ** (t.precision - t.scale) - 1)
        base = st.sampled_from([decimal.Decimal("1.25"), big.quantize(decimal.Decimal("0.01"))])
    elif pa.types.is_boolean(t):
        base = st.booleans()
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        base = st.sampled_from(["", "a"])
    else:
        base = st.sampled_from([b"", b"z"])
    return st.none() | base if nullable else base


class Misfit(Exception):
    pass


def py_step(v: Any, old: pa.DataType, new: pa.DataType) -> Any:
    """The model of one migration step (fields by name), either way."""
    if v is None:
        return None
    if pa.types.is_struct(new):
        out = {}
        for f in new:
            i = old.get_field_index(f.name)
            x = None if i < 0 else py_step(v[f.name], old.field(i).type, f.type)
            if x is None and not f.nullable:
                raise Misfit(f.name)
            out[f.name] = x
        return out
    if pa.types.is_list(new) or pa.types.is_large_list(new):
        items = [py_step(x, old.value_type, new.value_type) for x in v]
        if not new.value_field.nullable and any(x is None for x in items):
            raise Misfit("item")
        return items
    if pa.types.is_integer(new):
        lo, hi = records._int_range(new)
        if not lo <= v <= hi:
            raise Misfit(v)
    if new == pa.float32() and not math.isnan(v) and not _fits_float32(v):
        raise Misfit(v)
    if pa.types.is_decimal(new) and abs(v) >= 10 ** (new.precision - new.scale):
        raise Misfit(v)
    return v


def _fits_float32(v: float) -> bool:
    # NB: a double beyond float32's range does not even pack (OverflowError), and does not fit
    try:
        return bool(struct.unpack("<f", struct.pack("<f", v))[0] == v)
    except OverflowError:
        return False


def py_migrate(v: Any, types: list[pa.DataType], frm: int, to: int) -> Any:
    cur = len(types) - 1
    steps = [*range(frm, cur + 1), *range(cur - 1, to - 1, -1)]
    for a, b in itertools.pairwise(steps):
        v = py_step(v, types[a], types[b])
    return v


def canon(x: Any) -> Any:
    if isinstance(x, float):
        return ("f", x.hex())
    if isinstance(x, dict):
        return ("d", tuple((k, canon(v)) for k, v in sorted(x.items())))
    if isinstance(x, (list, tuple)):
        return ("l", tuple(canon(v) for v in x))
    if isinstance(x, bool):
        return ("b", x)
    return x


class Model:
    """Updates as written (with the version they were written as); contents at any version."""

    def __init__(self, kt: pa.DataType, vt: pa.DataType) -> None:
        self.keys = [kt]
        self.values = [vt]
        self.updates: list[tuple[Any, Any, int, int, int]] = []

    def contents(self, as_of: int, version: int) -> dict[Any, int] | None:
        """``{(key, value): diff}`` as ``version`` reads it, or None: a record does not fit."""
        cur = len(self.keys) - 1
        at_cur: dict[Any, tuple[Any, Any, int]] = {}
        for k, v, sid, t, d in self.updates:
            if t > as_of:
                continue
            k2 = py_migrate(k, self.keys, sid, cur)
            v2 = py_migrate(v, self.values, sid, cur)
            x = (canon(k2), canon(v2))
            kk, vv, dd = at_cur.get(x, (k2, v2, 0))
            at_cur[x] = (kk, vv, dd + d)
        out: dict[Any, int] = defaultdict(int)
        for k, v, d in at_cur.values():
            if not d:
                continue
            try:
                x = (canon(py_migrate(k, self.keys, cur, version)),
                     canon(py_migrate(v, self.values, cur, version)))
            except Misfit:
                return None
            out[x] += d
        return {x: d for x, d in out.items() if d}


def read(ix: Engine, name: str, as_of: int, version: int) -> dict[Any, int] | None:
    try:
        rows = ix.snapshot(name, as_of, schema_id=version).to_python()
    except SchemaMismatch:
        return None
    out = {}
    for (k, v), _, d in rows:
        x = (canon(k), canon(v))
        assert x not in out, f"two rows for {x}"
        out[x] = d
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[pa.DataType, pa.DataType, list[Any]]:
    kt = draw(st.sampled_from([pa.int8(), pa.uint8(), st_(("k", pa.int8(), False))]))
    vt = draw(struct_types(1))
    steps: list[Any] = []
    keys, vals = [kt], [vt]
    fresh = [0]
    for _ in range(draw(st.integers(3, 8))):
        action = draw(st.sampled_from(["write", "write", "evolve", "old-write", "compact"]))
        if action == "evolve":
            fresh[0] += 1
            which = draw(st.sampled_from(["key", "value", "value"]))
            options = _evolutions(keys[-1] if which == "key" else vals[-1], fresh)
            if not options:
                continue
            new = draw(st.sampled_from(options))
            (keys if which == "key" else vals).append(new)
            (vals if which == "key" else keys).append((vals if which == "key" else keys)[-1])
            steps.append(("evolve", which, new))
            continue
        if action == "compact":
            steps.append(("compact", draw(st.booleans())))
            continue
        sid = len(keys) - 1 if action == "write" else draw(st.integers(0, len(keys) - 1))
        ups = draw(st.lists(st.tuples(value_of(keys[sid], False), value_of(vals[sid], True),
                                      st.sampled_from([1, -1, 2])), min_size=1, max_size=6))
        steps.append(("write", sid, ups))
    return kt, vt, steps


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_evolution_chains_match_the_model(scenario: tuple[pa.DataType, pa.DataType,
                                                         list[Any]]) -> None:
    kt, vt, steps = scenario
    with tempfile.TemporaryDirectory() as d:
        ix = engine(d)
        ix.register("c", kt, vt)
        m = Model(kt, vt)
        t = 0
        for step in steps:
            if step[0] == "evolve":
                _, which, new = step
                version = ix.evolve_schema("c", **{f"{which}_type": new})
                if which == "key":
                    m.keys.append(new)
                    m.values.append(m.values[-1])
                else:
                    m.values.append(new)
                    m.keys.append(m.keys[-1])
                assert version == len(m.keys) - 1
            elif step[0] == "compact":
                if step[1]:
                    ix.allow_compaction("c", max(t - 1, 0))
                ix.maintain()
            else:
                _, sid, ups = step
                # retract something written before, as written, now and then
                live = [u for u in m.updates if u[2] == sid]
                rows = [((k, v), t, dd) for k, v, dd in ups]
                if live:
                    k, v, _, _, dd = live[len(ups) % len(live)]
                    rows.append(((k, v), t, -dd))
                txn = Txn(ix.state)
                gone = evolve.dropped_since(evolve.Schemas.of(ix.state.collections["c"]), sid)
                table = ix.normalize("c", rows, schema_id=sid)
                if gone:
                    with pytest.raises(SchemaMismatch, match="dropped"):
                        txn.stage_write("c", table, schema_id=sid)
                    continue
                txn.stage_write("c", table, schema_id=sid)
                ix.commit(txn)
                m.updates.extend((k, v, sid, t, dd) for (k, v), _, dd in rows)
                t += 1
                ix.seal("c", t)
            check(ix, m, t)
        check(ix, m, t)
        replica = Engine.open(FileBlob(d).read_only())
        check(replica, m, t)
        ix.allow_compaction("c", max(t - 1, 0))
        while ix.maintain():
            pass
        replica.refresh()
        check(ix, m, t)
        check(replica, m, t)


def check(ix: Engine, m: Model, t: int) -> None:
    c = ix.state.collections["c"]
    assert evolve.version(c) == len(m.keys) - 1
    if t == 0:
        return
    since = c.since
    for as_of in sorted({since, t - 1}):
        for version in range(len(m.keys)):
            expected = m.contents(as_of, version)
            got = read(ix, "c", as_of, version)
            assert got == expected, (as_of, version)

