"""The installed ``persist`` console script, run as a subprocess against file locations.

Every error case also checks the error contract: one line on stderr, no traceback, the
documented exit code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import persist
from persist import cli, layout
from persist.blob.file import FileBlob
from persist.indexed.engine import Options, Txn
from persist.indexed.format import meta
from persist.indexed.format.evolve import Types
from persist.indexed.format.write import new_part
from persist.indexed.maintenance import verify as verify_mod
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.maintenance.verify import verify
from persist.indexed.state.machine import Machine
from tests.support.engine import Engine, stop_leaving_its_log

EXE = shutil.which("persist", path=os.path.dirname(sys.executable))
OPTIONS = persist.Options(inline_threshold=1200, rollup_every=4, gc_grace_seconds=3600,
                          compaction=CompactionPolicy(final_rows=1 << 20))


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


def run(*args: str, expect: int = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert EXE is not None, "the persist console script is not installed (pip install -e .)"
    proc = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    if expect not in (cli.EXIT_OK, cli.EXIT_PROBLEMS):
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("persist: "), proc.stderr
    return proc


def _build(root: Path) -> None:
    """A small location: two collections, inline and blob parts, a hold, a retired blob."""
    with persist.open(root, reentrance_id="builder", options=OPTIONS) as client:
        ew, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        pw, _ = client.create_or_load("points", key_type=Point, value_type=pa.float64())
        for t in range(6):
            rows = 300 if t % 2 else 3  # big ones get a data blob of their own
            ew.append([((f"k{t}-{i}", i), t, 1) for i in range(rows)], t + 1).result()
        pw.append([((Point(1, 2), 0.5), 0, 1), ((Point(3, 4), 1.5), 1, 1)], 2).result()
        ew.allow_compaction(2).result()
        pw.hold("reader-a", 1).result()
        client.maintain()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "base"
    _build(root)
    return root


@pytest.fixture
def loc(base: Path, tmp_path: Path) -> Path:
    """A private copy of the base location, free to corrupt."""
    dst = tmp_path / "loc"
    shutil.copytree(base, dst)
    return dst


def _data_keys(root: Path) -> list[str]:
    return FileBlob(root).list_keys(layout.DATA_PREFIX)


def _referenced(root: Path) -> list[str]:
    state = Machine(FileBlob(root)).load()
    return sorted(p.blob_key for c in state.collections.values() for p in c.parts if p.blob_key)


# -- help and usage -----------------------------------------------------------------------------


def test_help_documents_exit_codes() -> None:
    out = run("--help").stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 "):
        assert f"\n  {code}" in out
    assert "inspect" in out
    assert "verify" in out
    assert run("--version").stdout.startswith("persist ")


def test_verify_help_states_one_default_for_grace() -> None:
    """It used to print two different "(default ...)" for --grace (the commit deadline's and
    the GC grace's)."""
    text = " ".join(run("verify", "--help").stdout.split())
    start = text.index("--grace SECONDS how")
    grace = text[start:text.index("--jobs", start)]
    assert grace.count("default") == 1, grace
    assert f"default: the engine's GC grace, {Options().gc_grace_seconds:g}s" in grace


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    run("frobnicate", expect=cli.EXIT_USAGE)
    run("snapshot", str(tmp_path), expect=cli.EXIT_USAGE)  # missing arguments
    run("lock", "release", "a", "b", expect=cli.EXIT_USAGE)
    run("lock", expect=cli.EXIT_USAGE)


def test_missing_location_is_not_created(tmp_path: Path) -> None:
    where = tmp_path / "nothing-here"
    err = run("inspect", str(where), expect=cli.EXIT_USAGE).stderr
    assert "no persist location" in err
    assert not where.exists()
    (tmp_path / "empty").mkdir()
    assert "nothing was ever committed there" in run("verify", str(tmp_path / "empty"),
                                                     expect=cli.EXIT_USAGE).stderr


# -- inspect --------------------------------------------------------------------------------------


def test_inspect(loc: Path) -> None:
    info = json.loads(run("inspect", str(loc), "--json").stdout)
    # its log is sharded (format 7), it holds Parquet parts (format 4) and compressed inline
    # parts (format 9)
    assert info["format_version"] == meta.PACKED_FORMAT_VERSION
    assert info["seq"] > 0
    assert info["writer"] == "builder"
    assert info["lock"]["holder"] == "builder"
    assert info["lock"]["released"] is True
    assert info["lock"]["generation"] == 1
    by_name = {c["name"]: c for c in info["collections"]}
    events, points = by_name["events"], by_name["points"]
    assert (events["key_type"], events["value_type"]) == ("string", "int64")
    assert (events["schema_version"], points["schema_version"]) == (0, 0)
    assert points["key_type"].endswith("test_cli:Point (struct<x: int64 not null, y: int64 not null>)")
    assert (events["since"], events["upper"]) == (2, 6)
    assert (points["since"], points["effective_since"], points["upper"]) == (0, 0, 2)
    assert points["holds"] == {"reader-a": 1}
    assert events["blob_parts"] >= 1
    assert points["inline_parts"] == 1
    assert events["rows"] > 0
    assert events["bytes"] == events["inline_bytes"] + events["blob_bytes"]
    text = run("inspect", f"file://{loc}").stdout
    for needle in ("format:     metadata v9", "events", "points", "lock:       free",
                   "reader-a at 1"):
        assert needle in text, text


def test_inspect_labels_stored_updates_apart_from_live_rows(tmp_path: Path) -> None:
    """``rows`` used to be the stored updates, unlabelled; an insert and its retraction are two
    of them until compaction cancels them. ``updates`` says so, and ``--live`` also counts the
    live rows as of upper - 1 (reading the data), only when asked."""
    loc = tmp_path / "loc"
    with persist.open(loc, options=OPTIONS) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((k, k), 0, 1) for k in range(5)], 1).result()
        w.append([((0, 0), 1, -1), ((1, 1), 1, -1), ((9, 9), 1, 2)], 2).result()
        client.create_or_load("empty", key_type=pa.int64(), value_type=pa.int64())
    info = json.loads(run("inspect", str(loc), "--json").stdout)
    by_name = {c["name"]: c for c in info["collections"]}
    assert by_name["c"]["updates"] == by_name["c"]["rows"] == 8
    assert "live_rows" not in by_name["c"]  # reads data: only on request
    live = json.loads(run("inspect", str(loc), "--json", "--live").stdout)
    by_name = {c["name"]: c for c in live["collections"]}
    assert (by_name["c"]["updates"], by_name["c"]["live_rows"]) == (8, 4)  # 2, 3, 4 and 9
    assert by_name["empty"]["live_rows"] is None  # nothing sealed: no time to count at
    def header(*args: str) -> list[str]:
        line = run("inspect", str(loc), *args).stdout.split("collections:")[1].splitlines()[1]
        return re.split(r"\s{2,}", line.strip())

    assert header()[-2:] == ["updates", "bytes"]
    assert header("--live")[-3:] == ["updates", "live rows", "bytes"]


