"""The native read path: a collection as a Spark DataFrame read by Spark's own Parquet reader.

    from operators import PersistTable
    df = PersistTable.forPath(spark, "s3://bucket/loc", "events").toDF()           # consolidated
    raw = PersistTable.forPath(spark, url, "events").toDF(as_of=41, consolidated=False)
    PersistTable.forPath(spark, url, "events").optimize()   # compacted by a Spark job

Shaped like Delta's ``DeltaTable.forPath(spark, path).toDF()``. The Python data source
(``format("persist")``, :mod:`operators.source`) is capped by the Python Data Source API
(measured on Spark 4.0-4.1: any such source, persist's or a trivial one, reaches 0.39-0.71x
``spark.read.parquet``, and is never told which columns a query needs); this path hands Spark's built-in reader the part files of a snapshot
(part format 4: plain, sorted Parquet files), so a query gets column pruning, predicate
pushdown, vectorized decoding and verified page checksums. The engine plans the read
and says, piece by piece, which parts are such files and what to apply to their rows
(:func:`persist.distributed.read_native`: a ``NativePlan`` of ``FileRead`` pieces, each with
its ``Residual``: the time bound and forwarding, the key range with its exactness, and whether
the rows must still be summed); this module only translates each residual into Spark Column
expressions. Everything else goes through the Python path, in Spark tasks, so the answer is
the Python source's:

* **raw** (``consolidated=False``): the files' rows at or before ``as_of`` (``time <= as_of``,
  pushed down; left out when no file holds a later row, ``NativePlan.later_rows``: a pushed
  filter costs Spark's reader the page index reads), times forwarded to ``as_of``, unioned
  with the other parts' raw tasks;
* **consolidated**: one DataFrame per key range of the engine's plan (disjoint ranges of the
  sorted runs): that range's files, filtered to the range and to ``time <= as_of`` (pushed
  down, so Parquet's statistics and page index skip what other ranges need), coalesced into
  one Spark partition (no shuffle), then summed there with the range's other parts: by Spark's
  own aggregation where it groups as persist does (:func:`sql_groups`; one partition needs no
  exchange), else by ``mapInArrow`` through :func:`persist.distributed.consolidate`. The
  ranges are unioned: each key lives in one.
  A read whose parts are settled (``persist.distributed.settled``: consolidated, one time
  each, key-disjoint) is read as the raw read is: nothing to sum. A base with a few runs on
  top (``FileRead.runs``, the runs at most ``persist.distributed.RUNS_SHARE`` of the base's
  rows) is read raw too, the runs applied by key (:meth:`_Plan._layered`): the base rows of
  keys no run holds pass, the rest are summed with the runs' contents. A marked base part
  (compaction's marks step) comes with its marks (``FileRead.marks``): its file is scanned
  with its marked rows dropped (:func:`operators.marks.unmarked`, a bitmap tested against
  ``_metadata.row_index``), before anything else; the marks step's delta is then part of
  the settled base, read raw.

On S3, the location's ``storage_options`` configure Spark's S3A reader too: the engine maps
them to ``fs.s3a.*`` options of each read (:func:`persist.distributed.hadoop_options`; a key
the session sets itself wins), and S3A's failures to reach the store are persist's errors,
told by the Java exception classes of the failure (:func:`persist.distributed.s3a_failure`).
Files on ``s3a://`` are handed to Spark with their lengths (the engine knows them: a part is
never rewritten), so Spark's driver lists and checks none of them (it spent three requests per
named path); one HEAD per read checks that S3A reaches the store with the read's settings.
Before the metadata is read, ``forPath`` asks whether anything listens at the read's endpoint
(one TCP connection, no S3 request, :class:`_EarlyProbe`), so that a dead or mistyped endpoint
is persist's error within the time Spark's own read takes to fail.

What falls back to the Python path: inline parts, parts of formats 1-3, parts written under
another schema version (migrated exactly by the engine), parts with a time beyond 2**63 - 1,
parts of a store no other process can reach, and every part of a collection with a
``uint64`` anywhere in its types (Spark's Parquet reader makes it ``decimal(20, 0)``, the
Python source a checked ``long``).

A DataFrame is a plan over the snapshot's files: a part that GC removes before ``toDF`` saw it
gone (its tail check, the S3A probe, Spark's check of a local path) is planned again by the
engine (``read_native``, within the engine's one read budget: it checks which planned files
are gone, never Spark's message); one removed after fails the query (Spark's
``FAILED_READ_FILE``, never skipped), and :meth:`PersistTable.toDF` plans it again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

import persist
from operators.marks import unmarked
from operators.options import Target
from operators.partitions import BATCH_ROWS, TaskPartition
from operators.partitions import read as read_partition
from operators.s3a import effective as _effective
from operators.s3a import java_classes as _java_classes
from operators.s3a import session_unset as _unset
from operators.schema import CollectionTypes, from_spark, to_spark
from persist import InvalidUsage

if TYPE_CHECKING:
    from operators.native_write import Written

#: Spark reader options of every native read: verify page checksums (zstd alone does not
#: protect data), and fail rather than skip a missing or damaged file.
READER_OPTIONS = {
    "parquet.page.verify-checksum.enabled": "true",
    "ignoreMissingFiles": "false",
    "ignoreCorruptFiles": "false",
    "mergeSchema": "false",
}

#: The error of a consolidated read whose diffs of one ``(key, value)`` sum outside int64,
#: raised inside Spark's aggregation (a Spark error whose message starts with persist's error
#: name, ``DiffOverflow``, as persist's own consolidation raises it).
DIFF_OVERFLOW = ("DiffOverflow: the diffs of one (key, value) sum outside int64 "
                 "[-2**63, 2**63 - 1]: persist does not wrap a sum; append updates that bring "
                 "it back within int64 (read raw updates, or as of an earlier time, meanwhile)")


class PersistTable:
    """A persist collection for Spark's native reader (see the module docstring).

    Made with :meth:`forPath`; :meth:`toDF` reads it, :meth:`write` appends to it.
    """

    def __init__(self, spark: Any, target: Target, reader_options: dict[str, str]) -> None:
        self._spark = spark
        self._target = target
        self._reader_options = reader_options
        # NB: started before the metadata read, so that settings S3A cannot reach the store
        # with fail within the time Spark's own read takes to (_EarlyProbe)
        self._early = _EarlyProbe.start(spark, target, reader_options)
        # NB: the collection's metadata, held for the table's life and brought up to date by
        # each toDF (one GET of the next log key when nothing changed) instead of read anew
        # (a LIST of the rollups and a GET per log entry since the newest: 8 requests in the
        # S3 request test).
        self._watch = persist.distributed.Watch(
            target.url, target.collection, storage_options=target.storage_options)

    @classmethod
    def forPath(cls, spark: Any, url: str, collection: str, *,
                storage_options: Mapping[str, Any] | None = None,
                reader_options: Mapping[str, str] | None = None,
                **unknown: Any) -> PersistTable:
        """The collection ``collection`` of the location at ``url``.

        Args:
            spark: the SparkSession.
            url: the location (``file:///...``, a path, ``s3://bucket/prefix``).
            storage_options: how persist opens the location (as everywhere in persist).
                Spark's reader reaches the same store with the same settings: ``s3://`` is
                read as ``s3a://``, and the endpoint, region, credentials and addressing
                style become that read's ``fs.s3a.*`` options
                (:func:`persist.distributed.hadoop_options`), except a key the session sets
                itself (``spark.hadoop.fs.s3a.*``, or its Hadoop configuration): the
                session's setting wins.
            reader_options: more options for Spark's reader; they win over both (per-read
                Hadoop settings such as ``fs.s3a.endpoint``).

        Raises:
            InvalidUsage: an argument of the wrong type, or an unknown keyword.
            MissingResource: no location at ``url``.
            UnknownCollection: no such collection (the message lists those there are).
        """
        _no_unknown("PersistTable.forPath", unknown, ("storage_options", "reader_options"))
        if not hasattr(spark, "read") or not hasattr(spark, "createDataFrame"):
            raise InvalidUsage(f"PersistTable.forPath: spark must be a SparkSession, not "
                               f"{type(spark).__name__}")
        for what, v in (("url", url), ("collection", collection)):
            if not isinstance(v, str) or not v:
                raise InvalidUsage(f"PersistTable.forPath: {what} must be a non-empty str, "
                                   f"not {v!r}")
        for what, m in (("storage_options", storage_options),
                        ("reader_options", reader_options)):
            if m is not None and not isinstance(m, Mapping):
                raise InvalidUsage(f"PersistTable.forPath: {what} must be a mapping, not "
                                   f"{type(m).__name__}")
        opts = {str(k): str(v) for k, v in (reader_options or {}).items()}
        target = Target(url, tuple(sorted((storage_options or {}).items())), collection)
        # NB: the location and collection exist (the table's metadata is read here): said
        # now, not at toDF
        return cls(spark, target, opts)

    def info(self) -> persist.distributed.CollectionInfo:
        """The collection as the location's latest metadata shows it."""
        return self._watch.current(fresh=True)

    def write(self, df: Any, *, mode: Literal["append", "overwrite"] = "append",
              upper: int | None = None, token: tuple[str, int] | None = None,
              native: bool | None = None,
              sort: bool | Literal["key", "full", "none"] = True) -> Written:
        """Appends ``df``'s updates (``key, value, time, diff``) to the collection and seals
        to ``upper``, in one atomic commit: by Spark's own Parquet writer when the native
        write path takes it, else by the ``persist`` sink, with the same outcome (the
        location's ``storage_options`` configure both). :func:`operators.write` with this
        table's location, collection and storage options: its arguments, errors and result
        (:class:`operators.Written`, saying which path ran and why)."""
        from operators.native_write import write

        t = self._target
        return write(df, t.url, t.collection, mode=mode, upper=upper, token=token,
                     storage_options=dict(t.storage_options), native=native, sort=sort)

    def toDF(self, *, as_of: int | None = None, consolidated: bool = True,
             partitions: int | None = None, **unknown: Any) -> Any:
        """The collection as of ``as_of`` as a Spark DataFrame of ``key, value, time, diff``,
        the Python source's schema (``operators/schema.py``).

        Args:
            as_of: the time to read as of, in ``[since, upper)`` (None: ``upper - 1``, the
                latest sealed time).
            consolidated: each ``(key, value)`` once with its diffs summed (never 0), time
                ``as_of``; False: the raw updates at or before ``as_of``, times forwarded to
                it.
            partitions: a consolidated read's number of key ranges at most (default: the
                engine's, one per 4 M rows; fewer when the parts' order allows no more
                within 1.5x decoding).

        Raises:
            InvalidUsage: ``as_of`` outside ``[since, upper)`` or not an int, nothing sealed
                yet, ``consolidated`` not a bool, ``partitions`` below 1, an unknown keyword
                (the message lists the valid ones); an ``s3://``
                location on a Spark without the S3A connector (use the Python source,
                ``spark.read.format("persist")``, there).
            SchemaMismatch: the key or value has no Spark type.
            PartMissing: GC kept removing parts while this read was planned.
            ChecksumMismatch: a part file's footer or page index (which Spark's reader
                trusts, and no page checksum covers) is not what persist wrote.
        """
        _no_unknown("toDF", unknown, ("as_of", "consolidated", "partitions"))
        if as_of is not None and (isinstance(as_of, bool) or not isinstance(as_of, int)):
            raise InvalidUsage(f"toDF: as_of must be an int time or None, not {as_of!r}")
        if not isinstance(consolidated, bool):
            raise InvalidUsage(f"toDF: consolidated must be a bool, not {consolidated!r}")
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions < 1):
            raise InvalidUsage(f"toDF: partitions must be an int >= 1 or None, not "
                               f"{partitions!r}")

        def build(plan: persist.distributed.NativePlan) -> Any:
            types = CollectionTypes.of(plan.info)
            options = _read_options(self._spark, t, self._reader_options)
            early, self._early = self._early, None  # NB: its answer is used once
            return _Plan(self._spark, types, options, early).read(plan)

        t = self._target
        return persist.distributed.read_native(
            t.url, t.collection, build, as_of=as_of, consolidated=consolidated, n=partitions,
            files=lambda info: native_types(CollectionTypes.of(info)),
            storage_options=t.storage_options, watch=self._watch)

    def optimize(self, *, partitions: int | None = None,
                 reentrance_id: str = "persist-optimize", lock_timeout: float = 60.0,
                 part_target_bytes: int = 64 << 20, **unknown: Any) -> Any:
        """Compacts the collection into a base of key-disjoint consolidated parts by a Spark
        job, as Delta's ``OPTIMIZE`` (:mod:`operators.optimize`): after it, a consolidated
        :meth:`toDF` at or after the since reads the parts as they are, with nothing to sum.

        Args:
            partitions: key ranges (Spark tasks) at most (None: the session's default
                parallelism, and one per ``operators.optimize.TASK_ROWS`` planned rows at
                most: a small collection is merged by one task).
            reentrance_id, lock_timeout: the writer identity the driver commits as, and how
                long it waits for the location's lock.
            part_target_bytes: the merged parts' size target (Arrow bytes).

        Returns:
            An :class:`operators.optimize.Optimized` (the commit's seq, parts and rows), or
            None if there was nothing to merge.

        Raises:
            PartsChanged: a planned part changed while the job ran (another writer compacted
                it): nothing committed, the staged parts discarded; run it again.
            LeaseRevoked: the job outlived its staging lease: nothing committed.
            LockHeld: another writer held the location's lock for ``lock_timeout``.
            InvalidUsage: an argument of the wrong type or an unknown keyword.
            DiffOverflow: a ``(key, value)``'s diffs sum outside int64 (nothing committed).
        """
        _no_unknown("optimize", unknown, ("partitions", "reentrance_id", "lock_timeout",
                                          "part_target_bytes"))
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions < 1):
            raise InvalidUsage(f"optimize: partitions must be an int >= 1 or None, not "
                               f"{partitions!r}")
        from operators.optimize import optimize

        t = self._target
        return optimize(self._spark, t.url, t.collection, storage_options=t.storage_options,
                        partitions=partitions, reentrance_id=reentrance_id,
                        lock_timeout=lock_timeout, part_target_bytes=part_target_bytes)


