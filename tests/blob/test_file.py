from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.blob.file import FLUSH_BYTES, MAP_MIN_BYTES, FileBlob
from persist.blob.metered import MeteredBlob
from persist.errors import InvalidUsage, MissingResource, UnknownCollection
from persist.location import resolve
from persist.runtime.replica import CountingRead
from tests.blob.conformance import BlobConformance


class TestFileBlob(BlobConformance):
    @pytest.fixture
    def blob(self, tmp_path: Path) -> FileBlob:
        return FileBlob(tmp_path / "blob")


class TestFileBlobMappingEverything(BlobConformance):
    """Every value read through a memory map (checksums, truncation and swaps included)."""

    @pytest.fixture
    def blob(self, tmp_path: Path) -> FileBlob:
        return FileBlob(tmp_path / "blob", map_min_bytes=1)


class TestFileBlobMappingNothing(BlobConformance):
    @pytest.fixture
    def blob(self, tmp_path: Path) -> FileBlob:
        return FileBlob(tmp_path / "blob", map_min_bytes=None)


class TestFileBlobNamedTemps(BlobConformance):
    """Conditional creates through a named temp file, as on a file system without unnamed
    (``O_TMPFILE``) files: the whole suite on that path too."""

    @pytest.fixture
    def blob(self, tmp_path: Path) -> FileBlob:
        b = FileBlob(tmp_path / "blob")
        b._unnamed = False  # what the first refusal of O_TMPFILE leaves (see below)
        return b


class TestFileBlobFlushingInOddPieces(BlobConformance):
    """Every value of more than 64 KiB written in pieces of an odd size, each flushed before
    the next (framed values and their checksums included): the pieces join up to exactly the
    value."""

    @pytest.fixture
    def blob(self, tmp_path: Path) -> FileBlob:
        return FileBlob(tmp_path / "blob", flush_bytes=(1 << 16) + 7)


