"""Options of the ``persist`` Spark source and sink, parsed once into frozen records.

Spark hands a Python data source its options as a case-insensitive mapping whose keys arrive
lower-cased (``maxRowsPerTrigger`` is ``maxrowspertrigger``): every lookup here goes through
:func:`_get` with the documented spelling, and the mapping is never copied into a plain dict.
``storage_options.<name>`` options are passed to persist's storage client as
``storage_options={name: value}`` ("true"/"false" become booleans).

The location is the path given to ``load()``/``save()`` (or a ``path`` option).

Every option is validated: a key that the mode (batch read, stream read, batch write, stream
write) does not know is :class:`~persist.errors.InvalidUsage` naming it and listing the
supported ones (:func:`check_keys`), so a misspelling never silently falls back to a default.
Spark adds keys of its own, found by experiment (pyspark 4.3): ``path`` (the ``load``/``save``
argument) everywhere; for a streaming write also ``checkpointLocation`` (when given as an
option) and ``queryName`` (when the query is named). Those are accepted where Spark passes them.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from persist import InvalidUsage

STORAGE_PREFIX = "storage_options."

Mode = Literal["consolidated", "raw"]
Pushdown = Literal["auto", "true", "false"]

#: Which options a mode accepts: a batch read, a stream read, either (``schema()`` runs
#: before Spark says which), a batch write, a stream write.
Kind = Literal["read", "stream", "any-read", "write", "stream-write"]

#: Every mode: the location (Spark passes the ``load``/``save`` argument as ``path``) and the
#: collection; ``storage_options.<name>`` keys are accepted on top of these.
_COMMON = ("path", "collection")
_BATCH_READ = ("as_of", "versionAsOf", "timestampAsOf", "tag", "mode", "numPartitions",
               "partitionRows", "filterPushdown", "auditPruning", "readChangeFeed",
               "startingVersion", "endingVersion")
_STREAM_READ = ("startingUpper", "maxRowsPerTrigger", "failOnDataLoss", "readHold",
                "readHoldLease", "readHoldLockTimeout", "refreshInterval", "partitionRows")
_WRITE = ("key_type", "value_type", "reentranceId", "lockTimeout", "mergeSchema")
#: Spark passes these to a streaming writer itself: ``checkpointLocation`` when the query's
#: checkpoint is given as an option, ``queryName`` when the query is named.
SPARK_STREAM_WRITE = ("checkpointLocation", "queryName")

SUPPORTED: dict[Kind, tuple[str, ...]] = {
    "read": _COMMON + _BATCH_READ,
    "stream": _COMMON + _STREAM_READ,
    "any-read": tuple(dict.fromkeys(_COMMON + _BATCH_READ + _STREAM_READ)),
    "write": _COMMON + _WRITE + ("upper",),
    "stream-write": _COMMON + _WRITE + ("sinkId", "writerIdleTimeout") + SPARK_STREAM_WRITE,
}

_WHAT: dict[Kind, str] = {
    "read": "a persist batch read", "stream": "a persist stream read",
    "any-read": "a persist read", "write": "a persist batch write",
    "stream-write": "a persist stream write",
}

_CHANGE_FEED_TIMESTAMPS = (
    "a change feed is bounded by persist times: startingVersion and endingVersion (both "
    "inclusive, as in Delta); map a wall-clock time to one with ReadHandle.as_of_timestamp "
    "or `persist history`"
)

#: Options other engines have that persist rejects with a reason, not just "unknown".
_REJECTED = {
    "startingtimestamp": _CHANGE_FEED_TIMESTAMPS,
    "endingtimestamp": _CHANGE_FEED_TIMESTAMPS,
    "paths": "persist reads one location: load() takes one URL, not a list",
}


def check_keys(options: Mapping[str, Any], kind: Kind) -> None:
    """Every key of ``options`` is one that ``kind`` supports (case-insensitively), or a
    ``storage_options.<name>``.

    Raises:
        InvalidUsage: naming the first unsupported key (with a close spelling if there is one)
            and listing the supported ones.
    """
    supported = SUPPORTED[kind]
    by_lower = {k.lower(): k for k in supported}
    for key in sorted(str(k) for k in options):
        low = key.lower()
        if low in by_lower or (low.startswith(STORAGE_PREFIX) and len(low) > len(STORAGE_PREFIX)):
            continue
        listed = ", ".join(supported) + f", {STORAGE_PREFIX}<name>"
        if low in _REJECTED:
            what = _WHAT[kind]
            raise InvalidUsage(f"option {key!r}: {_REJECTED[low]}. {what[0].upper()}{what[1:]} "
                               f"supports: {listed}")
        close = difflib.get_close_matches(low, list(by_lower), n=1, cutoff=0.75)
        hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
        where = _elsewhere(low, kind)
        raise InvalidUsage(f"unknown option {key!r} for {_WHAT[kind]}{hint}{where}; "
                           f"supported: {listed}")


def _elsewhere(low: str, kind: Kind) -> str:
    """`` (it applies to ...)`` when another mode supports ``low``."""
    modes: Iterable[Kind] = ("read", "stream", "write", "stream-write")
    others = [_WHAT[k].removeprefix("a persist ") for k in modes
              if k != kind and low in {s.lower() for s in SUPPORTED[k]}]
    return f" (it applies to {' and '.join(others)})" if others else ""


def _get(options: Mapping[str, str], key: str) -> str | None:
    # NB: keys arrive lower-cased, and the mapping may be Spark's CaseInsensitiveDict or a
    # plain dict (tests): look up the lower-cased spelling.
    value = options.get(key.lower())
    if value is None:
        value = options.get(key)
    return None if value is None else str(value)


def _int(options: Mapping[str, str], key: str, *, minimum: int = 0) -> int | None:
    raw = _get(options, key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidUsage(f"option {key}={raw!r} is not an integer") from None
    if value < minimum:
        raise InvalidUsage(f"option {key}={value} must be >= {minimum}")
    return value


def _float(options: Mapping[str, str], key: str) -> float | None:
    raw = _get(options, key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidUsage(f"option {key}={raw!r} is not a number") from None
    if value < 0:
        raise InvalidUsage(f"option {key}={value} must be >= 0")
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = _get(options, key)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidUsage(f"option {key}={raw!r} is not a boolean")


def _pushdown(options: Mapping[str, str]) -> Pushdown:
    raw = (_get(options, "filterPushdown") or "auto").strip().lower()
    if raw in ("true", "1", "yes"):
        return "true"
    if raw in ("false", "0", "no"):
        return "false"
    if raw == "auto":
        return "auto"
    raise InvalidUsage(f"option filterPushdown={raw!r}: use auto, true or false")


#: Seconds since the epoch of 10000-01-01: a larger ``timestampAsOf`` is not seconds (it is
#: most likely milliseconds), and read as seconds it would silently mean "the newest seal".
_MAX_EPOCH_SECONDS = 253_402_300_800


def _timestamp(options: Mapping[str, str]) -> str | float | None:
    """``timestampAsOf``: seconds since the epoch when it is a number (``1795693485``,
    ``1795693485.25``; Spark hands every option over as a string), else the ISO-8601 string
    as given (checked, with its zone, where it is looked up).

    Raises:
        InvalidUsage: a number that is not finite or not seconds (beyond the year 9999).
    """
    raw = (_get(options, "timestampAsOf") or "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return raw  # not a number: an ISO-8601 timestamp (or an error that says it is not one)
    if not math.isfinite(seconds):
        raise InvalidUsage(f"option timestampAsOf={raw!r} is not a time: give ISO-8601 with a "
                           f"zone or seconds since the epoch")
    if abs(seconds) >= _MAX_EPOCH_SECONDS:
        raise InvalidUsage(
            f"option timestampAsOf={raw!r} is not seconds since the epoch (it would be after "
            f"the year 9999): milliseconds? Divide by 1000")
    return seconds


def _storage_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return raw


#: The environment variable that turns ``auditPruning`` on by default (``1``/``true``), read
#: where Spark plans a read (its Python planning workers inherit the driver's environment).
AUDIT_ENV = "PERSIST_AUDIT_PRUNING"


def audit_default() -> bool:
    """Whether batch reads audit their pruning unless ``auditPruning`` says otherwise: the
    :data:`AUDIT_ENV` environment variable is ``1``/``true``/``yes`` (default: no).

    Raises:
        InvalidUsage: the variable is set to something else.
    """
    raw = os.environ.get(AUDIT_ENV, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise InvalidUsage(f"environment variable {AUDIT_ENV}={raw!r} is not a boolean "
                       f"(use 1/true/yes or 0/false/no)")


@dataclass(frozen=True)
class Target:
    """Where a collection lives: a location URL, its storage options, the collection's name.

    Picklable and small: it rides inside every Spark task that reads or writes.
    """

    url: str
    storage: tuple[tuple[str, Any], ...]
    collection: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """The ``storage_options`` to open the location with (a fresh dict)."""
        return dict(self.storage)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Target:
        """The target named by ``path`` and ``collection``, with every ``storage_options.*``.

        Raises:
            InvalidUsage: ``path`` or ``collection`` is missing or empty.
        """
        url = _get(options, "path")
        if not url:
            raise InvalidUsage(
                "persist needs a location: spark.read.format('persist').load('file:///loc') "
                "(or .option('path', ...)); a catalog table (saveAsTable) cannot name it: "
                "pyspark passes a Python data source no options when it reads or writes one"
            )
        name = _get(options, "collection")
        if not name:
            raise InvalidUsage("persist needs option collection=<name>")
        storage = tuple(sorted(
            (k[len(STORAGE_PREFIX):], _storage_value(str(v)))
            for k, v in options.items()
            if k.lower().startswith(STORAGE_PREFIX) and v is not None
        ))
        return cls(url, storage, name)


#: Default ``readHoldLockTimeout``: seconds a stream waits for the writer lock to move its
#: read hold.
READ_HOLD_LOCK_TIMEOUT = 10.0
#: Default ``lockTimeout``: seconds a write waits for the writer lock.
LOCK_TIMEOUT = 60.0


@dataclass(frozen=True)
class ReadOptions:
    """Options of ``spark.read`` / ``spark.readStream``."""

    target: Target
    #: Batch: the time to read as of (``as_of`` or Delta's ``versionAsOf``); None: upper - 1.
    as_of: int | None
    mode: Mode
    #: Batch, consolidated: at most this many key ranges (None: by size). Raw: ignored.
    num_partitions: int | None
    #: Batch raw mode and streaming: small parts are grouped into a partition up to this size
    #: (None: the engine's default, ``Scan.tasks``'s).
    partition_rows: int | None
    #: Streaming: "earliest", "latest" or a time.
    starting_upper: str | int
    max_rows_per_trigger: int | None
    fail_on_data_loss: bool
    read_hold: str | None
    read_hold_lock_timeout: float
    #: Streaming: seconds between metadata polls behind latestOffset (None: by location).
    refresh_interval: float | None
    #: Batch: take Spark's pushed filters: ``auto`` (where Spark plans each pushed scan on its
    #: own, see :func:`operators.filters.pushdown_safe`), ``true`` or ``false``.
    filter_pushdown: Pushdown = "auto"
    #: Batch: re-read the parts that pushed filters pruned, and fail if one holds a match.
    audit_pruning: bool = False
    #: Batch: read as of the last time sealed at or before this wall-clock time: ISO-8601
    #: with a zone (a string) or seconds since the epoch (a number); looked up in the
    #: collection's history (``ReadHandle.history``).
    timestamp_as_of: str | float | None = None
    #: Batch: the change feed (``readChangeFeed``): the raw updates with times in
    #: ``[starting_version, ending_version]`` and a ``_change_type`` column.
    change_feed: bool = False
    starting_version: int | None = None
    ending_version: int | None = None
    #: Batch: read as of the time this tag pins (``Client.tag``).
    tag: str | None = None
    #: Streaming: the read hold's lease in seconds (renewed by every micro-batch).
    read_hold_lease: float = 7 * 86400.0

    @classmethod
    def parse(cls, options: Mapping[str, str], kind: Kind = "any-read") -> ReadOptions:
        """Parses and validates every read option (defaults: consolidated, earliest, 1 M
        partition rows, failOnDataLoss, a 10 s hold lock timeout; a 0 timeout means 10 s).

        ``kind`` is ``"read"`` (batch), ``"stream"``, or ``"any-read"`` (either: what
        ``DataSource.schema()`` sees, before Spark says which).

        Raises:
            InvalidUsage: an option ``kind`` does not support, a missing target, a malformed
                or out-of-range value, or ``as_of`` and ``versionAsOf`` that disagree.
        """
        check_keys(options, kind)
        target = Target.parse(options)
        as_of = _int(options, "as_of")
        version = _int(options, "versionAsOf")
        if as_of is not None and version is not None and as_of != version:
            raise InvalidUsage(f"options as_of={as_of} and versionAsOf={version} disagree")
        mode = (_get(options, "mode") or "consolidated").strip().lower()
        if mode not in ("consolidated", "raw"):
            raise InvalidUsage(f"option mode={mode!r}: use 'consolidated' or 'raw'")
        starting_raw = (_get(options, "startingUpper") or "earliest").strip().lower()
        starting: str | int
        if starting_raw in ("earliest", "latest"):
            starting = starting_raw
        else:
            parsed = _int({"startingupper": starting_raw}, "startingUpper")
            if parsed is None:
                raise InvalidUsage("option startingUpper is empty")
            starting = parsed
        hold = _get(options, "readHold")
        ts = _timestamp(options)
        if ts is not None and (as_of is not None or version is not None):
            raise InvalidUsage("options timestampAsOf and as_of/versionAsOf both say what to "
                               "read as of: give one")
        lease = _float(options, "readHoldLease")
        if lease == 0:
            raise InvalidUsage("option readHoldLease=0: a read hold's lease is a positive "
                               "number of seconds")
        tag = (_get(options, "tag") or "").strip() or None
        if tag is not None and (ts is not None or as_of is not None or version is not None):
            raise InvalidUsage("option tag and as_of/versionAsOf/timestampAsOf all say what to "
                               "read as of: give one")
        feed = _bool(options, "readChangeFeed", False)
        first, last = _int(options, "startingVersion"), _int(options, "endingVersion")
        if feed and (ts is not None or as_of is not None or version is not None
                     or tag is not None):
            raise InvalidUsage("readChangeFeed reads the updates from startingVersion to "
                               "endingVersion: as_of, versionAsOf and timestampAsOf do not "
                               "apply to it")
        if not feed and (first is not None or last is not None):
            raise InvalidUsage("options startingVersion/endingVersion bound a change feed: "
                               "set readChangeFeed=true (or read as of a time with as_of)")
        if feed and first is None:
            raise InvalidUsage("readChangeFeed needs startingVersion (the first time, "
                               "inclusive)")
        if first is not None and last is not None and last < first:
            raise InvalidUsage(f"endingVersion={last} is below startingVersion={first}")
        return cls(
            target=target,
            as_of=as_of if as_of is not None else version,
            mode="raw" if mode == "raw" else "consolidated",
            num_partitions=_int(options, "numPartitions", minimum=1),
            partition_rows=_int(options, "partitionRows", minimum=1),
            starting_upper=starting,
            max_rows_per_trigger=_int(options, "maxRowsPerTrigger", minimum=1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            read_hold=hold.strip() if hold and hold.strip() else None,
            read_hold_lock_timeout=(_float(options, "readHoldLockTimeout")
                                    or READ_HOLD_LOCK_TIMEOUT),
            refresh_interval=_float(options, "refreshInterval"),
            filter_pushdown=_pushdown(options),
            audit_pruning=_bool(options, "auditPruning", audit_default()),
            timestamp_as_of=ts,
            change_feed=feed,
            starting_version=first,
            ending_version=last,
            tag=tag,
            read_hold_lease=7 * 86400.0 if lease is None else lease,
        )


#: Default ``writerIdleTimeout``: long enough to span the gap between back-to-back
#: micro-batches (about 0.1-0.5 s on a busy stream), short enough that another writer of the
#: location gets the lock about a second after the stream goes idle or stops (a
#: ``persist.open`` right after ``awaitTermination()`` still needs a ``lock_timeout``).
WRITER_IDLE_TIMEOUT = 1.0


@dataclass(frozen=True)
class WriteOptions:
    """Options of ``df.write`` / ``df.writeStream``."""

    target: Target
    #: Arrow types for a collection the write creates (None: from the DataFrame's schema).
    key_type: pa.DataType | None
    value_type: pa.DataType | None
    #: Batch: the upper to seal to (None: max time + 1).
    upper: int | None
    #: Streaming: names this sink's progress record (None: derived from the streaming query's
    #: id, so one per checkpoint; see :mod:`operators.sink`).
    sink_id: str | None
    #: The writer lock's reentrance id (None: one per write job, retries in it re-enter).
    reentrance_id: str | None
    lock_timeout: float
    #: Evolve the collection's schema first when the DataFrame adds nullable struct fields.
    merge_schema: bool = False
    #: Streaming: seconds the sink keeps its writer (and so the location's writer lock) open
    #: after a micro-batch's commit, for the next one to reuse; 0 closes it after every commit.
    writer_idle_timeout: float = WRITER_IDLE_TIMEOUT

    @classmethod
    def parse(cls, options: Mapping[str, str], kind: Kind = "write") -> WriteOptions:
        """Parses and validates every write option (default lock timeout 60 s; 0 means 60 s;
        mergeSchema false; a stream's writerIdleTimeout 1 s, where 0 means close at once).

        ``kind`` is ``"write"`` (batch) or ``"stream-write"``.

        Raises:
            InvalidUsage: an option ``kind`` does not support, a missing target, a malformed
                value, or a ``key_type``/``value_type`` that is not an Arrow type persist
                stores and Spark reads.
        """
        from operators.schema import parse_arrow_type

        check_keys(options, kind)
        target = Target.parse(options)
        key_alias, value_alias = _get(options, "key_type"), _get(options, "value_type")
        sink_id = _get(options, "sinkId")
        rid = _get(options, "reentranceId")
        idle = _float(options, "writerIdleTimeout")
        if idle is not None and not math.isfinite(idle):
            raise InvalidUsage(f"option writerIdleTimeout={idle} must be a finite number of "
                               f"seconds")
        return cls(
            target=target,
            key_type=parse_arrow_type(key_alias, option="key_type") if key_alias else None,
            value_type=(parse_arrow_type(value_alias, option="value_type")
                        if value_alias else None),
            upper=_int(options, "upper"),
            sink_id=sink_id.strip() if sink_id and sink_id.strip() else None,
            reentrance_id=rid.strip() if rid and rid.strip() else None,
            lock_timeout=_float(options, "lockTimeout") or LOCK_TIMEOUT,
            merge_schema=_bool(options, "mergeSchema", False),
            # NB: unlike lockTimeout, 0 is meaningful here (no writer kept between commits)
            writer_idle_timeout=WRITER_IDLE_TIMEOUT if idle is None else idle,
        )
