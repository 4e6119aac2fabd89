"""What a Spark user sees when something is wrong (issue 21, findings 9-12): workers that cannot
import persist, persist's errors as Spark shows them, writes refused before any task runs, and
every form of ``timestampAsOf`` docs/spark.md lists."""

from __future__ import annotations

import datetime
import re
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import operators
import persist
from operators.options import ReadOptions
from persist import InvalidUsage
from tests.spark.support import location

pytestmark = pytest.mark.spark


# -- 9: Spark's Python workers ----------------------------------------------------------------


@pytest.fixture
def worker_python(spark: Any) -> Iterator[Any]:
    """Lets a test point the workers of data sources registered from now on at another Python.

    NB: pyspark captures ``SparkContext.pythonExec`` (what ``PYSPARK_PYTHON`` set when the
    session started) into each Python function it registers, the data sources included: a
    source registered while it points elsewhere runs its workers there. Restored (and the
    persist source registered again, checked) afterwards.
    """
    sc = spark.sparkContext
    before = sc.pythonExec

    def use(python: str) -> None:
        sc.pythonExec = python

    yield use
    sc.pythonExec = before
    operators.register(spark)


def test_register_refuses_workers_that_cannot_import_persist(
        spark: Any, tmp_path: Path, worker_python: Any) -> None:
    """The README's example failed after 62 s deep in a Spark error when the workers' Python
    (``python3`` from PATH) lacked persist; register now says so first, naming PYSPARK_PYTHON."""
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python with nothing installed
    worker_python(str(bare / "bin" / "python"))
    began = time.monotonic()
    with pytest.raises(InvalidUsage) as info:
        operators.register(spark)
    took = time.monotonic() - began
    message = str(info.value)
    print(f"register refused the workers in {took:.1f} s: {message}")
    assert message.startswith("Spark's Python workers cannot run persist: ")
    assert "No module named" in message
    assert "PYSPARK_PYTHON" in message
    assert f"export PYSPARK_PYTHON={sys.executable}" in message


def test_register_passes_and_can_skip_the_check(spark: Any) -> None:
    operators.register(spark)  # the session's workers run this test's Python
    operators.register(spark, check=False)


# -- 10: errors as Spark shows them ------------------------------------------------------------


#: Spark's own prefix, then persist's error as its one line: type, then message.
HEADLINE = r"^\[PYTHON_DATA_SOURCE_ERROR\] [^:]+: persist\.errors\.{kind}: {message}"


def _events(url: str, times: int = 3) -> None:
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(times):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()


def test_planning_errors_reach_spark_as_persists_own_line(spark: Any, tmp_path: Path) -> None:
    """An AnalysisException used to wrap 900-1,500 characters of Python traceback with
    persist's message last."""
    url = location(tmp_path)
    _events(url)
    with pytest.raises(Exception, match=r"persist\.errors\.InvalidUsage") as info:
        (spark.read.format("persist").option("collection", "events").option("as_of", 9)
         .load(url).collect())
    text = str(info.value)
    assert re.match(HEADLINE.format(kind="InvalidUsage",
                                    message=re.escape("read of 'events' as of 9 is not below")),
                    text), text
    assert "Traceback" not in text
    with pytest.raises(Exception, match=r"persist\.errors\.UnknownCollection") as info:
        spark.read.format("persist").option("collection", "nope").load(url).collect()
    text = str(info.value)
    assert re.match(HEADLINE.format(kind="UnknownCollection",
                                    message=re.escape("unknown collection 'nope'")), text), text
    assert "Traceback" not in text


def test_task_errors_reach_spark_as_persists_own_line(spark: Any, tmp_path: Path) -> None:
    """A task's error (here a raw read whose part GC removed after planning) is persist's own
    line in the job's failure, not a traceback."""
    url = location(tmp_path)
    with persist.open(url, options=persist.Options(inline_threshold=0)) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1)], upper=1).result()
    df = (spark.read.format("persist").option("collection", "events").option("mode", "raw")
          .load(url))
    df.schema  # noqa: B018 - planned on the driver now; the part goes before the task runs
    for part in (tmp_path / "loc" / "data").rglob("*"):
        if part.is_file():
            part.unlink()
    with pytest.raises(Exception, match=r"persist\.errors\.\w+: ") as info:
        df.collect()
    text = str(info.value)
    assert re.search(r"persist\.errors\.\w+: ", text), text
    assert "Traceback (most recent call last)" not in text


# -- 11: writes refused on the driver, before any task ----------------------------------------


