"""The native read path: a collection as a Spark DataFrame read by Spark's own Parquet reader.

    from operators import PersistTable
    df = PersistTable.forPath(spark, "s3://bucket/loc", "events").toDF()           # consolidated
    raw = PersistTable.forPath(spark, url, "events").toDF(as_of=41, consolidated=False)

Shaped like Delta's ``DeltaTable.forPath(spark, path).toDF()``. The Python data source
(``format("persist")``, :mod:`operators.source`) is capped by the Python Data Source API
(NOTES.md: any such source reaches 0.39-0.71x ``spark.read.parquet``, and is never told which
columns a query needs); this path hands Spark's built-in reader the part files of a snapshot
(part format 4: plain, sorted Parquet files), so a query gets column pruning, predicate
pushdown, vectorized decoding and verified page checksums. The engine plans the read
(``persist.distributed``: ``describe``, ``CollectionInfo.snapshot``, ``Scan.tasks``) and says
which parts are such files (:func:`persist.distributed.parquet_files`,
:func:`persist.distributed.parquet_task`); everything else goes through the Python path, in
Spark tasks, so the answer is the Python source's:

* **raw** (``consolidated=False``): the files' rows at or before ``as_of`` (``time <= as_of``,
  pushed down), times forwarded to ``as_of``, unioned with the other parts' raw tasks;
* **consolidated**: one DataFrame per key range of the engine's plan (disjoint ranges of the
  sorted runs): that range's files, filtered to the range and to ``time <= as_of`` (pushed
  down, so Parquet's statistics and page index skip what other ranges need), coalesced into
  one Spark partition (no shuffle), then summed there with the range's other parts: by Spark's
  own aggregation where it groups as persist does (:func:`sql_groups`; one partition needs no
  exchange), else by ``mapInArrow`` through :func:`persist.distributed.consolidate`. The
  ranges are unioned: each key lives in one.
  A read whose only part is already consolidated at one time skips that step.

What falls back to the Python path: inline parts, parts of formats 1-3, parts written under
another schema version (migrated exactly by the engine), parts with a time beyond 2**63 - 1,
parts of a store no other process can reach, and every part of a collection with a
``uint64`` anywhere in its types (Spark's Parquet reader makes it ``decimal(20, 0)``, the
Python source a checked ``long``).

A DataFrame is a plan over the snapshot's files: a part that GC removes before the plan is
made is planned again (up to :data:`PLAN_ATTEMPTS` times); one removed after fails the query
(Spark's ``FAILED_READ_FILE``, never skipped), and :meth:`PersistTable.toDF` plans it again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

import persist
from operators.options import Target
from operators.partitions import BATCH_ROWS, TaskPartition, describe
from operators.partitions import read as read_partition
from operators.schema import MAX_LONG, CollectionTypes, from_spark, to_spark
from persist import InvalidUsage

#: Spark reader options of every native read: verify page checksums (zstd alone does not
#: protect data), and fail rather than skip a missing or damaged file.
READER_OPTIONS = {
    "parquet.page.verify-checksum.enabled": "true",
    "ignoreMissingFiles": "false",
    "ignoreCorruptFiles": "false",
    "mergeSchema": "false",
}
#: How often :meth:`PersistTable.toDF` plans again when a part went (GC) while planning.
PLAN_ATTEMPTS = 8


class PersistTable:
    """A persist collection for Spark's native reader (see the module docstring).

    Made with :meth:`forPath`; :meth:`toDF` reads it.
    """

    def __init__(self, spark: Any, target: Target, reader_options: dict[str, str]) -> None:
        self._spark = spark
        self._target = target
        self._reader_options = reader_options

    @classmethod
    def forPath(cls, spark: Any, url: str, collection: str, *,
                storage_options: Mapping[str, Any] | None = None,
                reader_options: Mapping[str, str] | None = None) -> PersistTable:
        """The collection ``collection`` of the location at ``url``.

        Args:
            spark: the SparkSession.
            url: the location (``file:///...``, a path, ``s3://bucket/prefix``).
            storage_options: how persist opens the location for planning (as everywhere in
                persist); Spark's reader reaches the same store through its own settings
                (``s3://`` is read as ``s3a://``: Hadoop's S3A connector and its
                ``fs.s3a.*`` settings).
            reader_options: more options for Spark's reader (per-read Hadoop settings such
                as ``fs.s3a.endpoint``).

        Raises:
            InvalidUsage: an argument of the wrong type.
            MissingResource: no location at ``url``.
            UnknownCollection: no such collection (the message lists those there are).
        """
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
        describe(target)  # the location and collection exist: say so now, not at toDF
        return cls(spark, target, opts)

    def info(self) -> persist.distributed.CollectionInfo:
        """The collection as the location's latest metadata shows it."""
        return describe(self._target)

    def toDF(self, *, as_of: int | None = None, consolidated: bool = True,
             partitions: int | None = None) -> Any:
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
                yet, ``consolidated`` not a bool, ``partitions`` below 1; an ``s3://``
                location on a Spark without the S3A connector (use the Python source,
                ``spark.read.format("persist")``, there).
            SchemaMismatch: the key or value has no Spark type.
            PartMissing: GC kept removing parts while this read was planned.
            ChecksumMismatch: a part file's footer or page index (which Spark's reader
                trusts, and no page checksum covers) is not what persist wrote.
        """
        if as_of is not None and (isinstance(as_of, bool) or not isinstance(as_of, int)):
            raise InvalidUsage(f"toDF: as_of must be an int time or None, not {as_of!r}")
        if not isinstance(consolidated, bool):
            raise InvalidUsage(f"toDF: consolidated must be a bool, not {consolidated!r}")
        if partitions is not None and (isinstance(partitions, bool)
                                       or not isinstance(partitions, int) or partitions < 1):
            raise InvalidUsage(f"toDF: partitions must be an int >= 1 or None, not "
                               f"{partitions!r}")
        gone: BaseException | None = None
        for _ in range(PLAN_ATTEMPTS):
            info = describe(self._target)
            types = CollectionTypes.of(info)
            scan = info.snapshot(as_of)
            if scan.as_of > MAX_LONG:
                raise InvalidUsage(f"as_of {scan.as_of} does not fit Spark's long")
            try:
                return _Plan(self._spark, types, self._reader_options).read(
                    scan, consolidated=consolidated, partitions=partitions)
            except _Gone as e:
                gone = e.__cause__  # a part went between the plan and Spark's listing
            except persist.PartMissing as e:
                gone = e  # ... or before its tail was verified
        raise persist.PartMissing(
            f"read of {self._target.collection!r}: parts kept disappearing while the read "
            f"was planned ({PLAN_ATTEMPTS} plans): {gone}")


class _Gone(Exception):
    """A file of the plan was not found when Spark listed it (GC removed it): plan again."""


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


def _spark_url(url: str) -> str:
    """Hadoop's name for the store of ``url`` (``s3://`` is S3A's ``s3a://``)."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


