"""The Blob protocol: a durable ``str -> bytes`` store, split into a read half and a write half.

``BlobRead`` (get, list_keys) is all a read-only replica is ever handed, so it cannot write by
construction. ``Blob(BlobRead)`` adds atomic ``set``, conditional ``set_if_absent`` (the commit
primitive) and idempotent ``delete``.

Every value is framed in the envelope of :mod:`persist.blob.envelope` by these base classes, so
no implementation can forget to checksum. Implementations provide only the raw ``_`` methods;
they translate their own errors (OSError, botocore) into :mod:`persist.errors` at this edge.

*Plain values* (``set_plain`` / ``get_plain``) are the one exception to the envelope: stored
byte for byte, so that another program can open them where they lie (a data part is a Parquet
file Spark reads), their checksum is returned by ``set_plain`` for the caller to keep with its
reference (``PartMeta.checksum``) and is checked by ``get_plain`` before a byte is returned. The
check lives here too, so no implementation can skip it. ``external_url`` tells such a program
where a key lives (a ``file://`` URL, ``s3://bucket/prefix/key``), or None for a store no other
process can reach (memory). ``get_range`` reads a stretch of a plain value as it is stored (a
Parquet file's tail, which the caller checks against a checksum it keeps of that stretch).

Invariant: a key once created by ``set_if_absent`` is never overwritten by a later
``set_if_absent``; exactly one of any number of racing creators of a key wins.
Invariant: ``set`` and ``set_if_absent`` are atomic: a reader sees the old value (or nothing)
or the whole new value, never a prefix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from persist.blob import envelope
from persist.blob.envelope import Framed
from persist.errors import InvalidUsage


class BlobRead(ABC):
    """The read half of a blob store."""

    #: True when ``set_if_absent`` is atomic against other processes and machines.
    supports_conditional_create: bool = True
    #: True when values are on this machine (affects caching and latency expectations).
    is_local: bool = True

    def get(self, key: str) -> bytes | None:
        """Returns the verified payload stored under ``key``, or None if there is none.

        Raises:
            Corruption / ChecksumMismatch: the stored bytes fail verification.
            IncompatibleFormat: the envelope is newer than this persist.
            ExternalError: the store failed (Determinate: nothing to worry about, retry).
        """
        view = self.get_view(key)
        return None if view is None else bytes(view)

    def get_view(self, key: str) -> memoryview | None:
        """Like :meth:`get`, but the verified payload is a view into the bytes read: no copy.

        NB: for large values (data parts). Copying a 10 MB part after reading it doubles the
        memory traffic of a read, and freeing the two buffers together makes the allocator
        return the pages to the OS, so the next read faults them all in again.
        """
        raw = self._get(key)
        if raw is None:
            return None
        return envelope.unframe(key, raw)

    def get_plain(self, key: str, checksum: int, *, size: int | None = None
                  ) -> memoryview | None:
        """Returns the plain value stored under ``key`` by :meth:`Blob.set_plain`, verified
        against ``checksum`` (what ``set_plain`` returned, kept with the reference to the
        value), as a view into the bytes read; None if there is none.

        Args:
            size: the value's length, when the reference keeps it (a wrong length is reported
                as such).

        Raises:
            ChecksumMismatch: the stored bytes are not the value checksummed (another length,
                flipped bits, truncation, another key's value).
            ExternalError: the store failed.
        """
        raw = self._get(key)
        if raw is None:
            return None
        return envelope.verify_plain(key, raw, checksum, size)

    def get_range(self, key: str, start: int, end: int | None = None) -> bytes | None:
        """The stored bytes of ``key`` from offset ``start`` up to ``end`` (None: its end),
        as they are stored: unverified, for a plain value (:meth:`Blob.set_plain`) whose
        reference keeps a checksum of that stretch (a Parquet part's tail). Shorter than
        asked where the value ends first (empty past its end); None if there is no value.

        Raises:
            InvalidUsage: ``start`` is negative or ``end`` below ``start``.
            ExternalError: the store failed.
        """
        if start < 0 or (end is not None and end < start):
            raise InvalidUsage(f"get_range of {key!r}: bad range [{start}, {end})")
        raw = self._get_range(key, start, end)
        return None if raw is None else bytes(raw)

    def get_foreign(self, key: str) -> memoryview | None:
        """Returns the bytes another program wrote under ``key`` (not through this store:
        Spark's own Parquet writer, at :meth:`external_url`), as stored and unverified; None
        if there is none. Nothing protects them yet: the caller checksums them
        (``envelope.checksum``) and keeps the checksum with its reference to the value, which
        :meth:`get_plain` then verifies on every read, as if :meth:`Blob.set_plain` had
        returned it.

        Raises:
            ExternalError: the store failed.
        """
        raw = self._get(key)
        return None if raw is None else memoryview(raw)

    def external_url(self, key: str) -> str | None:
        """Where another program (Spark's own Parquet reader, ...) finds the value of ``key``:
        an absolute ``file://`` URL, ``s3://bucket/prefix/key``, or None if no other process
        can reach this store (memory). Only a plain value (:meth:`Blob.set_plain`) is readable
        there as it was given; any other is in its envelope.

        Raises:
            InvalidUsage: ``key`` is not a valid key.
        """
        return self._external_url(key)

    def list_keys(self, prefix: str, *, start_after: str | None = None) -> list[str]:
        """Returns every key starting with ``prefix``, sorted; with ``start_after``, only
        those that sort after it.

        ``start_after`` lets a reader list only the end of a long run of keys: the metadata log
        after the entry a rollup covers (``meta/log/<seq>`` sorts by seq). Every store serves it
        at the cost of the keys it returns where it can (one S3 request per 1,000 keys
        returned, ``StartAfter``); a directory of files is read whole by the kernel, and only
        the names past ``start_after`` become keys.

        Raises:
            ExternalError: the store failed.
        """
        if start_after is None:
            return sorted(self._list(prefix))
        return sorted(self._list_after(prefix, start_after))

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Releases resources (connections). Idempotent."""

    def locator(self) -> tuple[str, str] | None:
        """``(store, root)``: the store this location lives in and its root there, each in
        one canonical spelling; None if this store cannot name other locations. Locations
        of one store can reference each other's blobs (a fork across locations, which reads
        them through :meth:`sibling`)."""
        return None

    def sibling(self, root: str) -> BlobRead:
        """The read half of the location at ``root`` (as :meth:`locator` spells it) of this
        store, reached as this one is (same credentials and options).

        Raises:
            InvalidUsage: this store cannot name other locations.
        """
        raise InvalidUsage(f"{type(self).__name__} cannot reach other locations of its store "
                           f"(asked for {root!r})")

    @abstractmethod
    def _get(self, key: str) -> bytes | memoryview | None:
        """Returns the raw framed bytes under ``key`` or None."""

    @abstractmethod
    def _list(self, prefix: str) -> list[str]:
        """Returns the keys under ``prefix`` in any order."""

    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        """Returns the keys under ``prefix`` that sort after ``start_after``, in any order.

        NB: this default lists the whole prefix and filters: correct for any store, and what
        a store that cannot do better costs. Every store of persist and every wrapper
        overrides it (a wrapper must forward it, or it would list the whole prefix below).
        """
        return [k for k in self._list(prefix) if k > start_after]

    def _external_url(self, key: str) -> str | None:
        """The URL of ``key`` for other programs (see :meth:`external_url`); None: none.
        Wrappers forward it to the store they wrap."""
        return None

    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        """The raw bytes ``[start, end)`` of ``key`` (see :meth:`get_range`), or None.

        NB: this default reads the whole value; a store that can read a stretch (a file, an
        S3 ranged GET) overrides it, and a wrapper forwards it to the store it wraps.
        """
        raw = self._get(key)
        return None if raw is None else memoryview(raw)[start:end]


class Blob(BlobRead):
    """A blob store that can also write."""

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        """Atomically and durably stores ``value`` under ``key``, replacing any old value.

        When this returns, the value survives a crash or power loss.

        Raises:
            Determinate: definitely not stored.
            Indeterminate: may or may not be stored.
        """
        self._set(key, envelope.frame(key, value))

    def set_if_absent(self, key: str, value: bytes | bytearray | memoryview) -> bool:
        """Atomically and durably creates ``key`` with ``value`` unless it already exists.

        Returns:
            True if this call created the key; False if the key already existed (nothing written).

        Raises:
            Determinate: definitely not created (and it is unknown whether the key exists).
            Indeterminate: may or may not have been created by this call.
        """
        return self._set_if_absent(key, envelope.frame(key, value))

    def set_plain(self, key: str, value: bytes | bytearray | memoryview) -> int:
        """Atomically and durably stores ``value`` under ``key`` as it is, with no envelope,
        replacing any old value (as :meth:`set`), and returns its checksum.

        The caller must keep the checksum with its reference to the value and read it back
        with :meth:`get_plain`, which verifies it: the stored bytes carry none.

        Returns:
            ``crc32c(value)``.

        Raises:
            Determinate: definitely not stored.
            Indeterminate: may or may not be stored.
        """
        crc = envelope.checksum(value)
        self._set(key, envelope.plain(value))
        return crc

    def delete(self, key: str) -> None:
        """Deletes ``key``. Deleting an absent key is not an error (idempotent).

        Raises:
            ExternalError: the store failed.
        """
        self._delete(key)

    def delete_shard(self, shard: str, keys: Sequence[str]) -> None:
        """Deletes ``keys``, every entry of the log shard ``shard`` (a prefix ending in ``/``,
        :func:`persist.layout.log_shard_done`), in seq order, as :meth:`delete` would one by
        one: a metadata trim that covers a whole shard. A store may delete them in one call
        (a file store removes the shard's directory with them, releasing the GIL once for the
        whole shard rather than once per entry); deleting absent entries is no error.

        Raises:
            ExternalError: the store failed; some of ``keys`` may be deleted.
        """
        self._delete_shard(shard, keys)

    def read_only(self) -> BlobRead:
        """Returns a view of this store with only the read half."""
        return ReadOnlyView(self)

    def sibling(self, root: str) -> Blob:
        """The location at ``root`` of this store, writable like this one (see
        :meth:`BlobRead.sibling`).

        Raises:
            InvalidUsage: this store cannot name other locations.
        """
        raise InvalidUsage(f"{type(self).__name__} cannot reach other locations of its store "
                           f"(asked for {root!r})")

    # NB: the raw writes store ``data`` as it is: a value framed by ``set``, a plain value
    # (an empty header), or (tests that corrupt storage on purpose) any bytes.
    @abstractmethod
    def _set(self, key: str, data: bytes | Framed) -> None: ...

    @abstractmethod
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool: ...

    @abstractmethod
    def _delete(self, key: str) -> None: ...

    def _delete_shard(self, shard: str, keys: Sequence[str]) -> None:
        # NB: the default: one delete each, in order (the last removes the shard if the store
        # keeps one)
        for key in keys:
            self._delete(key)


class Wrapping(Blob):
    """A store that wraps another (``inner``, a writable store) and does its work through it:
    its other locations too. Subclasses add what they wrap around the raw methods."""

    inner: Blob

    def locator(self) -> tuple[str, str] | None:
        """The wrapped store's (see :meth:`BlobRead.locator`)."""
        return self.inner.locator()

    def sibling(self, root: str) -> Blob:
        """The wrapped store's (see :meth:`Blob.sibling`)."""
        return self.inner.sibling(root)


class ReadOnlyView(BlobRead):
    """Only the read half of another store: it has no method that writes."""

    def __init__(self, inner: BlobRead) -> None:
        self._inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local

    def _get(self, key: str) -> bytes | memoryview | None:
        return self._inner._get(key)

    def _list(self, prefix: str) -> list[str]:
        return self._inner._list(prefix)

    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        return self._inner._list_after(prefix, start_after)

    def _external_url(self, key: str) -> str | None:
        return self._inner._external_url(key)

    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        return self._inner._get_range(key, start, end)

    def locator(self) -> tuple[str, str] | None:
        """The viewed store's (see :meth:`BlobRead.locator`)."""
        return self._inner.locator()

    def sibling(self, root: str) -> BlobRead:
        """The viewed store's, read-only (see :meth:`BlobRead.sibling`)."""
        other = self._inner.sibling(root)
        return other.read_only() if isinstance(other, Blob) else other

    def close(self) -> None:
        """Closes the store this views: the view shares, and so releases, its resources."""
        self._inner.close()
