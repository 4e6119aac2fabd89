"""A writer lock in a local file, arbitrated by ``flock`` on a sibling mutex file.

The record lives in ``<dir>/LOCK`` (checksummed like any blob); compare-and-set holds an
exclusive ``flock`` on ``<dir>/LOCK.mutex`` only for the read-compare-write, so a crashed process
never leaves the mutex held (the kernel drops flocks of dead processes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from typing_extensions import override

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import Corruption, Determinate
from persist.lock.base import LockRecord, WriterLock, decode_record, encode_record

_KEY = layout.LOCK_KEY


class FileLock(WriterLock):
    same_clock = True

    def __init__(self, directory: str | os.PathLike[str], **kw: float) -> None:
        super().__init__(**kw)
        self._blob = FileBlob(directory)
        self._mutex_path = os.path.join(self._blob.root, layout.LOCK_MUTEX_NAME)

    @contextlib.contextmanager
    def _mutex(self) -> Iterator[None]:
        try:
            # NB: the mutex file lives in the location's directory, which only a first write
            # creates (FileBlob): taking or reading the lock of a new location comes first.
            os.makedirs(self._blob.root, exist_ok=True)
            fd = os.open(self._mutex_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise Determinate(f"opening lock mutex {self._mutex_path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # also drops the flock

    def _read_unlocked(self) -> LockRecord | None:
        data = self._blob.get(_KEY)
        if data is None:
            return None
        try:
            return decode_record(data)
        except (ValueError, TypeError) as e:  # msgspec.DecodeError is a ValueError
            raise Corruption(_KEY, f"undecodable lock record: {e}") from e

    @override
    def _read(self) -> LockRecord | None:
        with self._mutex():
            return self._read_unlocked()

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord) -> bool:
        with self._mutex():
            if self._read_unlocked() != expected:
                return False
            self._blob.set(_KEY, encode_record(new))
            return True
