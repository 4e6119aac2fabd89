"""Collections stored as msgpack before msgpack became an explicit opt-in
(``persist.msgpack(T)``) keep opening and reading; opened with the bare class they are
refused with a message that names the opt-in. Bytes written by ``make_golden_msgpack``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from tests.golden.records_msgpack import Event, Point

HERE = Path(__file__).parent


@pytest.fixture
def location(tmp_path: Path) -> Path:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "msgpack-location", loc)
    return loc


def _rows(got: list[tuple[tuple[object, object], int, int]]) -> list[list[object]]:
    return [[repr(k), repr(v), d] for (k, v), _, d in got]


def test_msgpack_collections_read_identically_with_persist_msgpack(location: Path) -> None:
    expected = json.loads((HERE / "msgpack-expected.json").read_text())
    types = {"events": {"key_type": pa.string(), "value_type": persist.msgpack(Event)},
             "points": {"key_type": persist.msgpack(Point), "value_type": pa.int64()}}
    with persist.open(location, read_only=True) as replica:
        for name, by_time in expected.items():
            _, r = replica.create_or_load(name, **types[name])
            assert sorted(int(t) for t in by_time) == list(range(r.since, r.upper))
            for t, rows in by_time.items():
                assert _rows(r.snapshot(int(t)).to_python()) == rows, (name, t)
        _, events = replica.create_or_load("events", **types["events"])
        assert all(isinstance(v, Event) for (_, v), _, _ in events.snapshot(11).to_python())


def test_msgpack_collections_opened_with_the_bare_class_name_the_opt_in(
        location: Path) -> None:
    with persist.open(location, read_only=True) as replica:
        # Event does not map (a dict field): refused before the collection is looked at
        with pytest.raises(persist.SchemaMismatch,
                           match=r"value.tags: dict\[str, int\] has no Arrow mapping.*"
                                 r"persist.msgpack\(Event\)"):
            replica.create_or_load("events", key_type=pa.string(), value_type=Event)
        # Point maps now, but the collection stores it as msgpack
        with pytest.raises(persist.SchemaMismatch,
                           match=r"key is stored as opaque msgpack of "
                                 r"tests.golden.records_msgpack:Point.*"
                                 r"key_type=persist.msgpack\(Point\)"):
            replica.create_or_load("points", key_type=Point, value_type=pa.int64())


def test_a_writer_keeps_writing_msgpack_collections(location: Path) -> None:
    with persist.open(location, reentrance_id="w") as client:
        w, r = client.create_or_load("events", key_type=pa.string(),
                                     value_type=persist.msgpack(Event))
        before = r.snapshot(11).to_python()
        w.append([(("e9", Event("view", {"m": 1})), 12, 1)], upper=13).result()
        want = [*[((k, v), 12, d) for (k, v), _, d in before],
                (("e9", Event("view", {"m": 1})), 12, 1)]
        assert sorted(map(repr, r.snapshot(12).to_python())) == sorted(map(repr, want))
        w, r = client.create_or_load("points", key_type=persist.msgpack(Point),
                                     value_type=pa.int64())
        w.append([((Point(7, 7), 1), 12, 1)], upper=13).result()
        assert ((Point(7, 7), 1), 12, 1) in r.snapshot(12).to_python()


def test_version_1_nans_of_other_payloads_consolidate_on_read(location: Path) -> None:
    """The persist that wrote these parts kept NaNs of two payloads apart, +1 and -1 (issue 21
    #18); read now, they cancel (DESIGN §4: NaN equals NaN, any payload)."""
    with persist.open(location, read_only=True) as replica:
        _, r = replica.create_or_load("nans", key_type=pa.float64(), value_type=pa.int64())
        for t in range(r.since, r.upper):
            got = r.snapshot(t).to_python()
            if t % 2:
                assert got == [], t
            else:
                [((k, v), _, d)] = got
                assert math.isnan(k), t
                assert (v, d) == (1, 1), t
