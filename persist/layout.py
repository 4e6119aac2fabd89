"""The storage key layout of a location: every key persist stores, named in one place.

Every other module asks this one for keys and prefixes; none spells a path itself::

    meta/log/<seq:020d>        Commit      one per metadata commit; created with set_if_absent (a
                                           log not yet sharded: every persist before format 7)
    meta/log/s<first:020d>/<seq:020d>
                               Commit      the same, once the log is sharded (format 7): entries
                                           in directories of LOG_SHARD seqs, so a listing after
                                           a seq reads only the newest shards
    meta/rollup/<seq:020d>     State       the whole state as of <seq>, written every few commits,
                               or Manifest  its location-level fields and the pieces holding its collections
    meta/piece/<digest>        Piece       the collections of one bucket of a rollup, named by content
    meta/notify                Advert      where a writer with notify=True pushes new seqs
    data/<cid>/<part id>       Arrow IPC   one columnar part (zstd), immutable, unique name
    LOCK                       LockRecord  the writer lock, when it lives beside the data
    LOCK.mutex                 (empty)     file locations of older persists: the flock arbitrating LOCK's CaS
    LOCK.chain/<version:020d>  LockRecord  file locations: one file per state of the lock; the highest is current
    _pending/<key>/<uuid>      any         S3 with conditional_put="dynamodb": values being created
    leases/staging/<id>        LeaseRecord a distributed writer's staging lease (renewed in place)
    leases/revoked/<id>        (marker)    that lease's revocation: final, created with set_if_absent
    pins/<id>                  Pin         blobs of this location a fork in another location references
    holds/requests/<id>        HoldRequest a consumer's request to set, advance, renew or release a
                                           named hold, answered in place by the writer

A part's ``blob_key`` is a key under ``data/``, or a *reference* (:func:`ref_key`,
``ref/<upto>/<root>/<key>``): a fork's part, naming a key of another collection, possibly in
another location of the same store (``root``), whose rows past ``upto`` are hidden.

Invariant: keys under ``data/`` are uniquely named and never rewritten, so any layer may cache
them; nothing else is immutable.

This module sits on the ground floor (it imports nothing of persist), so every layer, the blob
layer included, may use it.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import quote, unquote

#: Every metadata key lies under this prefix.
META_PREFIX = "meta/"
#: The metadata log: one entry per commit, created with set_if_absent.
LOG_PREFIX = "meta/log/"
#: Rollups: the whole state as of a seq.
ROLLUP_PREFIX = "meta/rollup/"
#: Rollup pieces (``persist.indexed.state.pieces``): immutable, named by their content.
PIECE_PREFIX = "meta/piece/"
#: A writer's notifier advert. NB: outside ``meta/log/`` and ``meta/rollup/``, so neither a
#: replay nor a GC of metadata ever sees it.
NOTIFY_KEY = "meta/notify"
#: Columnar parts; immutable and uniquely named, hence cacheable.
DATA_PREFIX = "data/"
#: The writer lock's record, when the lock is kept in the location itself (file, S3).
LOCK_KEY = "LOCK"
#: File locations of older persists: the file whose ``flock`` arbitrated the compare-and-set
#: of ``LOCK`` (now taken only once, to retire that record; see ``persist.lock.file``).
LOCK_MUTEX_NAME = "LOCK.mutex"
#: File locations: the writer lock's record chain, one immutable file per state.
LOCK_CHAIN_PREFIX = "LOCK.chain/"
#: S3 with the DynamoDB-synchronized create: temporary copies of values being created.
PENDING_PREFIX = "_pending/"
#: Part ids of parts staged by another process for a later ``Client.apply(parts=...)`` (the
#: Spark sink) start with this. The commit deadline does not cover them (they may wait minutes
#: for their driver), so the writer's automatic leaked-blob sweep leaves them alone.
STAGED_PART_PREFIX = "staged-"
#: Staging leases (``persist.indexed.state.lease``): one record per lease, renewed in place.
LEASE_PREFIX = "leases/staging/"
#: Revocations of staging leases: created once, never deleted.
REVOKED_PREFIX = "leases/revoked/"
#: Pins: what forks in other locations reference of this location's blobs
#: (``persist.indexed.state.pins``).
PIN_PREFIX = "pins/"
#: Requests of consumers in other processes about named holds (``persist.indexed.state.requests``).
HOLD_REQUEST_PREFIX = "holds/requests/"
#: A part's ``blob_key`` that is a reference to a blob it does not own (see :func:`ref_key`).
REF_PREFIX = "ref/"


#: Log entries per shard of a sharded log (format 7, :func:`log_key`).
LOG_SHARD = 1024
#: What starts the name of a shard of the log: a letter, so every shard sorts after every
#: entry of the unsharded log before it (a seq's key sorts by seq across the switch).
LOG_SHARD_MARK = "s"


def log_key(seq: int, log_from: int | None = None) -> str:
    """Returns the key of metadata log entry ``seq`` of a log sharded from seq ``log_from`` on
    (None: not sharded; ``State.log_from``): ``meta/log/<seq>`` below it, and
    ``meta/log/s<first seq of its shard>/<seq>`` from it on.

    Every key sorts by seq, across the switch too (``s`` sorts after every digit), so a
    listing after an entry's key returns the entries after it in order."""
    if log_from is None or seq < log_from:
        return f"{LOG_PREFIX}{seq:020d}"
    return f"{LOG_PREFIX}{LOG_SHARD_MARK}{seq - seq % LOG_SHARD:020d}/{seq:020d}"


