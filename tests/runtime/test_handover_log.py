"""The documented blue/green handover logs no ERROR (issue 21, finding 13): the old writer's
fail-stop is a WARNING that says what happened and that it is expected during a switch."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from tests.support.patience import eventually

TYPES = {"key_type": pa.string(), "value_type": pa.int64()}


def test_a_blue_green_handover_logs_a_warning_not_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = str(tmp_path / "loc")
    with caplog.at_level(logging.DEBUG, logger="persist"):
        # NB: as the README runs it: pushing to a local replica that listens throughout
        blue = persist.open(url, reentrance_id="orders-writer", notify=True)
        orders, _ = blue.create_or_load("orders", **TYPES)
        orders.append([(("o-1", 100), 0, 1)], upper=1).result()
        replica = persist.open(url, read_only=True, notify=True)
        listener = replica.create_or_load("orders", **TYPES)[1].listen(0)
        green = persist.open(url, reentrance_id="orders-writer", notify=True)  # takes over
        with pytest.raises(persist.Fenced):
            orders.append([(("o-2", 200), 1, 1)], upper=2).result()
        moved, _ = green.create_or_load("orders", **TYPES)
        moved.append([(("o-2", 200), 1, 1)], upper=2).result()
        blue.stop()
        eventually(lambda: listener.poll(timeout=0.1) is not None and listener.frontier >= 2,
                   "the replica following the handover")
        listener.close()
        replica.stop()
        green.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "blue/green" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "'orders-writer'" in warned[0]
    assert "another writer took over" in warned[0]
    assert "was fenced" in warned[0]  # and the engine's own account of it


def test_other_fail_stops_still_log_errors(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Only the handover is downgraded: an indeterminate commit stays an ERROR."""
    from persist.errors import Indeterminate

    with persist.open(str(tmp_path / "loc")) as client:
        runtime = client._runtime
        assert runtime is not None
        with caplog.at_level(logging.ERROR, logger="persist"):
            runtime._poison(Indeterminate("the commit may or may not have landed"))
    assert any("going fail-stop: Indeterminate" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)
