"""What goes to storage as metadata: frozen, typed, versioned msgspec records.

Where each record is stored is :mod:`persist.layout`'s business (every value framed by
:mod:`persist.blob.envelope`): a :class:`Commit` per ``meta/log/<seq>``, a :class:`State` per
``meta/rollup/<seq>``, columnar parts under ``data/``.

The state of a location at sequence number ``n`` is the latest rollup at ``r <= n`` with the
commits ``r+1..n`` applied in order. A commit is tiny (only what changed), so commit cost does
not grow with history or with the number of collections; rollups bound the replay.

Format versions: every record carries ``version``. A reader refuses a version newer than
``FORMAT_VERSION`` with :class:`IncompatibleFormat` and keeps reading every older one;
``tests/golden/`` pins the bytes of versions 1 and 2.

Version 2 is records (:mod:`persist.indexed.format.records`): a collection whose key or value type is
not one of version 1's ten types, or a ``msgspec.Struct`` stored as an Arrow struct. A record
is written as version 2 exactly when it carries such a collection (:func:`required_version`): a
commit with a ``Register`` of one, a rollup holding one. Everything else stays version 1 byte
for byte, so a location without records stays readable by a persist that predates them, and
one with records is refused by it at the record that introduces them (every later record of
that collection is only reachable through it).

Optional fields: a field added to a stored record as ``X | msgspec.UnsetType = UNSET`` is
omitted from the bytes while unset, so every record that does not use it keeps its exact
bytes, and an older reader decodes a record that does use it by ignoring the unknown field. That
is right only for fields whose absence an older reader may assume: ``PartMeta.stats`` (a reader
that ignores them reads every part, which filtering never needs) and ``PartMeta.full`` (a
compaction that ignores it may tier the part again, which only costs), and a collection's
seal history (``CollectionMeta.history``/``unsealed``, ``PartMeta.inserted``/``retracted``:
informational, derived by replay), and a rollup's :attr:`State.trim` (the metadata trim's
progress: an older writer trims by listing as before, and the rollups it writes drop the
field, which a newer writer then recovers with one listing). None of them bumps the format
version. Nor does
``PartStats.tail`` (:class:`persist.indexed.format.stats.Tail`), a Parquet part's checksum of
its page index and footer: ``PartMeta`` has no 16th field to give (see its NB), so it is nested
in the part's stats, omitted while None (so every part without one keeps its bytes, and a part
written with a stats budget of 0 gets stats holding only it); an older persist ignores it
(and hands part files to another engine unverified, as it always did), and this one hands
another engine only files whose tail it verified (:mod:`persist.indexed.read.tail`);
``tests/golden/tail-commit.bin`` pins it. ``PartStats.groups``
(:class:`persist.indexed.format.stats.Groups`, a Parquet part's row groups' byte ranges and
checksums, what a ranged read of some row groups verifies) is nested the same way for the same
reasons; an older persist ignores it and reads such a part whole; ``tests/golden/
groups-commit.bin`` pins it.

Version 3 is schema evolution (:mod:`persist.indexed.format.evolve`): an :class:`EvolveSchema` op
registers a new schema version of a collection, whose :class:`CollectionMeta` then keeps its
history (``schemas``) and whose parts record the version they were written with
(``PartMeta.schema_id``). A persist that predates it would read such a collection's parts with
one schema and misread them, so a commit carrying ``EvolveSchema`` and a rollup holding an
evolved collection are version 3 (refused by older readers); every other record keeps its
version-1 or version-2 bytes (the new fields are ``UNSET`` until an evolution sets them).

Version 4 is Parquet parts (:mod:`persist.indexed.format.parquet`): a blob part stored as a plain
Parquet file (part format 4), its crc32c kept in ``PartMeta.checksum`` since the file carries no
envelope (a checksum is what marks a part as one). A persist that predates it would read such a blob as an enveloped Arrow
stream and fail on every read of it, or (a replica) read a state it cannot serve, so a commit
that adds a version-4 part (``AddPart``, ``ReplaceParts``) and a rollup holding one are version
4, refused by an older persist with ``IncompatibleFormat`` before it reads anything else of
them. Every other record keeps its bytes (the new fields are ``UNSET`` on older parts and on
inline parts, which stay Arrow IPC streams).

Version 5 is references (:mod:`persist.indexed.state.refs`): a fork's parts reference blobs
that another collection wrote, in this location or in another one of the same store, and may
hide the rows past the time the fork was made at (``PartMeta.blob_key`` is then a reference,
:func:`persist.layout.ref_key`). A persist that predates it would show the hidden rows, and its
GC would delete a blob that another collection still references, so a commit that registers
such a collection or restores a state (:class:`Restore`) and a rollup holding a collection
that references a blob it does not own are version 5. Named holds (``CollectionMeta.terms``,
``SetHold.kind``/``lease_ms``/``lapse``) and ``CollectionMeta.lineage`` need no version: an
older persist ignores them and computes the same effective since (a lapsed hold is not in
``holds``), it only lacks their names, leases and lapses.

Version 6 is incremental rollups (:mod:`persist.indexed.state.pieces`, DESIGN.md §9): a rollup
of a location with many collections is a :class:`Manifest` (the location-level fields of the
state and the list of its pieces, :class:`PieceRef`) stored at ``meta/rollup/<seq>``, its
collections in immutable :class:`Piece` records at ``meta/piece/<digest>`` (named by their
content), so a rollup rewrites only the pieces whose collections changed. A persist that
predates it reads the manifest's version first and refuses it with ``IncompatibleFormat``: it
never reads a manifest as a state with no collections. A location of few collections (one
piece's worth) keeps writing whole :class:`State` rollups, byte for byte as before, until it
first writes a manifest. A manifest and a piece are version 6 or, if a collection they hold
needs more, that version; a whole :class:`State` rollup is never version 6, which is how a
reader tells the two apart (:func:`is_manifest`); from version 7 on (a sharded log's), a
manifest is told apart by its ``buckets`` field, which a whole state never has.

Version 7 is the sharded log (:func:`persist.layout.log_key`): the entries from seq
``log_from`` on are stored in directories of ``LOG_SHARD`` seqs
(``meta/log/s<first>/<seq>``), so a writer's open lists only the newest shards after its
rollup instead of every name of one directory (a file store reads every name of a directory
it lists: 100,120 entries kept for one grace period were 146 ms of a 231 ms open). The first
commit a writer of this persist makes on a log that is not sharded (its fence) is the switch:
it is stored at its flat key, where an older writer's commit of the same seq would be
arbitrated against it, carries ``Commit.log_from = seq + 1`` and is version 7; every later
entry is sharded, and every state from it on has :attr:`State.log_from`, so a rollup holding it
(whole, or a manifest) is version 7 too. A persist that predates it reaches one of them
first whichever way it reads (the newest rollup, or the flat log after an older rollup up to
the switch), and refuses it with ``IncompatibleFormat``: it never probes the flat keys past
the switch as an end of log, nor commits there. Every other record keeps its bytes
(``log_from`` is ``UNSET`` until the switch).

Version 8 is marks (compaction's marks step, DESIGN.md §8): a *marked* base part references
the blob of the base part it replaced plus a marks blob naming the blob rows it hides
(:class:`persist.indexed.format.stats.Marks`, nested in ``PartStats.marks`` since ``PartMeta``
has no 16th field to give). msgspec ignores an unknown field, so a persist that predates it
would read the hidden rows as live: a commit that adds a marked part and a rollup (whole, a
manifest's piece) holding one are version 8, refused by an older persist with
``IncompatibleFormat``. Every other record keeps its bytes (``marks`` is omitted while None).

Version 9 is compressed inline parts (:func:`persist.indexed.format.columnar.pack_inline`): an
inline part's Arrow IPC stream stored as one LZ4 block in a frame that starts with
``columnar.INLINE_MAGIC`` where that saves at least an eighth of its bytes (inline parts are
most of a log entry's and a rollup's bytes: a 100-row append of four int64 columns went from
3,784 bytes to 1,657). A persist that predates it would fail to decode such a part on every
read, so a commit that adds one and a rollup (whole, a manifest's piece) holding one are
version 9, refused by an older persist with ``IncompatibleFormat``. A part that does not
compress keeps its plain stream, and every record without a compressed part its bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeAlias

import msgspec

from persist import layout
from persist.errors import Corruption, IncompatibleFormat, InvalidUsage
from persist.indexed.format import columnar, records
from persist.indexed.format.stats import Marks, PartStats, marks_of

#: The newest metadata format this persist reads (and writes for records referencing Parquet
#: parts, forks and restores).
FORMAT_VERSION = 9
#: The format of metadata records that carry no version-2 or version-3 feature.
BASE_FORMAT_VERSION = 1
#: The format of records carrying a collection of records (version-2 types).
RECORDS_FORMAT_VERSION = 2
#: The format of records carrying a schema evolution or an evolved collection.
EVOLUTION_FORMAT_VERSION = 3
#: The format of records referencing a Parquet part (part format 4).
PARQUET_FORMAT_VERSION = 4
#: The format of records carrying a reference to a blob another collection owns (a fork), or a
#: restore of an earlier state.
REFS_FORMAT_VERSION = 5
#: The format of a rollup's manifest and its pieces (incremental rollups); every record of
#: this version stored at a rollup key is a :class:`Manifest` (from version 7 on, one with a
#: ``buckets`` field).
MANIFEST_FORMAT_VERSION = 6
#: The format of the commit that shards the log and of every rollup of a sharded log.
SHARDED_LOG_FORMAT_VERSION = 7
#: The format of records adding or holding a marked part (compaction's marks step).
MARKS_FORMAT_VERSION = 8
#: The format of records adding or holding a compressed inline part
#: (:func:`persist.indexed.format.columnar.pack_inline`).
PACKED_FORMAT_VERSION = 9


class PartMeta(msgspec.Struct, frozen=True, kw_only=True):
    """One immutable columnar part of a collection: stored in a blob or inline in the log.

    Invariant: exactly one of ``blob_key`` and ``inline`` is set.
    Invariant: every row has ``min_time <= time <= max_time``.
    """

    id: str
    rows: int
    nbytes: int
    min_time: int
    max_time: int
    #: Sorted by (key, value, time) with no two rows sharing all three (compaction output).
    consolidated: bool = False
    blob_key: str | None = None
    inline: bytes | None = None
    #: The schema version (``SchemaVersion.id``) of the collection the part was written with;
    #: UNSET is version 0 (every part before the collection's first evolution).
    schema_id: int | msgspec.UnsetType = msgspec.UNSET
    #: Per-field null counts and bounds, overall and per record batch, within a byte budget
    #: (:mod:`persist.indexed.format.stats`); what a filtered read prunes by. UNSET: none (inline
    #: parts, parts written before stats). An older persist ignores the field.
    stats: PartStats | msgspec.UnsetType = msgspec.UNSET
    #: A run that reached its size target (a tier merge's output cut at
    #: ``CompactionPolicy.part_target_bytes``, a piece of a big append): it is not tiered with
    #: other runs again, only merged into the collection's base (an older persist never merged
    #: it again). An older persist ignores the field (and may merge it, which is only a cost).
    full: bool | msgspec.UnsetType = msgspec.UNSET
    #: The sums of the part's positive diffs and of its negative diffs' magnitudes (what a
    #: seal's history entry reports as inserted and retracted). UNSET: not counted (a part
    #: written by an older persist). An older persist ignores them.
    inserted: int | msgspec.UnsetType = msgspec.UNSET
    retracted: int | msgspec.UnsetType = msgspec.UNSET
    #: Set on a Parquet part (part format 4, :mod:`persist.indexed.format.parquet`): the crc32c
    #: of the whole blob, a plain file the store keeps no checksum of, verified before the blob
    #: is decoded; a record referencing such a part is metadata format version 4. UNSET: the
    #: blob is an Arrow IPC stream in an envelope (part formats 1-2, tagged inside), as an
    #: inline part always is.
    checksum: int | msgspec.UnsetType = msgspec.UNSET
    #: The rows are sorted by ``(key, value, time)`` in consolidation's order (every part
    #: format 4 writes; ``consolidated`` parts are sorted too). UNSET: no order is known.
    sorted: bool | msgspec.UnsetType = msgspec.UNSET
    # NB: at most 15 fields. msgspec writes the map header of a struct with more fields as a
    # map16 (3 bytes) whatever is omitted, which would change the stored bytes of every part
    # ever written (and the golden files). A 16th field goes into a nested struct.

    @property
    def ordered(self) -> bool:
        """Whether the rows are known to be sorted by ``(key, value, time)``."""
        return self.consolidated or self.sorted is True

    @property
    def parquet(self) -> bool:
        """Whether the part is a Parquet file (part format 4): it has a checksum."""
        return self.checksum is not msgspec.UNSET

    @property
    def marks(self) -> Marks | None:
        """The blob rows the part hides (a marked base part, format 8; None: none)."""
        return marks_of(self.stats)

    @property
    def packed(self) -> bool:
        """Whether the part is inline and compressed (format 9,
        :func:`persist.indexed.format.columnar.pack_inline`)."""
        return self.inline is not None and columnar.is_packed(self.inline)


class OfPart:
    """What a record that wraps one part (``part: PartMeta``) tells of it without reaching in:
    a staged part, a part handle."""

    __slots__ = ()
    part: PartMeta

    @property
    def id(self) -> str:
        """The part's id (unique within the location)."""
        return self.part.id

    @property
    def rows(self) -> int:
        """Rows stored in the part."""
        return self.part.rows

    @property
    def nbytes(self) -> int:
        """The part's encoded size in bytes."""
        return self.part.nbytes

    @property
    def min_time(self) -> int:
        """The part's smallest time."""
        return self.part.min_time

    @property
    def max_time(self) -> int:
        """The part's largest time."""
        return self.part.max_time


