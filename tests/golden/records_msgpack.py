"""The record types of the golden location of msgpack-coded collections
(``msgpack-location``, written by ``make_golden_msgpack`` before msgpack storage became an
explicit opt-in, ``persist.msgpack(T)``)."""

from __future__ import annotations

import struct

import msgspec


class Event(msgspec.Struct, frozen=True):
    """The value of ``events``: stored as msgpack (``tags``, a dict, has no Arrow mapping)."""

    kind: str
    tags: dict[str, int]


class Point(msgspec.Struct, frozen=True):
    """The key of ``points``: maps to an Arrow struct today, but stored as msgpack, as persist
    0.1 stored every class."""

    x: int
    y: int


#: Two NaNs with other payloads (bits): equal records, by DESIGN §4.
NAN_A = struct.unpack("<d", bytes.fromhex("000000000000f87f"))[0]
NAN_B = struct.unpack("<d", bytes.fromhex("010000000000f8ff"))[0]
