"""The engine's stream cursor (``persist.distributed.StreamCursor``), driven as a streaming
source drives it, without Spark: offsets as sealed frontiers, admission by rows, the data-loss
policy and the consumer hold's lifecycle."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import distributed
from persist.distributed import StreamCursor


def _write(url: str, times: dict[int, int]) -> None:
    """``times[t]`` updates at each time ``t``, each sealed."""
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t, n in sorted(times.items()):
            w.append([((t * 1000 + i, t), t, 1) for i in range(n)], upper=t + 1).result()


def _batch(cursor: StreamCursor, lo: int, hi: int) -> Counter[int]:
    """Updates per time of the batch ``[lo, hi)``, read as a source's tasks read them."""
    out: Counter[int] = Counter()
    for task in cursor.tasks(lo, hi):
        for t in distributed.read_task(distributed.ReadTask.from_bytes(task.to_bytes())):
            out.update(t.column("time").to_pylist())
    return out


def test_offsets_are_sealed_frontiers_and_batches_are_exact(tmp_path: Path) -> None:
    url = str(tmp_path)
    _write(url, {0: 3, 1: 4, 2: 5})
    cursor = StreamCursor(url, "c", refresh_interval=3600)
    assert cursor.initial() == 0
    assert cursor.offset(0) == {"upper": 0}
    end = cursor.latest(0)
    assert end == 3
    assert _batch(cursor, 0, end) == Counter({0: 3, 1: 4, 2: 5})
    cursor.commit(end)
    assert cursor.latest(end) == end  # nothing new sealed
    _write(url, {3: 2})
    assert cursor.latest(end) == end  # within its refresh interval the view is cached ...
    cursor.current(fresh=True)
    assert cursor.latest(end) == 4  # ... and then sees the seal
    assert _batch(cursor, 3, 4) == Counter({3: 2})
    assert StreamCursor(url, "c", start="latest").initial() == 4
    assert StreamCursor(url, "c", start=2).initial() == 2
    for bad in ({"offset": 3}, {"upper": -1}, {"upper": True}, None):
        with pytest.raises(persist.InvalidUsage, match="not a persist offset"):
            StreamCursor.frontier(bad)  # type: ignore[arg-type]
    with pytest.raises(persist.InvalidUsage, match="ends beyond its upper"):
        cursor.tasks(3, 9)
    for bad_start in ("first", -1, True):
        with pytest.raises(persist.InvalidUsage):
            StreamCursor(url, "c", start=bad_start)  # type: ignore[arg-type]


def test_admission_cuts_between_times_and_takes_a_big_time_whole(tmp_path: Path) -> None:
    url = str(tmp_path)
    _write(url, {0: 3, 1: 4, 2: 10, 3: 1})
    cursor = StreamCursor(url, "c")
    assert cursor.latest(0, max_rows=8) == 2  # 3 + 4 fit, 10 more do not
    assert cursor.latest(2, max_rows=8) == 3  # time 2 alone is more: taken whole
    assert cursor.latest(3, max_rows=8) == 4
    cursor.stop_at_now()
    _write(url, {4: 1})
    cursor.current(fresh=True)
    assert cursor.latest(4) == 4  # stopped at what was available
    assert cursor.reported() == 5


def test_data_loss_is_an_error_or_a_skip_ahead(tmp_path: Path) -> None:
    url = str(tmp_path)
    _write(url, {0: 2, 1: 2, 2: 2, 3: 2})
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.allow_compaction(2).result()
    strict = StreamCursor(url, "c")
    with pytest.raises(persist.InvalidUsage, match=r"lost data.*\[2, 2\]"):
        strict.latest(2)
    with pytest.raises(persist.InvalidUsage, match="lost data"):
        strict.tasks(2, 4)
    lenient = StreamCursor(url, "c", fail_on_data_loss=False)
    assert lenient.latest(2) == 4
    assert _batch(lenient, 2, 4) == Counter({3: 2})  # skipped ahead to since + 1
    # from 0 the forwarded history is the first batch: exact while since is inside it (the
    # updates at or below since are at their own times or at since, as compaction left them)
    first = _batch(strict, 0, 4)
    assert sum(first.values()) == 8
    assert first[3] == 2


def test_the_hold_is_taken_moved_and_adopted(tmp_path: Path) -> None:
    url = str(tmp_path)
    _write(url, {0: 2, 1: 2, 2: 2})
    cursor = StreamCursor(url, "c", hold="s", hold_lock_timeout=5)
    assert cursor.initial() == 0
    info = distributed.describe(url, "c")
    assert info.holds == {"s": 0}  # from 0: at the current since
    assert cursor.latest(0) == 3
    cursor.tasks(0, 3)
    cursor.commit(3)
    assert distributed.describe(url, "c").holds == {"s": 2}
    # since cannot pass the held frontier
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.allow_compaction(3).result()
        assert client.info("c").since == 2
    # a restart resumes at its checkpoint's offset: the live hold there is adopted
    again = StreamCursor(url, "c", hold="s", hold_lock_timeout=5)
    assert again.latest(3) == 3
    assert distributed.describe(url, "c").holds == {"s": 2}
    # pickled (shipped to a task), a cursor leaves its metadata view behind
    clone: Any = pickle.loads(pickle.dumps(again))
    assert again.watching
    assert not clone.watching