class HistoryEntry(msgspec.Struct, frozen=True, array_like=True):
    """One seal of a collection, for its history (``DESCRIBE HISTORY``, ``timestampAsOf``):
    the commit ``seq`` at wall-clock ``wall_ms`` (the writer's clock) advanced upper to
    ``upper``; since the previous seal, ``updates`` rows were added, with ``inserted`` and
    ``retracted`` the sums of their positive and negative diffs (None: a part added without
    those counts, by an older persist or sink)."""

    upper: int
    wall_ms: int
    seq: int
    updates: int
    inserted: int | None
    retracted: int | None


class SchemaVersion(msgspec.Struct, frozen=True, kw_only=True):
    """One registered schema of a collection: its key and value types (as in
    :class:`CollectionMeta`) under the version number ``id``."""

    id: int
    key_type: bytes
    value_type: bytes
    key_codec: str | None = None
    value_codec: str | None = None


class HoldTerms(msgspec.Struct, frozen=True, kw_only=True):
    """What a *named* hold is, beside its frontier in ``CollectionMeta.holds``
    (:mod:`persist.indexed.state.holds`).

    A ``"tag"`` pins one time for as long as it exists. A ``"hold"`` is a consumer's: it has a
    lease (``lease_ms``; 0 for none), and once the writer finds it not renewed for that long it
    commits its lapse: the hold leaves ``holds`` (it no longer holds compaction back) and stays
    here, ``lapsed_at`` its last frontier, until it is released, so its consumer's next advance
    fails saying so.
    """

    kind: str
    lease_ms: int = 0
    #: The wall-clock time (ms) of the commit that last set or renewed it: the clock of the
    #: writer that committed it, the only clock a lapse is judged by.
    renewed_ms: int = 0
    #: The frontier it held when the writer committed its lapse (None: live).
    lapsed_at: int | None = None


