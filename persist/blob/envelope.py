"""The envelope every stored value sits in: magic, version, length and a crc32c.

Layout (little endian, 24 bytes of header, then the payload)::

    offset  size  field
    0       4     magic  b"PST1"
    4       2     envelope format version (ENVELOPE_VERSION)
    6       2     reserved, zero
    8       8     payload length in bytes
    16      4     crc32c(key || header[0:16] || payload)
    20      4     crc32c(header[0:16]) (so a torn header is told apart from a torn payload)

NB: the key is folded into the checksum but not stored. Two valid values swapped between keys
(a misdirected write, a bad copy) therefore fail verification instead of decoding into a wrong
answer, at no cost in space.

Records that travel between processes rather than to storage (a staged part from a worker to
its committer, a read task from a planner to a worker) use the same envelope through
:func:`pack` and :func:`unpack`, with their *kind* in place of the key: their bytes are checked
before anything in them is decoded, and bytes of one kind never verify as another.

**Plain values** (:meth:`persist.blob.base.Blob.set_plain`) are stored as they are, with no
envelope, so that other programs can open them (a data part is a Parquet file that Spark reads
from its URL). Their checksum, ``crc32c(value)``, lives with the reference to the value instead
(a part's ``PartMeta.checksum``), and :func:`verify_plain` checks a value read against it. A
value of another key fails that check too (its checksum is another), unless the two are equal
byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from persist.errors import ChecksumMismatch, Corruption, IncompatibleFormat, InvalidUsage

MAGIC = b"PST1"
ENVELOPE_VERSION = 1
_HEADER = struct.Struct("<4sHHQII")
HEADER_LEN = _HEADER.size  # 24


@dataclass(frozen=True, slots=True)
class Framed:
    """A value in its envelope, as the two buffers stored one after the other.

    A plain value (:meth:`persist.blob.base.Blob.set_plain`) reaches the raw writes as one of
    these with an empty header: the payload is stored as it is.

    NB: not joined into one ``bytes``: a store that writes buffers in turn (a file) then never
    copies the payload, which for a data part is ~10 MB per million rows into fresh pages, as
    much time as the checksum and the file write together. ``bytes(framed)`` joins them.
    """

    header: bytes
    payload: bytes | bytearray | memoryview

    @property
    def buffers(self) -> tuple[bytes, bytes | bytearray | memoryview]:
        """``(header, payload)``: store them in this order, back to back."""
        return self.header, self.payload

    def __len__(self) -> int:
        return len(self.header) + memoryview(self.payload).nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers)


def frame(key: str, payload: bytes | bytearray | memoryview) -> Framed:
    """Wraps ``payload`` for storage under ``key``."""
    prefix = struct.pack("<4sHHQ", MAGIC, ENVELOPE_VERSION, 0, memoryview(payload).nbytes)
    body_crc = crc32c.crc32c(payload, crc32c.crc32c(prefix, crc32c.crc32c(key.encode())))
    return Framed(prefix + struct.pack("<II", body_crc, crc32c.crc32c(prefix)), payload)


def unframe(key: str, data: bytes | bytearray | memoryview) -> memoryview:
    """Verifies and strips the envelope of a value read from ``key``.

    Raises:
        Corruption: bad magic, truncated or over-long data.
        ChecksumMismatch: the crc32c does not match (flipped bits, or the value of another key).
        IncompatibleFormat: written by a newer envelope version.
    """
    view = memoryview(data)
    if len(view) < HEADER_LEN:
        raise Corruption(key, f"truncated: {len(view)} bytes is shorter than the envelope header")
    magic, version, _reserved, length, body_crc, head_crc = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise Corruption(key, f"bad magic {bytes(magic)!r}")
    prefix = view[:16]
    if crc32c.crc32c(prefix) != head_crc:
        raise ChecksumMismatch(key, "header checksum mismatch")
    if version > ENVELOPE_VERSION:
        raise IncompatibleFormat(
            f"blob {key!r} uses envelope version {version}; this persist reads up to "
            f"{ENVELOPE_VERSION}: upgrade persist"
        )
    if len(view) - HEADER_LEN != length:
        raise Corruption(
            key, f"length mismatch: header says {length} bytes, found {len(view) - HEADER_LEN}"
        )
    payload = view[HEADER_LEN:]
    if crc32c.crc32c(payload, crc32c.crc32c(prefix, crc32c.crc32c(key.encode()))) != body_crc:
        raise ChecksumMismatch(key, "payload checksum mismatch")
    return payload


def pack(kind: str, payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` (an encoded record) in an envelope for travel between processes, as one
    ``bytes``: :func:`unpack` with the same ``kind`` verifies it before it is decoded.

    Args:
        kind: what the record is, e.g. ``"persist.StagedPart"``; it takes the key's place in the
            checksum, so bytes packed as one kind fail verification as any other.
    """
    return bytes(frame(kind, payload))


def unpack(kind: str, data: object) -> memoryview:
    """Verifies and strips the envelope of a record :func:`pack` made as ``kind``; call it
    before decoding anything in ``data``.

    Raises:
        InvalidUsage: ``data`` is not bytes-like (bytes, bytearray or memoryview).
        Corruption: not an envelope: bad magic, truncated, or over-long.
        ChecksumMismatch: flipped bits, or a record packed as another kind.
        IncompatibleFormat: packed by a newer envelope version.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidUsage(f"an encoded {kind} is bytes, not {type(data).__name__}")
    if isinstance(data, memoryview) and (data.format != "B" or not data.c_contiguous):
        data = data.tobytes()  # NB: unframe counts elements; a view of other items miscounts
    return unframe(kind, data)


def checksum(value: bytes | bytearray | memoryview) -> int:
    """The checksum of a plain value: ``crc32c(value)``."""
    return int(crc32c.crc32c(value))


def plain(value: bytes | bytearray | memoryview) -> Framed:
    """A plain value as the raw writes take it: no envelope (an empty header)."""
    return Framed(b"", value)


def verify_plain(key: str, data: bytes | bytearray | memoryview, expected: int,
                 size: int | None = None) -> memoryview:
    """Checks a plain value read from ``key`` against the checksum its reference keeps.

    Args:
        expected: ``checksum(value)`` as it was when stored.
        size: the value's length when known (then checked first, and named in the error).

    Raises:
        ChecksumMismatch: the bytes are not the value checksummed: another length, flipped
            bits, a truncated value or another key's (a plain value cannot tell these apart).
    """
    view = memoryview(data)
    if view.format != "B":
        view = view.cast("B")  # an Arrow buffer's view is of signed chars
    if size is not None and len(view) != size:
        raise ChecksumMismatch(key, f"length mismatch: its reference says {size} bytes, found "
                                    f"{len(view)} (truncated, or another value)")
    got = checksum(view)
    if got != expected:
        raise ChecksumMismatch(key, f"checksum mismatch: crc32c {got:#010x}, its reference "
                                    f"says {expected:#010x}")
    return view