def _jobs_of(spark: Any, group: str) -> list[int]:
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_write_that_cannot_land_is_refused_before_any_task_runs(
        spark: Any, tmp_path: Path) -> None:
    """A write with an ``upper`` below the collection's, or of other types, failed only at
    commit, after the whole job ran (34.5 s); it is refused on the driver, no job started."""
    url = location(tmp_path)
    _events(url)
    rows = spark.createDataFrame([("k9", 9, 5, 1)], "key string, value long, time long, diff long")
    other = spark.createDataFrame([(9, 9, 5, 1)], "key long, value long, time long, diff long")
    sc = spark.sparkContext
    cases = [
        ("upper", rows, {"upper": 2}, InvalidUsage, "option upper=2 is below"),
        ("types", other, {}, persist.SchemaMismatch, "key"),
    ]
    for name, df, extra, kind, words in cases:
        group = f"persist-refused-{name}-{tmp_path.name}"
        sc.setJobGroup(group, f"a write that must be refused: {name}")
        try:
            writer = df.write.format("persist").mode("append").option("collection", "events")
            for k, v in extra.items():
                writer = writer.option(k, v)
            with pytest.raises(Exception, match=f"persist.errors.{kind.__name__}") as info:
                writer.save(url)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        text = str(info.value)
        assert f"persist.errors.{kind.__name__}: " in text, text
        assert words in text, text
        assert _jobs_of(spark, group) == [], f"{name}: a Spark job ran before the refusal"
    with persist.open(url, read_only=True) as client:
        assert client.info("events").upper == 3  # nothing landed


# -- 12: timestampAsOf, every documented form --------------------------------------------------


@pytest.fixture(scope="module")
def sealed_apart(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, float, int]:
    """A collection whose seals of times 0 and 1 lie in different whole seconds, and two
    wall-clock times (epoch seconds) between them: (url, between, a whole second between)."""
    url = location(tmp_path_factory.mktemp("ts"))
    with persist.open(url) as client:
        w, r = client.create_or_load("prices", key_type=pa.string(), value_type=pa.int64())
        w.append([(("apple", 3), 0, 1)], upper=1).result()
        first = r.history()[-1].committed_at.timestamp()
        # NB: waits for the next whole second (time passing is the point): the integer form
        # of epoch seconds needs a whole second between the two seals
        time.sleep(max(0.0, int(first) + 1.05 - time.time()))
        w.append([(("apple", 3), 1, -1), (("apple", 4), 1, 1)], upper=2).result()
        second = r.history()[-1].committed_at.timestamp()
    whole = int(first) + 1
    assert first < whole < second
    return url, (first + second) / 2, whole


def _forms(between: float, whole: int) -> dict[str, Any]:
    at = datetime.datetime.fromtimestamp(between, tz=datetime.UTC)
    plus2 = at.astimezone(datetime.timezone(datetime.timedelta(hours=2)))
    return {
        "ISO-8601 with Z": at.isoformat().replace("+00:00", "Z"),
        "ISO-8601 with an offset": plus2.isoformat(),
        "ISO-8601 with a space": at.isoformat(sep=" "),
        "a datetime given to option()": at,  # pyspark passes str(datetime)
        "epoch seconds": str(whole),
        "epoch seconds with a fraction": f"{between:.3f}",
    }


FORMS = list(_forms(0.0, 0))


@pytest.mark.parametrize("form", FORMS)
def test_timestamp_as_of_takes_every_documented_form(
        spark: Any, sealed_apart: tuple[str, float, int], form: str) -> None:
    """Epoch seconds, which docs/spark.md lists, failed: ``'1795693485' is not an ISO-8601
    timestamp``."""
    url, between, whole = sealed_apart
    value = _forms(between, whole)[form]
    df = (spark.read.format("persist").option("collection", "prices")
          .option("timestampAsOf", value).load(url))
    assert [(r.key, r.value, r.time) for r in df.collect()] == [("apple", 3, 0)]  # as of 0


@pytest.mark.parametrize(("raw", "words"), [
    ("2026-11-25T09:00:00", "has no time zone"),
    ("1795693485000", "milliseconds? Divide by 1000"),
    ("nan", "is not a time"),
    ("yesterday", "is not an ISO-8601 timestamp"),
])
def test_timestamp_as_of_refuses_what_is_not_a_time(
        spark: Any, sealed_apart: tuple[str, float, int], raw: str, words: str) -> None:
    url, _, _ = sealed_apart
    with pytest.raises(Exception, match=re.escape(words)):
        (spark.read.format("persist").option("collection", "prices")
         .option("timestampAsOf", raw).load(url).collect())


def test_timestamp_as_of_numbers_are_epoch_seconds() -> None:
    opts = {"path": "file:///x", "collection": "c"}
    assert ReadOptions.parse({**opts, "timestampasof": "1795693485"}).timestamp_as_of == \
        1795693485.0
    assert ReadOptions.parse({**opts, "timestampasof": " 1795693485.25 "}).timestamp_as_of == \
        1795693485.25
    iso = "2026-11-25T09:00:00Z"
    assert ReadOptions.parse({**opts, "timestampasof": iso}).timestamp_as_of == iso
