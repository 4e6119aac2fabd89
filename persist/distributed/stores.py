"""A process's handles on the locations its distributed reads and writes touch: one blob store
per location and storage options, kept for the life of the process (workers are reused across
tasks, and an S3 client is expensive to build), and the metadata state loaded from it."""

from __future__ import annotations

import functools
from typing import Any

from persist.blob.base import Blob, BlobRead
from persist.errors import MissingResource
from persist.indexed.format.meta import State
from persist.indexed.read.scan import Address
from persist.indexed.state.machine import Machine
from persist.location import resolve


@functools.lru_cache(maxsize=16)
def _read_half(url: str, storage: tuple[tuple[str, Any], ...]) -> BlobRead:
    # NB: only the read half: a reading task cannot write.
    return resolve(url, storage_options=dict(storage)).read_half()


@functools.lru_cache(maxsize=16)
def _writable(url: str, storage: tuple[tuple[str, Any], ...]) -> Blob:
    return resolve(url, storage_options=dict(storage)).blob


def read_half(address: Address) -> BlobRead:
    """The read-only blob store of ``address`` (one per process)."""
    return _read_half(address.url, address.storage)


def writable(address: Address) -> Blob:
    """The blob store of ``address``, writable (one per process): for staging parts and
    leases, never for metadata."""
    return _writable(address.url, address.storage)


def load_state(address: Address, *, must_exist: bool, name: str = "",
               machine: Machine | None = None) -> State:
    """The newest metadata state of ``address`` (loaded by ``machine``, a reader of
    ``address`` that later refreshes the state, if given).

    Raises:
        MissingResource: ``must_exist`` and nothing was ever committed there (a mistyped URL);
            the message names collection ``name`` if given.
        ExternalError, Corruption: storage failed.
    """
    state = (machine if machine is not None else Machine(read_half(address))).load()
    if must_exist and state.seq == 0:
        raise MissingResource(
            f"no persist location at {address.url!r}: nothing was ever committed there (a "
            f"mistyped URL?)" + (f", so it has no collection {name!r}" if name else ""))
    return state


__all__ = ["load_state", "read_half", "writable"]
