"""Seeded random traffic with injected faults, validated against its own history.

CI mode: a few thousand operations against ``mem://`` and against a file location, with
storage and lock faults, restarts, takeovers and outages; each run well under half a minute.
Slow mode (``-m slow``): ``PERSIST_NEMESIS_OPS`` operations (default 50,000) per location.
A failure prints the seed; ``PERSIST_NEMESIS_SEED=<seed>`` replays it.

Knobs (tests/knobs.py): in CI the memory run uses the session's knob set (the day's slice of
the rotation, or ``PERSIST_KNOBS``), the file run the next set in the rotation, and a short
file run flips knob sets on the live writer every 100 ms (the agitator). The slow mode runs
every location under every knob set, and with the agitator, ``PERSIST_NEMESIS_OPS`` each.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from persist.blob.memory import MemoryBlob
from tests import knobs
from tests.knobs import KnobSet
from tests.nemesis.conftest import nemesis_seed
from tests.nemesis.driver import Config, Nemesis, Report


def _run(cfg: Config) -> Report:
    try:
        report = Nemesis(cfg).run()
    except BaseException as e:
        e.add_note(f"nemesis seed {cfg.seed}: replay with PERSIST_NEMESIS_SEED={cfg.seed}")
        raise
    print(report.summary())
    for note in report.notes:
        print("note:", note)
    assert not report.problems, (
        f"nemesis found {len(report.problems)} problems (replay with "
        f"PERSIST_NEMESIS_SEED={cfg.seed}):\n" + "\n".join(report.problems[:30])
    )
    return report


def _mem_url() -> str:
    return f"mem://nemesis-{uuid.uuid4().hex}"


def test_nemesis_memory_with_faults(knob_set: KnobSet) -> None:
    url = _mem_url()
    try:
        report = _run(Config(url=url, seed=nemesis_seed(1), ops=3000, knobs=knob_set.name))
    finally:
        MemoryBlob.forget(url[len("mem://"):])
    assert report.counts.get("write.acked", 0) > 1000
    assert sum(report.injected.values()) > 0


def test_nemesis_file_with_faults(tmp_path: Path, knob_set: KnobSet) -> None:
    # NB: the next set of the rotation, so each CI run covers two sets of the matrix
    report = _run(Config(url=str(tmp_path / "loc"), seed=nemesis_seed(2), ops=2000,
                         knobs=knobs.following(knob_set).name))
    assert report.counts.get("write.acked", 0) > 300


def test_nemesis_knob_agitator(tmp_path: Path) -> None:
    """A few seconds of traffic while every 100 ms a random knob set replaces the live
    writer's options (and the next open's, storage options included)."""
    report = _run(Config(url=str(tmp_path / "loc"), seed=nemesis_seed(5), ops=1200,
                         knobs="default", agitate=True))
    assert report.flips >= 5, report.summary()
    assert report.counts.get("write.acked", 0) > 200


def test_nemesis_without_faults() -> None:
    """No injected faults: no write fails for a storage reason and no writer stops itself;
    writes fail only as the workload asks (invalid on purpose, or sent to a replaced writer)."""
    url = _mem_url()
    try:
        report = _run(Config(url=url, seed=nemesis_seed(3), ops=1500, faults=False))
    finally:
        MemoryBlob.forget(url[len("mem://"):])
    assert not any(k.startswith(("write.failed.Determinate", "write.failed.Indeterminate"))
                   for k in report.counts), report.counts
    assert "writer.recovered" not in report.counts


@pytest.mark.slow
@pytest.mark.timeout(3700)  # the run's own limit is max_seconds=3600, not pytest's default 600
@pytest.mark.parametrize("knob", list(knobs.KNOB_SETS))
@pytest.mark.parametrize("where", ["mem", "file"])
def test_nemesis_slow(where: str, knob: str, tmp_path: Path, slow_ops: int) -> None:
    url = _mem_url() if where == "mem" else str(tmp_path / "loc")
    try:
        _run(Config(url=url, seed=nemesis_seed(4), ops=slow_ops,
                    keep_contents=slow_ops <= 10000, max_seconds=3600, knobs=knob))
    finally:
        if where == "mem":
            MemoryBlob.forget(url[len("mem://"):])


@pytest.mark.slow
@pytest.mark.timeout(3700)  # as test_nemesis_slow
@pytest.mark.parametrize("where", ["mem", "file"])
def test_nemesis_slow_agitated(where: str, tmp_path: Path, slow_ops: int) -> None:
    """The whole run with the agitator flipping knob sets every 100 ms."""
    url = _mem_url() if where == "mem" else str(tmp_path / "loc")
    try:
        report = _run(Config(url=url, seed=nemesis_seed(6), ops=slow_ops,
                             keep_contents=slow_ops <= 10000, max_seconds=3600,
                             knobs="default", agitate=True))
    finally:
        if where == "mem":
            MemoryBlob.forget(url[len("mem://"):])
    assert report.flips > 0, report.summary()
