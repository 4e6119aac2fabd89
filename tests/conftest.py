"""Suite-wide fixtures: the S3/DynamoDB servers (tests/support/s3_fixtures.py), and the knob
matrix (tests/knobs.py): the core, runtime, replica and nemesis suites run under the knob set
``PERSIST_KNOBS`` names (default: the day's slice of the rotation, shown in the header)."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import knobs

pytest_plugins = ["tests.support.s3_fixtures"]

_chosen: tuple[knobs.KnobSet, str] | None = None


def _session_knobs() -> knobs.KnobSet:
    assert _chosen is not None
    return _chosen[0]


def pytest_configure(config: pytest.Config) -> None:
    global _chosen
    try:
        _chosen = knobs.from_env()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from e
    # NB: exported, so subprocesses of matrix tests (crash writers, replica workers) use it
    # too, and a rotation that crosses midnight cannot split one run over two sets.
    os.environ[knobs.ENV] = _chosen[0].name
    config.addinivalue_line(
        "markers", "knobs(name): run this test under the named knob set (tests/knobs.py), "
        "whatever PERSIST_KNOBS says; for tests that need one setting")


def pytest_report_header(config: pytest.Config) -> str:
    ks, how = _chosen if _chosen is not None else (knobs.rotation(), "?")
    return (f"persist knobs: {ks.name} ({how}): {ks.describe()}; "
            f"replay with {knobs.ENV}={ks.name} (applies to {', '.join(knobs.MATRIX_DIRS)})")


def _relpath(config: pytest.Config, path: Path) -> str:
    try:
        return str(path.relative_to(config.rootpath))
    except ValueError:
        return str(path)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    # NB: test modules build options at import time (module-level OPTIONS constants), which
    # happens while their collector collects: those must see the set too.
    path = getattr(collector, "path", None)
    inside = (isinstance(collector, pytest.Module) and path is not None
              and knobs.in_matrix(_relpath(collector.config, path)))
    if not inside:
        return (yield)
    with knobs.using(_session_knobs()):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, Any, Any]:
    marker = item.get_closest_marker("knobs")
    if marker is not None:
        ks: knobs.KnobSet | None = knobs.KNOB_SETS[marker.args[0]]
    elif knobs.in_matrix(_relpath(item.config, item.path)):
        ks = _session_knobs()
    else:
        ks = None
    with knobs.using(ks):
        return (yield)


@pytest.fixture(autouse=True)
def _jvm_watch(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test, in any directory: is this worker's Spark JVM (if it has one) still
    running? Two fresh-clone CI runs on 2026-11-29 lost one worker's JVM with no test named."""
    yield
    from tests.support import jvm_watch

    if (lost := jvm_watch.check(request.node.nodeid, call=False)) is not None:
        pytest.fail(lost, pytrace=False)


@pytest.fixture
def knob_set() -> knobs.KnobSet:
    """The session's knob set."""
    return _session_knobs()
