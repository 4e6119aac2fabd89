"""Engine options as knobs: validated on construction, replaceable on a live writer
(``Client.set_options``, linearized like a write), and each one real (group commit off really
commits one command at a time, background compaction off really leaves parts alone)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import InvalidUsage, Options, ReadOnly
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import MAX_INLINE_THRESHOLD
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.knobs import KNOB_SETS
from tests.support.patience import eventually


@pytest.fixture
def url() -> Iterator[str]:
    name = f"options-{uuid.uuid4().hex}"
    yield f"mem://{name}"
    MemoryBlob.forget(name)


@pytest.mark.parametrize("bad", [
    {"inline_threshold": -1}, {"inline_threshold": MAX_INLINE_THRESHOLD + 1},
    {"inline_threshold": 1.5}, {"rollup_every": 0}, {"rollup_every": True},
    {"gc_grace_seconds": -1.0}, {"commit_deadline_seconds": "60"}, {"cache_bytes": -1},
    {"group_commit": 1}, {"background_compaction": "no"}, {"compaction": {"fanin": 2}},
])
def test_a_bad_option_is_invalid_usage(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsage, match=next(iter(bad))):
        Options(**bad)


@pytest.mark.parametrize("bad", [{"fanin": 1}, {"final_rows": 0}, {"inline_flush_bytes": -1},
                                 {"fanin": 2.0}])
def test_a_bad_compaction_policy_is_invalid_usage(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsage, match=next(iter(bad))):
        CompactionPolicy(**bad)


def test_open_refuses_options_of_another_type(url: str) -> None:
    with pytest.raises(InvalidUsage, match=r"persist\.Options"):
        persist.open(url, options={"inline_threshold": 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(KNOB_SETS))
def test_every_knob_set_makes_valid_options(name: str) -> None:
    ks = KNOB_SETS[name]
    opts = ks.apply(Options())
    for k, v in ks.options.items():
        assert getattr(opts, k) == v
    for k, v in ks.compaction.items():
        assert getattr(opts.compaction, k) == v


def _open(url: str, **opts: Any) -> tuple[persist.Client, persist.WriteHandle,
                                          persist.ReadHandle]:
    client = persist.open(url, options=Options(**opts))
    w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
    return client, w, r


def test_group_commit_off_commits_one_command_per_commit(url: str) -> None:
    client, w, _ = _open(url, group_commit=False, background_compaction=False)
    with client:
        futures = [w.write([((f"k{i}", i), i, 1)]) for i in range(40)]
        for f in futures:
            f.result()
        assert client.stats["groups_max"] == 1
        assert client.stats["commits"] >= 41  # the registration, then one per write


def test_set_options_is_linearized_between_commands(url: str) -> None:
    """Commands submitted before set_options commit under the old options, those after under
    the new ones, even when all of them queue up behind one commit."""
    # NB: pins the options it observes: inline threshold, and no merging of the two parts
    client, w, r = _open(url, inline_threshold=MAX_INLINE_THRESHOLD,
                         background_compaction=False)
    with client:
        before = w.write([(("a", 1), 0, 1)])
        switched = client.set_options(Options(inline_threshold=0, background_compaction=False))
        after = w.write([(("b", 2), 0, 1)])
        seq_before, seq_switched, seq_after = before.result(), switched.result(), after.result()
        assert seq_before <= seq_switched < seq_after
        assert client.options.inline_threshold == 0
        parts = r._meta().parts
        assert [p.inline is not None for p in parts] == [True, False]
        w.seal(1).result()
        assert sorted(r.snapshot(0).to_python()) == [(("a", 1), 0, 1), (("b", 2), 0, 1)]


def test_set_options_refusals(url: str) -> None:
    client, _, _ = _open(url)
    with client:
        with pytest.raises(InvalidUsage, match=r"persist\.Options"):
            client.set_options({"group_commit": False})  # type: ignore[arg-type]
        with pytest.raises(InvalidUsage, match="cache_bytes"):
            client.set_options(Options(cache_bytes=1 << 10)).result()
        with persist.open(url, read_only=True) as replica, pytest.raises(ReadOnly):
            replica.set_options(Options())


def test_background_compaction_off_leaves_parts_until_maintain(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = CompactionPolicy(fanin=2, inline_flush_bytes=1 << 30)
    client, w, r = _open(url, background_compaction=False, compaction=policy)
    with client:
        # NB: counts the background thread's rounds, so the test waits for rounds that ran
        # (an event), not for a time in which some rounds may run on an idle machine
        runtime = client._runtime
        assert runtime is not None
        rounds: list[bool] = []
        original = runtime.maintain_once

        def counted(*, background: bool = False) -> bool:
            did = original(background=background)
            if background:
                rounds.append(did)
            return did

        monkeypatch.setattr(runtime, "maintain_once", counted)
        for t in range(8):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        after = len(rounds)
        eventually(lambda: len(rounds) >= after + 2, "two background rounds after the appends")
        assert len(r._meta().parts) == 8
        assert client.maintain()  # an explicit round compacts
        assert len(r._meta().parts) < 8
        for t in range(8, 16):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        client.set_options(Options(background_compaction=True, compaction=policy)).result()
        eventually(lambda: len(r._meta().parts) <= 2, "background compaction")
        assert len(r.snapshot(15).to_python()) == 16


def test_a_new_compaction_policy_replans_unchanged_collections(url: str) -> None:
    """The engine memoizes a collection's plan; the memo must not outlive the policy."""
    # NB: pins fanin 4 and no inline flush (the knob sets vary both)
    client, w, _ = _open(url, background_compaction=False,
                         compaction=CompactionPolicy(fanin=4, inline_flush_bytes=1 << 30))
    with client:
        for t in range(3):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        ix = client._ix
        assert ix.plan_compaction(client.state) == []  # fanin 4: 3 parts wait
        client.set_options(Options(background_compaction=False,
                                   compaction=CompactionPolicy(
                                       fanin=2, inline_flush_bytes=1 << 30))).result()
        assert [name for name, _ in ix.plan_compaction(client.state)] == ["c"]


def test_inline_parts_are_flushed_to_a_blob_even_when_the_threshold_would_keep_them() -> None:
    """With an inline threshold above the flush size (the knob set inline-max), the merge that
    flushes inline parts used to produce one inline part again: every later round merged it
    with the next small part and rewrote the collection's whole inline data, in a commit (and
    every rollup) carrying all of it."""
    from tests.support.engine import Engine

    # NB: pins the knobs it is about: the largest inline threshold, a small flush size, no
    # level merges, parts of 20 rows not yet final, and merges not cut into smaller parts
    ix = Engine.open(MemoryBlob(uuid.uuid4().hex), epoch=1, writer="w", options=Options(
        inline_threshold=MAX_INLINE_THRESHOLD,
        compaction=CompactionPolicy(fanin=1 << 30, final_rows=1 << 19, inline_flush_bytes=2048,
                                    part_target_bytes=64 << 20)))
    ix.fence()
    ix.register("c", pa.string(), pa.int64())
    for t in range(12):
        ix.write({"c": [((f"key-{t}-{i:04d}", i), t, 1) for i in range(20)]})
    assert all(p.inline is not None for p in ix.state.collections["c"].parts)
    ix.maintain()
    parts = ix.state.collections["c"].parts
    assert [p.inline is None for p in parts] == [True]  # flushed into one blob part
    ix.write({"c": [(("late", 1), 12, 1)]})
    assert ix.maintain() == 0  # one blob and one small inline part: nothing to rewrite
