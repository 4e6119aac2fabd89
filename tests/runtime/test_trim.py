"""Trimming the metadata by sequence number (DESIGN.md §9): no LIST of the log to trim it or to
open a writer, progress recorded in the rollups so the next writer goes on, a crash in the
middle of a trim left to the next writer, and a one-time LIST on a location an older persist
trimmed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.base import Blob
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.maintenance import gc
from persist.location import Location, open_writer
from persist.lock.memory import MemoryLock
from persist.runtime.client import Client
from persist.runtime.runtime import Runtime
from tests.nemesis.seam_writer import OPTIONS, RID
from tests.nemesis.test_crashpoints import _check_recovery, _parse, _spawn
from tests.support.recording import RecordingBlob

ROOT = Path(__file__).resolve().parents[2]


def _open(blob: Blob, name: str, options: Options) -> Client:
    """A writer opened as ``persist.open`` opens one (lock, load, fence), with maintenance
    rounds only when the test asks (``client.maintain()``)."""
    loc = Location(f"mem://{name}", blob, lambda: MemoryLock(name))
    w = open_writer(loc, "w", lock_timeout=5.0, options=options)
    runtime = Runtime(w.engine, lock=w.lock, lease=w.lease, maintenance=False)
    return Client(loc.url, w.engine, runtime=runtime)


def _commits(client: Client, n: int, *, maintain_every: int = 16) -> None:
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    for i in range(n):
        t = r.upper
        w.append([((t, i), t, 1)], t + 1).result()
        if i % maintain_every == maintain_every - 1:
            client.maintain()
    client.maintain()


def _rows(client: Client) -> int:
    """The rows of collection ``c`` as of its newest time, as ``client`` reads them."""
    _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    return len(r.snapshot(r.upper - 1).to_arrow())


def _killed_at(location: Path, seam: str, n: int) -> None:
    """Runs the seam writer at ``location`` until ``seam``'s ``n``-th hit kills it, then checks
    every acknowledged write is there and nothing else (``_check_recovery``)."""
    proc = _spawn(location, seam, n)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (
        f"{seam}:{n} was not reached (exit {proc.returncode}): {err.decode()[-2000:]}")
    acked, tried = _parse(out)
    assert acked
    _check_recovery(location, acked, tried)


def _seqs(blob: Blob, prefix: str) -> list[int]:
    return [layout.seq_of(k) for k in blob.list_keys(prefix)]


def test_trimming_and_opening_never_list_the_log() -> None:
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    opts = Options(rollup_every=8, gc_grace_seconds=0.0)
    client = _open(blob, name, opts)
    try:
        _commits(client, 300)
    finally:
        client.stop()
    assert blob.full_log_lists() == 0
    # everything up to the newest rollup was trimmed, by key
    rollups = _seqs(blob.inner, layout.ROLLUP_PREFIX)
    assert len(rollups) <= 2
    assert min(_seqs(blob.inner, layout.LOG_PREFIX)) > rollups[0]

    # a reopen lists the rollups and the log after the newest one: its tail, nothing before
    blob.reset()
    tail = len(_seqs(blob.inner, layout.LOG_PREFIX)) - sum(
        1 for s in _seqs(blob.inner, layout.LOG_PREFIX) if s <= rollups[-1])
    client = _open(blob, name, opts)
    try:
        assert blob.full_log_lists() == 0
        assert blob.log_keys_listed() == tail < opts.rollup_every + 2
        assert [p for p, _, _ in blob.lists].count(layout.LOG_PREFIX) == 1  # no second for the fence
        assert _rows(client) == 300
    finally:
        client.stop()


def test_short_lived_writers_leave_a_bounded_log() -> None:
    """12 writers of 200 commits each, none living a grace period: each trims what the ones
    before it left (their rollups' records say when they were written).

    NB: 12, not the 30 it had: with a grace of an hour (nothing trimmed), 12 such sessions
    left 2,476 log entries and 48 rollups (what the thinning keeps), against the bounds of 232
    and 14 below; the 30 took 55 s of a busy CI run."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    grace = 0.3
    opts = Options(rollup_every=16, gc_grace_seconds=grace)
    sessions, per = 12, 200
    for _ in range(sessions):
        client = _open(blob, name, opts)
        try:
            _commits(client, per, maintain_every=50)
        finally:
            client.stop()
        time.sleep(grace)  # the session's rollups are a grace old when the next one opens
    assert blob.full_log_lists() == 0
    logs = _seqs(blob.inner, layout.LOG_PREFIX)
    rollups = _seqs(blob.inner, layout.ROLLUP_PREFIX)
    # without the trim: every commit of every session (2,400+), and 48 rollups
    assert len(logs) <= per + 2 * opts.rollup_every
    assert len(rollups) <= per // opts.rollup_every + 2
    assert logs[-1] - logs[0] + 1 == len(logs)  # what is left is dense
    # and the next writer reads everything back
    client = _open(blob, name, opts)
    try:
        assert _rows(client) == sessions * per
    finally:
        client.stop()


def _appends(client: Client, n: int) -> None:
    """``n`` one-row appends to collection ``c``, no maintenance round among them."""
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    for i in range(n):
        t = r.upper
        w.append([((t, i), t, 1)], t + 1).result()


def test_a_clean_stop_rolls_up_and_the_next_open_replays_nothing() -> None:
    """A writer stopped with commits since its last rollup writes one of its final state, so
    the next open reads no log after it; a session that committed nothing but its own fence
    writes none (opening and closing costs no rollup)."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    opts = Options(rollup_every=16)
    client = _open(blob, name, opts)  # no maintenance round: nothing rolls up meanwhile
    try:
        _appends(client, 3 * opts.rollup_every)
        final = client.state.seq
        assert not blob.keys_written(layout.ROLLUP_PREFIX)
    finally:
        client.stop()
    assert [layout.seq_of(k) for k in blob.keys_written(layout.ROLLUP_PREFIX)] == [final]

    blob.reset()
    client = _open(blob, name, opts)  # commits its fence, and nothing else
    try:
        assert blob.log_keys_listed() == 0
        assert not blob.keys_read(layout.LOG_PREFIX)
        assert _rows(client) == 3 * opts.rollup_every
    finally:
        client.stop()
    assert not blob.keys_written(layout.ROLLUP_PREFIX)

    blob.reset()
    client = _open(blob, name, opts)
    try:
        assert len(blob.keys_read(layout.LOG_PREFIX)) == 1  # the session before's fence
        _appends(client, 2)
        final = client.state.seq
    finally:
        client.stop()
    assert [layout.seq_of(k) for k in blob.keys_written(layout.ROLLUP_PREFIX)] == [final]
    blob.reset()
    client = _open(blob, name, opts)
    try:
        assert not blob.keys_read(layout.LOG_PREFIX)
        assert _rows(client) == 3 * opts.rollup_every + 2
    finally:
        client.stop()


_DROPPED_AT_EXIT = """
import sys
import pyarrow as pa
import persist
client = persist.open(sys.argv[1], reentrance_id="x")
for i in range(80):  # more than one piece's worth: the rollup is a manifest and pieces
    w, r = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
    w.append([((i, 1), 0, 1)], upper=1).result()
client.maintain()
for i in range(0, 80, 7):  # commits to collections of several pieces since that rollup
    w, r = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
    w.append([((i, 2), 1, 1)], upper=2).result()
print(client.state.seq)
# no stop: the client's finalizer stops it at interpreter exit
"""


def test_a_writer_dropped_at_exit_rolls_up_quietly(tmp_path: Path) -> None:
    """A client never stopped is stopped by its finalizer at interpreter exit, when no thread
    can start: its rollup of several pieces is written by the exiting thread itself (it
    raised RuntimeError from the thread pool and skipped the lock's release)."""
    loc = tmp_path / "loc"
    out = subprocess.run([sys.executable, "-c", _DROPPED_AT_EXIT, str(loc)],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "failed" not in out.stderr, out.stderr
    final = int(out.stdout.split()[-1])
    blob = FileBlob(loc)
    assert _seqs(blob, layout.ROLLUP_PREFIX)[-1] == final
    data = blob.get(layout.rollup_key(final))
    assert data is not None
    assert meta.is_manifest(layout.rollup_key(final), bytes(data))


def test_a_stop_whose_rollup_fails_still_stops_and_loses_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollup at the stop is an optimization of the next open: when storage refuses it,
    the stop still ends (lock released), and the next writer replays the log instead."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    opts = Options(rollup_every=8)
    client = _open(blob, name, opts)
    try:
        _appends(client, 20)
    finally:
        from persist.errors import ExternalError
        from persist.indexed.state import machine

        def refused(*_: object, **__: object) -> str:
            raise ExternalError("storage refused the rollup")

        monkeypatch.setattr(machine.Machine, "write_rollup", refused)
        client.stop()
        monkeypatch.undo()
    assert client.stopped
    assert not blob.keys_written(layout.ROLLUP_PREFIX)
    client = _open(blob, name, opts)  # the lock was released: this writer gets it at once
    try:
        assert len(blob.keys_read(layout.LOG_PREFIX)) >= 20
        assert _rows(client) == 20
    finally:
        client.stop()


def test_a_location_an_older_persist_trimmed_is_listed_once() -> None:
    name = uuid.uuid4().hex
    inner = MemoryBlob(name)
    blob = RecordingBlob(inner)
    keep = Options(rollup_every=8, gc_grace_seconds=3600.0)
    client = _open(inner, name, keep)
    try:
        _commits(client, 100)
    finally:
        client.stop()
    # as an older persist left it: rollups without a record of the trim, the log from seq 1
    # (one of its trims cut the log at the first rollup, the rollups before it went too)
    log_from = None
    for key in inner.list_keys(layout.ROLLUP_PREFIX):
        data = inner.get(key)
        assert data is not None
        state = meta.decode_state(key, data)
        log_from = meta.log_from(state)
        inner.set(key, meta.encode(state))
    first_rollup = _seqs(inner, layout.ROLLUP_PREFIX)[0]
    for seq in range(1, first_rollup // 2):
        inner.delete(layout.log_key(seq, log_from))
    before = len(_seqs(inner, layout.LOG_PREFIX))
    trim = Options(rollup_every=8, gc_grace_seconds=0.0)
    client = _open(blob, name, trim)
    try:
        client.maintain()
        assert blob.full_log_lists() == 1  # the one survey of the log
        client.maintain()
        assert blob.full_log_lists() == 1
    finally:
        client.stop()
    assert len(_seqs(inner, layout.LOG_PREFIX)) < before // 4
    blob.reset()
    client = _open(blob, name, trim)  # the survey is recorded: the next writer lists nothing
    try:
        client.maintain()
        _commits(client, 40)
        assert blob.full_log_lists() == 0
        assert _rows(client) == 140
    finally:
        client.stop()


@pytest.mark.crash
@pytest.mark.parametrize("n", [1, 12])
def test_a_writer_killed_in_a_trim_loses_nothing_and_the_next_trims(
        n: int, tmp_path: Path) -> None:
    location = tmp_path / "loc"
    _killed_at(location, "trim.log_deleted", n)
    blob = FileBlob(str(location))
    with persist.open(location, reentrance_id=RID, options=OPTIONS) as client:
        client.maintain()
        client.maintain()
        head = client.state.seq
    rollups = _seqs(blob, layout.ROLLUP_PREFIX)
    # one left by the trims, and the stop's at the head if the rounds committed after it
    assert len(rollups) == 1 or (len(rollups) == 2 and rollups[1] >= head), (rollups, head)
    assert all(s > rollups[0] for s in _seqs(blob, layout.LOG_PREFIX))


class _NamesRead:
    """Counts the names a file store reads from directories (``os.listdir``, and ``os.scandir``
    under ``os.walk``): what a listing costs a file store, whatever it returns."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import os

        self.names = 0
        listdir, scandir = os.listdir, os.scandir

        def counted_listdir(path: str) -> list[str]:
            got = listdir(path)
            self.names += len(got)
            return got

        names = self

        class Counted:
            def __init__(self, path: str) -> None:
                self.it = scandir(path)

            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                self.it.close()

            def __iter__(self) -> Counted:
                return self

            def __next__(self) -> os.DirEntry[str]:
                entry = next(self.it)
                names.names += 1
                return entry

        def counted_scandir(path: str) -> Counted:
            return Counted(path)

        monkeypatch.setattr(os, "listdir", counted_listdir)
        monkeypatch.setattr(os, "scandir", counted_scandir)


def _all_log_seqs(root: Path) -> list[int]:
    return sorted(int(p.name) for p in (root / layout.LOG_PREFIX).rglob("*")
                  if p.is_file() and not p.name.startswith(".tmp-"))


def test_a_writer_open_reads_only_the_newest_shards_of_the_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Format 7: a file location's log is sharded, and an open reads the names of the shards
    from its rollup's on, not every entry a grace period keeps (DESIGN.md §7)."""
    monkeypatch.setattr(layout, "LOG_SHARD", 16)
    root = tmp_path / "loc"
    keep = Options(rollup_every=8, gc_grace_seconds=3600.0)  # nothing is trimmed
    client = persist.open(root, reentrance_id="w", options=keep,
                          storage_options={"fsync": False})
    try:
        _commits(client, 400, maintain_every=8)
    finally:
        client.stop()
    seqs = _all_log_seqs(root)
    assert seqs == list(range(1, seqs[-1] + 1))
    assert len(seqs) > 400
    log_dir = root / layout.LOG_PREFIX
    shards = sorted(p.name for p in log_dir.iterdir() if p.is_dir())
    assert [p.name for p in log_dir.iterdir() if p.is_file()] == [layout.log_key(1)[9:]]
    assert len(shards) == seqs[-1] // 16 + 1  # the switch's flat entry, then shards of 16

    # a writer's open: one LIST of the log after its rollup (counted by the store wrapper),
    # which reads the shard names and the newest shards' entries, not the 400 kept
    blob = RecordingBlob(FileBlob(root, fsync=False))
    read = _NamesRead(monkeypatch)
    loc = Location(f"file://{root}", blob, lambda: MemoryLock(uuid.uuid4().hex))
    w = open_writer(loc, "w2", lock_timeout=5.0, options=keep)
    names = read.names
    try:
        assert blob.full_log_lists() == 0
        log_lists = [(p, after) for p, after, _ in blob.lists if layout.LOG_PREFIX.startswith(p)]
        assert len(log_lists) == 1
        assert log_lists[0][1] is not None
        rollups = len(list((root / layout.ROLLUP_PREFIX).iterdir()))
        # the directories listed: meta/rollup/, meta/log/ (the flat entry and the shards), and
        # at most the two newest shards
        assert names <= rollups + 1 + len(shards) + 2 * 16, (names, len(seqs))
        assert w.engine.state.seq == seqs[-1] + 1  # its fence, after the whole log
    finally:
        w.lock.release(w.lease)
    # a reader reads the same state, through every shard
    with persist.open(root, read_only=True) as replica:
        assert _rows(replica) == 400


def test_a_trim_empties_and_removes_whole_shards(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(layout, "LOG_SHARD", 16)
    root = tmp_path / "loc"
    client = persist.open(root, reentrance_id="w",
                          options=Options(rollup_every=8, gc_grace_seconds=0.0),
                          storage_options={"fsync": False})
    try:
        _commits(client, 300, maintain_every=8)
        head = client.state.seq
    finally:
        client.stop()
    log_dir = root / layout.LOG_PREFIX
    seqs = _all_log_seqs(root)
    assert seqs
    assert seqs[-1] == head
    assert len(seqs) < 40
    # every shard whose entries were all trimmed is gone: what is left is the shards holding
    # entries (no empty directory accumulates, one per 16 commits)
    dirs = [p for p in log_dir.iterdir() if p.is_dir()]
    upcoming = layout.log_key(head + 1, 2).split("/")[2]  # may be empty: not yet whole
    assert all(any(d.iterdir()) for d in dirs if d.name != upcoming)
    assert len(dirs) <= len(seqs) // 16 + 2
    assert not any(p.is_file() for p in log_dir.iterdir())  # the switch's flat entry went too


@pytest.mark.crash
@pytest.mark.parametrize(("seam", "n"), [("file.shard_emptied", 1), ("file.shard_emptied", 3),
                                         ("trim.log_deleted", 9)])
def test_a_writer_killed_in_a_trim_of_a_sharded_log_loses_nothing(
        seam: str, n: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Killed between deleting a shard's last entry and its directory (or between two
    deletes): every acknowledged write is there, the next writer trims on, and what the kill
    left is at most an empty shard directory, which no listing after a later seq reads."""
    monkeypatch.setattr(layout, "LOG_SHARD", 4)
    monkeypatch.setenv("SEAM_LOG_SHARD", "4")
    location = tmp_path / "loc"
    _killed_at(location, seam, n)
    with persist.open(location, reentrance_id=RID, options=OPTIONS) as client:
        client.maintain()
        client.maintain()
        head = client.state.seq
    rollups = _seqs(FileBlob(str(location)), layout.ROLLUP_PREFIX)
    # the rounds' trims leave one rollup; the stop adds one at the head if the rounds
    # committed after it (Indexed.rollup_at_stop), and trims nothing
    assert len(rollups) == 1 or (len(rollups) == 2 and rollups[1] >= head), (rollups, head)
    seqs = _all_log_seqs(location)
    assert seqs == list(range(rollups[0] + 1, head + 1))
    log_dir = location / layout.LOG_PREFIX
    empty = [p.name for p in log_dir.iterdir() if p.is_dir() and not any(p.iterdir())]
    # an empty shard is the one the next commit goes to (trimmed up to the head, not yet
    # whole), or the one the kill left behind (a later trim never revisits a shard below it)
    upcoming = layout.log_key(head + 1, 2).split("/")[2]
    left = [e for e in empty if e != upcoming]
    assert not left, (empty, upcoming)


@pytest.mark.crash
def test_a_shard_left_empty_by_a_kill_goes_with_a_surveying_writers_first_trim(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Killed between deleting a shard's last entry and its directory: a writer whose progress
    comes from a LIST of the log (a newest rollup without a trim record) starts right past that
    entry, and its first trim removes the empty directory the kill left (no later trim reaches
    a shard below its start)."""
    monkeypatch.setattr(layout, "LOG_SHARD", 4)
    monkeypatch.setenv("SEAM_LOG_SHARD", "4")
    location = tmp_path / "loc"
    proc = _spawn(location, "file.shard_emptied", 2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    log_dir = location / layout.LOG_PREFIX
    empty = {p.name for p in log_dir.iterdir() if p.is_dir() and not any(p.iterdir())}
    assert empty  # the kill left the shard it emptied
    blob = FileBlob(str(location))
    trim = gc.MetaTrim()
    trim.survey(blob)  # the listing skips the empty shard: progress is its last seq
    assert trim.trimmed is not None
    assert layout.log_key(trim.trimmed, 2).split("/")[2] in empty
    upto = max(_seqs(blob, layout.ROLLUP_PREFIX))
    trim.trim(blob, upto, log_from=2)
    assert not empty & {p.name for p in log_dir.iterdir()}
    assert _all_log_seqs(location)[0] > trim.trimmed  # what the trim deleted, in order


def test_a_trimmed_shard_goes_with_the_temp_files_killed_writers_left(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(layout, "LOG_SHARD", 16)
    root = tmp_path / "loc"
    opts = Options(rollup_every=8, gc_grace_seconds=3600.0)
    client = persist.open(root, reentrance_id="w", options=opts, storage_options={"fsync": False})
    try:
        _commits(client, 40, maintain_every=8)
    finally:
        client.stop()
    first = root / layout.log_key(20, 2).rsplit("/", 1)[0]  # the shard of seqs 16..31
    (first / ".tmp-left-by-a-killed-writer").write_bytes(b"half")
    client = persist.open(root, reentrance_id="w", storage_options={"fsync": False},
                          options=Options(rollup_every=8, gc_grace_seconds=0.0))
    try:
        _commits(client, 40, maintain_every=8)
        client.maintain()
        assert client.state.seq > 2 * 32
    finally:
        client.stop()
    assert not first.exists()


def test_a_trim_deletes_each_whole_shard_in_one_call(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """A trim that covers a whole shard deletes it with one ``Blob.delete_shard`` (a file
    store removes the directory at once, the GIL released once for it), and no entry of it
    one by one; the partial shards around go entry by entry, as before; the memory store's
    default deletes each entry."""
    import os

    monkeypatch.setattr(layout, "LOG_SHARD", 16)
    root = tmp_path / "loc"
    keep = Options(rollup_every=8, gc_grace_seconds=3600.0)  # nothing is trimmed
    client = persist.open(root, reentrance_id="w", options=keep, storage_options={"fsync": False})
    try:
        _commits(client, 150, maintain_every=8)
    finally:
        client.stop()
    shards: list[tuple[str, int]] = []
    whole = FileBlob._delete_shard

    def counted(self: FileBlob, shard: str, keys: list[str]) -> None:
        shards.append((shard, len(keys)))
        whole(self, shard, keys)

    unlinked: list[str] = []
    unlink = os.unlink

    def counted_unlink(path: str, *args: object, **kw: object) -> None:
        unlinked.append(str(path))
        unlink(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(FileBlob, "_delete_shard", counted)
    monkeypatch.setattr(os, "unlink", counted_unlink)
    client = persist.open(root, reentrance_id="w", storage_options={"fsync": False},
                          options=Options(rollup_every=8, gc_grace_seconds=0.0))
    try:
        client.maintain()
        _commits(client, 8, maintain_every=8)
        client.maintain()
        head = client.state.seq
    finally:
        client.stop()
    assert len(shards) >= 8
    assert all(n == 16 for _, n in shards)
    assert all(s.startswith(layout.LOG_PREFIX + layout.LOG_SHARD_MARK) for s, _ in shards)
    # none of their entries was unlinked one by one, and their directories are gone
    gone = {str(root / s.rstrip("/")) for s, _ in shards}
    assert not [p for p in unlinked if os.path.dirname(p) in gone]
    assert not any(os.path.exists(d) for d in gone)
    rollups = _seqs(FileBlob(str(root)), layout.ROLLUP_PREFIX)
    assert _all_log_seqs(root) == list(range(rollups[0] + 1, head + 1))


def _known(trim: gc.MetaTrim, rollups: dict[int, tuple[int, float]]) -> None:
    """Makes ``trim`` know ``rollups`` (seq -> wall ms, monotonic time), as its writer's own."""
    for seq, (wall_ms, mono) in rollups.items():
        trim.rollups[seq] = gc._Rollup(wall_ms=wall_ms, mono=mono, own=True)


def test_thinning_keeps_the_newest_the_protected_and_one_per_window_and_shard() -> None:
    """Of the superseded rollups, the thinning keeps those a reader may still be reading
    (successor younger than the protection), the first of each window of the grace (the
    trim's ladder) and the first of each log shard (a restore's replay), and no other."""
    grace = 10.0 * gc.THIN_WINDOWS  # windows of 10 s, protection 5 s (the cap)
    now, now_ms = time.monotonic(), int(time.time() * 1000)
    trim = gc.MetaTrim()
    shard = layout.LOG_SHARD

    def at(age: float) -> tuple[int, float]:
        return now_ms - int(age * 1000), now - age

    # five rollups written in one 10 s window, 30-40 s ago, four of them in shard 0
    base_ms = (now_ms // 10_000 - 4) * 10_000
    rows = {64: base_ms + 100, 128: base_ms + 200, 192: base_ms + 300, 256: base_ms + 400,
            shard + 64: base_ms + 500}
    _known(trim, {s: (w, now - (now_ms - w) / 1000) for s, w in rows.items()})
    _known(trim, {shard + 128: at(4.0), shard + 192: at(3.0), shard + 256: at(1.0)})
    thin = trim.thinnable(grace)
    # 64: first of shard 0 and of its window; 128-256: thinned; shard+64: first of shard 1;
    # shard+128 (4 s old, another window): first of its window; shard+192's successor is 1 s
    # old: protected; shard+256: the newest
    assert thin == [128, 192, 256]
    blob = MemoryBlob(uuid.uuid4().hex)
    for s in trim.rollups:
        blob.set(layout.rollup_key(s), b"x")
    assert trim.thin(blob, grace) == 3
    assert _seqs(blob, layout.ROLLUP_PREFIX) == [64, shard + 64, shard + 128, shard + 192,
                                                 shard + 256]
    trim.trimmed = 0  # the next rollup's record names only what is kept
    record = trim.record(shard + 320, now_ms)
    assert record is not None
    assert [r.seq for r in record.rollups] == _seqs(blob, layout.ROLLUP_PREFIX)
    assert trim.thinnable(0.0) == []  # no grace: each trim leaves one rollup, nothing to thin


def test_short_sessions_inside_a_grace_leave_few_rollups_and_every_seq_restorable() -> None:
    """Sessions shorter than a grace each leave rollups the trim may not touch yet; the
    thinning keeps them to a few per window, a reopen reads everything, and a seq between
    kept rollups is restored by replaying from the one below it."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    grace = 4.0  # protection 1 s
    opts = Options(rollup_every=4, gc_grace_seconds=grace)
    started = time.monotonic()
    mark = 0
    for session in range(4):
        client = _open(blob, name, opts)
        try:
            _commits(client, 50, maintain_every=8)
            if session == 3:
                # NB: in the last session: a mark older than a grace at the restore (a slow
                # machine) is trimmed past, whatever the thinning
                mark = client.state.seq  # 350 rows
            _commits(client, 50, maintain_every=8)
        finally:
            client.stop()
    written = {layout.seq_of(k) for k in blob.keys_written(layout.ROLLUP_PREFIX)}
    time.sleep(grace / 4 + 0.1)  # every successor past the protection
    client = _open(blob, name, opts)
    try:
        client.maintain()
        elapsed = time.monotonic() - started
        rollups = _seqs(blob.inner, layout.ROLLUP_PREFIX)
        windows = int(elapsed / (grace / gc.THIN_WINDOWS)) + 1
        assert len(rollups) <= windows + 2, (rollups, elapsed)
        assert len(rollups) < len(written) // 2, (rollups, sorted(written))
        assert _rows(client) == 400
        client.restore(mark)  # replayed from the newest rollup kept below it
        assert _rows(client) == 350
    finally:
        client.stop()


@pytest.mark.crash
@pytest.mark.parametrize("n", [1, 5])
def test_a_writer_killed_while_thinning_rollups_loses_nothing(
        n: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Killed between two deletes of superseded rollups: every acknowledged write is there,
    the location verifies clean, and the next writer goes on."""
    monkeypatch.setenv("SEAM_GRACE", "8")  # windows of 1 s, protection 2 s
    monkeypatch.setenv("SEAM_WRITES", "300")
    location = tmp_path / "loc"
    _killed_at(location, "trim.rollup_thinned", n)


def test_the_log_is_trimmed_beside_a_long_merge(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """A maintenance round trims after its merges; while one takes long (here a compaction
    step held for 3 s), the runtime's side thread trims the log to the rollups that ripen
    meanwhile, so the log kept does not grow by every commit the merge took."""
    import threading

    from persist.indexed.engine import Indexed
    from persist.runtime import runtime as rt

    stall = threading.Event()
    stalled = threading.Event()
    compact = Indexed.compact

    def slow_compact(self: Indexed, *args: object, **kw: object) -> bool:
        if stall.is_set():
            stall.clear()
            stalled.set()
            time.sleep(3.0)
        return compact(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Indexed, "compact", slow_compact)
    root = tmp_path / "loc"
    opts = Options(rollup_every=8, gc_grace_seconds=1.0)
    assert rt.METADATA_BESIDE_SECONDS + opts.gc_grace_seconds < 2.5
    with persist.open(root, reentrance_id="w", options=opts,
                      storage_options={"fsync": False}) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        # appends up to the stall: the rollups of its last second ripen during it
        until, n = time.monotonic() + 1.5, 0
        while time.monotonic() < until:
            t = r.upper
            w.append([((t, n), t, 1)], t + 1).result()
            n += 1
        stall.set()
        t = r.upper
        w.append([((t, n), t, 1)], t + 1).result()
        assert stalled.wait(10.0)
        began = time.monotonic()

        def oldest() -> int:
            # NB: os.walk, not rglob: the trim removes shard directories while this lists
            seqs = [int(f) for _, _, files in os.walk(root / layout.LOG_PREFIX) for f in files
                    if not f.startswith(".tmp-")]
            return min(seqs, default=1 << 62)

        first = oldest()
        assert first < 1 << 62
        while time.monotonic() < began + 2.8 and oldest() <= first:
            time.sleep(0.05)
        assert time.monotonic() < began + 3.0, "the round ended before the check"
        assert oldest() > first  # trimmed beside the stalled round
        assert _rows(client) == n + 1