class Lineage(msgspec.Struct, frozen=True, kw_only=True):
    """Where a collection came from: a fork (``source`` and the rest set) and the last restore
    that rewound it. Informational, except ``restored``, by which listeners notice an undo."""

    #: The collection it was forked from, and the location (None: this one; else the source
    #: location's root in the same store, as :meth:`persist.blob.base.BlobRead.locator` spells
    #: it), the time and the source's seq it was forked as of.
    source: str | None = None
    location: str | None = None
    as_of: int | None = None
    seq: int | None = None
    #: The seq of the restore that last put this collection back to an earlier state (its
    #: frontiers may have moved backwards then).
    restored: int | None = None


class CollectionMeta(msgspec.Struct, frozen=True, kw_only=True):
    """A registered collection and its frontiers.

    Invariant: ``since <= upper``; both only ever advance.
    Invariant: ``holds`` are read holds (id -> frontier) that keep compaction from forwarding
    times past them; the effective since is ``min(since, *holds.values())``.
    """

    id: int
    name: str
    #: Arrow types serialized as a one-field Arrow schema (IPC bytes).
    key_type: bytes
    value_type: bytes
    #: For Python-object columns stored as msgpack in a binary column: the type's dotted name.
    key_codec: str | None = None
    value_codec: str | None = None
    since: int = 0
    upper: int = 0
    parts: tuple[PartMeta, ...] = ()
    holds: dict[str, int] = msgspec.field(default_factory=dict)
    #: Every schema version registered, oldest first (``schemas[i].id == i``), the last one
    #: equal to ``key_type``/``value_type`` and their codecs. UNSET until the first evolution:
    #: the collection then has one version, 0, its registered types.
    schemas: tuple[SchemaVersion, ...] | msgspec.UnsetType = msgspec.UNSET
    #: The most recent seals, oldest first (at most ``state.HISTORY_ENTRIES``), and what was
    #: added since the last one (an entry whose ``upper``, ``wall_ms`` and ``seq`` are those
    #: of the last seal). Derived by replaying commits (``state.apply_op``), never written by
    #: an op. UNSET until the first seal or write; an older persist ignores both fields (and
    #: drops them from the rollups it writes: history then restarts, nothing else changes).
    history: tuple[HistoryEntry, ...] | msgspec.UnsetType = msgspec.UNSET
    unsealed: HistoryEntry | msgspec.UnsetType = msgspec.UNSET
    #: The named holds among ``holds`` (tags and consumer holds with leases) and the lapsed
    #: ones (no longer in ``holds``): hold id -> terms. UNSET while there are none; an older
    #: persist ignores it (its holds are then plain holds, its lapsed ones absent).
    terms: dict[str, HoldTerms] | msgspec.UnsetType = msgspec.UNSET
    #: Where the collection came from (a fork) and when it was last restored. UNSET: neither.
    lineage: Lineage | msgspec.UnsetType = msgspec.UNSET
    # NB: 15 fields. msgspec writes the map header of a struct with more as a map16 whatever
    # is omitted, which would change the stored bytes of every collection (and the golden
    # files): a 16th field goes into a nested struct.


