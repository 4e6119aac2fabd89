"""Options of the ``persist`` Spark source and sink, parsed once into frozen records.

Spark hands a Python data source its options as a case-insensitive mapping whose keys arrive
lower-cased (``maxRowsPerTrigger`` is ``maxrowspertrigger``): every lookup here goes through
:func:`_get` with the documented spelling, and the mapping is never copied into a plain dict.
``storage_options.<name>`` options are passed to persist's storage client as
``storage_options={name: value}`` ("true"/"false" become booleans).

The location is the path given to ``load()``/``save()`` (or a ``path`` option).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from persist.errors import InvalidUsage

STORAGE_PREFIX = "storage_options."

Mode = Literal["consolidated", "raw"]


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


def _storage_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return raw


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
                "(or .option('path', ...))"
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


@dataclass(frozen=True)
class ReadOptions:
    """Options of ``spark.read`` / ``spark.readStream``."""

    target: Target
    #: Batch: the time to read as of (``as_of`` or Delta's ``versionAsOf``); None: upper - 1.
    as_of: int | None
    mode: Mode
    #: Batch, consolidated: key-hash buckets (None: by size). Raw: ignored.
    num_partitions: int | None
    #: Batch raw mode and streaming: small parts are grouped into a partition up to this size.
    partition_rows: int
    #: Streaming: "earliest", "latest" or a time.
    starting_upper: str | int
    max_rows_per_trigger: int | None
    fail_on_data_loss: bool
    read_hold: str | None
    read_hold_lock_timeout: float
    #: Streaming: seconds between metadata polls behind latestOffset (None: by location).
    refresh_interval: float | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Parses and validates every read option (defaults: consolidated, earliest, 1 M
        partition rows, failOnDataLoss, a 10 s hold lock timeout; a 0 timeout means 10 s).

        Raises:
            InvalidUsage: a missing target, a malformed or out-of-range value, or ``as_of``
                and ``versionAsOf`` that disagree.
        """
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
        return cls(
            target=target,
            as_of=as_of if as_of is not None else version,
            mode="raw" if mode == "raw" else "consolidated",
            num_partitions=_int(options, "numPartitions", minimum=1),
            partition_rows=_int(options, "partitionRows", minimum=1) or 1_000_000,
            starting_upper=starting,
            max_rows_per_trigger=_int(options, "maxRowsPerTrigger", minimum=1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            read_hold=hold.strip() if hold and hold.strip() else None,
            read_hold_lock_timeout=_float(options, "readHoldLockTimeout") or 10.0,
            refresh_interval=_float(options, "refreshInterval"),
        )


@dataclass(frozen=True)
class WriteOptions:
    """Options of ``df.write`` / ``df.writeStream``."""

    target: Target
    #: Arrow types for a collection the write creates (None: from the DataFrame's schema).
    key_type: pa.DataType | None
    value_type: pa.DataType | None
    #: Batch: the upper to seal to (None: max time + 1).
    upper: int | None
    #: Streaming: names this sink's progress record (default: the collection's name).
    sink_id: str
    #: The writer lock's reentrance id (None: one per write job, retries in it re-enter).
    reentrance_id: str | None
    lock_timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Parses and validates every write option (default lock timeout 60 s; 0 means 60 s).

        Raises:
            InvalidUsage: a missing target, a malformed value, or a ``key_type``/``value_type``
                that is not an Arrow type persist stores and Spark reads.
        """
        from operators.schema import parse_arrow_type

        target = Target.parse(options)
        key_alias, value_alias = _get(options, "key_type"), _get(options, "value_type")
        sink_id = _get(options, "sinkId")
        rid = _get(options, "reentranceId")
        return cls(
            target=target,
            key_type=parse_arrow_type(key_alias, option="key_type") if key_alias else None,
            value_type=(parse_arrow_type(value_alias, option="value_type")
                        if value_alias else None),
            upper=_int(options, "upper"),
            sink_id=sink_id.strip() if sink_id and sink_id.strip() else target.collection,
            reentrance_id=rid.strip() if rid and rid.strip() else None,
            lock_timeout=_float(options, "lockTimeout") or 60.0,
        )