def test_unknown_storage_option_is_usage(loc: Path) -> None:
    run("inspect", str(loc), "-o", "colour=blue", expect=cli.EXIT_USAGE)
    run("inspect", str(loc), "-o", "novalue", expect=cli.EXIT_USAGE)


# -- verify ---------------------------------------------------------------------------------------


def test_verify_clean_with_progress_bar(loc: Path) -> None:
    proc = run("verify", str(loc))
    assert "no problems found" in proc.stdout
    assert "verify" in proc.stderr  # the tqdm bar
    assert "blob" in proc.stderr
    report = json.loads(run("verify", str(loc), "--json", "--no-progress").stdout)
    assert report["problems"] == []
    assert report["leaked"] == []
    assert report["data_blobs"] >= len(_referenced(loc))
    assert report["inline_parts"] >= 1


def _corrupt_first(loc: Path, prefix: str, how: str) -> str:
    blob = FileBlob(loc)
    key = _referenced(loc)[0] if prefix == "data" else blob.list_keys(prefix)[0]
    raw = bytearray(blob._get(key) or b"")
    if how == "flip":
        raw[len(raw) // 2] ^= 0x10
    elif how == "truncate":
        raw = raw[: len(raw) - 7]
    elif how == "delete":
        blob.delete(key)
        return key
    blob._set(key, bytes(raw))
    return key


@pytest.mark.parametrize(("prefix", "how", "says"), [
    ("data", "flip", "checksum mismatch"),
    ("data", "truncate", "length mismatch"),
    ("data", "delete", "but missing"),
    (layout.ROLLUP_PREFIX, "flip", "checksum mismatch"),
    (layout.LOG_PREFIX, "flip", "checksum mismatch"),
])
def test_verify_finds_corruption(loc: Path, prefix: str, how: str, says: str) -> None:
    key = _corrupt_first(loc, prefix, how)
    proc = run("verify", str(loc), "--no-progress", expect=cli.EXIT_PROBLEMS)
    problems = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBLEM")]
    assert any(key in p and says in p for p in problems), proc.stdout


def test_verify_finds_swapped_blobs(loc: Path) -> None:
    a, b = _referenced(loc)[:2]
    blob = FileBlob(loc)
    ra, rb = blob._get(a), blob._get(b)
    assert ra is not None
    assert rb is not None
    blob._set(a, rb)
    blob._set(b, ra)
    out = run("verify", str(loc), "--no-progress", expect=cli.EXIT_PROBLEMS).stdout
    assert f"PROBLEM: {a}" in out
    assert f"PROBLEM: {b}" in out


def test_verify_finds_well_framed_wrong_contents(loc: Path) -> None:
    """A valid file under the wrong key: a Parquet part (plain, no envelope) holding another
    part's valid bytes fails its own checksum; a part whose metadata's checksum matches bytes
    that are not what the metadata says (a writer's bug) fails the decode checks."""
    a, b = _referenced(loc)[:2]
    blob = FileBlob(loc)
    state = Machine(blob).load()
    parts = {p.blob_key: p for c in state.collections.values() for p in c.parts}
    other = blob.get_plain(b, parts[b].checksum)  # type: ignore[arg-type]
    assert other is not None
    blob.set_plain(a, other)
    out = run("verify", str(loc), "--no-progress", expect=cli.EXIT_PROBLEMS).stdout
    assert f"PROBLEM: {a}" in out
    assert "checksum mismatch" in out or "length mismatch" in out, out
    # the metadata of a forged to b's bytes, except for its rows and times
    forged = msgspec.structs.replace(parts[a], checksum=parts[b].checksum,
                                     nbytes=parts[b].nbytes, stats=parts[b].stats,
                                     rows=parts[b].rows + 1,
                                     min_time=parts[b].min_time + 1)
    c = next(c for c in state.collections.values() if forged in c.parts or
             parts[a] in c.parts)
    problems = verify_mod._check_part_data(c.name, c, forged, other)
    assert any(f"{a} holds {parts[b].rows} rows" in p for p in problems), problems
    assert any(f"{a} has times" in p for p in problems), problems


def test_verify_finds_a_rollup_disagreeing_with_the_log(loc: Path) -> None:
    blob = FileBlob(loc)
    rollups = blob.list_keys(layout.ROLLUP_PREFIX)
    logs = blob.list_keys(layout.LOG_PREFIX)
    assert logs
    assert rollups
    key = rollups[-1]
    data = blob.get(key)
    assert data is not None
    state = meta.decode_state(key, data)
    c = state.collections["events"]
    lie = msgspec.structs.replace(
        state, collections={**state.collections,
                            "events": msgspec.structs.replace(c, upper=c.upper + 100)})
    blob.set(key, meta.encode(lie))
    out = run("verify", str(loc), "--no-progress", expect=cli.EXIT_PROBLEMS).stdout
    assert f"rollup {state.seq} disagrees with the log" in out, out


def test_verify_finds_a_log_gap(loc: Path) -> None:
    blob = FileBlob(loc)
    # A few more commits past the newest rollup (a writer killed before its stop's rollup),
    # then a hole in the middle of them.
    no_rollups = persist.Options(rollup_every=10_000, gc_grace_seconds=3600)
    client = persist.open(loc, reentrance_id="builder", options=no_rollups)
    try:
        ew, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(6, 9):
            ew.append([((f"g{t}", t), t, 1)], t + 1).result()
    finally:
        stop_leaving_its_log(client)
    newest_rollup = layout.seq_of(blob.list_keys(layout.ROLLUP_PREFIX)[-1])
    later = [k for k in blob.list_keys(layout.LOG_PREFIX) if layout.seq_of(k) > newest_rollup + 1]
    blob.delete(later[0])
    out = run("verify", str(loc), "--no-progress", expect=cli.EXIT_PROBLEMS).stdout
    assert "gap" in out, out


def test_newer_format_is_a_persist_error(loc: Path) -> None:
    blob = FileBlob(loc)
    key = blob.list_keys(layout.ROLLUP_PREFIX)[-1]  # always read on open
    raw = bytearray(blob._get(key) or b"")
    raw[4] = 99  # envelope version (the header checksum then fails first, so fix it up)
    import struct

    import crc32c

    raw[20:24] = struct.pack("<I", crc32c.crc32c(bytes(raw[:16])))
    blob._set(key, bytes(raw))
    err = run("inspect", str(loc), expect=cli.EXIT_ERROR).stderr
    assert "IncompatibleFormat" in err
    assert "upgrade persist" in err


# -- leaked blobs ---------------------------------------------------------------------------------


def test_leaked_blobs_are_listed_and_deleted(loc: Path) -> None:
    blob = FileBlob(loc)
    leaked = f"{layout.DATA_PREFIX}1/leaked-by-a-crash"
    blob.set(leaked, b"an orphan part")
    referenced = _referenced(loc)
    report = json.loads(run("verify", str(loc), "--json", "--no-progress").stdout)
    assert report["leaked"] == [leaked]
    assert report["problems"] == []
    out = run("verify", str(loc), "--no-progress", "--delete-leaked", "--grace", "0").stdout
    assert "deleted: 1 leaked blobs" in out
    assert blob.get(leaked) is None
    assert _referenced(loc) == referenced
    assert set(referenced) <= set(_data_keys(loc))
    assert json.loads(run("verify", str(loc), "--json", "--no-progress").stdout)["leaked"] == []


def test_delete_leaked_spares_a_blob_committed_during_the_grace(loc: Path) -> None:
    """A live writer writes a part, verify sees it unreferenced, the writer commits it while
    verify waits out the grace period: it must survive; a truly abandoned one must not."""
    blob = FileBlob(loc)
    abandoned = f"{layout.DATA_PREFIX}1/abandoned"
    blob.set(abandoned, b"orphan")
    with persist.open(loc, reentrance_id="builder", options=OPTIONS) as client:
        _, er = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        c = client.state.collections["events"]
        upper = c.upper
        table = pa.table({"key": pa.array([f"staged{i}" for i in range(400)]),
                          "value": pa.array(range(400), pa.int64()),
                          "time": pa.array([upper] * 400, pa.uint64()),
                          "diff": pa.array([1] * 400, pa.int64())}, schema=Types.of(c).schema)
        part = new_part(blob, c, table, inline_threshold=0, consolidated=False)
        assert part.blob_key is not None
        proc = subprocess.Popen([EXE or "persist", "verify", str(loc), "--no-progress",
                                 "--delete-leaked", "--grace", "3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the first listing is done
        assert "waiting 3s" in line, line
        client.apply(parts={"events": [part]}, seals={"events": upper + 1}).result()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == cli.EXIT_OK, (out, err)
        assert "deleted: 1 leaked blobs" in out
        assert part.blob_key in _data_keys(loc)
        assert blob.get(abandoned) is None
        assert len(er.snapshot(upper).to_arrow()) >= 400
    report = json.loads(run("verify", str(loc), "--json", "--no-progress").stdout)
    assert report["problems"] == []
    assert report["leaked"] == []


def test_verify_ignores_a_part_compacted_and_collected_while_it_reads(loc: Path) -> None:
    """A live writer may retire a part and delete its blob after verify loaded the state; the
    retired key stays in the state until the GC's Forget commits. Not a problem: the part is
    no longer live. (A false positive of the slow nemesis, under load.)"""
    state = Machine(FileBlob(loc)).load()
    live = [p for p in state.collections["events"].parts if p.blob_key]
    assert live

    class CompactingMidRead(FileBlob):
        fired = False

        def _get(self, key: str) -> bytes | memoryview | None:
            if key.startswith(layout.DATA_PREFIX) and not self.fired:
                self.fired = True
                writer = Engine.open(FileBlob(loc), epoch=state.epoch + 1, writer="compactor",
                                 options=OPTIONS)
                writer.fence()
                txn = Txn(writer.state)
                parts = writer.state.collections["events"].parts
                txn.stage(writer.run_compaction(writer.state, "events", parts))
                retired = writer.commit(txn).retired
                for r in retired:  # the GC's deletes, its Forget not committed
                    FileBlob(loc).delete(r.key)
            return super()._get(key)

    report = verify(CompactingMidRead(loc).read_only(), url=str(loc))
    assert report.problems == []
    assert all(p.blob_key in _data_keys(loc) for p in
               Machine(FileBlob(loc)).load().collections["events"].parts if p.blob_key)


# -- snapshot -------------------------------------------------------------------------------------


def test_snapshot_to_parquet(loc: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.parquet"
    run("snapshot", str(loc), "events", "--as-of", "4", "--out", str(out))
    table = pq.read_table(out)
    with persist.open(loc, read_only=True) as replica:
        _, er = replica.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        want = er.snapshot(4).to_arrow()
    assert table.column_names == ["key", "value", "time", "diff"]
    assert table.select(["key", "value", "diff"]).equals(want.select(["key", "value", "diff"]))
    assert set(table.column("time").to_pylist()) == {4}
    assert table.schema.metadata[b"persist.as_of"] == b"4"
    # Default: the latest definite time, upper - 1; Python-object columns stay msgpack bytes.
    msg = run("snapshot", str(loc), "points", "--out", str(tmp_path / "p.parquet")).stdout
    assert "as of 1" in msg
    points = pq.read_table(tmp_path / "p.parquet")
    assert len(points) == 2
    assert points.schema.metadata[b"persist.key_codec"].endswith(b"Point")


def test_snapshot_errors(loc: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "x.parquet")
    assert "below its since" in run("snapshot", str(loc), "events", "--as-of", "1", "--out",
                                    out, expect=cli.EXIT_USAGE).stderr
    assert "not below its upper" in run("snapshot", str(loc), "events", "--as-of", "6",
                                        "--out", out, expect=cli.EXIT_USAGE).stderr
    assert "unknown collection" in run("snapshot", str(loc), "nope", "--out", out,
                                       expect=cli.EXIT_USAGE).stderr
    run("snapshot", str(loc), "events", "--out", str(tmp_path / "no" / "dir" / "x.parquet"),
        expect=cli.EXIT_ERROR)
    assert not os.path.exists(out)


# -- lock -----------------------------------------------------------------------------------------


@pytest.fixture
def live_writer(loc: Path) -> Iterator[tuple[persist.Client, list[Any]]]:
    lost: list[Any] = []
    client = persist.open(loc, reentrance_id="live", lease_seconds=0.6, options=OPTIONS,
                          on_lock_lost=lost.append)
    try:
        yield client, lost
    finally:
        client.stop()


def test_lock_show_and_forced_release(loc: Path,
                                      live_writer: tuple[persist.Client, list[Any]]) -> None:
    client, lost = live_writer
    shown = json.loads(run("lock", str(loc), "--json").stdout)
    assert shown["holder"] == "live"
    assert shown["released"] is False
    assert "held by 'live'" in run("lock", str(loc)).stdout
    err = run("lock", "release", str(loc), expect=cli.EXIT_LOCK_HELD).stderr
    assert "--force" in err
    proc = run("lock", "release", "--force", str(loc))
    assert "WARNING" in proc.stderr
    assert "released the writer lock of 'live'" in proc.stdout
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost, "the writer never noticed it lost the lock"
    assert client.lock_lost is not None
    with persist.open(loc, reentrance_id="next", options=OPTIONS) as successor:
        assert successor.state.epoch > client.state.epoch
    assert "not held" in run("lock", "release", "--force", str(loc)).stdout


# -- dynamodb -------------------------------------------------------------------------------------


def test_dynamodb_create_table_unreachable_is_one_line() -> None:
    proc = run("dynamodb", "create-table", "t", "--endpoint-url", "http://127.0.0.1:9",
               "--region", "us-east-1", "-o", "max_attempts=1",
               "-o", "aws_access_key_id=x", "-o", "aws_secret_access_key=y",
               expect=cli.EXIT_ERROR, timeout=120)
    assert "persist: " in proc.stderr


def test_delete_leaked_refuses_when_verify_found_problems(loc: Path) -> None:
    blob = FileBlob(loc)
    leaked = f"{layout.DATA_PREFIX}1/leaked"
    blob.set(leaked, b"orphan")
    _corrupt_first(loc, "data", "flip")
    proc = run("verify", str(loc), "--no-progress", "--delete-leaked", "--grace", "0",
               expect=cli.EXIT_PROBLEMS)
    assert "not deleting leaked blobs" in proc.stderr
    assert blob.get(leaked) == b"orphan"
