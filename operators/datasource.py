"""The ``persist`` format as a PySpark data source: what Spark instantiates by name, and which
hands out the readers (:mod:`operators.source`) and writers (:mod:`operators.sink`).

It is the one module that knows both sides, so the reader and writer modules never import each
other.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from operators.options import ReadOptions
from operators.partitions import describe
from operators.schema import CollectionTypes
from operators.sink import PersistBatchWriter, PersistStreamWriter
from operators.source import PersistBatchReader, PersistStreamReader, change_feed_schema
from persist import InvalidUsage


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

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader as of the ``as_of`` option, else the time :meth:`schema` pinned.

        Raises:
            InvalidUsage: bad or unknown options, or ``as_of`` outside ``[since, upper)``.
            MissingResource: nothing was ever committed at the URL.
            SchemaMismatch: ``schema`` is not the collection's.
            UnknownCollection: no such collection.
        """
        return PersistBatchReader(ReadOptions.parse(self.options, "read"), schema,
                                  self.pinned_as_of)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader of the collection's updates as its upper advances.

        Raises:
            InvalidUsage: bad or unknown options.
            MissingResource: nothing was ever committed at the URL.
            SchemaMismatch: ``schema`` is not the collection's.
            UnknownCollection: no such collection.
        """
        return PersistStreamReader(ReadOptions.parse(self.options, "stream"), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer; creates the collection if it does not exist (taking the lock).
        ``overwrite`` replaces the contents as a diff at one new time (see
        :class:`~operators.sink.PersistBatchWriter`).

        Raises:
            InvalidUsage: bad or unknown options.
            SchemaMismatch: the DataFrame does not fit the collection.
            LockHeld: creating the collection, the writer lock stayed busy.
        """
        return PersistBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer that lands each micro-batch once; creates the collection if it
        does not exist. Raises as :meth:`writer` does, and InvalidUsage for ``overwrite``
        (a stream only appends)."""
        return PersistStreamWriter(self.options, schema, overwrite)


__all__ = ["PersistDataSource"]