def test_a_big_value_is_flushed_as_it_is_written(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A value of several flush_bytes is flushed after each of them (a commit beside it then
    never waits for all of it, bench/README.md); a smaller one only by the final fsync; with
    fsync off, never."""
    synced: list[int] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    blob = FileBlob(tmp_path / "b", flush_bytes=1000)
    value = os.urandom(3500)
    blob.set("data/a", value)
    assert synced == [1000, 2000, 3000]
    assert blob.get("data/a") == value
    synced.clear()
    # NB: stored framed (a header, then the value): the pieces cross the buffers' edge
    assert blob.set_if_absent("data/b", value[:2500]) is True
    assert synced == [1000, 2000]
    assert blob.get("data/b") == value[:2500]
    synced.clear()
    blob.set("data/c", value[:900])
    assert synced == []
    FileBlob(tmp_path / "c", flush_bytes=1000, fsync=False).set("data/a", value)
    assert synced == []


def test_flushing_is_a_storage_option(tmp_path: Path) -> None:
    """``storage_options={"flush_bytes": ...}`` sets the piece or turns flushing as a value is
    written off (the final fsync stays); anything else is refused by name."""
    assert resolve(tmp_path).blob.flush_bytes == FLUSH_BYTES  # type: ignore[attr-defined]
    for off in (None, False, 0, "0"):
        loc = resolve(tmp_path, storage_options={"flush_bytes": off})
        assert loc.blob.flush_bytes is None  # type: ignore[attr-defined]
    loc = resolve(tmp_path, storage_options={"flush_bytes": 1 << 22})
    assert loc.blob.flush_bytes == 1 << 22  # type: ignore[attr-defined]
    assert loc.blob.sibling(str(tmp_path / "s")).flush_bytes == 1 << 22  # type: ignore[attr-defined]
    for bad in (-1, "big", True):
        with pytest.raises(InvalidUsage, match="flush_bytes"):
            resolve(tmp_path, storage_options={"flush_bytes": bad})


def test_a_mapped_value_outlives_its_file_and_holds_no_descriptor(tmp_path: Path) -> None:
    """GC unlinks a part and ``set`` replaces a file while a reader may still hold a view of
    it: the view keeps the value it read. Mapping leaves no file descriptor open."""
    blob = FileBlob(tmp_path, map_min_bytes=1 << 10)
    big = bytes(range(256)) * 64  # 16 KiB: mapped
    blob.set("data/a", big)
    blob.set("data/b", big[::-1])
    fds = len(os.listdir("/proc/self/fd"))
    views = [blob.get_view("data/a"), blob.get_view("data/b")]
    assert len(os.listdir("/proc/self/fd")) == fds
    blob.delete("data/a")
    blob.set("data/b", b"small now")
    assert views[0] == big
    assert views[1] == big[::-1]
    assert blob.get("data/a") is None
    assert blob.get("data/b") == b"small now"


def _create(root: str, key: str, i: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    q.put((i, FileBlob(root).set_if_absent(key, str(i).encode())))


def test_conditional_create_is_atomic_across_processes(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_create, args=(str(tmp_path), "k", i, q)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    results = [q.get() for _ in procs]
    winners = [i for i, won in results if won]
    assert len(winners) == 1
    assert FileBlob(tmp_path).get("k") == str(winners[0]).encode()


def test_no_temp_files_left_and_none_listed(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    blob.set("a/b", b"1")
    blob.set_if_absent("a/c", b"2")
    blob.set_if_absent("a/c", b"3")
    assert sorted(os.listdir(tmp_path / "a")) == ["b", "c"]


def test_conditional_creates_use_unnamed_temp_files_here(tmp_path: Path) -> None:
    """On this machine's file system (Linux, ext4 or tmpfs) a conditional create links an
    unnamed file into place: the fast path is the one the suite runs."""
    blob = FileBlob(tmp_path)
    assert blob.set_if_absent("a/c", b"2")
    assert blob._unnamed


def test_a_kernel_without_unnamed_files_falls_back_to_named_temps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that predates O_TMPFILE reads the flag as O_DIRECTORY, and open(2) then fails
    with EISDIR: the create goes through a named temp file instead, exactly, and so does
    every one after it."""
    import persist.blob.file as file_blob

    monkeypatch.setattr(file_blob, "_O_TMPFILE", os.O_DIRECTORY)
    blob = FileBlob(tmp_path)
    assert blob._unnamed
    assert blob.set_if_absent("a/c", b"2")
    assert not blob._unnamed
    assert not blob.set_if_absent("a/c", b"3")
    assert blob.set_if_absent("a/d", b"4")
    assert (blob.get("a/c"), blob.get("a/d")) == (b"2", b"4")
    assert sorted(os.listdir(tmp_path / "a")) == ["c", "d"]


def _killed_before_the_link(root: str) -> None:
    from persist import crashpoints

    crashpoints.arm("file.tmp_synced")
    FileBlob(root).set_if_absent("a/k", b"x" * 5000)


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed", "named"])
def test_a_create_killed_before_its_link_leaves_no_key(tmp_path: Path, unnamed: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL after the temp file is written and synced, before the link: the key is absent
    and can be created. An unnamed temp file dies with the process; a named one stays
    behind, unlisted, for trims to sweep (as before)."""
    import persist.blob.file as file_blob

    if not unnamed:
        monkeypatch.setattr(file_blob, "_O_TMPFILE", None)  # the forked child inherits it
    FileBlob(tmp_path).set("a/other", b"o")
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_killed_before_the_link, args=(str(tmp_path),))
    p.start()
    p.join(30)
    assert p.exitcode == -9
    blob = FileBlob(tmp_path)
    assert blob.get("a/k") is None
    assert blob.list_keys("a/") == ["a/other"]
    left = sorted(n for n in os.listdir(tmp_path / "a") if n.startswith(".tmp-"))
    assert len(left) == (0 if unnamed else 1)
    assert blob.set_if_absent("a/k", b"y")
    assert blob.get("a/k") == b"y"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a\\b"])
def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(InvalidUsage):
        FileBlob(tmp_path).set(key, b"")


def test_reading_a_missing_root_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "not" / "there"
    blob = FileBlob(root)
    assert blob.get("k") is None
    assert blob.list_keys("") == []
    assert not (tmp_path / "not").exists()
    # a read-only open of a location no writer has created is refused (a mistyped path looks
    # exactly like that), unless asked for; either way it leaves no trace
    with pytest.raises(MissingResource, match="no persist location"):
        persist.open(root, read_only=True)
    assert not (tmp_path / "not").exists()
    with persist.open(root, read_only=True, missing_ok=True) as replica:
        assert replica.state.seq == 0
        with pytest.raises(UnknownCollection, match="'c'"):
            replica.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
    assert not (tmp_path / "not").exists()
    blob.set("a/b", b"v")  # the first write makes the directories
    assert FileBlob(root).get("a/b") == b"v"


def test_mapping_is_a_storage_option(tmp_path: Path) -> None:
    """``storage_options={"map_min_bytes": ...}`` sets the threshold or turns mapping off;
    anything else is refused by name."""
    assert isinstance(resolve(tmp_path).blob, FileBlob)
    assert resolve(tmp_path).blob.map_min_bytes == MAP_MIN_BYTES  # type: ignore[attr-defined]
    for off in (None, False, 0, "0"):
        loc = resolve(tmp_path, storage_options={"map_min_bytes": off})
        assert loc.blob.map_min_bytes is None  # type: ignore[attr-defined]
    loc = resolve(tmp_path, storage_options={"map_min_bytes": "4096"})
    assert loc.blob.map_min_bytes == 4096  # type: ignore[attr-defined]
    for bad in (-1, "big", True):
        with pytest.raises(InvalidUsage, match="map_min_bytes"):
            resolve(tmp_path, storage_options={"map_min_bytes": bad})


class TestMeteredFileBlob(BlobConformance):
    """The metering wrapper is transparent: framing, plain values and URLs pass through."""

    @pytest.fixture
    def blob(self, tmp_path: Path) -> MeteredBlob:
        return MeteredBlob(FileBlob(tmp_path / "blob"))


def test_external_url_is_an_absolute_file_url(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path / "rel" / ".." / "loc")
    url = blob.external_url("data/3/abc")
    assert url == (tmp_path / "loc" / "data" / "3" / "abc").as_uri()
    assert url is not None
    assert url.startswith("file:///")
    with pytest.raises(InvalidUsage):
        blob.external_url("../outside")
    counted = CountingRead(blob.read_only())
    assert counted.external_url("data/3/abc") == url


def test_listing_after_a_key_skips_temp_files_and_a_missing_directory(tmp_path: Path) -> None:
    """A write in flight (its temp file beside the log entries) is no key, with or without a
    start key; a prefix whose directory was never made lists nothing."""
    blob = FileBlob(tmp_path)
    for seq in (1, 2, 3):
        blob.set(f"meta/log/{seq:03d}", b"v")
    (tmp_path / "meta" / "log" / ".tmp-inflight").write_bytes(b"half")
    assert blob.list_keys("meta/log/") == ["meta/log/001", "meta/log/002", "meta/log/003"]
    assert blob.list_keys("meta/log/", start_after="meta/log/001") == [
        "meta/log/002", "meta/log/003"]
    assert blob.list_keys("meta/log/", start_after="") == blob.list_keys("meta/log/")
    assert blob.list_keys("nothing/here/", start_after="nothing/here/0") == []
