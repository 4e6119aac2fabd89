"""Verifying a Parquet part's tail before another engine's reader trusts it.

Persist's own readers verify a Parquet part (part format 4) whole against ``PartMeta.checksum``
before decoding a byte. Another engine's reader (Spark's ``spark.read.parquet``) reads the file
itself and verifies only what Parquet checksums: page bodies. It trusts the file's *tail*
(:class:`persist.indexed.format.stats.Tail`: page index, footer with its row-group and column
statistics and page offsets, footer length, magic) to decide which row groups and pages to
read, so one flipped bit in a column's min or max skips rows silently (seen: 4,839 of 4,987
rows returned, no error, in 2 of 60 single-bit flips over a part).

:func:`verify_tail` checks that tail against the checksum recorded when the part was written,
with one ranged read of the tail (a few KiB: the footer and page index), before the file's
URL is handed out (:mod:`persist.distributed.native`). Verified tails are remembered per
process, so planning the same snapshot again reads nothing.

NB: a check at planning time, not at the reader's: a part's blob is immutable (never
rewritten under its key), so what was verified is what the reader reads, unless the storage
itself changes it between the two, which neither this check nor any other before the read
can see (the page checksums still cover the pages then).
"""

from __future__ import annotations

import threading

import crc32c
import msgspec

from persist.blob.base import BlobRead
from persist.errors import ChecksumMismatch, PartMissing
from persist.indexed.format.meta import PartMeta

#: Verified tails remembered per process (``(url, offset, crc)``); past this many the memory
#: is cleared (a plan then reads the tails again).
MAX_REMEMBERED = 1 << 16

_lock = threading.Lock()
_verified: set[tuple[str, int, int]] = set()


def verify_tail(blob: BlobRead, key: str, part: PartMeta) -> bool:
    """Checks the tail of Parquet part ``part``, stored at ``key`` of ``blob``, against the
    tail checksum its stats recorded.

    Args:
        key: the blob key the part's bytes live at (a fork's reference resolved).

    Returns:
        True: the tail is as written (now, or earlier in this process). False: the part
        records no tail checksum (written before it was recorded, or not a Parquet part):
        nothing another reader would trust of it can be verified, so persist reads it.

    Raises:
        ChecksumMismatch: the tail is not what was written (flipped bits, truncated, grown),
            naming the part.
        PartMissing: the blob is gone (GC removed the part after the plan was made).
        ExternalError: the store failed.
    """
    s = part.stats
    if isinstance(s, msgspec.UnsetType) or s.tail is None or not part.parquet:
        return False
    tail = s.tail
    url = blob.external_url(key) or key
    remembered = (url, tail.offset, tail.crc)
    with _lock:
        if remembered in _verified:
            return True
    got = blob.get_range(key, tail.offset)
    if got is None:
        raise PartMissing(f"part {part.id} ({key!r}) is gone: GC removed it after this read "
                          f"was planned (plan it again)")
    want = part.nbytes - tail.offset
    if len(got) != want:
        raise ChecksumMismatch(key, f"part {part.id}: its tail from byte {tail.offset} is "
                                    f"{len(got)} bytes, its metadata says {want} (the file "
                                    f"was truncated or grew)")
    crc = crc32c.crc32c(got)
    if crc != tail.crc:
        raise ChecksumMismatch(key, f"part {part.id}: its Parquet tail (page index and footer, "
                                    f"bytes {tail.offset}-{part.nbytes}) has crc32c "
                                    f"{crc:#010x}, its metadata says {tail.crc:#010x}")
    with _lock:
        if len(_verified) >= MAX_REMEMBERED:
            _verified.clear()
        _verified.add(remembered)
    return True


def forget() -> None:
    """Forgets every verified tail (a test that damages a file after reading it)."""
    with _lock:
        _verified.clear()


__all__ = ["MAX_REMEMBERED", "forget", "verify_tail"]
