"""Delta Lake's own Spark writer and reader as W9's peer, in an environment of its own.

No delta-spark runs on the project's pyspark 4.3 (every release tried fails at its first read;
docs/spark.md lists them). delta-spark 4.0.1 runs on pyspark 4.0.5 (both Scala 2.13), so the
peer runs there: ``./dev delta-env`` creates the virtualenv ``.venv-delta`` (pyspark
:data:`PYSPARK`, delta-spark :data:`DELTA`, from PyPI) and fetches Delta's JARs with Maven (the
``delta40`` set of ``tests/support/jars.py``). W9 then runs this file as a script in that
virtualenv, in its own JVM, after W9's own session ended:

    .venv-delta/bin/python -I bench/systems/delta_spark.py --parquet DIR --work DIR \\
        --jars A.jar,B.jar --rounds 3 [--quick]

The script needs only the standard library and pyspark (the virtualenv has neither persist nor
pyarrow). In one ``local[2]`` session (the settings of W9's, zstd Parquet) it reads W9's source
rows (the Parquet directory W9 wrote) and, after one warm-up of each, times ``--rounds`` rounds,
the order rotated every round, of:

* ``delta write``: ``df.write.format("delta")`` of those rows into a new table;
* ``parquet write``: ``df.write.parquet`` of the same rows (the floor, in the same JVM);
* ``delta read``: ``spark.read.format("delta")`` of the table, into the ``noop`` sink;
* ``parquet read``: ``spark.read.parquet`` of W9's directory, into the ``noop`` sink;
* ``parquet read of delta's files``: ``spark.read.parquet`` of the table's directory (its data
  files, the log left out), into the ``noop`` sink: Delta's file layout without its log;

then Delta's answer to updates: one ``MERGE`` of 1% updates into a copy of the table (deletion
vectors on: the deletes are recorded beside the files, as persist's retractions are, not by
rewriting them), 1% of the rows deleted (matched on ``key, value, time``) and as many new rows
inserted, and ``--rounds`` reads of the merged table (``delta read after merge``) against as many
of W9's Parquet (``parquet read (rdd)``), both counting every row of the query's RDD: Spark's
``noop`` sink fails on a table with deletion vectors in delta-spark 4.0.1 ("Cannot work with a
non-pinned table snapshot of the TahoeFileIndex").

The script prints one line, :data:`MARKER` followed by JSON (protocol :data:`PROTOCOL`):
``{"protocol", "pyspark", "delta", "rows", "rounds", "seconds": {case: [s, ...]},
"merge": {"deleted", "inserted", "rows_after", "deletion_vectors"}}``. :func:`measure`
runs it and parses that line; :func:`add_to` puts the numbers into W9's result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The checkout (this file is ``bench/systems/delta_spark.py``).
REPO = Path(__file__).resolve().parents[2]
#: The peer's virtualenv, created by ``./dev delta-env``.
VENV = REPO / ".venv-delta"
#: The versions ``./dev delta-env`` installs (delta-spark 4.0.x is built for Spark 4.0.x).
PYSPARK = "4.0.5"
DELTA = "4.0.1"
#: The JAR set (``tests/support/maven/delta40/pom.xml``) holding delta-spark :data:`DELTA`.
JAR_SET = "delta40"
PROTOCOL = 1
MARKER = "DELTA-PEER-RESULT "
#: The cases the script times, each in seconds per round.
CASES = ("delta write", "parquet write", "delta read", "parquet read")
#: Delta's own data files (the table's directory) read as plain Parquet: what of Delta's read
#: is its files' layout (Spark-written) and what its log.
DELTA_FILES = "parquet read of delta's files"
MERGED_READ = "delta read after merge"
#: Parquet's read as the read after the MERGE is measured (every row through the query's RDD).
PARQUET_RDD = "parquet read (rdd)"
MERGE = "delta merge"
#: The fraction of the rows a MERGE updates (as W9's stage (c): 1% out, as many in).
UPDATED = 0.01


class PeerError(RuntimeError):
    """The peer did not run or did not report (the message says why)."""


# -- the W9 side (persist's virtualenv) -----------------------------------------------------------


def python() -> Path:
    return VENV / "bin" / "python"


def unavailable() -> str | None:
    """Why the Delta peer cannot run here (no ``.venv-delta``), or None."""
    if not os.access(python(), os.X_OK):
        return (f"Delta's Spark peer needs its own environment (no delta-spark runs on "
                f"pyspark 4.3): run `./dev delta-env` to create {VENV.name} (pyspark "
                f"{PYSPARK}, delta-spark {DELTA}, ~500 MB)")
    return None


def jars() -> str:
    """delta-spark :data:`DELTA`'s JARs, comma-separated (fetched with Maven if need be).

    Raises:
        PeerError: they cannot be fetched here.
    """
    sys.path.insert(0, str(REPO))
    try:
        from tests.support import jars as j
    except ImportError as e:
        raise PeerError(f"tests/support/jars.py is not importable: {e}") from e
    finally:
        sys.path.remove(str(REPO))
    try:
        return j.spark_jars(JAR_SET)
    except (j.JarsUnavailable, ValueError) as e:
        raise PeerError(f"delta-spark {DELTA}'s JARs are not available: {e}") from e


def parse(stdout: str) -> dict[str, Any]:
    """The peer's report: the JSON after the last :data:`MARKER` line of its output.

    Raises:
        PeerError: no such line, bad JSON, another protocol, or a case missing.
    """
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARKER)]
    if not lines:
        raise PeerError("the Delta peer printed no result line")
    try:
        doc = json.loads(lines[-1][len(MARKER):])
    except ValueError as e:
        raise PeerError(f"the Delta peer's result is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("protocol") != PROTOCOL:
        got = doc.get("protocol") if isinstance(doc, dict) else type(doc).__name__
        raise PeerError(f"the Delta peer speaks protocol {got!r}, not {PROTOCOL}")
    seconds = doc.get("seconds")
    missing = [c for c in CASES if not (isinstance(seconds, dict) and seconds.get(c))]
    if missing:
        raise PeerError(f"the Delta peer reported no {', '.join(missing)}")
    if not isinstance(doc.get("rows"), int) or doc["rows"] <= 0:
        raise PeerError(f"the Delta peer reported rows={doc.get('rows')!r}")
    return doc


def measure(parquet: str, work: Path, *, rounds: int, quick: bool,
            timeout: float = 1800.0) -> dict[str, Any]:
    """Runs the peer on W9's Parquet directory ``parquet`` (tables under ``work``, removed
    after) and returns its parsed report.

    Raises:
        PeerError: the environment is missing, the JARs cannot be had, the script failed or
            timed out, or its report is malformed.
    """
    why = unavailable()
    if why is not None:
        raise PeerError(why)
    cmd = [str(python()), "-I", str(Path(__file__).resolve()), "--parquet", parquet,
           "--work", str(work), "--jars", jars(), "--rounds", str(rounds)]
    if quick:
        cmd.append("--quick")
    work.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise PeerError(f"the Delta peer did not finish within {timeout:.0f} s") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise PeerError(f"the Delta peer failed (exit {p.returncode}): {tail}")
    return parse(p.stdout)


#: W9's column for the Parquet cases measured in Delta's session (its own JVM and pyspark).
PARQUET_COLUMN = "parquet in Delta's session"


def add_to(res: Any, doc: dict[str, Any], *, write: str, reads: tuple[str, ...],
           updated: str | None, merge: str) -> None:
    """Adds ``doc`` (:func:`parse`'s) to W9's ``res`` (a ``WorkloadResult``): Delta's write
    under ``write``, its raw read under each of ``reads`` and its read after the MERGE under
    ``updated``, in the ``delta`` column, as records/s; the same session's Parquet write and
    read in :data:`PARQUET_COLUMN`; the MERGE's seconds under ``merge``; and a note with the
    versions and the within-session ratios."""
    rows = int(doc["rows"])
    sec = doc["seconds"]
    if PARQUET_COLUMN not in res.extra:
        res.extra.append(PARQUET_COLUMN)
        res.columns[PARQUET_COLUMN] = f"parquet (pyspark {doc.get('pyspark', '?')}, Delta's JVM)"
    for s in sec["delta write"]:
        res.add(write, "rec/s", "higher", "delta", rows / s)
    for s in sec["parquet write"]:
        res.add(write, "rec/s", "higher", PARQUET_COLUMN, rows / s)
    for metric in reads:
        for s in sec["delta read"]:
            res.add(metric, "rec/s", "higher", "delta", rows / s)
        for s in sec["parquet read"]:
            res.add(metric, "rec/s", "higher", PARQUET_COLUMN, rows / s)
    m = doc.get("merge") or {}
    after = int(m.get("rows_after") or rows)
    if updated is not None:
        for s in sec.get(MERGED_READ, []):
            res.add(updated, "rec/s", "higher", "delta", after / s)
        for s in sec.get(PARQUET_RDD, []):
            res.add(updated, "rec/s", "higher", PARQUET_COLUMN, rows / s)
    for s in sec.get(MERGE, []):
        res.add(merge, "s", "lower", "delta", s)

    def ratio(a: str, b: str) -> str:  # of the median records/s, as the report's ratios
        return f"{statistics.median(1 / s for s in sec[a]) / statistics.median(1 / s for s in sec[b]):.2f}"

    text = (f"delta: delta-spark {doc.get('delta', '?')} on pyspark {doc.get('pyspark', '?')} "
            f"in its own virtualenv and JVM (no delta-spark runs on pyspark 4.3), on W9's "
            f"{rows:,} source rows (its Parquet directory), {doc.get('rounds')} round(s) after "
            f"one warm-up each, order rotated; in that session, Delta / Parquet: write "
            f"{ratio('delta write', 'parquet write')}x, read "
            f"{ratio('delta read', 'parquet read')}x (records/s)")
    if sec.get(DELTA_FILES):
        text += (f", Delta's own data files read as plain Parquet "
                 f"{ratio(DELTA_FILES, 'parquet read')}x (the rest of Delta's read is its log "
                 f"and reader)")
    if sec.get(MERGED_READ) and sec.get(PARQUET_RDD):
        text += (f", read after a MERGE of {m.get('deleted', 0):,} deletes and "
                 f"{m.get('inserted', 0):,} inserts (deletion vectors "
                 f"{'on' if m.get('deletion_vectors') else 'off'}) "
                 f"{ratio(MERGED_READ, PARQUET_RDD)}x (both reads counting the query's RDD "
                 f"rows: the noop sink fails on a table with deletion vectors in this "
                 f"delta-spark)")
    res.notes.append(text + f"; the '{PARQUET_COLUMN}' column is that session's Parquet")


# -- the peer itself (runs in .venv-delta: standard library and pyspark only) ---------------------


def _session(jar_list: str, quick: bool) -> Any:
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName("persist-bench-delta")
         .config("spark.jars", jar_list)
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog",
                 "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.driver.memory", "4g")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         # NB: zstd for Delta's files and Parquet's alike, as persist writes its parts
         .config("spark.sql.parquet.compression.codec", "zstd"))
    if quick:
        b = b.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _noop(df: Any) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("append").save()
    return time.perf_counter() - t


def _rdd(df: Any) -> float:
    """Seconds to produce every row of ``df``'s query (its RDD of rows, counted)."""
    t = time.perf_counter()
    df._jdf.queryExecution().toRdd().count()
    return time.perf_counter() - t


def _timed_write(writer: Any, path: str, fmt: str) -> float:
    t = time.perf_counter()
    writer.format(fmt).mode("errorifexists").save(path)
    return time.perf_counter() - t


def peer(parquet: str, work: Path, jar_list: str, rounds: int, quick: bool) -> dict[str, Any]:
    """Times the cases (module docstring) and returns the report."""
    import pyspark

    spark = _session(jar_list, quick)
    try:
        src = spark.read.parquet(parquet)
        rows = src.count()
        table = str(work / "table")
        # warm-up: one of each (JIT, codegen, Delta's log code); the table is the one read
        _timed_write(src.write, table, "delta")
        _timed_write(src.write, str(work / "warm-parquet"), "parquet")
        _noop(spark.read.parquet(parquet))
        _noop(spark.read.format("delta").load(table))
        got = spark.read.format("delta").load(table).count()
        if got != rows:
            raise RuntimeError(f"Delta read {got} rows of the {rows} it wrote")
        seconds: dict[str, list[float]] = {c: [] for c in CASES}
        cases = (*CASES, DELTA_FILES)
        seconds[DELTA_FILES] = []
        for r in range(rounds):
            k = r % len(cases)
            for case in [*cases[k:], *cases[:k]]:
                if case == "delta write":
                    s = _timed_write(src.write, str(work / f"delta-{r}"), "delta")
                elif case == "parquet write":
                    s = _timed_write(src.write, str(work / f"parquet-{r}"), "parquet")
                elif case == "delta read":
                    s = _noop(spark.read.format("delta").load(table))
                elif case == DELTA_FILES:
                    s = _noop(spark.read.parquet(table))
                else:
                    s = _noop(spark.read.parquet(parquet))
                seconds[case].append(s)
            for d in (f"delta-{r}", f"parquet-{r}"):
                shutil.rmtree(work / d, ignore_errors=True)
        merge = _merge(spark, src, table, rows)
        # NB: the noop sink fails on a table with deletion vectors in delta-spark 4.0.1
        # ("Cannot work with a non-pinned table snapshot of the TahoeFileIndex"), so these
        # two read every row through the query's RDD instead, Parquet's read alike
        after: dict[str, Callable[[], float]] = {
            MERGED_READ: lambda: _rdd(spark.read.format("delta").load(table)),
            PARQUET_RDD: lambda: _rdd(spark.read.parquet(parquet))}
        for f in after.values():
            f()
        for r in range(rounds):
            for case in (list(after) if r % 2 == 0 else list(after)[::-1]):
                seconds.setdefault(case, []).append(after[case]())
        seconds[MERGE] = [merge.pop("seconds")]
        return {"protocol": PROTOCOL, "pyspark": pyspark.__version__, "delta": _delta_version(),
                "rows": rows, "rounds": rounds, "seconds": seconds, "merge": merge}
    finally:
        spark.stop()


def _delta_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("delta-spark")
    except PackageNotFoundError:
        return "?"


def _merge(spark: Any, src: Any, table: str, rows: int) -> dict[str, Any]:
    """One MERGE into ``table``: deletes the first 1% of the source rows (matched on ``key,
    value, time``), inserts as many new rows (the same with the key moved out of the source's
    key space, a later time). Deletion vectors on, so the deletes need no rewrite."""
    from pyspark.sql import functions as F

    n = max(1, int(rows * UPDATED))
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true')")
    gone = src.limit(n).withColumn("op", F.lit("d"))
    last = src.agg(F.max("time")).first()[0]
    new = (src.limit(n).withColumn("key", F.col("key") + F.lit(1 << 41))
           .withColumn("time", F.lit(last + 1)).withColumn("op", F.lit("i")))
    updates = gone.unionByName(new).localCheckpoint()  # NB: fixed rows, computed before timing
    updates.count()
    updates.createOrReplaceTempView("w9_updates")
    t = time.perf_counter()
    spark.sql(f"""
        MERGE INTO delta.`{table}` AS t
        USING w9_updates AS u
        ON t.key = u.key AND t.value = u.value AND t.time = u.time
        WHEN MATCHED AND u.op = 'd' THEN DELETE
        WHEN NOT MATCHED AND u.op = 'i' THEN INSERT (key, value, time, diff)
            VALUES (u.key, u.value, u.time, u.diff)
    """)
    seconds = time.perf_counter() - t
    after = spark.read.format("delta").load(table).count()
    dv = spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").where(
        "key = 'delta.enableDeletionVectors'").collect()
    return {"seconds": seconds, "deleted": rows + n - after, "inserted": n,
            "rows_after": after, "deletion_vectors": bool(dv and dv[0][1] == "true")}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--jars", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    doc = peer(a.parquet, a.work, a.jars, a.rounds, a.quick)
    print(MARKER + json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
