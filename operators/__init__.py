"""Spark operators for persist: the native read path (``PersistTable``: Spark's own Parquet
reader over the collection's part files), and ``PersistedSource`` (batch as-of and streaming by
frontier) and the ``persist`` sink, through PySpark's Python Data Source API (pyspark >= 4.0).

    from operators import PersistTable
    df = PersistTable.forPath(spark, "file:///data/loc", "events").toDF(as_of=41)

    import operators
    operators.register(spark)
    df = spark.read.format("persist").option("collection", "events").load("file:///data/loc")
    q = (spark.readStream.format("persist").option("collection", "events").load(url)
         .writeStream.foreachBatch(handle).option("checkpointLocation", ckpt).start())
    df.write.format("persist").mode("append").option("collection", "out").save(url)
    operators.write(df, url, "out", token=("nightly", 7))   # Spark's own Parquet writer

Modules: :mod:`operators.native` (the native read path), :mod:`operators.native_write`
(the native write path), :mod:`operators.datasource` (the data source), :mod:`operators.source` (readers),
:mod:`operators.sink` (writers), :mod:`operators.partitions` (what a Spark task reads),
:mod:`operators.schema` (types across the boundary), :mod:`operators.options` (option
parsing), :mod:`operators.filters` (Spark's pushed filters as persist filters). See
``docs/spark.md``.

They stand on the engine's public API alone (``import persist``; :mod:`persist.distributed`
for planning, reading and staging in parallel), as any other engine would:
``tests/test_layering.py`` refuses an import of anything else of persist.
"""

from __future__ import annotations

from typing import Any

from operators.datasource import PersistDataSource, check_workers
from operators.native import PersistTable
from operators.native_write import Written, write

#: The name the source and sink are registered under: ``spark.read.format("persist")``.
FORMAT = "persist"


def register(spark: Any, *, check: bool = True) -> None:
    """Registers the ``persist`` format with a SparkSession (once per session).

    Spark runs the source and the sink in Python workers it starts itself, with the Python that
    ``PYSPARK_PYTHON`` names (``python3`` from PATH when unset), not necessarily the one
    persist is installed in. So ``register`` first checks, with one tiny Spark read (a second
    or two), that those workers can import persist and its operators: otherwise the first real
    read fails much later, deep inside a Spark error.

    Args:
        check: run that check (False skips it, e.g. where every worker is known to be set up).

    Raises:
        InvalidUsage: Spark's Python workers cannot import persist; the message names
            ``PYSPARK_PYTHON`` and the worker's own error.
    """
    if check:
        check_workers(spark)
    spark.dataSource.register(PersistDataSource)


__all__ = ["FORMAT", "PersistDataSource", "PersistTable", "Written", "register", "write"]
