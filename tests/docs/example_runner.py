"""Runs one documentation example in this (fresh) process: ``python example_runner.py JSON``.

JSON holds ``path`` (the Markdown file), ``line`` (its opening fence), ``code`` and ``setups``.
The code is compiled as if it stood at its place in the Markdown file, so a traceback names the
file and the line of the documentation (and shows that line). ``tests/docs/test_examples.py``
describes the setups; the only one made here is ``spark``: a local SparkSession named ``spark``,
with the fast test settings of ``tests/spark/conftest.py`` (filter pushdown on, as
docs/spark.md asks of users), stopped after the example.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def spark_session() -> Any:
    # NB: Python workers are separate processes: the parent set PYTHONPATH and PYSPARK_PYTHON.
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("persist-docs")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def main() -> None:
    spec = json.loads(sys.argv[1])
    path, line, code, setups = spec["path"], spec["line"], spec["code"], spec["setups"]
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": path}
    if "spark" in setups:
        namespace["spark"] = spark_session()
    try:
        # Line 1 of the code is the line after the fence.
        exec(compile("\n" * line + code, path, "exec"), namespace)
    finally:
        if "spark" in setups:
            namespace["spark"].stop()


if __name__ == "__main__":
    main()
