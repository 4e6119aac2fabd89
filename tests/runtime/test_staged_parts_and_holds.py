"""``Client.apply(parts=..., holds=...)`` and ``WriteHandle.hold``: the two additions the Spark
operators build on (parts staged by other processes, durable read holds)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import persist
from persist.errors import InvalidUsage
from persist.indexed.format import write
from persist.indexed.format.evolve import Types
from persist.indexed.format.meta import PartMeta
from persist.location import resolve
from tests.support.engine import updates_between


def url() -> str:
    return f"mem://{uuid.uuid4().hex}"


def _stage(loc_url: str, client: persist.Client, name: str, rows: list[tuple[object, ...]],
           *, inline_threshold: int) -> PartMeta:
    """Encodes and stores ``rows`` as a part, the way a Spark task does (own blob handle)."""
    c = client.state.collections[name]
    types = Types.of(c)
    from persist.indexed.format.columnar import from_updates

    table = from_updates(rows, types.schema, types.key, types.value)
    return write.new_part(resolve(loc_url).blob, c, table, inline_threshold=inline_threshold,
                            consolidated=False)


@pytest.mark.parametrize("inline_threshold", [0, 1 << 20], ids=["blob", "inline"])
def test_staged_parts_commit_with_a_seal(inline_threshold: int) -> None:
    u = url()
    with persist.open(u) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        p1 = _stage(u, client, "c", [(("a", 1), 0, 1), (("b", 2), 1, 1)],
                    inline_threshold=inline_threshold)
        p2 = _stage(u, client, "c", [(("a", 1), 1, -1)], inline_threshold=inline_threshold)
        assert (p1.blob_key is None) == bool(inline_threshold)
        client.apply(parts={"c": [p1, p2]}, seals={"c": 2}).result()
        assert r.upper == 2
        assert r.snapshot(0).to_python() == [(("a", 1), 0, 1)]
        assert r.snapshot(1).to_python() == [(("b", 2), 1, 1)]


def test_staged_parts_below_upper_fail_atomically() -> None:
    u = url()
    with persist.open(u) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.seal(5).result()
        ok = _stage(u, client, "c", [(("a", 1), 5, 1)], inline_threshold=1 << 20)
        late = _stage(u, client, "c", [(("b", 1), 4, 1)], inline_threshold=1 << 20)
        with pytest.raises(InvalidUsage, match="below its upper"):
            client.apply(parts={"c": [ok, late]}, seals={"c": 6}).result()
        assert r.upper == 5
        assert client.state.collections["c"].parts == ()


def test_staged_parts_must_live_under_data() -> None:
    with persist.open(url()) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        bad = PartMeta(id="x", rows=1, nbytes=1, min_time=0, max_time=0, blob_key="meta/log/1")
        with pytest.raises(InvalidUsage, match="outside"):
            client.apply(parts={"c": [bad]})


def test_hold_keeps_compaction_back_and_releases() -> None:
    with persist.open(url()) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((1, 1), 0, 1)], upper=1).result()
        w.hold("stream-a", 0).result()
        assert w.holds == {"stream-a": 0}
        for t in range(1, 10):
            w.append([((1, 1), t, 1)], upper=t + 1).result()
        w.allow_compaction(9).result()
        assert r.since == 0  # held back: the effective since
        # exact updates after the hold are still there, with their own times
        got = pa.concat_tables(updates_between(client, "c", 1, 10))
        assert sorted(got.column("time").to_pylist()) == list(range(1, 10))
        w.hold("stream-a", 4).result()
        assert r.since == 4
        with pytest.raises(InvalidUsage, match="below its since"):
            w.hold("stream-b", 3).result()
        w.hold("stream-a", None).result()
        assert w.holds == {}
        assert r.since == 9


def test_hold_and_data_commit_together() -> None:
    with persist.open(url()) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        client.apply(writes={"c": [((1, 1), 0, 1)]}, seals={"c": 1},
                     holds={"c": {"h": 0}}).result()
        assert (r.upper, w.holds) == (1, {"h": 0})
