"""A location whose idempotency tokens sit under their old name, ``__sink_progress`` (written by
``make_golden_tokens``, as persist recorded them before the record was the engine's), keeps
working: its tokens are read, honoured and advanced where they are, and no second record is
started beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.distributed import TOKENS, Committer, Stager, Token

HERE = Path(__file__).parent


@pytest.fixture
def loc(tmp_path: Path) -> str:
    shutil.copytree(HERE / "tokens-location", tmp_path / "loc")
    return f"file://{tmp_path}/loc"


def test_the_old_location_reads_identically(loc: str) -> None:
    expected = json.loads((HERE / "tokens-expected.json").read_text())
    with persist.open(loc, read_only=True) as client:
        assert TOKENS.collection(client.state) == "__sink_progress"
        for token, seq in expected["tokens"].items():
            assert client.token(token) == seq
        _, read = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert sorted(int(t) for t in expected["events"]) == list(range(read.since, read.upper))
        for t, rows in expected["events"].items():
            got = sorted([k, v, d] for (k, v), _, d in read.snapshot(int(t)).to_python())
            assert got == rows, t


def test_old_tokens_are_honoured_and_advanced_where_they_are(loc: str) -> None:
    expected = json.loads((HERE / "tokens-expected.json").read_text())
    last = expected["tokens"]["loader"]
    with persist.open(loc, reentrance_id="svc") as client:
        upper = client.info("events").upper
        replay = client.apply(writes={"events": [(("late", 1), upper, 1)]},
                              seals={"events": upper + 1}, token=Token("loader", last))
        assert replay.result() is None  # applied before the rename: still a replay
        assert client.info("events").upper == upper
        done = client.apply(writes={"events": [(("late", 1), upper, 1)]},
                            seals={"events": upper + 1}, token=Token("loader", last + 1))
        assert done.result() is not None
        assert client.token("loader") == last + 1
        assert client.token("copy@q") == expected["tokens"]["copy@q"]  # untouched
        assert TOKENS.name not in client.collections  # no second record beside the old one
        with pytest.raises(persist.InvalidUsage, match="records tokens"):
            client.apply(writes={"__sink_progress": []}, token=Token("x", 1))
    # the committer (and so the Spark sink) sees the same record
    stager = Stager.start(loc, "events", job="golden")
    staged = [stager.stage([(("again", 1), upper + 1, 1)])]
    committer = Committer(loc, reentrance_id="svc")
    assert not committer.commit({"events": staged}, token=Token("loader", last + 1))
    staged = [stager.stage([(("again", 1), upper + 1, 1)])]
    assert committer.commit({"events": staged}, seals={"events": upper + 2},
                            token=Token("copy@q", expected["tokens"]["copy@q"] + 1))
    stager.release(staged)
    with persist.open(loc, read_only=True) as client:
        assert client.token("copy@q") == expected["tokens"]["copy@q"] + 1
        assert TOKENS.collection(client.state) == "__sink_progress"
        assert TOKENS.name not in client.collections
        _, read = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        latest = {k: d for (k, _), _, d in read.snapshot(upper + 1).to_python()}
        assert latest["late"] == 1
        assert latest["again"] == 1


def test_a_new_location_records_tokens_under_the_engine_name(tmp_path: Path) -> None:
    with persist.open(tmp_path / "new") as client:
        client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        client.apply(seals={"events": 1}, token=Token("t", 0)).result()
        assert TOKENS.collection(client.state) == TOKENS.name == "__persist_tokens"
        assert "__sink_progress" not in client.collections
        assert client.token("t") == 0
