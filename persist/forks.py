"""``persist.fork``: forking a collection into another location of the same blob store.

The fork's parts reference the source location's blobs (by that location's root in the store,
:func:`persist.layout.ref_key`), so it costs one metadata commit in the destination and no data.
The source's GC learns of it through pins (:mod:`persist.indexed.state.pins`): the forker pins
the blobs in every location they live in, verifies they are still read there, then commits the
fork within the destination writer's commit deadline. A fork in the same location is
``Client.fork``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from persist import crashpoints
from persist.blob.base import Blob
from persist.errors import Determinate, InvalidUsage, PersistError
from persist.indexed.format.meta import CollectionMeta, State
from persist.indexed.state import pins, refs
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection
from persist.location import open as open_location
from persist.location import resolve
from persist.runtime.client import Client

log = logging.getLogger("persist.fork")

#: How many times a fork plans again when the source's compaction retired a blob it pinned
#: between its plan and its verification.
ATTEMPTS = 5


def fork(src_url: str | os.PathLike[str], name: str, dst_url: str | os.PathLike[str], *,
         into: str | None = None, as_of: int | None = None, client: Client | None = None,
         storage_options: dict[str, Any] | None = None, lock_timeout: float = 0.0) -> int:
    """Forks collection ``name`` of the location at ``src_url`` as of ``as_of`` (default: its
    latest sealed time) into a new writable collection ``into`` (default: ``name``) of the
    location at ``dst_url``, on the same blob store (two directories of one machine, two
    prefixes of one bucket and endpoint), copying no data. See ``Client.fork`` for what a fork
    is; the source keeps every blob the fork reads until the fork no longer reads it.

    Args:
        client: an open writer of ``dst_url`` to commit through (its own lock); None opens
            the destination for this fork (waiting up to ``lock_timeout`` for its lock).
        storage_options: for both locations (one store: one set of credentials).

    Returns:
        The seq of the destination's commit that registered the fork.

    Raises:
        InvalidUsage: the locations are not on one store, ``into`` exists, ``as_of`` is not
            in ``[since, upper)``.
        UnknownCollection: the source has no collection ``name``.
        LockHeld: (no ``client``) the destination's lock is held.
        Determinate: the source's compaction kept retiring what the fork pinned.
        ExternalError: storage failed.
    """
    into = name if into is None else into
    src = resolve(src_url, storage_options=storage_options)
    here = src.blob.locator()
    with _destination(dst_url, client, storage_options, lock_timeout) as dst:
        there = resolve(dst.address.url, storage_options=dst.address.storage_options)
        dst_loc = there.blob.locator()
        if here is None or dst_loc is None or here[0] != dst_loc[0]:
            raise InvalidUsage(f"cannot fork from {os.fspath(src_url)!r} into "
                               f"{os.fspath(dst_url)!r}: a fork references the source's blobs, "
                               f"so both locations must be on one store (got {here} and "
                               f"{dst_loc})")
        if here[1] == dst_loc[1]:
            seq: int = dst.fork(name, into=into, as_of=as_of).result()
            return seq
        for attempt in range(ATTEMPTS):
            prepared = prepare(src.blob, here[1], dst_loc[1], name, into=into, as_of=as_of,
                               commit_within=dst.options.commit_deadline_seconds)
            if prepared is None:
                log.info("fork of %r: the source retired a blob it pinned; planning again "
                         "(attempt %d)", name, attempt + 1)
                # NB: a short random pause, growing: a source compacting in bursts (after each
                # of its writes) lets a plan through between them, not in lockstep with them
                time.sleep(random.uniform(0.0, 0.02 * 2 ** attempt))
                continue
            try:
                seq = dst.register_fork(prepared.planned, into=into,
                                        pinned_at=prepared.started,
                                        within=prepared.commit_within).result()
            except (InvalidUsage, Determinate):
                prepared.unpin()  # definitely not committed: nothing reads what they pin
                raise
            crashpoints.hit("fork.committed")
            return seq
    raise Determinate(f"fork of {name!r}: the source's compaction retired what the fork "
                      f"pinned {ATTEMPTS} times in a row; try again")


@dataclass
class Prepared:
    """A fork of another location's collection, planned and pinned, to commit in its
    destination within the commit deadline of :attr:`started`."""

    planned: CollectionMeta
    pins: list[tuple[Blob, pins.Pin]]
    #: ``time.monotonic()`` before the pins were made.
    started: float
    #: Seconds from :attr:`started` within which to commit or not at all (the pins say so).
    commit_within: float

    def unpin(self) -> None:
        """Releases the pins (the fork will not be committed)."""
        _unpin(self.pins)


def prepare(src: Blob, src_root: str, dst_root: str, name: str, *, into: str,
            as_of: int | None, commit_within: float) -> Prepared | None:
    """Steps 1 of the pin protocol (:mod:`persist.indexed.state.pins`): plans the fork of
    ``name`` of the location ``src`` (at root ``src_root``) into the location at
    ``dst_root`` on the source's newest state, pins what it reads, and verifies on a newer
    state that the source still reads all of it. None if it does not (the pins are deleted
    again: plan again). The pins promise a commit within ``commit_within`` seconds of now
    (the destination writer's commit deadline; ``Client.register_fork(within=...)`` keeps the
    promise).

    Raises:
        UnknownCollection, InvalidUsage: no such collection; ``as_of`` not readable.
        ExternalError: storage failed (pins made are deleted again, as far as storage lets).
    """
    started = time.monotonic()
    # NB: scan: LIST the log instead of probing it. A probe trusts a missing entry to mean
    # the end of the log for half of *its own* grace; a source writer with a shorter one may
    # have trimmed it meanwhile, and the fork would plan on a state with nothing in it.
    state = Machine(src.read_only()).load(scan=True)
    planned = refs.forked(collection(state.collections, name), name=into, cid=0, as_of=as_of,
                          src_seq=state.seq, root=src_root, location=src_root)
    made = _pin(src, src_root, dst_root, planned, f"fork of {name!r} into {into!r}",
                commit_within)
    crashpoints.hit("fork.pinned")
    try:
        fresh = Machine(src.read_only()).load(scan=True)
    except BaseException:
        _unpin(made)
        raise
    if not _still_read(fresh, src_root, planned):
        _unpin(made)
        return None
    return Prepared(planned, made, started, commit_within)


@contextlib.contextmanager
def _destination(url: str | os.PathLike[str], client: Client | None,
                 storage_options: dict[str, Any] | None, lock_timeout: float
                 ) -> Iterator[Client]:
    if client is not None:
        if client.read_only:
            raise InvalidUsage("persist.fork commits through a writer; the client is read-only")
        yield client
        return
    with open_location(url, storage_options=storage_options, lock_timeout=lock_timeout) as c:
        yield c


def _pin(src: Blob, src_root: str, dst_root: str, planned: CollectionMeta,
         note: str, commit_within: float) -> list[tuple[Blob, pins.Pin]]:
    """Pins what ``planned`` reads in every location it reads from (the source's, and those
    the source itself borrows from)."""
    made: list[tuple[Blob, pins.Pin]] = []
    try:
        for root, keys in sorted(refs.foreign([planned]).items()):
            store = src if root == src_root else src.sibling(root)
            made.append((store, pins.create(store, location=dst_root, keys=keys,
                                                  commit_within=commit_within, note=note)))
    except BaseException:
        _unpin(made)
        raise
    return made


def _still_read(state: State, src_root: str, planned: CollectionMeta) -> bool:
    """Whether the source (newest ``state``) still reads every blob ``planned`` references:
    its own live parts for its blobs, its own references for blobs it borrows."""
    live = refs.referenced(state.collections.values())
    borrowed = refs.foreign(state.collections.values())
    # NB: the source may read its own blobs through a reference too (a fork that came back
    # from a location that forked it): a pin keeps those, as it keeps any other's.
    return all(keys <= (live | borrowed.get(root, set()) if root == src_root
                        else borrowed.get(root, set()))
               for root, keys in refs.foreign([planned]).items())


def _unpin(made: list[tuple[Blob, pins.Pin]]) -> None:
    for store, pin in made:
        try:
            pins.delete(store, pin.id)
        except PersistError as e:  # the source's GC releases it once it sees it unread
            log.info("could not delete pin %s: %s", pin.id, e)


__all__ = ["ATTEMPTS", "Prepared", "fork", "prepare"]