class _Plan:
    """One read of one snapshot scan, as DataFrames."""

    def __init__(self, spark: Any, types: CollectionTypes, options: dict[str, str]) -> None:
        self.spark = spark
        self.types = types
        self.schema = types.spark_schema
        self.options = {**options, **READER_OPTIONS}
        self.native = native_types(types)
        self.sql_sum = sql_groups(types)

    def read(self, scan: persist.distributed.Scan, *, consolidated: bool,
             partitions: int | None) -> Any:
        """The DataFrame of ``scan`` (see the module docstring)."""
        if not consolidated or self._consolidated_already(scan):
            return self._raw(scan)
        return self._consolidated(scan, partitions)

    def _raw(self, scan: persist.distributed.Scan) -> Any:
        from pyspark.sql import functions as F

        as_of = scan.as_of
        rest = scan
        frames = []
        if self.native:
            urls, rest = persist.distributed.parquet_files(scan)
            if urls:
                frames.append(self._files(urls).where(F.col("time") <= as_of)
                              .withColumn("time", F.lit(as_of)))
        if rest.kept or not frames:
            frames.append(self._python(rest.tasks()))
        return self._union(frames)

    def _consolidated(self, scan: persist.distributed.Scan, partitions: int | None) -> Any:
        frames = []
        python: list[persist.distributed.ReadTask] = []
        for task in scan.tasks(consolidated=True, n=partitions):
            if not self.native:
                python.append(task)
                continue
            urls, rest = persist.distributed.parquet_task(task)
            if not urls:
                python.append(rest)
                continue
            cond, exact = self._in_range(task, scan.as_of)
            df = self._files(urls).where(cond)
            if self.sql_sum and exact:
                frames.append(self._summed(df, rest, scan.as_of))
            else:
                frames.append(df.coalesce(1).mapInArrow(_Consolidate(rest, self.types),
                                                        self.schema))
        # NB: always a Python-path child, empty or not. Each range above is one partition
        # (SinglePartition), and Spark >= 4.1 unions children that all report the same
        # partitioning partition by partition (spark.sql.unionOutputPartitioning, SPARK-52921):
        # every range would run in one task, one after the other. A child partitioned
        # otherwise makes the union a plain concatenation: one task per range.
        frames.append(self._python(python))
        return self._union(frames)

    @staticmethod
    def _consolidated_already(scan: persist.distributed.Scan) -> bool:
        """The fast path: a snapshot of one part holding one time, already consolidated
        (compaction's output once since passed its time) is its own contents."""
        if len(scan.kept) != 1:
            return False
        p = scan.kept[0]
        return bool(p.consolidated and p.min_time == p.max_time)

    def _files(self, urls: tuple[str, ...]) -> Any:
        reader = self.spark.read.options(**self.options).schema(self.schema)
        paths = [_spark_url(u) for u in urls]
        try:
            df = reader.parquet(*paths)
        except Exception as e:
            text = str(e)
            if "PATH_NOT_FOUND" in text or "Path does not exist" in text:
                raise _Gone() from e
            s3a = any(p.startswith("s3a://") for p in paths)
            if s3a and ("ClassNotFoundException" in text or "No FileSystem for scheme" in text):
                raise InvalidUsage(
                    "this Spark cannot read s3a:// (Hadoop's S3A connector, hadoop-aws and "
                    "the AWS SDK bundle at Spark's Hadoop version, is not on its classpath: "
                    "see docs/spark.md, 'The native path on S3'); read through the Python "
                    "source instead: spark.read.format(\"persist\").option(\"collection\", "
                    f"...).load(url). Spark said: {text.splitlines()[0][:300]}") from None
            raise
        return df.select("key", "value", "time", "diff")

    def _summed(self, files: Any, rest: persist.distributed.ReadTask, as_of: int) -> Any:
        """One key range consolidated by Spark's own aggregation, in one partition: the
        range's rows of ``files`` (filtered exactly) and the contents of its other parts
        (``rest``, consolidated by persist), summed per ``(key, value)``.

        NB: ``coalesce(1)`` makes the range one partition (no shuffle), which satisfies the
        aggregation's clustering: Spark plans no exchange, and the partial and final
        aggregation run in that partition's task. Exact where Spark's grouping is persist's
        (:func:`sql_groups`).
        """
        from pyspark.sql import functions as F

        rows = files
        if rest.parts:
            rows = rows.unionByName(self._python([rest], partial=True))
        return (rows.coalesce(1).groupBy("key", "value").agg(F.sum("diff").alias("diff"))
                .where(F.col("diff") != 0)
                .select("key", "value", F.lit(as_of).alias("time"), "diff"))

    def _in_range(self, task: persist.distributed.ReadTask, as_of: int) -> tuple[Any, bool]:
        """``time <= as_of`` and, where it can say it exactly or more loosely, the task's key
        range: pushed to Spark's reader so row groups and pages of other ranges are skipped.
        Also whether the condition is exactly the range (else the rows are cut exactly by the
        engine, :func:`persist.distributed.consolidate`)."""
        from pyspark.sql import functions as F

        cond = F.col("time") <= as_of
        r = task.key_range
        if r is None:
            return cond, True
        key = F.col("key")
        kind = self.schema["key"].dataType.typeName()
        lo, hi = _bound(r.lo, kind), _bound(r.hi, kind)
        exact = (lo is None) == (r.lo is None) and (hi is None) == (r.hi is None)
        if hi is not None:
            # NB: Spark sorts NaN above every number, as persist's ranges do; nulls and NaN
            # belong to the last range (hi None) only.
            cond = cond & (key < F.lit(hi))
        if lo is not None:
            above = key >= F.lit(lo)
            cond = cond & (above | key.isNull() if r.hi is None else above)
        return cond, exact

    def _python(self, tasks: list[persist.distributed.ReadTask], *, partial: bool = False
                ) -> Any:
        """The engine's tasks read by persist in Spark tasks (one each); ``partial``:
        consolidated tasks that hold only some parts of their range (see :class:`_ReadTasks`)."""
        rows = [(t.to_bytes(),) for t in tasks]
        seed = self.spark.createDataFrame(
            self.spark.sparkContext.parallelize(rows, max(1, len(rows))), "task binary")
        return seed.mapInArrow(_ReadTasks(self.types, partial=partial), self.schema)

    @staticmethod
    def _union(frames: list[Any]) -> Any:
        return functools.reduce(lambda a, b: a.union(b), frames)


def _bound(v: Any, kind: str) -> Any:
    """A key range bound as a Spark literal of the key's type, or None where one would not be
    exact (the range then reads more, and the engine cuts it exactly)."""
    if v is None:
        return None
    if kind in ("byte", "short", "integer", "long") and isinstance(v, int):
        return v
    if kind in ("float", "double") and isinstance(v, float):
        return v
    if kind == "string" and isinstance(v, bytes):
        try:
            return v.decode("utf-8")  # Spark compares strings by their UTF-8 bytes
        except UnicodeDecodeError:
            return None  # a truncated stats bound
    return None


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
