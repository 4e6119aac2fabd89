"""A Spark driver process for the native write's kill test: writes ``ROWS`` rows into
collection ``c`` of ``DST`` with ``operators.write`` (token ``("job", 1)``). Run as
``python -m tests.spark.native_write_driver DST ROWS [STORAGE_OPTIONS_JSON]`` (with storage
options, an ``s3://`` location: the session then carries the S3A JARs); the test arms a crash
point (``PERSIST_CRASH_AT=adopt.adopted``: SIGKILL between staging and commit) and runs it
again."""

from __future__ import annotations

import json
import sys

import operators
from tests.spark.support import session_builder


def main() -> None:
    """Runs the write once (or until killed)."""
    dst, rows = sys.argv[1], int(sys.argv[2])
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    jars = ("s3a",) if dst.startswith("s3://") else ()
    spark = session_builder("persist-native-kill-test", jars=jars).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "id % 97 as key", "cast(id as string) as value", "id % 5 as time", "1L as diff")
    written = operators.write(df, dst, "c", token=("job", 1), storage_options=options)
    print("done", written.landed, written.rows, flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
