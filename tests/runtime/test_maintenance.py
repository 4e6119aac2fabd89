"""Maintenance under storage errors: each step makes progress on its own; a clean stop ends it
without leaving garbage."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.memory import MemoryBlob
from persist.errors import Determinate
from persist.indexed.engine import Options
from persist.indexed.maintenance import gc
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import verify
from persist.indexed.state.machine import Machine
from persist.location import resolve
from persist.runtime.client import Client
from persist.runtime.runtime import Runtime
from tests.support.engine import Engine


class FlakyBlob(MemoryBlob):
    """Fails deletes of the keys in ``fail_delete``, and the next ``fail_gets`` GETs."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.fail_delete: set[str] = set()
        self.fail_gets = 0

    def _delete(self, key: str) -> None:
        if key in self.fail_delete or "*" in self.fail_delete:
            raise Determinate(f"injected: delete {key}")
        super()._delete(key)

    def _get(self, key: str) -> bytes | memoryview | None:
        if self.fail_gets:
            self.fail_gets -= 1
            raise Determinate(f"injected: get {key}")
        return super()._get(key)


def test_gc_keeps_the_deletes_it_made_before_one_failed() -> None:
    blob = FlakyBlob(uuid.uuid4().hex)
    keys = tuple(f"{layout.DATA_PREFIX}1/k{i}" for i in range(5))
    for k in keys:
        blob.set(k, b"x")
    blob.fail_delete = {keys[3]}
    assert gc.delete_retired(blob, keys).keys == keys[:3]
    blob.fail_delete = {keys[3]}
    with pytest.raises(Determinate):
        gc.delete_retired(blob, keys[3:])
    assert blob.list_keys(layout.DATA_PREFIX) == list(keys[3:])


def test_a_failing_gc_does_not_starve_rollups() -> None:
    """With every delete failing, rounds still write rollups, so the log a reopen must replay
    stays bounded (it grew without bound before, until reopening failed)."""
    blob = FlakyBlob(uuid.uuid4().hex)
    opts = Options(inline_threshold=0, rollup_every=4, gc_grace_seconds=0.0)
    ix = Engine.open(blob, epoch=1, writer="w", options=opts)
    ix.fence()
    client = Client("mem://flaky", ix, runtime=Runtime(ix, lock=None, lease=None,
                                                         maintenance=False))
    try:
        w, _r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        blob.fail_delete = {"*"}
        for t in range(12):
            w.append([((t, t), t, 1)], t + 1).result()
            if t % 4 == 3:
                with pytest.raises(Determinate, match="injected: delete"):
                    client.maintain()
        assert client.state.retired  # nothing could be collected...
        rollups = blob.list_keys(layout.ROLLUP_PREFIX)
        assert rollups  # ...but rolled up
        assert layout.seq_of(rollups[-1]) >= client.state.seq - 4
    finally:
        client.stop()


def test_loading_retries_a_failed_read() -> None:
    blob = FlakyBlob(uuid.uuid4().hex)
    ix = Engine.open(blob, epoch=1, writer="w")
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    blob.fail_gets = 2
    assert Machine(blob).load() == ix.state
    blob.fail_gets = 3
    with pytest.raises(Determinate, match="injected: get"):
        Machine(blob).load()


def test_a_clean_stop_leaves_no_leaked_blob(tmp_path: Path) -> None:
    """A stop while background compaction ran left the merge's part unreferenced (``persist
    verify``: "leaked: 1 unreferenced data blobs", issue 27): the runtime stopped committing
    before the merge's commit arrived. Now maintenance ends first, and its merge commits."""
    # NB: compaction pinned (the knob sets vary it): parts in blobs, merged two at a time in
    # the background after every append, so that a merge is under way when stop comes; the
    # writer's own leak sweep off, so that it cannot hide a leak
    opts = persist.Options(inline_threshold=0, background_compaction=True,
                           compaction=CompactionPolicy(fanin=2), leak_grace_seconds=None)
    busy = 0
    for trial in range(6):
        url = f"file://{tmp_path}/loc{trial}"
        client = persist.open(url, options=opts)
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(12):
            k = np.arange(t * 20_000, t * 20_000 + 40_000)
            w.append(pa.table({"key": k, "value": k % 7, "time": np.full(len(k), t, np.uint64),
                               "diff": np.ones(len(k), np.int64)}), upper=t + 1).result()
        busy += client._runtime.maintaining  # type: ignore[union-attr]
        client.stop()
        assert client.lock_lost is None
        report = verify(resolve(url).read_half(), url=url)
        assert (report.problems, report.leaked) == ([], [])
        with persist.open(url, options=opts) as again:
            rows = again.create_or_load("c", key_type=pa.int64(),
                                        value_type=pa.int64())[1].snapshot(11).to_arrow()
            assert len(rows) == 260_000
        if busy >= 2:
            break
    assert busy >= 2  # the stops came while a round ran (else the test proved nothing)
