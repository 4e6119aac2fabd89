"""The native write path: Spark's own Parquet writer writes a batch's part files.

    import operators
    operators.write(df, "file:///data/loc", "events")                    # append, sealed
    operators.write(df, url, "events", token=("nightly-load", 7))        # lands once

The ``persist`` sink (``df.write.format("persist")``) hands every row to a Python worker as
Arrow, which then sorts and encodes it: about 60% of the sink's time is Spark handing the rows
over. Here the rows never leave the JVM. The DataFrame is sorted within its partitions by
``key`` (ascending, nulls last: persist's order for the types taken,
:data:`persist.distributed.adopt.NATIVE_TYPES`; see :data:`SORTS` for why the key alone) and
written by ``df.write.parquet`` with zstd (level 1), page checksums, row groups of persist's
batch size (64 Ki rows) and parquet-mr's page index, into a staging directory under a staging lease
(:func:`persist.distributed.staging`). The driver then adopts each file
(:func:`persist.distributed.adopt`: one read of the file for persist's crc32c, its footer,
its times and diffs, and a check of its rows' full ``(key, value, time)`` order, recorded only
where it holds) and commits them all once through the engine's
:class:`~persist.distributed.Committer`, with the optional idempotency ``token``: the same
exactly-once commit, lease and kill-safety the sink has. A driver killed before the commit
leaves only files under its lease's directory, which the sweeps reclaim once it lapses.

What the native path does not take goes through the ``persist`` sink, with the same outcome:
key or value types outside ``NATIVE_TYPES`` (floats, timestamps, decimals, unsigned, records,
lists...), a DataFrame whose key or value Spark type is not the collection's own, and
``mode="overwrite"``. :class:`Written` says which path ran and why. A ``token`` needs the
native path (the sink's batch write has no token): asking for one where it cannot run is
refused before anything is written.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from operators.options import LOCK_TIMEOUT, WriteOptions
from operators.s3a import effective, java_classes, session_unset
from operators.schema import arrow_type_for
from operators.sink import prepare
from persist import InvalidUsage, PersistError
from persist.distributed import (
    Committer,
    Stager,
    Staging,
    Token,
    adopt,
    clean_staging,
    hadoop_options,
    native_types,
    s3a_failure,
    staging,
)

log = logging.getLogger("persist.spark")

#: What ``write(sort=...)`` takes: ``"key"`` (True): Spark sorts each partition by the key
#: alone, which it radix-sorts when the key is an integer type (one sort prefix decides the
#: order), and the adoption records a file sorted where its rows turn out in persist's full
#: ``(key, value, time)`` order (unique keys per partition, or ties already in order);
#: ``"full"``: Spark sorts by all three (its comparison sort: measured 1.9x the key-only sort
#: of 5 M int64 rows), every file then checked sorted; False (``"none"``): no sort, no order
#: recorded. A file not recorded sorted reads exactly all the same: readers and compaction
#: sort it themselves.
SORTS = ("key", "full", "none")

#: How often the driver renews the staging lease while Spark writes (seconds): well within
#: the lease's 10 minutes.
RENEW_SECONDS = 60.0


@dataclass(frozen=True)
class Written:
    """What :func:`write` did."""

    #: Spark's Parquet writer wrote the parts (False: the ``persist`` sink did).
    native: bool
    #: Why the sink wrote them (None when native).
    why: str | None = None
    #: Part files adopted and committed (native only).
    parts: int = 0
    #: Rows committed (native only; 0 when the token was already applied).
    rows: int = 0
    #: False: nothing was committed (the token was already applied, or no rows and no upper).
    landed: bool = True


def write(df: DataFrame, url: str, collection: str, *,
          mode: Literal["append", "overwrite"] = "append", upper: int | None = None,
          token: tuple[str, int] | None = None,
          storage_options: Mapping[str, Any] | None = None,
          key_type: str | None = None, value_type: str | None = None,
          lock_timeout: float = LOCK_TIMEOUT, native: bool | None = None,
          sort: bool | Literal["key", "full", "none"] = True) -> Written:
    """Appends ``df``'s updates (``key, value, time, diff``) to ``collection`` at ``url`` and
    seals to ``upper`` (default: max time + 1), in one atomic commit: natively when it can (see
    the module docstring), else through the ``persist`` sink.

    Args:
        mode: ``"append"``, or ``"overwrite"`` (always the sink's: see its docs).
        token: ``(id, seq)``: the commit's idempotency token; a write whose seq is not above
            the last one recorded under ``id`` lands nothing (a retried job lands once).
        key_type, value_type: Arrow type names for a collection this write creates (as the
            sink's options of those names).
        native: True: refuse rather than take the sink; False: always the sink; None: native
            when it can.
        sort: how Spark sorts each partition before writing it (:data:`SORTS`): ``"key"``
            (True, the default) by the key alone, the part recorded sorted where the
            adoption finds its rows in persist's full ``(key, value, time)`` order;
            ``"full"`` by all three (every part recorded sorted; Spark's slower sort, worth
            it where many rows share a key and the parts are read consolidated before
            compaction rewrites them); ``"none"`` (False) no sort (about half of a native
            write's time with a three-column sort, measured in docs/spark.md). A part not
            recorded sorted costs consolidated and key-range reads a sort until compaction
            rewrites it; every read is exact either way.

    Raises:
        InvalidUsage: bad arguments; ``native=True`` or a ``token`` where the native path
            cannot run; rows at a null, negative or sealed time.
        SchemaMismatch: the DataFrame does not fit the collection.
        PersistError: the commit failed (nothing landed; the staged files are deleted).
    """
    if not isinstance(df, DataFrame):
        raise InvalidUsage(f"write: df must be a pyspark DataFrame, not {type(df).__name__}")
    if mode not in ("append", "overwrite"):
        raise InvalidUsage(f"write: mode must be 'append' or 'overwrite', not {mode!r}")
    order = "key" if sort is True else "none" if sort is False else sort
    if order not in SORTS:
        raise InvalidUsage(f"write: sort must be True, False or one of {SORTS}, not {sort!r}")
    if token is not None and not (isinstance(token, tuple) and len(token) == 2
                                  and isinstance(token[0], str) and token[0]
                                  and isinstance(token[1], int)
                                  and not isinstance(token[1], bool) and token[1] >= 0):
        raise InvalidUsage(f"write: token must be (id: non-empty str, seq: int >= 0), not "
                           f"{token!r}")
    options: dict[str, str] = {"path": url, "collection": collection,
                               "lockTimeout": str(lock_timeout)}
    if upper is not None:
        options["upper"] = str(upper)
    if key_type is not None:
        options["key_type"] = key_type
    if value_type is not None:
        options["value_type"] = value_type
    for k, v in (storage_options or {}).items():
        options[f"storage_options.{k}"] = str(v)
    opts = WriteOptions.parse(options, "write")
    rid = f"persist-spark-native-write:{uuid.uuid4().hex}"
    types = prepare(opts, df.schema, rid)
    why = _why_not_native(df, types.key, types.value, mode) if native is not False else \
        "native=False"
    if why is not None:
        if native:
            raise InvalidUsage(f"write to {collection!r}: the native path cannot take it "
                               f"({why}); nothing was written")
        if token is not None:
            raise InvalidUsage(f"write to {collection!r} with a token needs the native path, "
                               f"which cannot take it ({why}); nothing was written")
        _sink(df, mode, options)
        return Written(native=False, why=why)
    return _native(df, opts, types.schema_id, rid, token, order)


def _why_not_native(df: DataFrame, key: Any, value: Any, mode: str) -> str | None:
    """Why ``df`` goes through the sink (None: it need not)."""
    if mode != "append":
        return f"mode={mode!r}"
    if not native_types(key, value):
        return f"key {key} / value {value}: not types Spark's Parquet writer stores as persist"
    fields = {f.name: f.dataType for f in df.schema.fields}
    for col, want in (("key", key), ("value", value)):
        have = arrow_type_for(fields[col], column=col)
        if have != want:
            return f"the DataFrame's {col} is {fields[col].simpleString()}, the collection's {want}"
    return None


def _sink(df: DataFrame, mode: str, options: Mapping[str, str]) -> None:
    """The ``persist`` sink's write of ``df`` (the format registered if it is not yet)."""
    from operators.datasource import PersistDataSource

    df.sparkSession.dataSource.register(PersistDataSource)
    path = options["path"]
    rest = {k: v for k, v in options.items() if k != "path"}
    df.write.format("persist").mode(mode).options(**rest).save(path)


def _spark_url(url: str) -> str:
    """Hadoop's name for the store of ``url`` (``s3://`` is S3A's ``s3a://``)."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


@contextlib.contextmanager
def _renewing(stager: Stager) -> Iterator[None]:
    """Renews ``stager``'s lease every :data:`RENEW_SECONDS` while Spark writes (no task of
    persist's runs meanwhile to renew it)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                stager.renew(at_most_every=0)
            except PersistError as e:  # adopt() renews again and raises it
                log.warning("renewing staging lease %s failed: %s", stager.lease_id, e)

    t = threading.Thread(target=loop, name="persist-native-write-lease", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def _write_parquet(df: DataFrame, st: Staging, sort: str, hadoop: Mapping[str, str]) -> None:
    """Spark writes ``df`` as part files into ``st``'s directory (each partition sorted as
    ``sort``, one of :data:`SORTS`), with the Hadoop settings ``hadoop`` (S3A's, from the
    location's ``storage_options``).

    NB: Spark's ``FileOutputCommitter`` writes each task's file under ``_temporary/`` in the
    directory and renames it into place when the task commits (algorithm 2: one rename per
    file, at task commit; the job commit only cleans up). On S3A a rename is a server-side
    COPY and a DELETE: no byte goes through Spark, and every key it makes, temporary or not,
    lies in the lease's directory. Writing to the final key without the copy needs the S3A
    magic committer, which Spark binds only through spark-hadoop-cloud's commit protocol, a
    session-wide setting (DESIGN.md §11a)."""
    rows = df.select(F.col("key"), F.col("value"), F.col("time").cast("long").alias("time"),
                     F.col("diff").cast("long").alias("diff"))
    by = {"key": [F.col("key").asc_nulls_last()],
          "full": [F.col("key").asc_nulls_last(), F.col("value").asc_nulls_last(),
                   F.col("time").asc()],
          "none": []}[sort]
    ordered = rows.sortWithinPartitions(*by) if by else rows
    (ordered.write.mode("errorifexists")
     .options(**hadoop)
     .option("mapreduce.fileoutputcommitter.algorithm.version", "2")
     .option("compression", "zstd")
     .option("parquet.compression.codec.zstd.level", "1")
     .option("parquet.page.write-checksum.enabled", "true")
     .option("parquet.block.row.count.limit", str(st.batch_rows))
     .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
     .parquet(_spark_url(st.url)))


def _s3a_failure(spark: Any, url: str, e: BaseException,
                 hadoop: Mapping[str, str]) -> PersistError | None:
    """persist's error for ``e`` when it is S3A's failure to reach ``url`` (else None)."""
    if not url.startswith("s3://"):
        return None
    classes, last = java_classes(e)
    return s3a_failure(_spark_url(url), classes, effective(spark, dict(hadoop)), last)


def _native(df: DataFrame, opts: WriteOptions, schema_id: int, rid: str,
            token: tuple[str, int] | None, sort: str) -> Written:
    target = opts.target
    name = target.collection
    stager = Stager.start(target.url, name, job=f"spark native write to {name!r}",
                          storage_options=target.storage_options, schema_version=schema_id)
    st = staging(stager)
    parts = []
    spark = df.sparkSession
    hadoop = session_unset(spark, hadoop_options(target.url, target.storage_options))
    try:
        with _renewing(stager):
            try:
                _write_parquet(df, st, sort, hadoop)
            except Exception as e:
                # NB: S3A's failures to reach the store (connector, credentials, endpoint)
                # are told by the Java classes of the cause chain, as a native read's.
                failure = _s3a_failure(spark, st.url, e, hadoop)
                if failure is not None:
                    raise failure from None
                raise
        # NB: with a token, a retry of a write that landed has rows below the upper now:
        # staged anyway, and its commit drops them by the token (one that did not land and
        # has rows below the upper is refused by the commit).
        parts = adopt(st, replay=token is not None, ordered=sort != "none")
        seal = opts.upper
        if seal is None and parts:
            seal = max(p.max_time for p in parts) + 1
        landed = False
        if seal is not None:
            committer = Committer(target.url, reentrance_id=rid,
                                  storage_options=target.storage_options,
                                  lock_timeout=opts.lock_timeout)
            landed = committer.commit({name: parts} if parts else None, seals={name: seal},
                                      token=None if token is None else Token(*token))
    finally:
        try:
            clean_staging(st)
        except PersistError as e:
            log.warning("cleaning staging directory %s failed (%s); it is reclaimed once its "
                        "lease lapses", st.prefix, e)
        stager.release(parts)
    return Written(native=True, parts=len(parts) if landed else 0,
                   rows=sum(p.rows for p in parts) if landed else 0, landed=landed)


__all__ = ["Written", "write"]
