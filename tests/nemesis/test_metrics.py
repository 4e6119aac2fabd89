"""Metrics: the runtime's hooks feed prometheus_client, the blob wrapper counts bytes and
errors, and everything is a no-op when prometheus_client is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.blob.memory import MemoryBlob
from persist.blob.metered import MeteredBlob
from persist.blob.unreliable import Faults, UnreliableBlob
from persist.errors import Determinate, Fenced, RuntimeShutdown
from persist.lock.memory import MemoryLock
from tests.nemesis.driver import open_writer_with
from tests.support.patience import PATIENCE

prometheus_client = pytest.importorskip("prometheus_client")
ROOT = Path(__file__).resolve().parents[2]


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if value is None else float(value)


def test_runtime_metrics() -> None:
    name = f"metrics-{uuid.uuid4().hex}"
    rid = f"m-{uuid.uuid4().hex[:8]}"
    commits = sample("persist_commit_seconds_count")
    beats = sample("persist_lock_heartbeats_total", {"result": "ok"})
    losses = sample("persist_lock_losses_total")
    client = persist.open(f"mem://{name}", reentrance_id=rid, lease_seconds=0.3)
    try:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        futures = [w.write([((i, i), 0, 1)]) for i in range(20)]
        w.seal(5).result()
        for f in futures:
            f.result()
        assert sample("persist_commit_seconds_count") > commits
        assert sample("persist_group_commit_commands_sum") >= 21
        assert sample("persist_upper", {"writer": rid, "collection": "c"}) == 5
        assert sample("persist_since", {"writer": rid, "collection": "c"}) == 0
        assert sample("persist_parts", {"writer": rid, "collection": "c"}) >= 1
        deadline = time.monotonic() + PATIENCE
        while sample("persist_lock_heartbeats_total", {"result": "ok"}) <= beats:
            assert time.monotonic() < deadline, "no heartbeat was counted"
            time.sleep(0.05)
        # A takeover under the same id: the old writer's next commit is fenced.
        with persist.open(f"mem://{name}", reentrance_id=rid):
            with pytest.raises((Fenced, RuntimeShutdown)):
                w.seal(6).result()
            assert sample("persist_lock_losses_total") == losses + 1
            assert sample("persist_fail_stops_total", {"kind": "Fenced"}) >= 1
    finally:
        client.stop()
        MemoryBlob.forget(name)
    # A stopped runtime leaves the scrape-time gauges.
    assert prometheus_client.REGISTRY.get_sample_value(
        "persist_upper", {"writer": rid, "collection": "c"}) is None


def test_commit_failures_by_kind() -> None:
    name = f"metrics-{uuid.uuid4().hex}"
    blob = UnreliableBlob(MemoryBlob(name), seed=1)
    client = open_writer_with(f"mem://{name}", blob, MemoryLock(name), reentrance_id="x",
                              options=persist.Options())
    try:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        before = sample("persist_commit_failures_total", {"kind": "Determinate"})
        blob.set_faults({"set_if_absent": Faults(fail=1.0)})
        with pytest.raises(Determinate):
            w.write([((1, 1), 0, 1)]).result()
        assert sample("persist_commit_failures_total", {"kind": "Determinate"}) == before + 1
    finally:
        client.stop()
        MemoryBlob.forget(name)


def test_metered_blob_counts_bytes_and_errors() -> None:
    written = sample("persist_blob_bytes_written_total")
    read = sample("persist_blob_bytes_read_total")
    inner = UnreliableBlob(MemoryBlob(), seed=0)
    blob = MeteredBlob(inner)
    blob.set("k", b"x" * 100)
    assert blob.get("k") == b"x" * 100
    assert blob.set_if_absent("k", b"y") is False  # nothing written
    framed = len(inner.inner._get("k") or b"")
    assert sample("persist_blob_bytes_written_total") == written + framed
    assert sample("persist_blob_bytes_read_total") == read + framed
    errors = sample("persist_blob_errors_total", {"op": "get", "kind": "Determinate"})
    with inner.outage(), pytest.raises(Determinate):
        blob.get("k")
    assert sample("persist_blob_errors_total", {"op": "get", "kind": "Determinate"}) == errors + 1


def test_a_writer_counts_its_storage_traffic() -> None:
    """Every writer's engine reads and writes through the blob metrics (``open_writer``): its
    data part's framed bytes are counted written, and read again by an uncached snapshot."""
    name = f"metered-{uuid.uuid4().hex}"
    written = sample("persist_blob_bytes_written_total")
    read = sample("persist_blob_bytes_read_total")
    opts = persist.Options(inline_threshold=0, cache_bytes=0)
    with persist.open(f"mem://{name}", options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((i, i), 0, 1) for i in range(100)], 1).result()
        (part,) = client.state.collections["c"].parts
        assert part.blob_key is not None
        framed = len(MemoryBlob(name)._get(part.blob_key) or b"")
        assert sample("persist_blob_bytes_written_total") >= written + framed
        assert len(r.snapshot(0).to_arrow()) == 100
        assert sample("persist_blob_bytes_read_total") >= read + framed
    MemoryBlob.forget(name)


def test_everything_works_without_prometheus_client() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "import pyarrow as pa, persist\n"
        "from persist import metrics\nfrom persist.blob.metered import MeteredBlob\n"
        "assert not metrics.enabled()\n"
        "with persist.open('mem://no-prom', reentrance_id='a') as c:\n"
        "    w, r = c.create_or_load('c', key_type=pa.int64(), value_type=pa.int64())\n"
        "    w.append([((1, 1), 0, 1)], 1).result()\n"
        "    assert r.snapshot(0).to_python() == [((1, 1), 0, 1)]\n"
        "    MeteredBlob(c._ix.blob).get('nope')\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
