"""A Blob in a local directory, durable across crashes and power loss.

Keys map to relative paths (``a/b/c`` -> ``root/a/b/c``). Durability lives in exactly one
function, :meth:`FileBlob._write_durably`: temp file in the target directory, write, fsync the
file, then rename (``set``) or hard-link (``set_if_absent``) into place, then fsync the directory.
``link(2)`` fails with EEXIST when the target exists, which makes conditional create atomic
against every other process on the machine (the kernel arbitrates, no lock file needed).

A conditional create's temp file has no name where the file system allows it (``O_TMPFILE``,
linked into place with ``linkat`` through ``/proc/self/fd``): no temp name to create and unlink,
so the directory changes once per commit, not three times (0.375-0.384 ms against 0.453-0.458
for a 2 KB create + fsync + directory fsync on ext4 here, 1,200 each, alternating), and a
process killed before the link leaves nothing behind (the unnamed inode is freed with it).
Where ``O_TMPFILE`` or ``/proc`` is missing, the named temp file does the same job.

Values of ``map_min_bytes`` or more (data parts) are read by mapping the file, not copying it:
reading a 10 MB part into fresh memory cost ~20% of decoding it. Files are never changed in
place (a new value is a new inode; GC unlinks, which leaves a live mapping intact), so a mapping
sees the whole value as it was when opened. The price: an I/O error on a mapped page (a failing
disk), or a file truncated by another program while it is read, kills the process with SIGBUS
instead of raising. ``FileBlob(root, map_min_bytes=None)`` (for a location, the storage option
``map_min_bytes=None``) reads everything with ``read(2)``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
import uuid
from collections.abc import Sequence

import pyarrow as pa
from typing_extensions import override

from persist import crashpoints, layout
from persist.blob.base import Blob
from persist.blob.envelope import Framed
from persist.errors import Determinate, Indeterminate, InvalidUsage

_TMP = ".tmp-"
#: ``open(2)``'s flag for an unnamed file in a directory (Linux only).
_O_TMPFILE: int | None = getattr(os, "O_TMPFILE", None)
#: What ``open(2)`` answers with ``O_TMPFILE`` where the file system (or an old kernel) has none.
_NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})
#: Values at least this large are memory-mapped when read (see the module docstring).
MAP_MIN_BYTES = 1 << 20
#: A value is flushed to disk every this many bytes as it is written (``fdatasync``), so
#: that a big part's flush never makes a concurrent commit's fsync wait for all of it
#: (:meth:`FileBlob._write_durably`; measured in bench/README.md, "Appends beside a merge").
FLUSH_BYTES = 1 << 20


def _failed(key: str, e: OSError, *, linked: bool) -> Determinate | Indeterminate:
    """What a failed durable write of ``key`` raises: once the name is in place (``linked``)
    its directory entry may not be durable yet, so it may or may not have landed."""
    if linked:
        return Indeterminate(f"syncing directory for {key!r}: {e}")
    return Determinate(f"writing {key!r}: {e}")


class FileBlob(Blob):
    """A directory of files. Safe to share between processes on one machine."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True,
                 map_min_bytes: int | None = MAP_MIN_BYTES,
                 flush_bytes: int | None = FLUSH_BYTES) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.map_min_bytes = map_min_bytes
        self.flush_bytes = flush_bytes
        # NB: fsync=False exists only for throwaway benchmarks of the engine's CPU cost; it
        # voids the durability guarantee and is never the default.
        self._fsync = fsync
        self._known_dirs: set[str] = set()
        #: Whether conditional creates use an unnamed temp file (see the module docstring);
        #: turned off for good by the first file system that refuses one.
        self._unnamed = _O_TMPFILE is not None and os.path.isdir("/proc/self/fd")
        # NB: the root is created by the first write (``_ensure_dir`` makes every missing
        # directory up to it, durably), not here: a read-only replica opened on a mistyped
        # path must not leave directories behind, and reads of a missing root are just empty.
        self.is_local = True

    @override
    def locator(self) -> tuple[str, str] | None:
        # NB: the real path: two spellings of one directory (a symlink) are one root, or a
        # pin would name a location its source could not recognize as a reference to itself.
        return ("file", os.path.realpath(self.root))

    @override
    def sibling(self, root: str) -> Blob:
        return FileBlob(root, fsync=self._fsync, map_min_bytes=self.map_min_bytes,
                        flush_bytes=self.flush_bytes)

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/") or "\\" in key:
            raise InvalidUsage(f"invalid blob key {key!r}")
        return os.path.join(self.root, *key.split("/"))

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._known_dirs:
            return
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(m)
            # NB: a new directory entry is only durable once its parent is fsynced.
            self._fsync_dir(os.path.dirname(m))
        self._known_dirs.add(directory)

    def _fsync_dir(self, directory: str) -> None:
        if not self._fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        path = self._path(key)
        try:
            if self.map_min_bytes is not None and os.stat(path).st_size >= self.map_min_bytes:
                # NB: Arrow closes the descriptor here; the mapping lives as long as the buffer
                # (and whatever zero-copy slices of it a decoded part keeps).
                with pa.memory_map(path) as mapped:
                    return memoryview(mapped.read_buffer()).cast("B")  # bytes, not signed chars
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise Determinate(f"reading {key!r}: {e}") from e

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(end - start)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise Determinate(f"reading {key!r} from byte {start}: {e}") from e

    @override
    def _external_url(self, key: str) -> str:
        return pathlib.Path(self._path(key)).as_uri()

    @override
    def _list(self, prefix: str) -> list[str]:
        # The prefix names a directory plus the start of a file name in it; walk from there.
        head, _, _ = prefix.rpartition("/")
        start = os.path.join(self.root, *head.split("/")) if head else self.root
        out: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(start):
                rel = os.path.relpath(dirpath, self.root)
                base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
                dirnames[:] = [d for d in dirnames if (base + d + "/").startswith(prefix)
                               or prefix.startswith(base + d + "/")]
                out.extend(base + name for name in filenames
                           if not name.startswith(_TMP) and (base + name).startswith(prefix))
        except OSError as e:
            raise Determinate(f"listing {prefix!r}: {e}") from e
        return out

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        # NB: one listdir of the prefix's directory. The kernel still reads every name (~0.4 us
        # an entry here, 38-45 ms for 100 k log entries in one directory: what a sharded log,
        # format 7, keeps out of ``meta/log/``); names at or before the start key are dropped
        # by one string comparison each, so no key before it is ever built or stat'ed
        # (building each one and asking whether it is a directory, as ``_list`` does, cost ~3x
        # that). A subdirectory (a shard of a sharded log) whose keys all sort before the
        # start key is never read; the one the start key lies in is listed after it the same
        # way, and every later one whole.
        head, _, name_prefix = prefix.rpartition("/")
        base = head + "/" if head else ""
        if start_after.startswith(base):
            after = start_after[len(base):]
        elif base > start_after:
            after = ""  # every key of this directory sorts after it
        else:
            return []
        # the one entry that may be a directory holding keys past the start key though its
        # own name sorts before it ("a" for "a/b")
        inside = after.split("/", 1)[0] if "/" in after else None
        start = os.path.join(self.root, *head.split("/")) if head else self.root
        try:
            names = os.listdir(start)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise Determinate(f"listing {prefix!r} after {start_after!r}: {e}") from e
        out: list[str] = []
        for name in [n for n in names
                     if (n > after or n == inside) and n.startswith(name_prefix)]:
            try:
                mode = os.stat(os.path.join(start, name), follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue  # deleted since the listing
            except OSError as e:
                raise Determinate(f"listing {prefix!r} after {start_after!r}: {e}") from e
            if stat.S_ISDIR(mode):
                sub = base + name + "/"
                out.extend(self._list_after(sub, start_after) if start_after.startswith(sub)
                           else self._list(sub))
            elif name > after and not name.startswith(_TMP):
                out.append(base + name)
        return out

    def _write_durably(self, key: str, data: bytes | Framed, *, exclusive: bool) -> bool:
        """The one place durability happens. Returns False if ``exclusive`` and the key exists."""
        path = self._path(key)
        directory = os.path.dirname(path)
        try:
            self._ensure_dir(directory)
        except OSError as e:
            raise Determinate(f"writing {key!r}: {e}") from e
        if exclusive and self._unnamed:
            created = self._create_unnamed(key, path, directory, data)
            if created is not None:
                return created
        tmp = os.path.join(directory, f"{_TMP}{uuid.uuid4().hex}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise Determinate(f"writing {key!r}: {e}") from e
        linked = False
        try:
            try:
                self._write_synced(fd, data)
            finally:
                os.close(fd)
            crashpoints.hit("file.tmp_synced")
            if exclusive:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
            else:
                os.replace(tmp, path)
            linked = True
            crashpoints.hit("file.linked")
            self._fsync_dir(directory)
            return True
        except OSError as e:
            raise _failed(key, e, linked=linked) from e
        finally:
            if exclusive or not linked:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _create_unnamed(self, key: str, path: str, directory: str,
                        data: bytes | Framed) -> bool | None:
        """``_write_durably``'s conditional create through an unnamed temp file (the module
        docstring): True created, False the key exists, None this file system has no unnamed
        files (nothing was written; the caller takes the named temp file)."""
        assert _O_TMPFILE is not None
        try:
            fd = os.open(directory, os.O_WRONLY | _O_TMPFILE, 0o644)
        except OSError as e:
            if e.errno in _NO_TMPFILE:
                self._unnamed = False
                return None
            raise Determinate(f"writing {key!r}: {e}") from e
        linked = False
        try:
            try:
                self._write_synced(fd, data)
                crashpoints.hit("file.tmp_synced")
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    # NB: linkat with AT_SYMLINK_FOLLOW (what a dir fd and follow_symlinks
                    # make CPython call) on the descriptor's /proc name: the way open(2)
                    # documents to give an O_TMPFILE file a name. EEXIST is the refusal.
                    try:
                        os.link(f"/proc/self/fd/{fd}", os.path.basename(path),
                                dst_dir_fd=dfd, follow_symlinks=True)
                    except FileExistsError:
                        return False
                    linked = True
                    crashpoints.hit("file.linked")
                    if self._fsync:
                        os.fsync(dfd)
                finally:
                    os.close(dfd)
            finally:
                os.close(fd)
            return True
        except OSError as e:
            raise _failed(key, e, linked=linked) from e

    def _write_synced(self, fd: int, data: bytes | Framed) -> None:
        """Writes ``data`` to ``fd`` and fsyncs it (unless fsync is off)."""
        # NB: a big value is flushed to disk as it is written, every flush_bytes, not all at
        # once by the fsync below: on a journaling file system a small commit's fsync
        # (another thread's or process's) waits for the dirty data the journal commit must
        # order before it, so one flush of tens of MiB stalls every commit beside it
        step = (self.flush_bytes or 0) if self._fsync else 0
        next_flush = step
        written = 0
        for buf in data.buffers if isinstance(data, Framed) else (data,):
            view = memoryview(buf)
            while view:
                n = os.write(fd, view[:next_flush - written] if step else view)
                view = view[n:]
                written += n
                if step and written >= next_flush:
                    os.fdatasync(fd)
                    next_flush = written + step
        crashpoints.hit("file.tmp_written")
        if self._fsync:
            os.fsync(fd)

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        self._write_durably(key, data, exclusive=False)

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        return self._write_durably(key, data, exclusive=True)

    @override
    def _delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return
            raise Determinate(f"deleting {key!r}: {e}") from e
        shard = layout.log_shard_done(key)
        if shard is not None:
            # NB: the last entry of a shard of the log (a trim deletes in seq order): the shard
            # is empty for good (every later seq lies in a later shard), so its directory goes
            # too, or ``meta/log/`` would gain a name per 1,024 commits forever; with the temp
            # files killed writers left in it (no live writer creates a seq of a shard below
            # the head: a fenced one that tries fails). Not durable and not retried: a crash
            # here leaves an empty directory, which a listing after a later seq never reads.
            crashpoints.hit("file.shard_emptied")
            directory = self._path(shard.rstrip("/"))
            self._known_dirs.discard(directory)
            with contextlib.suppress(OSError):
                for name in os.listdir(directory):
                    if name.startswith(_TMP):
                        os.unlink(os.path.join(directory, name))
                os.rmdir(directory)

    @override
    def _delete_shard(self, shard: str, keys: Sequence[str]) -> None:
        # NB: every entry of the shard at once, with the temp files killed writers left in it:
        # one call into Arrow's C++ that releases the GIL for the whole shard. One ``unlink``
        # each (what ``_delete`` does) releases and retakes it per entry, and under a thread
        # appending meanwhile each retake waited for it: ~1.3 ms an entry, where the
        # ``unlink`` alone takes ~30-40 us, and every wait ended by forcing the appending
        # thread off the GIL (bench/README.md, "Incremental rollups at 10,000 collections").
        # Only the shard's own entries are in it (a trim deletes whole shards here), so
        # nothing else goes. The seam, the ``rmdir`` and a crash between them are as for the
        # shard's last entry in ``_delete``.
        from pyarrow import fs

        directory = self._path(shard.rstrip("/"))
        self._known_dirs.discard(directory)
        try:
            fs.LocalFileSystem().delete_dir_contents(directory, missing_dir_ok=True)
        except OSError as e:
            raise Determinate(f"deleting the log shard {shard!r}: {e}") from e
        crashpoints.hit("file.shard_emptied")
        with contextlib.suppress(OSError):
            os.rmdir(directory)
