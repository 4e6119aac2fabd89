"""Docs and code agree on every default they both state (issue 21, finding 14).

Each default is read from the code (a dataclass field's default, a module constant, or what
parsing empty options yields) and must appear, formatted as the docs write it, in the sentence or
table row of the docs that states it. docs/spark.md's options table is checked row by row: every
option the source and sink accept has a row, and its default column says what parsing gives.

The docs had drifted: docs/spark.md gave ``numPartitions`` as "1 per 10 M rows" where the code
uses 4 M, and the README gave ``verify --delete-leaked`` the writer's 600 s leak grace where the
CLI waits the engine's GC grace, 300 s.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from operators import options as spark_options
from operators.options import ReadOptions, WriteOptions
from operators.sink import STAGED_PART_BYTES
from persist.distributed.stage import STAGE_INLINE_BYTES
from persist.indexed.engine import Options
from persist.indexed.format.stats import STATS_BYTES
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.scan import ROWS_PER_RANGE, ROWS_PER_TASK
from persist.indexed.state.transitions import HISTORY_ENTRIES
from persist.lock.base import WriterLock
from persist.runtime.replica import Follower

REPO = Path(__file__).resolve().parents[2]


def default(cls: type, name: str) -> Any:
    """The default of dataclass field ``cls.name`` as declared (not as a test's knobs set it)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.default
    raise AssertionError(f"{cls.__name__} has no field {name}")


def kwdefault(fn: Any, name: str) -> Any:
    return (fn.__kwdefaults__ or {})[name]


def text(doc: str) -> str:
    """``doc`` with every run of whitespace as one space (prose wraps anywhere)."""
    return re.sub(r"\s+", " ", (REPO / doc).read_text())


def size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def millions(n: int) -> str:
    return f"{n / 1_000_000:g} M"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


GC_GRACE = default(Options, "gc_grace_seconds")
LEASE = kwdefault(WriterLock.__init__, "lease_seconds")
SKEW = kwdefault(WriterLock.__init__, "max_skew_rate")
MIN_POLL = kwdefault(Follower.__init__, "min_poll")
MAX_POLL = kwdefault(Follower.__init__, "max_poll")

#: (doc, what, the statement as the doc words it, with the code's value in it).
CLAIMS: list[tuple[str, str, str]] = [
    ("README.md", "leak grace", f"`Options.leak_grace_seconds` "
     f"({default(Options, 'leak_grace_seconds'):g} s)"),
    ("README.md", "verify --grace", f"`--grace` (default: the engine's GC grace, "
     f"`Options.gc_grace_seconds`, {GC_GRACE:g} s)"),
    ("README.md", "stats bytes", f"`Options.stats_bytes` ({size(STATS_BYTES)})"),
    ("README.md", "part target", f"`CompactionPolicy.part_target_bytes` "
     f"({size(default(CompactionPolicy, 'part_target_bytes'))} of Arrow data)"),
    ("README.md", "history", f"keeps each collection's {HISTORY_ENTRIES} most recent seals"),
    ("docs/reliability.md", "verify --grace", f"(default: the engine's GC grace, {GC_GRACE:g} s)"),
    ("docs/reliability.md", "commit deadline", f"(`Options.commit_deadline_seconds`, default "
     f"{default(Options, 'commit_deadline_seconds'):g} s)"),
    ("docs/reliability.md", "lease lapse", f"until it lapsed ({LEASE * SKEW:g} s by default)"),
    ("docs/s3.md", "lease lapse", "`lease \u00d7 skew` of observation"
     f" ({LEASE * SKEW:g} s by default)"),
    ("docs/replicas.md", "min poll", f"`min_poll` later ({MIN_POLL * 1000:g} ms by default)"),
    ("docs/replicas.md", "max poll", f"up to `max_poll` ({MAX_POLL:g} s)"),
    ("docs/replicas.md", "poll range", f"(replica polls, defaults {MIN_POLL * 1000:g} ms … "
     f"{MAX_POLL:g} s)"),
    ("docs/replicas.md", "gc grace", f"`gc_grace_seconds` after its retirement ({GC_GRACE:g} s by "
     f"default)"),
    ("docs/spark.md", "raw task rows", f"`partitionRows` (default {ROWS_PER_TASK:,}"),
    ("docs/spark.md", "ranges", f"The default asks for one range per "
     f"{millions(ROWS_PER_RANGE)} rows"),
    ("docs/spark.md", "gc grace", f"grace, {minutes(GC_GRACE)} by default"),
    ("docs/spark.md", "inline threshold", f"inline parts (small writes, "
     f"{size(default(Options, 'inline_threshold'))} by default)"),
    ("docs/spark.md", "staged part bytes", f"reach {size(STAGED_PART_BYTES)} "
     f"(`operators.sink.STAGED_PART_BYTES`)"),
    ("docs/spark.md", "staged inline", f"parts under {size(STAGE_INLINE_BYTES)} ride back inline"),
    ("docs/spark.md", "writer idle", f"writerIdleTimeout ({spark_options.WRITER_IDLE_TIMEOUT:g} s)"),
]


@pytest.mark.parametrize(("doc", "statement"), [(d, s) for d, _, s in CLAIMS],
                         ids=[f"{d}:{w}" for d, w, _ in CLAIMS])
def test_the_docs_state_the_codes_default(doc: str, statement: str) -> None:
    assert statement in text(doc), f"{doc} should say: {statement}"


# -- docs/spark.md's options table --------------------------------------------------------------

BASE = {"path": "file:///loc", "collection": "c"}


def _read() -> ReadOptions:
    return ReadOptions.parse(BASE, "read")


def _stream() -> ReadOptions:
    return ReadOptions.parse(BASE, "stream")


def _write() -> WriteOptions:
    return WriteOptions.parse(BASE, "stream-write")


def _bool(b: bool) -> str:
    return f"`{str(b).lower()}`"


def table() -> dict[str, str]:
    """docs/spark.md's options table: option name(s) cell -> default cell."""
    lines = (REPO / "docs" / "spark.md").read_text().splitlines()
    start = lines.index("| option | applies to | default | meaning |")
    rows: dict[str, str] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[2]
    return rows


def expected_defaults(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What each option's default cell must say, from parsing options that leave it unset."""
    monkeypatch.delenv(spark_options.AUDIT_ENV, raising=False)
    read, stream, write = _read(), _stream(), _write()
    return {
        "`mode`": f"`{read.mode}`",
        "`numPartitions`": f"1 per {millions(ROWS_PER_RANGE)} rows",
        # None: the engine's (Scan.tasks) rows per task
        "`partitionRows`": f"{ROWS_PER_TASK if read.partition_rows is None else 0:,}",
        "`filterPushdown`": f"`{read.filter_pushdown}`",
        "`auditPruning`": f"{_bool(read.audit_pruning)} (`{spark_options.AUDIT_ENV}`)",
        "`startingUpper`": f"`{stream.starting_upper}`",
        "`failOnDataLoss`": _bool(stream.fail_on_data_loss),
        "`readHoldLockTimeout`": f"{stream.read_hold_lock_timeout:g}",
        "`readHoldLease`": f"{stream.read_hold_lease:g}",
        "`lockTimeout`": f"{write.lock_timeout:g}",
        "`writerIdleTimeout`": f"{write.writer_idle_timeout:g}",
        "`mergeSchema`": _bool(write.merge_schema),
        "`maxRowsPerTrigger`": "none" if stream.max_rows_per_trigger is None else "?",
        "`readHold`": "none" if stream.read_hold is None else "?",
    }


def test_the_options_table_gives_the_parsed_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = table()
    for name, want in expected_defaults(monkeypatch).items():
        assert name in rows, f"docs/spark.md's options table has no row {name}"
        assert rows[name] == want, f"{name}: the table says {rows[name]!r}, the code {want!r}"


def test_every_option_has_a_row_in_the_table() -> None:
    documented = " ".join(table())
    every = {o for kind in spark_options.SUPPORTED.values() for o in kind} - {"path"}
    missing = sorted(o for o in every if f"`{o}`" not in documented)
    assert missing == [], f"options without a row in docs/spark.md's options table: {missing}"


def test_the_refresh_interval_default_is_the_watchs(tmp_path: Path) -> None:
    import pyarrow as pa

    import persist
    from persist import distributed

    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    local = distributed.Watch(url, "c").interval
    assert table()["`refreshInterval`"] == f"{local:g} (local) / 1 (S3)"
