"""``envelope.pack``/``unpack``: records that travel between processes are verified before
anything in them is decoded; every damage is a typed error, never other bytes."""

from __future__ import annotations

import pytest

from persist.blob.envelope import HEADER_LEN, pack, unpack
from persist.errors import ChecksumMismatch, Corruption, IncompatibleFormat, InvalidUsage

PAYLOAD = bytes(range(256)) * 3


def test_round_trip_of_every_bytes_like() -> None:
    packed = pack("persist.Test", PAYLOAD)
    assert isinstance(packed, bytes)
    assert len(packed) == HEADER_LEN + len(PAYLOAD)
    for data in (packed, bytearray(packed), memoryview(packed)):
        assert bytes(unpack("persist.Test", data)) == PAYLOAD
    assert bytes(unpack("persist.Test", pack("persist.Test", b""))) == b""


def test_every_single_bit_flip_and_truncation_is_refused() -> None:
    packed = pack("persist.Test", PAYLOAD)
    for i in range(len(packed)):
        for bit in range(8):
            damaged = bytearray(packed)
            damaged[i] ^= 1 << bit
            with pytest.raises((Corruption, IncompatibleFormat)):
                unpack("persist.Test", bytes(damaged))
    for n in range(len(packed)):
        with pytest.raises(Corruption):
            unpack("persist.Test", packed[:n])
    with pytest.raises(Corruption, match="length mismatch"):
        unpack("persist.Test", packed + b"\0")


def test_another_kind_or_no_bytes_is_refused() -> None:
    packed = pack("persist.Test", PAYLOAD)
    with pytest.raises(ChecksumMismatch):
        unpack("persist.Other", packed)
    for bad in ("text", None, 42, [1, 2]):
        with pytest.raises(InvalidUsage, match="is bytes, not"):
            unpack("persist.Test", bad)
