"""``bench/w4_ceiling.py``: both appenders run under W4's loop and report a rate and a CPU
cost per append for every round (behaviour, never timing), and the null runtime resolves
every append it queued, in order of its times."""

from __future__ import annotations

import threading
from pathlib import Path

from bench import w4_ceiling
from bench.common import make_batch


def test_both_appenders_report_every_round(tmp_path: Path) -> None:
    got = w4_ceiling.measure(seconds=0.2, threads=4, sync_ms=0.1, rounds=2, root=tmp_path)
    assert set(got) == {"null", "persist"}
    for m in got.values():
        assert len(m["rate"]) == len(m["cpu_us"]) == 2
        assert all(x > 0 for x in m["rate"] + m["cpu_us"])


def test_the_null_runtime_resolves_every_append() -> None:
    null = w4_ceiling._Null(0.0001)
    table = make_batch(1, 10, time_lo=0)
    try:
        threads = [threading.Thread(target=lambda: [null.append(table) for _ in range(50)])
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert null._next == 200
    finally:
        null.close()
