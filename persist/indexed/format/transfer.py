"""The records a distributed write hands between processes: a :class:`StagedPart`, from the
worker that staged it to the process that commits it, and a :class:`Token`, the commit's
idempotency key.

Both are public as ``persist.distributed.StagedPart`` and ``persist.distributed.Token``. They are
defined here, in the engine's format layer, because the runtime's ``Client.apply`` consumes them
while ``persist.distributed`` stands above the runtime (its ``Committer`` opens writers).

A staged part is **bound** to where it was staged: its location (the URL its stager was given),
its collection (name and id) and the types of the schema version it was staged with. A commit
refuses a part bound elsewhere before anything is submitted (:meth:`StagedPart.check`), so a part
staged for a same-named collection of another location, or of other types, can never reach the
metadata, where every later read would fail on it.

Its bytes (:meth:`StagedPart.to_bytes`, and pickle, which goes through them) sit in the stored
value's envelope (:func:`persist.blob.envelope.pack`), verified before anything in them is
decoded: a damaged staged part is a :class:`~persist.errors.Corruption`, never a crash or other
rows. Every record that travels between processes (a staged part, a read task, a part handle)
shares that encoding through :class:`Travelling`. An inline part's Arrow payload is also validated against the types it is bound to, and
against what its metadata says of it, before a commit takes it (:func:`check_inline`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlparse

import msgspec
import pyarrow as pa

from persist.blob import envelope
from persist.errors import (
    Corruption,
    IncompatibleFormat,
    InvalidUsage,
    PersistError,
    SchemaMismatch,
    UnknownCollection,
)
from persist.indexed.format import columnar, evolve
from persist.indexed.format.meta import (
    CollectionMeta,
    OfPart,
    PartMeta,
    SchemaVersion,
    version_of,
)
from persist.indexed.format.write import diff_sums

#: The newest staged-part record this persist decodes (and the one it encodes). 2: its part may
#: be a compressed inline part (metadata format 9), which a persist that predates it cannot
#: decode.
STAGED_PART_VERSION = 2

_ENC = msgspec.msgpack.Encoder()
_T = TypeVar("_T", bound="Travelling")


class Travelling:
    """A frozen ``msgspec.Struct`` with a ``version`` that travels between processes as checked
    bytes: :meth:`to_bytes` is the msgpack record in the envelope of stored values, with
    :attr:`KIND` in place of the key (so bytes of one kind never verify as another), and
    :meth:`from_bytes` verifies it before anything in it is decoded. Pickle goes through the same
    bytes.
    """

    __slots__ = ()
    #: What the record's envelope is checked as, e.g. ``persist.StagedPart``.
    KIND: ClassVar[str]
    #: The newest version of the record this persist decodes (and the one it encodes).
    NEWEST: ClassVar[int]
    #: What to do about a record of a newer version (the end of the message).
    NEWER: ClassVar[str]

    def to_bytes(self) -> bytes:
        """The record encoded (msgpack) in a checksummed envelope: :meth:`from_bytes` gives it
        back anywhere."""
        return envelope.pack(self.KIND, _ENC.encode(self))

    @classmethod
    def from_bytes(cls: type[_T], data: bytes | bytearray | memoryview) -> _T:
        """The record :meth:`to_bytes` made, its checksum verified before anything in it is
        decoded.

        Raises:
            InvalidUsage: ``data`` is not bytes.
            Corruption: damaged or truncated bytes, bytes of another kind of record, or a
                record that does not decode.
            IncompatibleFormat: encoded by a newer persist.
        """
        payload = envelope.unpack(cls.KIND, data)
        version = version_of(cls.KIND, payload)
        if version > cls.NEWEST:
            raise IncompatibleFormat(f"a {cls.KIND} of format {version}; this persist reads up "
                                     f"to {cls.NEWEST}: {cls.NEWER}")
        try:
            record: _T = msgspec.msgpack.decode(payload, type=cls)
        except (msgspec.DecodeError, UnicodeDecodeError) as e:  # bad UTF-8 is the latter
            raise Corruption(cls.KIND, f"undecodable record: {e}") from None
        try:
            record.check_decoded()
        except IncompatibleFormat:
            raise
        except (PersistError, pa.ArrowException, OSError, ValueError, TypeError, KeyError,
                IndexError) as e:
            # NB: bytes with a valid checksum can still be wrong (a buggy producer): whatever
            # does not hold together is this record's corruption, named as such, never an
            # untyped error (or an InvalidUsage blaming the reader) later in the read.
            raise Corruption(cls.KIND, f"the record does not hold together: "
                                       f"{type(e).__name__}: {e}") from e
        return record

    def check_decoded(self) -> None:
        """Checks what msgspec's types cannot, as :meth:`from_bytes` decodes the record: that
        its parts (types, parts, filter) decode and fit together. Nothing by default.

        Raises:
            PersistError, or an error of decoding (ValueError, ArrowException...): they do not
                (:meth:`from_bytes` reports any as ``Corruption``).
        """

    def __reduce__(self) -> tuple[Any, ...]:
        # NB: pickle (Spark's commit messages and tasks, multiprocessing) carries the
        # checksummed bytes, so damage on the way is caught as it is for to_bytes. The
        # reconstructor is a module function: cloudpickle (Spark) pickles a classmethod by
        # value, with its module's globals, which it cannot.
        return (_from_bytes, (type(self), self.to_bytes()))


def _from_bytes(cls: type[_T], data: bytes) -> _T:
    """Unpickles a travelling record (see ``Travelling.__reduce__``)."""
    return cls.from_bytes(data)


class StagedPart(Travelling, msgspec.Struct, OfPart, frozen=True, kw_only=True):
    """A part another process encoded and stored for ``collection``, not yet committed: what
    ``persist.distributed.Stager.stage`` returns and ``Client.apply(parts=...)`` (or a
    ``Committer``) commits.

    Serializable: :meth:`to_bytes` / :meth:`from_bytes`, and pickle (which uses them), both
    checksummed; it travels from the worker that staged it to the writer.
    """

    #: The format of this record (refused by a persist that predates it).
    version: int = STAGED_PART_VERSION
    #: The URL of the location it was staged at (as its stager was given it).
    location: str
    #: The collection's name and id at that location.
    collection: str
    collection_id: int
    #: The schema version it was staged with: its id and its key and value types.
    schema: SchemaVersion
    #: The part itself (stored under ``data/``, or inline), tagged with ``schema.id``.
    part: PartMeta

    KIND: ClassVar[str] = "persist.StagedPart"
    NEWEST: ClassVar[int] = STAGED_PART_VERSION
    NEWER: ClassVar[str] = "stage and commit with the same persist version"

    def check_decoded(self) -> None:
        """Its types decode, and its part is stored in one place, tagged with its version.

        Raises:
            Corruption: they do not decode, or the part does not hold together.
        """
        types = (columnar.deserialize_type(self.schema.key_type),
                 columnar.deserialize_type(self.schema.value_type))
        if self.schema.id < 0:
            raise Corruption(self.KIND, f"schema version {self.schema.id}")
        check_part_record(self.part, evolve.Schemas((types,) * (self.schema.id + 1)))
        if self.part.marks is not None:
            # NB: only compaction's marks step writes marks (over a base part it replaces):
            # a staged part that says some rows of a blob are hidden is not one a stager made
            raise Corruption(self.KIND, f"part {self.part.id} carries marks")

    def check(self, name: str, location: str,
              collections: Mapping[str, CollectionMeta]) -> PartMeta:
        """The part, once shown to belong to collection ``name`` of ``collections`` (a state's)
        at the location ``location`` (the committing client's URL).

        Raises:
            InvalidUsage: staged for another collection, at another location, or for another
                collection of the same name (the location was replaced since).
            UnknownCollection: ``collections`` has no ``name``.
            SchemaMismatch: staged with types that are not those of ``c``'s schema version
                ``schema.id``.
            Corruption: the record contradicts itself (a part tagged with another version, an
                inline payload that is not the rows its metadata describes, marks).
        """
        p = self.part
        if p.marks is not None:
            raise Corruption(self.KIND, f"part {p.id} carries marks: only compaction writes "
                                        f"them; nothing was committed")
        if self.collection != name:
            raise InvalidUsage(f"part {p.id} was staged for {self.collection!r}, not {name!r}")
        c = collections.get(name)
        if c is None:
            raise UnknownCollection(f"part {p.id} is for collection {name!r}, which this "
                                    f"location does not have")
        if canonical_location(self.location) != canonical_location(location):
            raise InvalidUsage(
                f"part {p.id} was staged for {name!r} at {self.location!r}, not at this "
                f"location {location!r}: a part is committed where it was staged; nothing was "
                f"committed")
        if self.collection_id != c.id:
            raise InvalidUsage(
                f"part {p.id} was staged for collection {name!r} with id {self.collection_id}, "
                f"but {name!r} here has id {c.id} (the location was replaced since?); nothing "
                f"was committed")
        versions = evolve.history(c)
        sid = self.schema.id
        if not 0 <= sid < len(versions) or versions[sid] != self.schema:
            have = (f"its schema version {sid} has other types" if 0 <= sid < len(versions)
                    else f"it has schema versions 0 to {len(versions) - 1}")
            raise SchemaMismatch(
                f"part {p.id} was staged for {name!r} with key {_type_name(self.schema.key_type)}"
                f" and value {_type_name(self.schema.value_type)} (schema version {sid}), but "
                f"{have}; nothing was committed")
        if evolve.part_version(p) != sid:
            raise Corruption(self.KIND, f"part {p.id} is tagged with schema version "
                                           f"{evolve.part_version(p)}, its record says {sid}")
        if p.inline is not None:
            check_inline(p, evolve.Schemas.of(c).part_schema(sid))
        return p


def check_part_record(p: PartMeta, schemas: evolve.Schemas) -> None:
    """Checks that the part record ``p`` (of a collection whose versions are ``schemas``)
    holds together: stored either in a blob or inline, never both or neither, with a schema
    version the collection has.

    Raises:
        Corruption: it does not.
    """
    key = f"part {p.id}"
    if (p.blob_key is None) == (p.inline is None):
        raise Corruption(key, "a part is either stored in a blob or inline: this one is "
                              + ("both" if p.inline is not None else "neither"))
    sid = evolve.part_version(p)
    if not 0 <= sid <= schemas.current:
        raise Corruption(key, f"tagged with schema version {sid}; the collection has 0 to "
                              f"{schemas.current}")


def check_inline(p: PartMeta, schema: pa.Schema) -> None:
    """Checks that the inline part ``p`` holds what its metadata says, in ``schema``, before a
    commit takes it (a commit must never make the metadata hold rows a read cannot decode):
    its payload decodes as ``schema`` and validates fully, and its row count, size, time range
    and diff sums are the ones recorded; an inline part carries no stats (nothing may prune it
    by stats a reader cannot check).

    Raises:
        Corruption: it does not.
    """
    key = f"inline part {p.id}"
    assert p.inline is not None
    if p.stats is not msgspec.UNSET:
        raise Corruption(key, "an inline part carries stats (only a stored part has them)")
    if p.nbytes != len(p.inline):
        raise Corruption(key, f"{len(p.inline)} bytes, its metadata says {p.nbytes}")
    table = columnar.decode_part(key, p.inline, schema)
    try:
        table.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as e:
        raise Corruption(key, f"invalid Arrow data: {e}") from None
    if len(table) != p.rows:
        raise Corruption(key, f"{len(table)} rows, its metadata says {p.rows}")
    for column in ("time", "diff"):
        if table.column(column).null_count:
            raise Corruption(key, f"null {column}s")
    if len(table):
        lo, hi = columnar.time_range(table)
        if (lo, hi) != (p.min_time, p.max_time):
            raise Corruption(key, f"times {lo}..{hi}, its metadata says "
                                  f"{p.min_time}..{p.max_time}")
    counted = (p.inserted, p.retracted)
    if msgspec.UNSET not in counted and diff_sums(table) != counted:
        raise Corruption(key, f"diff sums {diff_sums(table)}, its metadata says {counted}")


def canonical_location(url: str) -> str:
    """``url`` spelled one way per location, so that a part staged through one spelling is
    committed through another (``/data/loc``, ``file:///data/loc/``): a local path made
    absolute with symlinks resolved, an S3 prefix without its trailing slash."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file") and parsed.netloc in ("", "localhost"):
        path = parsed.path if parsed.scheme == "file" else url
        return "file://" + os.path.realpath(path)
    if parsed.scheme == "s3":
        return f"s3://{parsed.netloc}/{parsed.path.strip('/')}"
    return url


def _type_name(data: bytes) -> str:
    try:
        return str(columnar.deserialize_type(data))
    except Corruption:
        return "(undecodable type)"


class Token(msgspec.Struct, frozen=True):
    """An idempotency token for ``Client.apply``: the apply lands at most once per ``id``
    and ``seq``, and only if ``seq`` is above every seq applied under ``id`` before
    (Delta's ``txnAppId``/``txnVersion``). A retried or replayed apply is then a no-op.

    Raises (construction):
        InvalidUsage: ``id`` is not a non-empty str, or ``seq`` not an int in ``[0, 2**63)``.
    """

    id: str
    seq: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidUsage(f"a token id must be a non-empty str, not {self.id!r}")
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or \
                not 0 <= self.seq < 1 << 63:
            raise InvalidUsage(f"a token seq must be an int in [0, 2**63), not {self.seq!r}")


__all__ = ["STAGED_PART_VERSION", "StagedPart", "Token", "Travelling", "canonical_location",
           "check_inline"]
