"""Schema evolution through the clients: ``Client.evolve_schema`` and ``AsyncClient``'s,
linearized with writes, compare-and-set, refusals that change nothing, handles pinned to the
schema version they were opened with (old-schema readers, listeners and writers), replicas
that follow evolutions."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist.errors import InvalidUsage, ReadOnly, SchemaMismatch, UnknownCollection
from tests.support.patience import PATIENCE


def url() -> str:
    return f"mem://{uuid.uuid4().hex}"


V0 = pa.struct([pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())])
V1 = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("tag", pa.string()),
                pa.field("name", pa.string())])
V2 = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("tag", pa.string())])


def rows(read: persist.ReadHandle, as_of: int) -> list[Any]:
    return [(k, v, d) for (k, v), _, d in read.snapshot(as_of).to_python()]


def test_evolve_schema_is_linearized_with_writes(tmp_path: Path) -> None:
    with persist.open(tmp_path, reentrance_id="w") as client:
        w0, r0 = client.create_or_load("c", key_type=pa.string(), value_type=V0)
        assert (w0.schema_version, r0.schema_version) == (0, 0)
        # none waited on: queue order decides which schema each one meets
        before = w0.append([(("a", {"id": 1, "name": "x"}), 0, 1)], upper=1)
        evolved = client.evolve_schema("c", value_type=V1)
        after = w0.append([(("b", {"id": 2, "name": None}), 1, 1)], upper=2)
        before.result()
        after.result()
        assert evolved.result() == 1
        w1, r1 = client.create_or_load("c", key_type=pa.string(), value_type=V1)
        assert r1.schema_version == 1
        assert r1.schema.field("value").type == V1
        assert r0.schema.field("value").type == V0
        w1.append([(("c", {"id": 2**40, "tag": "t", "name": None}), 2, 1)], upper=3).result()
        assert rows(r1, 2) == [
            ("a", {"id": 1, "tag": None, "name": "x"}, 1),
            ("b", {"id": 2, "tag": None, "name": None}, 1),
            ("c", {"id": 2**40, "tag": "t", "name": None}, 1),
        ]
        # the old handle reads as version 0: as of 1 every value fits
        assert rows(r0, 1) == [("a", {"id": 1, "name": "x"}, 1),
                               ("b", {"id": 2, "name": None}, 1)]
        # ... as of 2 one does not: a typed error naming it, never a truncated value
        with pytest.raises(SchemaMismatch, match=r"value\.id: the int64 value 1099511627776"):
            r0.snapshot(2).to_arrow()
        # its raw updates as of 1 are migrated too
        got = [t.to_pylist() for t in r0.snapshot(1).batches()]
        assert sorted(r["key"] for t in got for r in t) == ["a", "b"]
        client.maintain()
        assert rows(r1, 2)[2] == ("c", {"id": 2**40, "tag": "t", "name": None}, 1)
    with persist.open(tmp_path, read_only=True) as replica:
        _, r = replica.create_or_load("c", key_type=pa.string(), value_type=V1)
        assert rows(r, 2)[0] == ("a", {"id": 1, "tag": None, "name": "x"}, 1)


def test_refusals_change_nothing() -> None:
    with persist.open(url()) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        w.append([((1, {"id": 1, "name": "x"}), 0, 1)], upper=1).result()
        before = client.state
        narrowing = pa.struct([pa.field("id", pa.int16(), nullable=False),
                               pa.field("name", pa.string())])
        with pytest.raises(SchemaMismatch, match=r"value\.id: int32 cannot narrow to int16"):
            client.evolve_schema("c", value_type=narrowing).result()
        required = pa.struct([*V0, pa.field("n", pa.int8(), nullable=False)])
        with pytest.raises(SchemaMismatch, match=r"value\.n: a new field must be nullable"):
            client.evolve_schema("c", value_type=required).result()
        with pytest.raises(SchemaMismatch, match="key: int64 cannot change to string"):
            client.evolve_schema("c", key_type=pa.string()).result()
        with pytest.raises(UnknownCollection):
            client.evolve_schema("nope", value_type=V1).result()
        with pytest.raises(InvalidUsage, match="expect_version"):
            client.evolve_schema("c", value_type=V1, expect_version=-1)
        with pytest.raises(SchemaMismatch, match="not supported"):
            client.evolve_schema("c", value_type=pa.float16())
        assert client.state is before
        # the types it already has: nothing committed, the current version
        assert client.evolve_schema("c", value_type=V0).result() == 0
        assert client.state is before


def test_compare_and_set_refuses_a_concurrent_evolution() -> None:
    with persist.open(url()) as client:
        client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        first = client.evolve_schema("c", value_type=V1, expect_version=0)
        second = client.evolve_schema("c", value_type=V2, expect_version=0)
        assert first.result() == 1
        with pytest.raises(SchemaMismatch, match="at version 1, not the expected 0"):
            second.result()
        seq = client.state.seq
        assert client.evolve_schema("c", value_type=V2, expect_version=1).result() == 2
        assert client.state.seq == seq + 1


def test_old_schema_writers_and_listeners() -> None:
    with persist.open(url()) as client:
        w0, r0 = client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        w0.seal(1).result()
        listener = r0.listen(0)  # the updates at times > 0, as version 0
        w0.append([((0, {"id": 0, "name": "a"}), 1, 1)], upper=2).result()
        client.evolve_schema("c", value_type=V1).result()
        # blue, still on version 0, keeps writing: migrated to version 1 on commit
        w0.append([((1, {"id": 1, "name": "b"}), 2, 1)], upper=3).result()
        _, r1 = client.create_or_load("c", key_type=pa.int64(), value_type=V1)
        assert rows(r1, 2)[1] == (1, {"id": 1, "tag": None, "name": "b"}, 1)
        events = listener.poll(5)
        while not any(isinstance(e, persist.ListenProgress) and e.upper >= 3 for e in events):
            events += listener.poll(5)
        got = [r for e in events if isinstance(e, persist.ListenUpdates)
               for r in e.batch.to_pylist()]
        assert [r["value"] for r in got] == [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}]
        # once a later version drops one of its fields, blue's writes are refused
        client.evolve_schema("c", value_type=V2).result()
        before = client.state
        with pytest.raises(SchemaMismatch, match=r"a later version dropped value\.name"):
            w0.append([((2, {"id": 2, "name": "c"}), 3, 1)], upper=4).result()
        assert client.state is before
        listener.close()


def test_replicas_follow_evolutions(tmp_path: Path) -> None:
    with persist.open(tmp_path, reentrance_id="w") as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        w.append([((1, {"id": 1, "name": "x"}), 0, 1)], upper=1).result()
        with persist.open(tmp_path, read_only=True) as replica:
            _, blue = replica.create_or_load("c", key_type=pa.int64(), value_type=V0)
            client.evolve_schema("c", value_type=V1).result()
            w1, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V1)
            w1.append([((2, {"id": 2, "tag": "t", "name": None}), 1, 1)], upper=2).result()
            blue.wait_for_upper(1, timeout=PATIENCE)
            # a handle opened before keeps reading as its version
            assert rows(blue, 1) == [(1, {"id": 1, "name": "x"}, 1),
                                     (2, {"id": 2, "name": None}, 1)]
            _, green = replica.create_or_load("c", key_type=pa.int64(), value_type=V1)
            assert green.schema_version == 1
            assert rows(green, 1)[0] == (1, {"id": 1, "tag": None, "name": "x"}, 1)
            with pytest.raises(ReadOnly):
                replica.evolve_schema("c", value_type=V2)
            with pytest.raises(SchemaMismatch, match=r"earlier versions: 0: key int64"):
                replica.create_or_load("c", key_type=pa.int64(), value_type=V2)


def test_asyncio_face() -> None:
    async def main() -> None:
        async with await persist.aio.open(url()) as client:
            w, r = await client.create_or_load("c", key_type=pa.int64(), value_type=V0)
            await w.append([((1, {"id": 1, "name": "x"}), 0, 1)], upper=1)
            assert await client.evolve_schema("c", value_type=V1, expect_version=0) == 1
            with pytest.raises(SchemaMismatch, match="not the expected 0"):
                await client.evolve_schema("c", value_type=V2, expect_version=0)
            assert (w.schema_version, r.schema_version) == (0, 0)
            _, r1 = await client.create_or_load("c", key_type=pa.int64(), value_type=V1)
            assert r1.schema_version == 1
            got = await r1.snapshot(0).to_python()
            assert got == [((1, {"id": 1, "tag": None, "name": "x"}), 0, 1)]
            assert await r.snapshot(0).to_python() == [((1, {"id": 1, "name": "x"}), 0, 1)]

    asyncio.run(main())


def poll_until_it_fails(listener: persist.Listener) -> None:
    for _ in range(20):
        listener.poll(5)


def test_a_listener_fails_loudly_on_a_value_its_version_cannot_hold() -> None:
    with persist.open(url()) as client:
        _, r0 = client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        listener = r0.listen(0)
        client.evolve_schema("c", value_type=V1).result()
        w1, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V1)
        w1.append([((1, {"id": 2**40, "tag": None, "name": None}), 1, 1)], upper=2).result()
        with pytest.raises(SchemaMismatch, match=r"value\.id: the int64 value 1099511627776"):
            poll_until_it_fails(listener)
        with pytest.raises(SchemaMismatch):  # and stays failed: nothing is skipped
            listener.poll(0.1)
