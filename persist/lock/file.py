"""A writer lock in a local directory: a chain of immutable record files, extended by ``link(2)``.

Each state of the lock is a new file ``LOCK.chain/<version>`` (a checksummed blob holding one
:class:`~persist.lock.base.LockRecord`); the current record is the one with the highest version.
``_cas(expected, new)`` reads the current record, at version ``n``; if it equals ``expected``, it
creates version ``n+1`` holding ``new`` with :meth:`FileBlob.set_if_absent` (temp file, fsync,
``link``, fsync of the directory). The kernel lets exactly one process create a name, so exactly
one compare-and-set wins each version, and with it each generation.

NB: nothing is ever held. The previous design kept one ``LOCK`` file whose compare-and-set ran
under a blocking ``flock`` of ``LOCK.mutex``: a writer SIGSTOPped inside that section blocked
every other open of the location, the same-id takeover included, until it was resumed or killed.
Here a process stopped at any point holds nothing; at worst it has created a version it has not
yet confirmed, which every other process reads as the current record like any other.

Reaping: after winning version ``v``, versions below ``v-1`` are deleted. A name can therefore be
created twice: a process paused between reading version ``n`` and linking ``n+1`` links ``n+1``
again if it was created and reaped meanwhile. Such a late link is never the highest version
(reaping ``n+1`` takes a winner at ``n+3``, and the highest version is never deleted), so a
compare-and-set counts as won only if its version is still the highest after the link.
(A win that others built on before it was confirmed also reports False: the record was
superseded, so the caller loses nothing by re-reading.)

Migration from the single ``LOCK`` file of older persists: while the chain is empty, ``LOCK`` is
the current record (version 0), so an existing holder, generation and lease are honoured. The
first compare-and-set that creates version 1 first *retires* ``LOCK``: under ``LOCK.mutex``
(the older persists' own protocol, taken without blocking, under the deadline) it rewrites
``LOCK`` as a tombstone, the same record with ``version`` :data:`RETIRED_VERSION`. An older persist
then refuses the location (``IncompatibleFormat``) instead of taking the lock beside the chain,
which could hand one generation to two writers. Once version 1 exists, ``LOCK`` is never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

import msgspec
from typing_extensions import override

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import Corruption, Determinate, ExternalError, IncompatibleFormat, Timeout
from persist.lock.base import LOCK_FORMAT_VERSION, LockRecord, WriterLock, encode_record

#: The ``version`` of a retired ``LOCK`` file: newer than any older persist reads.
RETIRED_VERSION = 1 << 20


class FileLock(WriterLock):
    """A writer lock kept in a location's directory (see the module docstring)."""

    same_clock = True

    def __init__(self, directory: str | os.PathLike[str], **kw: float) -> None:
        """Args:
            directory: the location's directory (created by the first acquire).
            kw: lease settings, as for :class:`~persist.lock.base.WriterLock`.
        """
        super().__init__(**kw)
        self._blob = FileBlob(directory)
        self._chain_dir = os.path.join(self._blob.root, *layout.LOCK_CHAIN_PREFIX.split("/"))
        self._mutex_path = os.path.join(self._blob.root, layout.LOCK_MUTEX_NAME)

    def __repr__(self) -> str:
        return f"<FileLock {self._blob.root}>"

    # -- reading -------------------------------------------------------------------------------

    def _deadline(self, deadline: float | None) -> float:
        return time.monotonic() + self.store_timeout if deadline is None else deadline

    def _versions(self) -> list[int]:
        try:
            names = os.listdir(self._chain_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise Determinate(f"listing the writer lock {self._chain_dir}: {e}") from e
        # NB: temp files of an interrupted write (".tmp-...") are not versions.
        return sorted(int(n) for n in names if n.isdigit())

    def _decode(self, key: str, data: bytes | memoryview, *, retired_ok: bool) -> LockRecord:
        try:
            rec = msgspec.msgpack.decode(data, type=LockRecord)
        except (ValueError, TypeError) as e:  # msgspec.DecodeError is a ValueError
            raise Corruption(key, f"undecodable lock record: {e}") from e
        if rec.version == RETIRED_VERSION and retired_ok:
            return rec
        if rec.version > LOCK_FORMAT_VERSION:
            raise IncompatibleFormat(f"lock record {key} has version {rec.version}; this "
                                     f"persist reads up to {LOCK_FORMAT_VERSION}")
        return rec

    def _legacy(self) -> tuple[LockRecord | None, bool]:
        """Returns the record of the single ``LOCK`` file (as version 1) and whether it is
        retired. A retired file of a location never locked before holds generation 0: None."""
        data = self._blob.get(layout.LOCK_KEY)
        if data is None:
            return None, False
        rec = self._decode(layout.LOCK_KEY, data, retired_ok=True)
        if rec.version != RETIRED_VERSION:
            return rec, False
        if rec.generation == 0:
            return None, True
        return msgspec.structs.replace(rec, version=LOCK_FORMAT_VERSION), True

    def _load(self, deadline: float) -> tuple[int, LockRecord | None]:
        """Returns the highest version and its record (version 0: the ``LOCK`` file)."""
        while True:
            versions = self._versions()
            if not versions:
                return 0, self._legacy()[0]
            key = layout.lock_chain_key(versions[-1])
            data = self._blob.get(key)
            if data is not None:
                return versions[-1], self._decode(key, data, retired_ok=False)
            # NB: reaped between the listing and the read: a newer version exists; look again.
            if time.monotonic() >= deadline:
                raise Determinate(f"the writer lock {self._chain_dir} kept changing while "
                                  f"being read")

    @override
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        return self._load(self._deadline(deadline))[1]

    # -- compare-and-set -----------------------------------------------------------------------

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord, *,
             deadline: float | None = None) -> bool:
        deadline = self._deadline(deadline)
        version, current = self._load(deadline)
        if current != expected:
            return False
        if version == 0 and not self._retire_legacy(expected, deadline):
            return False
        if not self._blob.set_if_absent(layout.lock_chain_key(version + 1), encode_record(new)):
            return False
        versions = self._versions()
        if not versions or versions[-1] != version + 1:
            return False  # a late link below the head, or already superseded (module docstring)
        for old in versions:
            if old < version:
                # NB: best effort; a file left behind is only clutter below the head.
                with contextlib.suppress(ExternalError):
                    self._blob.delete(layout.lock_chain_key(old))
        return True

    def _retire_legacy(self, expected: LockRecord | None, deadline: float) -> bool:
        """Turns ``LOCK`` into a tombstone of ``expected`` (see the module docstring).

        Returns False if ``LOCK`` no longer holds ``expected``.
        """
        with self._legacy_mutex(deadline):
            current, retired = self._legacy()
            if retired or current != expected:
                return current == expected
            base = expected or LockRecord(holder="", generation=0, lease_ms=0, wall_ms=0,
                                          released=True)
            tomb = msgspec.structs.replace(base, version=RETIRED_VERSION)
            self._blob.set(layout.LOCK_KEY, encode_record(tomb))
            return True

    @contextlib.contextmanager
    def _legacy_mutex(self, deadline: float) -> Iterator[None]:
        try:
            os.makedirs(self._blob.root, exist_ok=True)
            fd = os.open(self._mutex_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise Determinate(f"opening lock mutex {self._mutex_path}: {e}") from e
        try:
            # NB: never a blocking flock: a process stopped inside the section must not
            # stop this one. Only older persists (and a one-time retirement) take this mutex.
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise Timeout(
                            f"{self._mutex_path} stayed locked until the deadline: a process "
                            f"of an older persist holds it (stopped inside its critical "
                            f"section?)"
                        ) from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # also drops the flock


__all__ = ["RETIRED_VERSION", "FileLock"]
