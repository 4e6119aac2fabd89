"""The ``persist`` format as a PySpark data source: what Spark instantiates by name, and which
hands out the readers (:mod:`operators.source`) and writers (:mod:`operators.sink`).

It is the one module that knows both sides, so the reader and writer modules never import each
other.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from operators.options import ReadOptions
from operators.partitions import describe
from operators.schema import CollectionTypes
from operators.sink import PersistBatchWriter, PersistStreamWriter
from operators.source import PersistBatchReader, PersistStreamReader, change_feed_schema
from persist import InvalidUsage, PersistError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# -- errors as Spark shows them ---------------------------------------------------------------

#: Read by pyspark's worker when it reports an exception to the JVM: set, it sends the
#: exception's own line (``persist.errors.InvalidUsage: read of ...``) instead of its traceback
#: (what ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets for a whole session).
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"
#: Set in every Python worker process Spark starts (the secret it connects back with): this
#: code runs in one, not in a user's own process (a test calling the source directly).
IN_WORKER = "PYTHON_WORKER_FACTORY_SECRET"


def _report_headline() -> None:
    """Makes the Spark worker running this code report the persist error being raised as its
    one line, with its type, instead of a traceback of 900-1,500 characters that ends with it.

    NB: only for persist's own errors, whose messages say what was wrong and what to do (a bug
    keeps its traceback), and only inside a Spark worker: every pyspark worker (planning,
    tasks, stream offsets, commits) exits once it has reported an exception, so the setting
    never outlives the error it is for. ``setdefault``: a session's own choice stands.
    """
    if IN_WORKER in os.environ:
        os.environ.setdefault(HIDE_TRACEBACK, "1")


def headlined(fn: F) -> F:
    """``fn``, whose :class:`~persist.errors.PersistError` reaches Spark as its own line
    (:func:`_report_headline`). Its signature is kept (pyspark inspects ``latestOffset``'s)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PersistError:
            _report_headline()
            raise

    return cast(F, wrapper)


def headlined_rows(fn: F) -> F:
    """:func:`headlined` for a task's ``read``: its errors surface while Spark iterates."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            yield from fn(*args, **kwargs)
        except PersistError:
            _report_headline()
            raise

    return cast(F, wrapper)


def _headlined_class(base: type[T], name: str, methods: tuple[str, ...],
                     rows: tuple[str, ...] = ()) -> type[T]:
    """A subclass of ``base`` named ``name`` (a global of this module, so Spark pickles its
    instances by reference) whose ``methods`` are :func:`headlined` and ``rows`` (a task's
    ``read``) :func:`headlined_rows`: what the data source hands to Spark."""
    namespace: dict[str, Any] = {
        "__module__": __name__, "__qualname__": name,
        "__doc__": f"{base.__name__} as handed to Spark: its persist errors reach Spark as "
                   f"their own line.",
    }
    namespace.update({m: headlined(getattr(base, m)) for m in methods})
    namespace.update({m: headlined_rows(getattr(base, m)) for m in rows})
    return cast("type[T]", type(name, (base,), namespace))


_BatchReader = _headlined_class(PersistBatchReader, "_BatchReader",
                                ("push_filters", "partitions"), rows=("read",))
_StreamReader = _headlined_class(
    PersistStreamReader, "_StreamReader",
    ("initialOffset", "latestOffset", "prepareForTriggerAvailableNow", "partitions", "commit"),
    rows=("read",))
_BatchWriter = _headlined_class(PersistBatchWriter, "_BatchWriter", ("write", "commit", "abort"))
_StreamWriter = _headlined_class(PersistStreamWriter, "_StreamWriter",
                                 ("write", "commit", "abort"))


def refuse_catalog_table(options: Any) -> None:
    """Refuses ``CREATE TABLE ... USING persist`` (Spark passes a catalog table's ``provider``
    and ``owner`` only when it creates one).

    NB: pyspark 4.3 gives a Python data source no options when it later reads or inserts into
    a catalog table (checked: ``SELECT``, ``spark.table`` and ``INSERT INTO`` all see an empty
    mapping), so such a table would be registered and then fail at every use. Refusing it at
    creation says so where the user acts.

    Raises:
        InvalidUsage: always, when ``options`` are a catalog table's.
    """
    keys = {str(k).lower() for k in options}
    if {"provider", "owner"} <= keys:
        raise InvalidUsage(
            "persist collections cannot be catalog tables on this pyspark: Spark does not pass a "
            "table's options (its location and collection) back to a Python data source when "
            "the table is read or written, so every later SELECT or INSERT would fail. Read "
            "with spark.read.format('persist').option('collection', c).load(url) (and "
            "createOrReplaceTempView for SQL), write with df.write.format('persist')...save(url)")


class PersistDataSource(DataSource):
    """The ``persist`` format: batch and streaming reads, batch and streaming writes.

    Register it once per session with ``operators.register(spark)``.
    """

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        #: The as_of a batch DataFrame is pinned to when no as_of option is given.
        self.pinned_as_of: int | None = None

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("persist")``."""
        return "persist"

    @headlined
    def schema(self) -> StructType:
        """``key, value, time, diff`` in the collection's types (read from its metadata), and
        ``_change_type`` for a change feed (``readChangeFeed``).

        NB: Spark calls this once, when the DataFrame is created; the newest sealed time is
        pinned here, so every action on one batch DataFrame reads the same definite snapshot.
        """
        # NB: Spark calls schema() for batch and stream reads alike, before it says which:
        # options of either are accepted here, and reader()/streamReader() check their own.
        refuse_catalog_table(self.options)
        opts = ReadOptions.parse(self.options, "any-read")
        c = describe(opts.target)
        if opts.as_of is None and c.upper > 0:
            self.pinned_as_of = c.upper - 1
        schema = CollectionTypes.of(c).spark_schema
        return change_feed_schema(schema) if opts.change_feed else schema

    @headlined
    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader as of the ``as_of`` option, else the time :meth:`schema` pinned.

        Raises:
            InvalidUsage: bad or unknown options, or ``as_of`` outside ``[since, upper)``.
            MissingResource: nothing was ever committed at the URL.
            SchemaMismatch: ``schema`` is not the collection's.
            UnknownCollection: no such collection.
        """
        return _BatchReader(ReadOptions.parse(self.options, "read"), schema, self.pinned_as_of)

    # NB: not @headlined. When this raises, pyspark 4.3's streaming runner then fails in its own
    # ``finally: reader.stop()`` (UnboundLocalError: 'reader'), and a worker reporting only
    # its last exception's line would show that instead of persist's error; with the
    # traceback, persist's error stays in the report (the chain's first exception).
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader of the collection's updates as its upper advances.

        Raises:
            InvalidUsage: bad or unknown options.
            MissingResource: nothing was ever committed at the URL.
            SchemaMismatch: ``schema`` is not the collection's.
            UnknownCollection: no such collection.
        """
        return _StreamReader(ReadOptions.parse(self.options, "stream"), schema)

    @headlined
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer; creates the collection if it does not exist (taking the lock).
        ``overwrite`` replaces the contents as a diff at one new time (see
        :class:`~operators.sink.PersistBatchWriter`).

        Raises:
            InvalidUsage: bad or unknown options.
            SchemaMismatch: the DataFrame does not fit the collection.
            LockHeld: creating the collection, the writer lock stayed busy.
        """
        return _BatchWriter(self.options, schema, overwrite)

    @headlined
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer that lands each micro-batch once; creates the collection if it
        does not exist. Raises as :meth:`writer` does, and InvalidUsage for ``overwrite``
        (a stream only appends)."""
        return _StreamWriter(self.options, schema, overwrite)



# -- can Spark's Python workers run persist? ------------------------------------------------

#: The name the worker check registers its probe source under.
CHECK_FORMAT = "persist_worker_check"


class _WorkerCheckReader(DataSourceReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        """One row from the executor's Python: its executable and where persist came from."""
        spec = importlib.util.find_spec("persist")
        yield sys.executable, str(spec.origin if spec is not None else None)


class WorkerCheck(DataSource):
    """A one-row source that only Python workers able to import :mod:`operators` (and so
    persist) can plan and read: Spark pickles it by reference, so a worker without the package
    fails to unpickle it, on the driver's planning worker and on an executor alike."""

    @classmethod
    def name(cls) -> str:
        """The probe's format name."""
        return CHECK_FORMAT

    def schema(self) -> str:
        """The executor's Python and where it found persist."""
        return "python string, persist string"

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader of the one row."""
        return _WorkerCheckReader()


def _worker_python(spark: Any) -> str:
    """How this session chose its workers' Python, for the error message."""
    conf = None
    try:
        conf = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # NB: a session without that conf may answer in any way
        conf = None
    if conf:
        return f"spark.pyspark.python={conf}"
    env = os.environ.get("PYSPARK_PYTHON")
    if env:
        return f"PYSPARK_PYTHON={env}"
    found = shutil.which("python3")
    return f"PYSPARK_PYTHON is not set, so Spark runs `python3` from PATH ({found or 'none found'})"


def _worker_error(e: BaseException) -> str:
    """The worker's own error, from the wrapping Spark exception (its last "X: message" line)."""
    text = str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception)\b.*:", line) and "SQLSTATE" not in line:
            return line
    return lines[0] if lines else type(e).__name__


def check_workers(spark: Any) -> None:
    """Checks that the Python workers Spark starts can import persist and its operators: one
    tiny read through a probe source, planned by a driver-side worker and read by an executor.

    Raises:
        InvalidUsage: they cannot (the message names ``PYSPARK_PYTHON``, how this session set
            it, and the worker's own error), within the seconds a Spark job takes to start.
    """
    spark.dataSource.register(WorkerCheck)
    try:
        rows = spark.read.format(CHECK_FORMAT).load().collect()
    except Exception as e:  # NB: whatever Spark wraps the worker's failure in
        raise InvalidUsage(
            f"Spark's Python workers cannot run persist: {_worker_error(e)}. Spark starts its "
            f"workers with PYSPARK_PYTHON, not with this program's Python ({sys.executable}); "
            f"here {_worker_python(spark)}. Set PYSPARK_PYTHON to a Python where persist is "
            f"installed before the SparkSession starts (e.g. `export PYSPARK_PYTHON="
            f"{sys.executable}`; on a cluster, the executors' Python), or install persist "
            f"there (pip install 'persist[spark]'). See docs/spark.md, 'Python workers'"
        ) from e
    if len(rows) != 1:
        raise InvalidUsage(f"persist's worker check read {len(rows)} rows, not 1: {rows!r}")


__all__ = ["CHECK_FORMAT", "PersistDataSource", "WorkerCheck", "check_workers"]
