"""A streaming copy whose Spark driver is killed with SIGKILL mid-stream, then restarted from
its checkpoint, lands every update exactly once: no duplicates, no gaps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist.distributed import TOKENS
from tests.spark.support import canon, expected_updates, fill, location
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def _driver(src: str, dst: str, ckpt: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "tests.spark.stream_driver", src, dst,
                             str(ckpt)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _batches_committed(dst: str) -> int:
    """How many micro-batches the sink has committed at ``dst`` (0 before the first)."""
    if not (Path(dst.removeprefix("file://")) / "meta").exists():
        return 0
    try:
        with persist.open(dst, read_only=True) as client:
            if TOKENS.name not in client.collections:
                return 0
            _, r = client.create_or_load(TOKENS.name, key_type=pa.string(),
                                         value_type=pa.int64())
            if r.upper == 0:
                return 0
            values = r.snapshot(r.upper - 1).to_arrow().column("value").to_pylist()
            return max(values) + 1 if values else 0
    except persist.PersistError:
        return 0


def test_a_killed_driver_restarts_without_duplicates_or_gaps(spark: Any, tmp_path: Path) -> None:
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "dst"), tmp_path / "ckpt"
    fill(src, "events", range(30), rows=40)  # 30 sealed times, one 40-row micro-batch each
    first = _driver(src, dst, ckpt)
    try:
        deadline = time.monotonic() + PATIENCE
        while _batches_committed(dst) < 3:
            assert first.poll() is None, f"the driver ended early: {first.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, f"no micro-batch committed within {PATIENCE} s"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
        first.communicate()  # reaps it and closes its pipes
    killed_at = _batches_committed(dst)
    print(f"killed after {killed_at} committed micro-batches")
    assert killed_at < 30, "the stream finished before it could be killed"
    second = _driver(src, dst, ckpt)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert "done" in out
    want = canon(expected_updates(src, "events", 0, 30))
    got = canon(expected_updates(dst, "copy", 0, 30))
    assert got == want  # every update once: no duplicate, no gap
    with persist.open(dst, read_only=True) as client:
        assert client.state.collections["copy"].upper == 30