# -- the operations a commit carries --------------------------------------------------------


class Register(msgspec.Struct, frozen=True, tag="register"):
    """Adds ``collection``, as given, under a name not yet registered; the next collection id
    moves past its ``id``."""

    collection: CollectionMeta


class AddPart(msgspec.Struct, frozen=True, tag="add"):
    """Appends ``part`` to collection ``name``; a part with rows has them all at times >= its
    upper."""

    name: str
    part: PartMeta


class Seal(msgspec.Struct, frozen=True, tag="seal"):
    """Advances collection ``name``'s upper to ``upper`` (never backwards)."""

    name: str
    upper: int


class AllowCompaction(msgspec.Struct, frozen=True, tag="since"):
    """Advances collection ``name``'s since to ``since`` (never backwards, never past upper)."""

    name: str
    since: int


class ReplaceParts(msgspec.Struct, frozen=True, tag="replace"):
    """Compaction: ``removed`` parts are replaced by ``added`` with identical contents at every
    time >= ``frontier`` (times below it forwarded to it)."""

    name: str
    removed: tuple[str, ...]
    added: tuple[PartMeta, ...]
    frontier: int


class SetHold(msgspec.Struct, frozen=True, tag="hold"):
    """Sets (or, with ``frontier`` None, releases) a durable read hold.

    With ``kind``, a named hold (:class:`HoldTerms`): a ``"tag"`` or a ``"hold"`` with a lease
    of ``lease_ms`` (0: none), renewed by this commit. With ``lapse`` (and ``frontier`` None),
    the writer's decision that the consumer hold last renewed at ``lapse`` (wall ms) lapsed:
    it no longer holds compaction back. An older persist reads the first as a plain hold and
    the second as a release: the same effective since either way.
    """

    name: str
    hold_id: str
    frontier: int | None
    kind: str | msgspec.UnsetType = msgspec.UNSET
    lease_ms: int | msgspec.UnsetType = msgspec.UNSET
    lapse: int | msgspec.UnsetType = msgspec.UNSET


