"""The nemesis catches a broken engine: each test plants one bug and expects a violation.

These prove the suite has teeth end to end (traffic, history, final read, validator): a green
run is evidence, not an accident of weak checks. About two seconds each.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

import persist.indexed.engine as indexed
import persist.indexed.format.columnar as columnar
import persist.indexed.read.scan as scan
from persist.blob.memory import MemoryBlob
from persist.errors import Determinate
from tests.nemesis.driver import Config, Nemesis


def _problems(ops: int = 800, knobs: str | None = None) -> list[str]:
    name = f"mutant-{uuid.uuid4().hex}"
    try:
        return Nemesis(Config(url=f"mem://{name}", seed=1234, ops=ops, knobs=knobs)).run().problems
    finally:
        MemoryBlob.forget(name)


def test_acknowledging_without_committing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    commit = indexed.Indexed.commit

    def lossy(self: indexed.Indexed, txn: indexed.Txn, *, force: bool = False) -> Any:
        if txn.writes and rng.random() < 0.05:
            return self.state  # acknowledges, writes nothing
        return commit(self, txn, force=force)

    monkeypatch.setattr(indexed.Indexed, "commit", lossy)
    assert any(p.startswith("lost:") for p in _problems())


def test_compaction_forwarding_past_since_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    forward = columnar.forward
    monkeypatch.setattr(columnar, "forward", lambda table, frontier: forward(table, frontier + 3))
    # NB: pinned to merges at fanin 2 with no pause: the bug shows only in a merge, and under
    # the day's knob set (compact-none, say) on a loaded machine the run could end before the
    # background merged anything (seen failing 1 in 4 runs).
    problems = _problems(knobs="compact-aggressive")
    assert any("snapshot" in p or "listen" in p or "final contents" in p for p in problems)


def test_reporting_determinate_after_landing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    commit = indexed.Indexed.commit

    def liar(self: indexed.Indexed, txn: indexed.Txn, *, force: bool = False) -> Any:
        state = commit(self, txn, force=force)
        if txn.writes and rng.random() < 0.05:
            raise Determinate("mutant: it landed")
        return state

    monkeypatch.setattr(indexed.Indexed, "commit", liar)
    assert any("failed with Determinate" in p for p in _problems())


def test_a_snapshot_dropping_a_row_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    to_arrow = scan.SnapshotRead.to_arrow

    def dropping(self: scan.SnapshotRead) -> Any:
        table = to_arrow(self)
        return table.slice(1) if len(table) > 3 and rng.random() < 0.05 else table

    monkeypatch.setattr(scan.SnapshotRead, "to_arrow", dropping)
    assert any("snapshot" in p for p in _problems())