def log_shard_done(key: str) -> str | None:
    """The directory (a prefix ending in ``/``) of the log shard that ``key`` is the last
    entry of, or None: not a sharded log entry, or not its shard's last. A trim deletes a
    shard's entries in order, so deleting this one empties the shard for good (every later
    seq lies in a later shard)."""
    if not key.startswith(LOG_PREFIX + LOG_SHARD_MARK):
        return None
    shard, sep, name = key[len(LOG_PREFIX):].partition("/")
    if not sep or not name.isdigit() or int(name) % LOG_SHARD != LOG_SHARD - 1:
        return None
    return f"{LOG_PREFIX}{shard}/"


def rollup_key(seq: int) -> str:
    """Returns the key of the rollup as of ``seq``."""
    return f"{ROLLUP_PREFIX}{seq:020d}"


def piece_key(digest: str) -> str:
    """Returns the key of the rollup piece whose stored bytes have the hex digest ``digest``."""
    return f"{PIECE_PREFIX}{digest}"


def seq_of(key: str) -> int:
    """Returns the seq of a log or rollup key (the inverse of :func:`log_key`/:func:`rollup_key`).

    Raises:
        ValueError: ``key`` does not end in a seq.
    """
    return int(key.rsplit("/", 1)[1])


def data_prefix(collection_id: int | str) -> str:
    """Returns the prefix under which the parts of collection ``collection_id`` are stored."""
    return f"{DATA_PREFIX}{collection_id}/"


def data_key(collection_id: int | str, part_id: str) -> str:
    """Returns the blob key of part ``part_id`` of collection ``collection_id``."""
    return f"{DATA_PREFIX}{collection_id}/{part_id}"


def _staged_name(key: str) -> str | None:
    """The name that marks a data blob as staged: its part id (``data/<cid>/<part id>``), or,
    for a file a foreign writer staged in a directory (``data/<cid>/<dir>/<file>``, Spark's
    native write: :func:`staged_dir`), the directory's name. None: not a data key."""
    if not key.startswith(DATA_PREFIX):
        return None
    parts = key.split("/", 3)
    return parts[2] if len(parts) >= 3 else None


def is_staged(key: str) -> bool:
    """True if the data blob at ``key`` was staged by another process (see STAGED_PART_PREFIX):
    its part id, or the staging directory it lies in (:func:`staged_dir`), starts with it."""
    name = _staged_name(key)
    return name is not None and name.startswith(STAGED_PART_PREFIX)


def lease_of(key: str) -> str | None:
    """The staging lease a staged data blob was staged under (its part id, or its staging
    directory's name, is ``staged-<lease id>-<uuid>``), or None: not staged, or staged without
    a lease."""
    name = _staged_name(key)
    if name is None or not name.startswith(STAGED_PART_PREFIX):
        return None
    rest = name[len(STAGED_PART_PREFIX):]
    lease, sep, tail = rest.partition("-")
    return lease if sep and len(lease) == 32 and len(tail) == 32 else None


def staged_dir(collection_id: int | str, lease_id: str) -> str:
    """A fresh directory (a key prefix ending in ``/``) for a foreign writer (Spark's own
    Parquet writer) to stage part files of collection ``collection_id`` in, under staging
    lease ``lease_id``: ``data/<cid>/staged-<lease id>-<uuid>/``. Every key below it is a
    staged data blob of that lease (:func:`lease_of`), whatever the writer names its files
    (its temporary files included), so the sweeps leave them alone while the lease lives and
    reclaim whatever no commit references once it is revoked."""
    return f"{data_prefix(collection_id)}{staged_part_id(lease_id)}/"


#: Ids ``random_id`` draws from one ``os.urandom`` call.
_IDS_PER_DRAW = 256
_ids: list[str] = []
# NB: a forked child must never hand out its parent's remaining ids
os.register_at_fork(after_in_child=_ids.clear)