def _no_unknown(where: str, unknown: Mapping[str, Any], valid: tuple[str, ...]) -> None:
    """Raises ``InvalidUsage`` naming the keywords of ``unknown`` (a typo) and the valid ones."""
    if unknown:
        raise InvalidUsage(f"{where}: unknown keyword{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(sorted(unknown))}; the keywords are "
                           f"{', '.join(valid)}")


def _nowhere(t: pa.DataType, bad: Callable[[pa.DataType], bool]) -> bool:
    """Whether no type in ``t`` (itself, or a field or item of a record or list, at any
    depth) is ``bad``."""
    if bad(t):
        return False
    if pa.types.is_struct(t):
        return all(_nowhere(t.field(i).type, bad) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _nowhere(t.value_type, bad)
    return True


def native_types(types: CollectionTypes) -> bool:
    """Whether Spark's Parquet reader reads parts of ``types`` as the Python source's schema:
    not with a ``uint64`` anywhere (Spark reads it as ``decimal(20, 0)``)."""
    return all(_nowhere(t, pa.types.is_uint64) for t in (types.key, types.value))


def sql_groups(types: CollectionTypes) -> bool:
    """Whether Spark's ``groupBy("key", "value")`` groups rows of ``types`` as persist's
    consolidation does: when no float is anywhere in them. Spark normalizes floats in grouping
    keys (``-0.0`` groups with ``0.0``); persist keeps them two records (every NaN is one)."""
    return all(_nowhere(t, pa.types.is_floating) for t in (types.key, types.value))


#: The block size a file status of S3A reports (``fs.s3a.block.size``'s default), given to
#: the statuses :meth:`_Plan._known` makes. Spark splits a file by its own
#: ``spark.sql.files.maxPartitionBytes``, not by this.
S3A_BLOCK_BYTES = 32 << 20


def _spark_url(url: str) -> str:
    """Hadoop's name for the store of ``url`` (``s3://`` is S3A's ``s3a://``)."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


def _read_options(spark: Any, target: Target, reader_options: Mapping[str, str]
                  ) -> dict[str, str]:
    """The Hadoop options of a native read of ``target`` (before :data:`READER_OPTIONS`):
    its ``storage_options`` as ``fs.s3a.*`` keys the session does not set, then
    ``reader_options``."""
    return {**_unset(spark, persist.distributed.hadoop_options(
        target.url, target.storage_options)), **reader_options}


class _EarlyProbe:
    """Whether S3A can reach a table's store at all, asked by :meth:`PersistTable.forPath`
    before it reads the metadata, so that a mistyped or dead endpoint is persist's error
    within the time Spark's own read takes to fail (S3A's failure to connect, even to a
    closed port on loopback with its retries off, takes ~0.24 s in the AWS SDK, each time,
    and its probe (:meth:`_Plan._known`) could start only once the metadata named a file).

    No S3 request: one TCP connection to the endpoint S3A would connect to (the read's
    ``fs.s3a.endpoint``, its scheme's port; ``fs.s3a.connection.ssl.enabled`` for an
    endpoint without one), closed at once, in a thread of its own that ends with it (within
    the read's connect timeout, 5 s at most). Only a refusal (nothing listens there) or an
    unknown host (the name does not resolve) is an answer, S3A's endpoint error; anything
    else (connected, timed out, a transient resolver failure) is none, and the read's own
    probe decides as before. Asked only where that endpoint is where S3A's requests go:
    path-style addressing (a virtual-hosted request goes to ``<bucket>.<host>``), no proxy
    (``fs.s3a.proxy.host``, the JVM's ``http(s).proxyHost``, ``HTTP(S)_PROXY``), no
    per-bucket ``fs.s3a.bucket.<bucket>.*`` setting; else there is no probe.

    The answer is for the settings it was asked with (the read's options and the session's
    values of the S3A keys persist maps): :meth:`failure` says nothing for other ones (a
    session setting changed between ``forPath`` and ``toDF``), nor before the connection
    has its answer (the read does not wait for it), and a table uses it once.
    """

    #: The longest the probe's connection may take (the read's connect timeout, if shorter).
    CONNECT_SECONDS = 5.0

    def __init__(self, target: Target, address: tuple[str, int], timeout: float,
                 settings: tuple[Any, ...], used: dict[str, str]) -> None:
        self._target = target
        self._url = _spark_url(target.url)
        self._address = address
        self._timeout = timeout
        self._settings = settings
        self._used = used
        self._done = threading.Event()
        self._failure: persist.PersistError | None = None
        self.thread = threading.Thread(target=self._run, name="persist-s3a-probe",
                                       daemon=True)

    @classmethod
    def start(cls, spark: Any, target: Target, reader_options: Mapping[str, str]
              ) -> _EarlyProbe | None:
        """The probe of ``target``'s store with a read's settings (``reader_options`` over
        its ``storage_options``), started; None off S3, without a JVM here (a Spark Connect
        session), or where the endpoint is not where S3A connects (see the class)."""
        if not target.url.startswith("s3://") \
                or getattr(spark, "_jsparkSession", None) is None:
            return None
        options = _read_options(spark, target, reader_options)
        settings = cls.settings(spark, target, options)
        used, direct = dict(settings[1]), settings[2]
        endpoint = used.get("fs.s3a.endpoint", "")
        if not direct or not endpoint \
                or used.get("fs.s3a.path.style.access", "").strip().lower() != "true":
            return None
        secure = used.get("fs.s3a.connection.ssl.enabled", "true").lower() != "false"
        parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint
                                       else f"{'https' if secure else 'http'}://{endpoint}")
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:  # not a port: S3A's own probe says what is wrong
            return None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            return None
        timeout = cls.CONNECT_SECONDS
        with contextlib.suppress(ValueError):
            timeout = min(timeout, int(used.get("fs.s3a.connection.establish.timeout",
                                                "")) / 1000)
        probe = cls(target, (parsed.hostname, port), max(timeout, 0.001),
                    settings, used)
        probe.thread.start()
        return probe

    @staticmethod
    def settings(spark: Any, target: Target, options: dict[str, str]) -> tuple[Any, ...]:
        """What an answer is for: the read's options, the S3A settings it used, and whether
        its requests go straight to the endpoint (no proxy, no per-bucket setting)."""
        used = _effective(spark, options)
        bucket = target.url[len("s3://"):].split("/", 1)[0]
        per_bucket = f"fs.s3a.bucket.{bucket}."
        hadoop = spark._jsc.hadoopConfiguration()
        system = spark._jvm.java.lang.System
        direct = (not any(k.startswith(per_bucket) or k == "fs.s3a.proxy.host"
                          for k in options)
                  and hadoop.get("fs.s3a.proxy.host") is None
                  and hadoop.getPropsWithPrefix(per_bucket).isEmpty()
                  and not any(system.getProperty(f"{p}.proxyHost") for p in ("http", "https"))
                  and not any(os.environ.get(v) for v in ("HTTP_PROXY", "HTTPS_PROXY",
                                                          "http_proxy", "https_proxy")))
        return (tuple(sorted(options.items())), tuple(sorted(used.items())), direct)

    def _run(self) -> None:
        host, port = self._address
        try:
            with socket.create_connection((host, port), timeout=self._timeout):
                pass
        except ConnectionRefusedError as e:
            self._failure = self._error("java.net.ConnectException", f"{host}:{port}: {e}")
        except socket.gaierror as e:
            if e.errno == socket.EAI_NONAME:
                self._failure = self._error("java.net.UnknownHostException", f"{host}: {e}")
        except OSError:  # timed out, unreachable for now: no answer
            pass
        finally:
            self._done.set()

    def _error(self, java_class: str, detail: str) -> persist.PersistError | None:
        # NB: S3A's error for the same failure (the Java class its SDK raises for it), told
        # as the probe's own finding rather than as S3A's words
        error = persist.distributed.s3a_failure(self._url, [java_class], self._used)
        return None if error is None else type(error)(
            f"{error} (the probe of the endpoint before the read: {detail})")

    def failure(self, spark: Any, options: dict[str, str]) -> persist.PersistError | None:
        """persist's error for S3A's endpoint with ``options`` (a read's, before
        :data:`READER_OPTIONS`), if the probe has answered that nothing is there; None: no
        answer (yet), or asked with other settings."""
        if not self._done.is_set() or self._failure is None:
            return None
        return self._failure if self.settings(spark, self._target, options) \
            == self._settings else None


class _Plan:
    """One read of one snapshot scan, as DataFrames."""

    def __init__(self, spark: Any, types: CollectionTypes, options: dict[str, str],
                 early: _EarlyProbe | None = None) -> None:
        self.spark = spark
        self.types = types
        self.schema = types.spark_schema
        self._given = options
        self._early = early  # the table's probe of S3A's endpoint, asked before its metadata
        self.options = {**options, **READER_OPTIONS}
        self.sql_sum = sql_groups(types)
        self.times = True  # whether a file may hold rows after as_of (read() says)
        self._probed = False  # whether S3A reached the store with these settings (_known)

    def read(self, plan: persist.distributed.NativePlan) -> Any:
        """The DataFrame of ``plan`` (see the module docstring)."""
        # NB: a time filter pushed down makes Spark's Parquet reader fetch each row group's
        # page index (ranged GETs on S3: 76 against 42 for 4 files with S3A's classic
        # stream); when no file holds a row after as_of it keeps every row: left out.
        self.times = plan.later_rows
        frames = [self._piece(f) for f in plan.files]
        # NB: a consolidated read always has a Python-path child, empty or not. Each range is
        # one partition (SinglePartition), and Spark >= 4.1 unions children that all report
        # the same partitioning partition by partition (spark.sql.unionOutputPartitioning,
        # SPARK-52921): every range would run in one task, one after the other. A child
        # partitioned otherwise makes the union a plain concatenation: one task per range.
        if plan.tasks or not frames or any(f.residual.consolidate or f.runs is not None
                                           for f in plan.files):
            frames.append(self._python(list(plan.tasks)))
        return functools.reduce(lambda a, b: a.union(b), frames)

    def _piece(self, piece: persist.distributed.FileRead) -> Any:
        """One piece of the plan: its files read by Spark, filtered by its residual, summed
        with its other parts if the residual says so."""
        from pyspark.sql import functions as F

        r = piece.residual
        df = self._files(piece.urls, piece.sizes, piece.marks)
        cond = _where(r, times=self.times)
        if cond is not None:
            df = df.where(cond)
        if piece.runs is not None:
            return self._layered(df, piece.runs, r.as_of)
        if not r.consolidate:
            return df.withColumn("time", F.lit(r.as_of))
        assert piece.rest is not None
        if self.sql_sum and (r.keys is None or r.keys.exact):
            return self._summed(df, piece.rest, r.as_of)
        return df.coalesce(1).mapInArrow(_Consolidate(piece.rest, self.types), self.schema)

    def _files(self, urls: tuple[str, ...], sizes: tuple[int, ...] = (),
               marks: tuple[persist.distributed.FileMarks, ...] = ()) -> Any:
        """The files' rows (``key, value, time, diff``) of the files ``urls`` (of lengths
        ``sizes``, if known), a marked file's marked rows dropped (``marks``: its bitmap
        tested against ``_metadata.row_index``, one scan of every file,
        :func:`operators.marks.unmarked`).

        ``s3a://`` files of known lengths are handed to Spark as file statuses (:meth:`_known`):
        Spark's driver lists and checks nothing (it spent three requests per named path, or
        seven per folder plus one LIST per 5,000 objects), and one HEAD per read checks that
        S3A reaches the store with the read's settings. Other files (and every file of a
        Spark Connect session) are named to ``spark.read.parquet``, which checks that each
        exists.
        """
        paths = [_spark_url(u) for u in urls]
        try:
            # NB: a Spark Connect session has no JVM here to build the index in: paths
            if len(sizes) == len(paths) and paths and all(p.startswith("s3a://")
                                                          for p in paths) \
                    and getattr(self.spark, "_jsparkSession", None) is not None:
                df = self._known(paths, sizes)
            else:
                df = self.spark.read.options(**self.options).schema(self.schema).parquet(*paths)
        except Exception as e:
            # NB: S3A's failures to reach the store (missing connector, credentials,
            # endpoint) are told by the Java classes of the cause chain, never the message.
            s3a = [p for p in paths if p.startswith("s3a://")]
            if s3a:
                classes, last = _java_classes(e)
                failure = persist.distributed.s3a_failure(
                    s3a[0], classes, _effective(self.spark, self.options), last)
                if failure is not None:
                    raise failure from None
            raise
        if marks:
            df = unmarked(self.spark, df, {m.url: m.bitmap for m in marks})
        return df.select("key", "value", "time", "diff")

    def _known(self, paths: list[str], sizes: tuple[int, ...]) -> Any:
        """``paths`` read by Spark's Parquet source over a file index built from their known
        statuses (path and length: a part's blob is never rewritten, and the engine checked
        its tail at that length), with no listing.

        The index is Spark's own ``InMemoryFileIndex``, given the statuses through a
        ``FileStatusCache`` it reads instead of listing (a fresh client of the session's
        cache, emptied once the index holds them), in a ``HadoopFsRelation`` with this read's
        options: the relation ``spark.read.parquet`` builds, minus the listing. A file gone
        by the time the query runs fails it (``ignoreMissingFiles=false``: Spark's
        ``FAILED_READ_FILE``), never a short read. With the session's file status cache off
        (``spark.sql.hive.filesourcePartitionFileCacheSize=0``) the index lists each file
        itself: the same rows, Spark's requests.

        The first file is probed first (one HEAD through S3A with this read's Hadoop
        settings), so that settings S3A cannot reach the store with fail here, as persist's
        error (see :meth:`_files`), rather than in the query; a first file gone or of
        another length is ``PartMissing`` / ``ChecksumMismatch``. Before it, the table's
        probe of the endpoint (:class:`_EarlyProbe`), if it found nothing there with these
        settings, is raised instead.
        """
        from pyspark.sql import DataFrame

        jvm = self.spark._jvm
        session = self.spark._jsparkSession
        sources = jvm.org.apache.spark.sql.execution.datasources
        hadoop_fs = jvm.org.apache.hadoop.fs
        utils = jvm.org.apache.spark.api.python.PythonUtils
        options = utils.toScalaMap(dict(self.options))
        if not self._probed and self._early is not None:
            early, self._early = self._early, None
            failure = early.failure(self.spark, self._given)
            if failure is not None:
                raise failure from None
        if not self._probed:
            conf = session.sessionState().newHadoopConfWithOptions(options)
            first = hadoop_fs.Path(paths[0])
            status = first.getFileSystem(conf).getFileStatus(first)
            if status.getLen() != sizes[0]:
                raise persist.ChecksumMismatch(paths[0], f"the file is {status.getLen()} "
                                               f"bytes, persist wrote {sizes[0]}")
            self._probed = True
        cache = sources.FileStatusCache.getOrCreate(session)
        roots = []
        gateway = self.spark.sparkContext._gateway
        for path, size in zip(paths, sizes, strict=True):
            root = hadoop_fs.Path(path)
            status = gateway.new_array(hadoop_fs.FileStatus, 1)
            status[0] = hadoop_fs.FileStatus(size, False, 1, S3A_BLOCK_BYTES, 0, root)
            cache.putLeafFiles(root, status)
            roots.append(root)
        schema = session.parseDataType(self.schema.json())
        none = jvm.scala.Option.apply(None)
        no_partitions = getattr(sources, "PartitionSpec$").__getattr__("MODULE$").emptySpec()
        try:
            index = sources.InMemoryFileIndex(session, utils.toSeq(roots), options,
                                              jvm.scala.Option.apply(schema), cache,
                                              jvm.scala.Option.apply(no_partitions), none)
        finally:
            cache.invalidateAll()
        relation = sources.HadoopFsRelation(
            index, jvm.org.apache.spark.sql.types.StructType(), schema, none,
            sources.parquet.ParquetFileFormat(), options, session)
        return DataFrame(session.baseRelationToDataFrame(relation), self.spark)

    def _summed(self, files: Any, rest: persist.distributed.ReadTask, as_of: int) -> Any:
        """One key range consolidated by Spark's own aggregation, in one partition: the
        range's rows of ``files`` (filtered exactly) and the contents of its other parts
        (``rest``, consolidated by persist), summed per ``(key, value)``.

        NB: ``coalesce(1)`` makes the range one partition (no shuffle), which satisfies the
        aggregation's clustering: Spark plans no exchange, and the partial and final
        aggregation run in that partition's task. Exact where Spark's grouping is persist's
        (:func:`sql_groups`).
        """

        rows = files
        if rest.rows:
            rows = rows.unionByName(self._python([rest], partial=True))
        return _sum(rows.coalesce(1), as_of)

    def _layered(self, base: Any, runs: persist.distributed.ReadTask, as_of: int) -> Any:
        """The base's files (``base``: their rows at or before ``as_of``) with the runs applied
        by key (``FileRead.runs``): the rows of keys no run holds as they are, the rest summed
        with the runs' contents (read by persist, in one Spark task, twice: for the keys and
        for the sum).

        NB: the runs' keys are broadcast (they are at most ``RUNS_SHARE`` of the base), so
        each half is one pass over the base's files with a hash probe per row and no
        exchange of the base; Spark scans the files once per half. A null key never matches
        an equi-join: when a run may hold one (``null_keys``), every null-key row of the base
        is summed (exact either way).
        """
        from pyspark.sql import functions as F

        contents = self._python([runs], partial=True)
        keys = F.broadcast(contents.select(F.col("key").alias("_run_key")))
        hit = base["key"] == keys["_run_key"]
        passed = base.join(keys, hit, "left_anti")
        touched = base.join(keys, hit, "left_semi")
        if persist.distributed.null_keys(runs):
            passed = passed.where(F.col("key").isNotNull())
            touched = touched.unionByName(base.where(F.col("key").isNull()))
        passed = passed.withColumn("time", F.lit(as_of))
        if self.sql_sum:
            summed = _sum(touched.unionByName(contents), as_of)
        else:
            summed = touched.coalesce(1).mapInArrow(_Consolidate(runs, self.types), self.schema)
        return passed.unionByName(summed)

    def _python(self, tasks: list[persist.distributed.ReadTask], *, partial: bool = False
                ) -> Any:
        """The engine's tasks read by persist in Spark tasks (one each); ``partial``:
        consolidated tasks that hold only some parts of their range (see :class:`_ReadTasks`)."""
        rows = [(t.to_bytes(),) for t in tasks]
        seed = self.spark.createDataFrame(
            self.spark.sparkContext.parallelize(rows, max(1, len(rows))), "task binary")
        return seed.mapInArrow(_ReadTasks(self.types, partial=partial), self.schema)

def _sum(rows: Any, as_of: int) -> Any:
    """``rows`` summed per ``(key, value)`` by Spark's aggregation, zero sums dropped, time
    ``as_of`` (exact where Spark groups as persist does: :func:`sql_groups`)."""
    from pyspark.sql import functions as F

    # NB: try_sum is null where the sum leaves int64 (a plain sum fails with Spark's own
    # ArithmeticException under ANSI, and wraps without it): persist's error instead.
    total = F.try_sum("diff")
    diff = F.when(total.isNull(), F.raise_error(F.lit(DIFF_OVERFLOW))).otherwise(total)
    return (rows.groupBy("key", "value").agg(diff.alias("diff"))
            .where(F.col("diff") != 0)
            .select("key", "value", F.lit(as_of).alias("time"), "diff"))


def _where(r: persist.distributed.Residual, *, times: bool = True) -> Any | None:
    """A residual's filter as a Spark condition, pushed to Spark's reader (its row groups and
    pages of other times and ranges are skipped), or None for none; ``times``: keep the
    ``time <= as_of`` bound (False: no file holds a later row). Spark orders NaN above every
    number and a null key satisfies no comparison, the order the engine's bounds are meant
    in."""
    from pyspark.sql import functions as F

    conds = [F.col("time") <= r.as_of] if times else []
    k = r.keys
    key = F.col("key")
    if k is not None and k.hi is not None:
        conds.append(key < F.lit(k.hi))
    if k is not None and k.lo is not None:
        above = key >= F.lit(k.lo)
        conds.append(above | key.isNull() if k.nulls else above)
    if not conds:
        return None
    return functools.reduce(lambda a, b: a & b, conds)


class _ReadTasks:
    """``mapInArrow``: engine tasks (their bytes) read by persist, in Spark's layout.

    ``partial``: consolidated tasks holding only the parts of their key range that Spark's
    reader does not read (:func:`persist.distributed.parquet_task`), read without re-planning:
    ``read_task`` re-plans a consolidated task whose part GC removed over every part of its
    range, which here would count the files Spark reads twice.
    """

    def __init__(self, types: CollectionTypes, *, partial: bool = False) -> None:
        self.types = types
        self.partial = partial

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for raw in b.column("task").to_pylist():
                task = persist.distributed.ReadTask.from_bytes(raw)
                if not self.partial:
                    yield from read_partition(TaskPartition(task, self.types))
                    continue
                out = persist.distributed.consolidate(task, task.schema.empty_table())
                yield from to_spark(out, self.types.arrow_schema, time=task.as_of).to_batches(
                    max_chunksize=BATCH_ROWS)


class _Consolidate:
    """``mapInArrow`` of one key range: every row Spark's reader decoded for it (one
    partition), summed with the range's other parts by the engine."""

    def __init__(self, rest: persist.distributed.ReadTask, types: CollectionTypes) -> None:
        self.rest = rest
        self.types = types

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrow = self.types.arrow_schema
        got = list(batches)
        table = pa.Table.from_batches(got) if got else arrow.empty_table()
        # NB: Spark's layout back to the stored types (records field by field; the engine
        # casts the rest exactly), so rows from the files and from the other parts group as
        # one.
        out = persist.distributed.consolidate(self.rest, from_spark(table, self.types))
        yield from to_spark(out, arrow, time=self.rest.as_of).to_batches(
            max_chunksize=BATCH_ROWS)
