"""One local SparkSession for every Spark test (starting one costs seconds), with the persist
format registered. Settings: C1 JIT + serial GC start the JVM about twice as fast (measured:
~8 s instead of ~17 s); no UI; loopback only; two shuffle partitions. Filter pushdown is on (as
docs/spark.md asks of users), and every batch read audits its pruning (PERSIST_AUDIT_PRUNING:
parts skipped by stats are re-read and must hold no match)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The JAR sets the shared session was started with: None, or why a set is missing.
SESSION_JARS: dict[str, str | None] = {}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        # NB: Python workers are separate processes: they see PYTHONPATH, not pytest's sys.path.
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        path = os.environ.get("PYTHONPATH")
        mp.setenv("PYTHONPATH", str(REPO) + (os.pathsep + path if path else ""))
        # NB: read where Spark plans a read: its Python planning workers inherit the JVM's
        # environment, which is this process's when the session starts.
        mp.setenv("PERSIST_AUDIT_PRUNING", "1")
        import operators
        from tests.spark.support import session_builder
        from tests.support.jars import JarsUnavailable

        # NB: with the S3A connector (tests/support/jars.py), for the tests of Spark's own
        # readers on s3a://; without it (no Maven, no network) the other tests still run, and
        # those fail with the reason (the s3a fixture).
        try:
            builder = session_builder("persist-tests", jars=("s3a",))
            SESSION_JARS["s3a"] = None
        except JarsUnavailable as e:
            builder = session_builder("persist-tests")
            SESSION_JARS["s3a"] = str(e)
        session = (
            builder
            .config("spark.sql.python.filterPushdown.enabled", "true")
            # NB: catalog tests register tables; keep the warehouse out of the checkout
            .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        operators.register(session)
        try:
            yield session
        finally:
            session.stop()


@pytest.fixture(scope="session")
def s3a(spark: Any) -> None:
    """The shared session reaches ``s3a://`` (else the test fails, saying why not)."""
    why = SESSION_JARS.get("s3a", "the session was started without the s3a JARs")
    if why is not None:
        pytest.fail(f"Spark's S3A connector is not available: {why}")


@pytest.fixture(autouse=True, scope="module")
def _jvm_answers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each Spark test file, one py4j call: names the file after which the JVM is alive
    but no longer answers (tests/conftest.py's per-test watch sees only a process that ended)."""
    yield
    from tests.support import jvm_watch

    if (lost := jvm_watch.check(request.node.nodeid, call=True)) is not None:
        pytest.fail(lost, pytrace=False)