class Forget(msgspec.Struct, frozen=True, tag="forget"):
    """GC deleted these retired blobs; drop them from the retired list."""

    keys: tuple[str, ...]


class EvolveSchema(msgspec.Struct, frozen=True, tag="evolve"):
    """Registers ``schema`` as collection ``name``'s newest schema version: its id is one more
    than the current version's (compare-and-set: an evolution planned against another version
    is refused), and the change from the current types is one that
    :func:`persist.indexed.format.evolve.problems` allows."""

    name: str
    schema: SchemaVersion


class Restore(msgspec.Struct, frozen=True, tag="restore"):
    """Puts the collections back as they were at commit ``seq``: ``collections`` is that
    state's (:mod:`persist.indexed.state.refs`). An undo: frontiers may move backwards, and
    collections registered after ``seq`` are dropped. The blobs only the current state
    references are retired, those the restored one needs are un-retired."""

    seq: int
    collections: dict[str, CollectionMeta]


Op: TypeAlias = (Register | AddPart | Seal | AllowCompaction | ReplaceParts | SetHold | Forget
                 | EvolveSchema | Restore)


class Commit(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the metadata log: the ops a writer applied atomically at ``seq``.

    ``epoch`` is the writer's lock generation (fence token). Invariant: epochs never decrease
    along the log; a writer never commits after a commit of a higher epoch.
    An empty ``ops`` is a fence: the new holder of the lock claiming the log.
    """

    version: int = BASE_FORMAT_VERSION
    seq: int
    epoch: int
    writer: str
    wall_ms: int
    ops: tuple[Op, ...] = ()
    #: Set on the one commit that shards the log (format 7): ``seq + 1``, the first entry
    #: stored under a shard (:func:`persist.layout.log_key`); this commit itself is stored at
    #: its flat key. UNSET on every other commit.
    log_from: int | msgspec.UnsetType = msgspec.UNSET


class Retired(msgspec.Struct, frozen=True):
    """A data blob no longer referenced since commit ``seq`` (at ``wall_ms``); GC deletes it
    after the grace period."""

    key: str
    seq: int
    wall_ms: int


class RollupAt(msgspec.Struct, frozen=True, array_like=True):
    """A rollup (``meta/rollup/<seq>``) and when it was written (a writer's wall clock, ms)."""

    seq: int
    wall_ms: int


class Trim(msgspec.Struct, frozen=True, kw_only=True):
    """What a rollup records of the metadata trim (DESIGN.md §9): enough for any later writer
    to go on trimming by sequence number, without listing the log.

    Stored in :attr:`State.trim` of a rollup record only; a state in memory never has it
    (:func:`decode_rollup` takes it out). An older persist ignores it, which is safe: its
    writer trims as it always did (listing, by the rollups it wrote itself), and the rollups
    it writes drop the field, which a newer writer meets as a location whose trim is unknown
    (one listing of the log, then recorded again).
    """

    #: When this rollup was written: the writer's wall clock, in ms.
    written_ms: int
    #: Every log entry ``<= trimmed`` is deleted, or left over by an interrupted trim and
    #: never read again (every reader starts from a rollup above it); a later trim deletes
    #: the entries after it, by seq.
    trimmed: int
    #: The older rollups that may still exist, ascending, with when each was written (the
    #: writer that found one without a record counts the time it listed it).
    rollups: tuple[RollupAt, ...] = ()


class State(msgspec.Struct, frozen=True, kw_only=True):
    """The whole metadata state of a location as of ``seq`` (a rollup)."""

    version: int = BASE_FORMAT_VERSION
    seq: int = 0
    epoch: int = 0
    writer: str = ""
    wall_ms: int = 0
    next_cid: int = 1
    #: Decoded as a dict; a state a writer or replica loaded from a manifest holds a map that
    #: decodes each piece at its first use (:class:`persist.indexed.state.pieces.Collections`),
    #: which is never encoded as it is (:func:`encode_rollup` takes a dict of it).
    collections: Mapping[str, CollectionMeta] = msgspec.field(default_factory=dict)
    retired: tuple[Retired, ...] = ()
    #: A rollup record's trim progress (:class:`Trim`); UNSET on every state in memory and in
    #: rollups written before it (or by an older persist). Not part of the state: two
    #: rollups of one seq may differ in it, and replay never sets it.
    trim: Trim | msgspec.UnsetType = msgspec.UNSET
    #: The first seq whose log entry is stored under a shard (format 7,
    #: :func:`persist.layout.log_key`); UNSET: the log is not sharded (yet). Set by the commit
    #: that shards it (:attr:`Commit.log_from`) and kept by every later state.
    log_from: int | msgspec.UnsetType = msgspec.UNSET


def log_from(state: State) -> int | None:
    """The first seq of ``state``'s log stored under a shard (None: not sharded): what
    :func:`persist.layout.log_key` takes to name the entries after ``state``."""
    return None if isinstance(state.log_from, msgspec.UnsetType) else state.log_from


class PieceRef(msgspec.Struct, frozen=True, array_like=True):
    """One piece of a rollup: the collections hashed into ``bucket``
    (:func:`persist.indexed.state.pieces.bucket_of`), stored at ``key``
    (``meta/piece/<digest>``, the blake2b digest of its stored bytes), ``count`` collections in
    ``nbytes`` bytes."""

    bucket: int
    key: str
    count: int
    nbytes: int


class Dropped(msgspec.Struct, frozen=True, array_like=True):
    """A piece an older rollup references and this one does not: no rollup from ``seq`` on
    references it, so it is deleted with the last rollup below ``seq`` (the metadata trim)."""

    key: str
    seq: int


class Piece(msgspec.Struct, frozen=True, kw_only=True):
    """The collections of one bucket of a rollup (name -> metadata). Immutable once stored."""

    version: int = MANIFEST_FORMAT_VERSION
    collections: dict[str, CollectionMeta] = msgspec.field(default_factory=dict)


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """An incremental rollup as of ``seq``: :class:`State`'s fields but its collections, which
    are in ``pieces`` (hashed into ``buckets`` buckets, at most one piece each; an empty bucket
    has none), plus the pieces older rollups still reference (``dropped``)."""

    version: int = MANIFEST_FORMAT_VERSION
    seq: int = 0
    epoch: int = 0
    writer: str = ""
    wall_ms: int = 0
    next_cid: int = 1
    retired: tuple[Retired, ...] = ()
    buckets: int = 1
    pieces: tuple[PieceRef, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    trim: Trim | msgspec.UnsetType = msgspec.UNSET
    #: :attr:`State.log_from` (format 7; UNSET: the log is not sharded).
    log_from: int | msgspec.UnsetType = msgspec.UNSET
    #: The buckets whose piece holds forks (:func:`persist.indexed.state.refs.is_fork`), and
    #: how many; every other piece holds none. UNSET: not counted (a manifest written before
    #: the field, which a persist that predates it ignores: no format version of its own).
    #: NB: a commit that retires a blob asks which collections are forks (only a fork can
    #: still read it): with the counts, an open replaying one decodes only the pieces
    #: holding forks, not every piece (a location of 10,000 collections, 512 pieces: opens on
    #: a tail of 3,000 commits took 171-226 ms, against 221-289 ms decoding every piece). A
    #: count is checked against its piece when the piece is decoded.
    forked: dict[int, int] | msgspec.UnsetType = msgspec.UNSET


class _Versioned(msgspec.Struct):
    version: int


class _Shape(msgspec.Struct):
    version: int
    buckets: int | msgspec.UnsetType = msgspec.UNSET


_ENC = msgspec.msgpack.Encoder()
_COMMIT_DEC = msgspec.msgpack.Decoder(Commit)
_STATE_DEC = msgspec.msgpack.Decoder(State)
_VERSION_DEC = msgspec.msgpack.Decoder(_Versioned)
_SHAPE_DEC = msgspec.msgpack.Decoder(_Shape)
_MANIFEST_DEC = msgspec.msgpack.Decoder(Manifest)
_PIECE_DEC = msgspec.msgpack.Decoder(Piece)


_OP_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {
    t: msgspec.msgpack.Decoder(t) for t in (Register, AddPart, Seal, AllowCompaction,
                                            ReplaceParts, SetHold, Forget, EvolveSchema,
                                            Restore)
}


def encode(record: Commit | State) -> bytes:
    """Returns the stored bytes of ``record`` (msgpack), its ``version`` raised to
    :func:`required_version` if it is lower."""
    need = required_version(record)
    if need > record.version:
        record = msgspec.structs.replace(record, version=need)
    return _ENC.encode(record)


def required_version(record: Commit | State) -> int:
    """The lowest format version that can carry ``record``: 9 if it adds (a commit) or holds
    (a rollup) a compressed inline part, else 8 if it adds or holds a marked part, else 5 if it
    restores a state (a commit) or registers or holds a collection referencing a blob it does
    not own (a fork), else 4 if it adds or holds a Parquet part, else 3 if it evolves a schema
    (a commit) or registers or holds an evolved collection, else 2 if it registers (a commit)
    or holds (a rollup) a collection of version-2 types, else 1; and at least 7 for the commit
    that shards the log and every state of a sharded log."""
    if record.log_from is not msgspec.UNSET:
        return max(SHARDED_LOG_FORMAT_VERSION, _required(record))
    return _required(record)


def _required(record: Commit | State) -> int:
    if isinstance(record, Commit):
        restores = [op for op in record.ops if isinstance(op, Restore)]
        if restores:
            return max([REFS_FORMAT_VERSION,
                        *(collection_version(c) for op in restores
                          for c in op.collections.values())])
        colls: Any = [op.collection for op in record.ops if isinstance(op, Register)]
        parts: Any = [p for op in record.ops for p in _parts_of(op)]
        if any(p.packed for p in parts):
            return max([PACKED_FORMAT_VERSION, *(collection_version(c) for c in colls)])
        if any(p.marks is not None for p in parts):
            return max([MARKS_FORMAT_VERSION, *(collection_version(c) for c in colls)])
        if any(p.parquet for p in parts):
            return max([PARQUET_FORMAT_VERSION, *(collection_version(c) for c in colls)])
        if any(isinstance(op, EvolveSchema) for op in record.ops):
            return max([EVOLUTION_FORMAT_VERSION, *(collection_version(c) for c in colls)])
    else:
        colls = record.collections.values()
    return max((collection_version(c) for c in colls), default=BASE_FORMAT_VERSION)


def _parts_of(op: Op) -> tuple[PartMeta, ...]:
    """The parts an op adds (a registered collection's own included)."""
    if isinstance(op, AddPart):
        return (op.part,)
    if isinstance(op, ReplaceParts):
        return op.added
    if isinstance(op, Register):
        return op.collection.parts
    return ()


def borrows(c: CollectionMeta) -> bool:
    """Whether ``c`` references a blob it does not own: one of another collection (its key is
    outside ``c``'s data prefix), of another location, or with rows hidden past a time cut (a
    fork's part, :func:`persist.layout.ref_key`)."""
    own = layout.data_prefix(c.id)
    return any(p.blob_key is not None and not p.blob_key.startswith(own) for p in c.parts)


def collection_version(c: CollectionMeta) -> int:
    """9 for a collection holding a compressed inline part, 8 for one holding a marked part,
    5 for one that references a blob it does not own (a fork), 4 for one holding a Parquet
    part, 3 for an evolved collection, 2 for one of version-2 types (see the module
    docstring), else 1."""
    if any(p.packed for p in c.parts):
        return PACKED_FORMAT_VERSION
    if any(p.marks is not None for p in c.parts):
        return MARKS_FORMAT_VERSION
    if borrows(c):
        return REFS_FORMAT_VERSION
    if any(p.parquet for p in c.parts):
        return PARQUET_FORMAT_VERSION
    if c.schemas is not msgspec.UNSET:
        return EVOLUTION_FORMAT_VERSION
    v2 = _type_is_v2(c.key_type) or _type_is_v2(c.value_type)
    return RECORDS_FORMAT_VERSION if v2 else BASE_FORMAT_VERSION


@functools.lru_cache(maxsize=1024)
def _type_is_v2(type_bytes: bytes) -> bool:
    try:
        t = columnar.deserialize_type(type_bytes)
    except Corruption:
        return False  # not a type at all: the reader reports that, not the version check
    return records.is_v2_type(t)


def check_op(op: Op) -> None:
    """Checks that ``op`` has exactly the types of its stored form, so that a commit carrying it
    decodes on every reader.

    NB: msgspec encodes what it is given: an op built with an int for a name (a caller's bug)
    encodes fine and then fails to decode on every later open, making the whole location
    unreadable. Checking the round trip when an op is staged refuses it before anything is
    written.

    Raises:
        InvalidUsage: a field of ``op`` has a type its stored form does not allow.
    """
    try:
        _OP_DECODERS[type(op)].decode(_ENC.encode(op))
    except (KeyError, TypeError, OverflowError, msgspec.EncodeError, msgspec.DecodeError) as e:
        raise InvalidUsage(f"malformed {type(op).__name__} operation, refused: {e}") from e


def encode_commit_checked(key: str, commit: Commit) -> bytes:
    """Encodes ``commit`` for ``key`` and proves it decodes back to the same bytes.

    This is the last line of defence against a malformed record: a commit that could not be
    decoded, once created, would make every later open of the location fail.

    Raises:
        InvalidUsage: the record does not survive a round trip; it must not be written.
    """
    try:
        data = encode(commit)
        again = _ENC.encode(decode_commit(key, data))
    except (TypeError, OverflowError, msgspec.EncodeError, Corruption) as e:
        raise InvalidUsage(f"refusing to write commit {key}: its record would not decode "
                           f"({e}); nothing was written") from e
    if again != data:
        raise InvalidUsage(f"refusing to write commit {key}: its record does not survive a "
                           f"round trip; nothing was written")
    return data


def version_of(key: str, data: bytes | memoryview) -> int:
    """The ``version`` field of the msgpack record ``data`` (read from ``key``), read alone,
    before the record is decoded: a newer record is refused as such, not as undecodable.

    Raises:
        Corruption: not a msgpack record with an int ``version``.
    """
    try:
        version: int = _VERSION_DEC.decode(data).version
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise Corruption(key, f"undecodable record: {e}") from e
    return version


def _check_version(key: str, data: bytes) -> None:
    version = version_of(key, data)
    if version > FORMAT_VERSION:
        raise IncompatibleFormat(
            f"{key!r} has metadata format version {version}; this persist reads up to "
            f"{FORMAT_VERSION}: upgrade persist to read this location"
        )


def _decode(key: str, data: bytes, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    _check_version(key, data)
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # a bad UTF-8 string is the latter
        raise Corruption(key, f"undecodable metadata: {e}") from e


def decode_commit(key: str, data: bytes) -> Commit:
    """Decodes the log entry stored under ``key`` (a ``meta/log/<seq>`` key).

    Raises:
        Corruption: undecodable, or its ``seq`` is not the one ``key`` names.
        IncompatibleFormat: a format version newer than :data:`FORMAT_VERSION`.
    """
    commit: Commit = _decode_at(key, data, _COMMIT_DEC, "commit")
    return commit


def decode_state(key: str, data: bytes) -> State:
    """Decodes the rollup stored under ``key`` (a ``meta/rollup/<seq>`` key).

    Raises:
        Corruption: undecodable, or its ``seq`` is not the one ``key`` names.
        IncompatibleFormat: a format version newer than :data:`FORMAT_VERSION`.
    """
    return decode_rollup(key, data)[0]


def decode_rollup(key: str, data: bytes) -> tuple[State, Trim | None]:
    """Decodes the rollup stored under ``key``: the state, without the trim progress the
    record carries (:class:`Trim`), and that progress (None: the record has none).

    Raises:
        Corruption: undecodable, or its ``seq`` is not the one ``key`` names.
        IncompatibleFormat: a format version newer than :data:`FORMAT_VERSION`.
    """
    if is_manifest(key, data) and version_of(key, data) <= FORMAT_VERSION:
        # NB: a manifest decoded as a State would read as a location without collections.
        raise Corruption(key, "a rollup manifest, not a whole state: it is read with its "
                              "pieces (persist.indexed.state.pieces.read_rollup)")
    state: State = _decode_at(key, data, _STATE_DEC, "rollup")
    trim = state.trim
    if isinstance(trim, msgspec.UnsetType):
        return state, None
    return msgspec.structs.replace(state, trim=msgspec.UNSET), trim


def encode_rollup(state: State, trim: Trim | None) -> bytes:
    """Returns the stored bytes of the rollup of ``state`` recording ``trim`` (None: no
    trim progress, the bytes a persist before :class:`Trim` wrote)."""
    if not isinstance(state.collections, dict):
        state = msgspec.structs.replace(state, collections=dict(state.collections))
    return encode(state if trim is None else msgspec.structs.replace(state, trim=trim))


def _decode_at(key: str, data: bytes, decoder: msgspec.msgpack.Decoder[Any], what: str) -> Any:
    # NB: a record copied under another seq's key would replay in the wrong place; the key
    # itself is checked against what the record says.
    record = _decode(key, data, decoder)
    if record.seq != layout.seq_of(key):
        raise Corruption(key, f"{what} says seq {record.seq} but is stored as "
                              f"{layout.seq_of(key)}")
    return record


def is_manifest(key: str, data: bytes) -> bool:
    """Whether the rollup record ``data`` (stored at ``key``) is a :class:`Manifest`: version 6,
    or a newer one with a ``buckets`` field (a whole state rollup is at most version 5, or 7
    and newer without that field: a sharded log's).

    Raises:
        Corruption: not a msgpack record with an int ``version``.
    """
    version = version_of(key, data)
    if version <= MANIFEST_FORMAT_VERSION:
        return version == MANIFEST_FORMAT_VERSION
    try:
        return _SHAPE_DEC.decode(data).buckets is not msgspec.UNSET
    except (msgspec.DecodeError, TypeError) as e:
        raise Corruption(key, f"not a metadata record: {e}") from e


def encode_piece(collections: dict[str, CollectionMeta]) -> bytes:
    """The stored bytes of a piece holding ``collections`` (version 6, or more if one of them
    needs it)."""
    version = max((collection_version(c) for c in collections.values()),
                  default=MANIFEST_FORMAT_VERSION)
    return _ENC.encode(Piece(version=max(version, MANIFEST_FORMAT_VERSION),
                             collections=collections))


def decode_piece(key: str, data: bytes) -> Piece:
    """Decodes the piece stored under ``key``.

    Raises:
        Corruption: undecodable.
        IncompatibleFormat: a format version newer than :data:`FORMAT_VERSION`.
    """
    piece: Piece = _decode(key, data, _PIECE_DEC)
    return piece


def encode_manifest(manifest: Manifest) -> bytes:
    """The stored bytes of ``manifest`` (its version as given, the highest of its pieces', but
    at least 7 for a sharded log's)."""
    if (manifest.log_from is not msgspec.UNSET
            and manifest.version < SHARDED_LOG_FORMAT_VERSION):
        manifest = msgspec.structs.replace(manifest, version=SHARDED_LOG_FORMAT_VERSION)
    return _ENC.encode(manifest)


def decode_manifest(key: str, data: bytes) -> Manifest:
    """Decodes the manifest stored under ``key`` (a ``meta/rollup/<seq>`` key).

    Raises:
        Corruption: undecodable, or its ``seq`` is not the one ``key`` names.
        IncompatibleFormat: a format version newer than :data:`FORMAT_VERSION`.
    """
    manifest: Manifest = _decode_at(key, data, _MANIFEST_DEC, "rollup manifest")
    return manifest
