"""Reading the small records a location keeps beside its metadata log (staging leases, pins,
hold requests): each a msgpack record with a ``version``, refused when newer than this persist
reads."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from persist.blob.base import BlobRead
from persist.errors import Corruption, IncompatibleFormat

T = TypeVar("T")


def read(blob: BlobRead, key: str, decoder: msgspec.msgpack.Decoder[T], *, what: str,
         newest: int) -> T | None:
    """The record of ``decoder``'s type stored under ``key``, or None if there is none.

    Raises:
        Corruption: the record does not decode.
        IncompatibleFormat: its ``version`` is newer than ``newest``.
        ExternalError: storage failed.
    """
    data = blob.get(key)
    if data is None:
        return None
    try:
        rec = decoder.decode(data)
    except msgspec.DecodeError as e:
        raise Corruption(key, f"undecodable {what}: {e}") from e
    version: Any = getattr(rec, "version", 0)
    if version > newest:
        raise IncompatibleFormat(f"{key!r} has {what} format version {version}; this "
                                 f"persist reads up to {newest}")
    return rec


__all__ = ["read"]
