"""A Spark driver process for the kill tests: copies collection ``events`` of ``SRC`` into
collection ``copy`` of ``DST`` with a persist stream (small micro-batches, one checkpoint),
until every sealed update is copied (``Trigger.AvailableNow``). Run as
``python -m tests.spark.stream_driver SRC DST CHECKPOINT``; the test kills it with SIGKILL
and runs it again."""

from __future__ import annotations

import sys

import operators
from tests.spark.support import session_builder


def main() -> None:
    """Runs the copy once, to the end (or until killed)."""
    src, dst, ckpt = sys.argv[1:4]
    spark = session_builder("persist-kill-test").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    operators.register(spark)
    q = (spark.readStream.format("persist").option("collection", "events")
         .option("maxRowsPerTrigger", 40).load(src)
         .writeStream.format("persist").option("collection", "copy")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start(dst))
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