def random_id() -> str:
    """32 random lowercase hex digits (128 bits from ``os.urandom``), as ``uuid4().hex`` gives
    but without its version bits: a part's id.

    NB: drawn 256 at a time. ``os.urandom`` releases the GIL, and on the commit path of a
    caller running its own write (``Runtime._help``) that short release was where the runtime
    thread, woken by the write's put, took the GIL: the caller then waited for it back, an OS
    thread wake (~60-90 µs here), for a 0.5 µs call. Safe across threads (``list.pop`` is
    atomic; two threads refilling at once just draw twice) and forks (the child's pool is
    emptied)."""
    try:
        return _ids.pop()
    except IndexError:
        pass
    raw = os.urandom(16 * _IDS_PER_DRAW).hex()
    drawn = [raw[i:i + 32] for i in range(0, len(raw), 32)]
    _ids.extend(drawn[1:])
    return drawn[0]


def staged_part_id(lease_id: str) -> str:
    """A fresh id for a part staged under staging lease ``lease_id``:
    ``staged-<lease id>-<uuid>`` (what :func:`lease_of` reads back from its key)."""
    return f"{STAGED_PART_PREFIX}{lease_id}-{uuid.uuid4().hex}"


def lease_key(lease_id: str) -> str:
    """Returns the key of staging lease ``lease_id``'s record."""
    return f"{LEASE_PREFIX}{lease_id}"


def revoked_key(lease_id: str) -> str:
    """Returns the key of staging lease ``lease_id``'s revocation marker."""
    return f"{REVOKED_PREFIX}{lease_id}"


def pin_key(pin_id: str) -> str:
    """Returns the key of pin ``pin_id``'s record."""
    return f"{PIN_PREFIX}{pin_id}"


def hold_request_key(request_id: str) -> str:
    """Returns the key of hold request ``request_id`` (and of its answer, written in place)."""
    return f"{HOLD_REQUEST_PREFIX}{request_id}"


def ref_key(key: str, *, root: str | None = None, upto: int | None = None) -> str:
    """The ``blob_key`` of a part that references blob ``key`` (a ``data/`` key) of another
    collection: in the location whose root in the same store is ``root`` (None: this one),
    its rows with a time past ``upto`` hidden (None: none). Without either it is ``key``.

    ``ref/<upto or ->/<root, percent-quoted, or ->/<key>``: unambiguous whatever ``root``
    holds, and never a ``data/`` key, so no sweep mistakes it for a stored blob.
    """
    if root is None and upto is None:
        return key
    return (f"{REF_PREFIX}{'-' if upto is None else upto}/"
            f"{'-' if root is None else quote(root, safe='')}/{key}")


def parse_ref(blob_key: str) -> tuple[str | None, str, int | None]:
    """The ``(root, key, upto)`` a part's ``blob_key`` names (the inverse of :func:`ref_key`;
    a plain key is ``(None, key, None)``).

    Raises:
        ValueError: a malformed reference.
    """
    if not blob_key.startswith(REF_PREFIX):
        return None, blob_key, None
    upto, root, key = blob_key[len(REF_PREFIX):].split("/", 2)
    if not key.startswith(DATA_PREFIX):
        raise ValueError(f"a reference names a key outside {DATA_PREFIX!r}: {blob_key!r}")
    return (None if root == "-" else unquote(root), key, None if upto == "-" else int(upto))


def owner_of(key: str) -> str | None:
    """The collection id (as spelled in the key) that ``data/<cid>/...`` belongs to."""
    if not key.startswith(DATA_PREFIX):
        return None
    return key[len(DATA_PREFIX):].split("/", 1)[0]


def is_immutable(key: str) -> bool:
    """True if the value at ``key`` is never rewritten once created (safe to cache)."""
    return key.startswith(DATA_PREFIX)


def lock_chain_key(version: int) -> str:
    """Returns the key of state ``version`` of a file location's writer lock."""
    return f"{LOCK_CHAIN_PREFIX}{version:020d}"


def pending_key(key: str, token: str) -> str:
    """Returns the temporary key that a DynamoDB-synchronized create of ``key`` writes first."""
    return f"{PENDING_PREFIX}{key}/{token}"


__all__ = [
    "DATA_PREFIX",
    "HOLD_REQUEST_PREFIX",
    "LEASE_PREFIX",
    "LOCK_CHAIN_PREFIX",
    "LOCK_KEY",
    "LOCK_MUTEX_NAME",
    "LOG_PREFIX",
    "LOG_SHARD",
    "LOG_SHARD_MARK",
    "META_PREFIX",
    "NOTIFY_KEY",
    "PENDING_PREFIX",
    "PIECE_PREFIX",
    "PIN_PREFIX",
    "REF_PREFIX",
    "REVOKED_PREFIX",
    "ROLLUP_PREFIX",
    "STAGED_PART_PREFIX",
    "data_key",
    "data_prefix",
    "hold_request_key",
    "is_immutable",
    "is_staged",
    "lease_key",
    "lease_of",
    "lock_chain_key",
    "log_key",
    "log_shard_done",
    "owner_of",
    "parse_ref",
    "pending_key",
    "piece_key",
    "pin_key",
    "ref_key",
    "revoked_key",
    "rollup_key",
    "seq_of",
    "staged_dir",
    "staged_part_id",
]
