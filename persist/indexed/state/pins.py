"""Pins: how a fork in another location keeps this location's blobs from this location's GC.

A fork across locations of one store (``persist.fork(src_url, name, dst_url)``) references
blobs under the source location's prefix. The source's state does not know (the destination
commits to its own log, without the source's lock), so the source's GC could delete a blob
the fork reads once the source's own collections retire it. A **pin** tells it: a record at
``layout.pin_key(id)`` in the *source* location naming the destination location (its root in
the store) and the source's blob keys the fork reads.

The protocol (DESIGN.md §9, "References and GC"):

1. *Pin, then verify, then commit.* The forker creates the pin (:func:`create`, a fresh key),
   then reloads the source's newest state and checks that every key it pinned is still read
   by a live part there (else it deletes the pin and plans again on the newer state), then
   commits the fork in the destination within the destination writer's commit deadline
   counted from before the pin.
2. *Every GC path of the source checks the pins right before it deletes* (the retired-blob GC
   through :class:`persist.indexed.maintenance.gc.PinGuard`; the leaked-blob sweeps count a
   pinned key as referenced).
3. *A pin is released by the source's GC* once it has seen, twice a release grace apart (at
   least twice the commit bound the pin records, and the source's own grace), that the
   destination's newest state reads none of its keys; and a pin that still protects something
   is never released.

Why a blob is never deleted while a fork reads it: storage is linearizable (S3 and the file
store are). The GC deletes only a blob its own state retired, and a retired blob is never read
by a live part of its state again, except by a restore, which runs with the GC paused. So a
fork whose verification (step 1) found the key live verified it *before* the retirement, its
pin was created before that, and the GC, which lists pins after reading the state that
retired the key, sees the pin. The pin protects the key until the destination has been seen
reading none of its keys for a whole release grace: a fork commit still in flight lands
within its deadline, shorter than that grace, so it is seen by the second look; and once a
destination reads none of a pin's keys it never reads them again (only a new fork could add
them, and its verification would find them retired). The same holds when the source itself
only borrows the key (a fork of a fork): the forker verifies the source still reads it, which
keeps the source's own pin alive.

Why nothing leaks: a pin whose fork never committed (the forker crashed), and one whose
destination let go of every key (compaction, or the destination was deleted), is released by
rule 3, and the blobs it protected are deleted by the next GC round (they stay retired
meanwhile). No clock is compared across machines for safety: durations only, each on one
machine's monotonic clock, as the leaked-blob sweeps do.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from collections.abc import Iterable

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.indexed.state import stored

#: The format of a pin record. 2: ``commit_within_ms`` (a reader of format 1 would not know
#: that a pin asks for a longer release grace than its own, so it must refuse these).
PIN_FORMAT_VERSION = 2


class Pin(msgspec.Struct, frozen=True, kw_only=True):
    """The stored form of a pin (``layout.pin_key(id)``), written once, deleted on release."""

    version: int = PIN_FORMAT_VERSION
    id: str
    #: The destination location: its root in the same store (``BlobRead.locator``).
    location: str
    #: The keys of this location's blobs the destination's fork reads.
    keys: tuple[str, ...]
    #: Who made it and what for (for operators): ``host:pid`` and the fork.
    holder: str
    note: str
    #: Wall-clock milliseconds (the forker's clock) when it was made; informational.
    created_ms: int
    #: The bound, in milliseconds from before the pin was made, within which the forker
    #: commits the fork in the destination or not at all (the destination writer's commit
    #: deadline when it pinned). The source releases the pin only after twice this (and
    #: never sooner than its own grace): a source and a destination with different commit
    #: deadlines must not rely on each other's. None in format-1 pins: the source's own.
    commit_within_ms: int | None = None

    @property
    def commit_within(self) -> float | None:
        """:attr:`commit_within_ms` in seconds."""
        return None if self.commit_within_ms is None else self.commit_within_ms / 1000


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(Pin)


def create(blob: Blob, *, location: str, keys: Iterable[str], commit_within: float,
           note: str = "") -> Pin:
    """Creates a pin in ``blob``'s location for a fork at ``location`` reading ``keys``, whose
    commit lands within ``commit_within`` seconds of a time before this call or never.

    Raises:
        ExternalError: storage failed (the pin may exist: a source GC releases it once it sees
            that nothing reads its keys).
    """
    pin = Pin(id=uuid.uuid4().hex, location=location, keys=tuple(sorted(set(keys))),
              holder=f"{socket.gethostname()}:{os.getpid()}", note=note,
              created_ms=int(time.time() * 1000),
              # NB: rounded up: the source's grace must not come out shorter than the bound
              commit_within_ms=math.ceil(commit_within * 1000))
    if not blob.set_if_absent(layout.pin_key(pin.id), _ENC.encode(pin)):
        raise AssertionError(f"pin {pin.id} exists already")  # a fresh uuid: never
    return pin


def read(blob: BlobRead, key: str) -> Pin | None:
    """The pin stored under ``key``, or None if there is none.

    Raises:
        Corruption: the record does not decode.
        IncompatibleFormat: a newer pin format.
        ExternalError: storage failed.
    """
    return stored.read(blob, key, _DEC, what="pin", newest=PIN_FORMAT_VERSION)


def listing(blob: BlobRead) -> list[Pin]:
    """Every pin of ``blob``'s location (a LIST, then a GET each).

    Raises:
        Corruption, IncompatibleFormat, ExternalError: as :func:`read`.
    """
    out = []
    for key in blob.list_keys(layout.PIN_PREFIX):
        pin = read(blob, key)
        if pin is not None:  # released meanwhile
            out.append(pin)
    return out


def delete(blob: Blob, pin_id: str) -> None:
    """Releases pin ``pin_id`` (idempotent).

    Raises:
        ExternalError: storage failed.
    """
    blob.delete(layout.pin_key(pin_id))


def pinned(blob: BlobRead) -> dict[str, str]:
    """Every key of ``blob``'s location a pin names, each with the location that pins it
    (one of them, if several do).

    Raises:
        Corruption, IncompatibleFormat, ExternalError: as :func:`read`.
    """
    return {k: f"location {p.location}" for p in listing(blob) for k in p.keys}


__all__ = ["PIN_FORMAT_VERSION", "Pin", "create", "delete", "listing", "pinned", "read"]
