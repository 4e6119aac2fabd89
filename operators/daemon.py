"""A PySpark daemon that imports persist and this connector before it forks Python workers.

    spark = (SparkSession.builder
             .config("spark.python.daemon.module", "operators.daemon")
             .getOrCreate())

Spark starts one Python daemon per executor and forks a worker from it for a Python task; it
reaps a worker idle for a minute. So a Python job that comes more than a minute after the
last one (a lone ``PersistTable.optimize()``, the first read of a stream) runs in freshly
forked workers, each of which imports persist, numpy and pyarrow before its task starts
(2.5-3.8 s each under a load average of 13-16 on 2 cores, measured; bench/README.md,
"Distributed compaction"). This daemon imports them once, before it forks: its workers start
with them loaded (measured: a lone ``optimize()`` of W9's 5 M rows in 7.95 s against
13.65-14.61 s with Spark's own daemon, same machine and load).

A session setting, which the connector cannot make for one job: the session's builder
opts in. Nothing else changes: the daemon is Spark's own (``pyspark.daemon.manager``); the
imports start no thread, so forking after them is as safe as Spark's own fork.
"""

from __future__ import annotations

import operators  # noqa: F401  (what a connector task imports: persist, pyarrow, numpy)
import persist.distributed  # noqa: F401

if __name__ == "__main__":
    from pyspark.daemon import manager

    manager()
