"""The JARs Spark needs beyond pyspark's own, fetched with Maven once per machine and cached.

    from tests.support import jars
    paths = jars.classpath("s3a")       # hadoop-aws + the AWS SDK bundle, for s3a:// paths
    paths = jars.classpath("delta")     # delta-spark, for Delta's own Spark reader
    paths = jars.classpath("delta40")   # delta-spark 4.0.1, the Delta peer's (pyspark 4.0.5)
    builder = jars.with_jars(builder, "s3a", "delta")   # a SparkSession.Builder using them

    ./dev jars [--colon] [s3a] [delta] [delta40]  # fetch, print the JARs (commas, as spark.jars takes)

Each set is a small checked-in pom (``tests/support/maven/<set>/pom.xml``) resolved with the
ordinary Maven client, ``mvn dependency:build-classpath``: Maven downloads the artifacts into
its local repository (``~/.m2``, once per machine; a clean clone on the same machine, as CI
is, finds them there), and the JARs are then hard-linked into the git-ignored ``.jars/<set>/``
of the checkout (no copies: the AWS SDK bundle alone is 686 MB). ``.jars/<set>.json`` records
what was resolved and from which pom and properties, so a later call costs a few ``stat``s, and
a changed pom or pyspark resolves again.

Why not ``spark.jars.packages``: Spark's own resolver (Ivy) does not read the machine's Maven
settings, and resolves on every session start.

The S3A set follows pyspark's Hadoop: its version is read from the ``hadoop-client-api`` JAR in
pyspark's ``jars/`` and passed to the pom as ``hadoop.version``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
POMS = Path(__file__).resolve().parent / "maven"
#: Where the checkout keeps the resolved sets (git-ignored).
CACHE = REPO / ".jars"
SETS = ("s3a", "delta", "delta40")


class JarsUnavailable(RuntimeError):
    """A set could not be fetched (no ``mvn``, no network, an artifact not served)."""


def pyspark_hadoop_version() -> str:
    """The Hadoop version pyspark ships (from ``jars/hadoop-client-api-<version>.jar``).

    Raises:
        JarsUnavailable: pyspark is not installed, or ships no hadoop-client-api JAR.
    """
    try:
        import pyspark
    except ImportError as e:
        raise JarsUnavailable("pyspark is not installed") from e
    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    m = re.fullmatch(r"hadoop-client-api-(.+)\.jar", found[-1].name) if found else None
    if m is None:
        raise JarsUnavailable(f"no hadoop-client-api JAR in {Path(pyspark.__file__).parent}/jars")
    return m.group(1)


def _properties(name: str) -> dict[str, str]:
    if name != "s3a":
        return {}
    try:
        return {"hadoop.version": pyspark_hadoop_version()}
    except JarsUnavailable:
        import importlib.util

        if importlib.util.find_spec("pyspark") is not None:
            raise
        # NB: no pyspark in this Python (``./dev jars`` runs without the project's
        # virtualenv): the pom's own hadoop.version, pyspark 4.3's.
        m = re.search(r"<hadoop\.version>([^<]+)</hadoop\.version>",
                      (POMS / name / "pom.xml").read_text())
        return {"hadoop.version": m.group(1)} if m else {}


def _key(name: str, props: dict[str, str]) -> str:
    pom = (POMS / name / "pom.xml").read_bytes()
    return hashlib.sha256(pom + json.dumps(props, sort_keys=True).encode()).hexdigest()


def _cached(name: str, key: str) -> list[Path] | None:
    try:
        record = json.loads((CACHE / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    paths = [Path(p) for p in record.get("jars", [])]
    if record.get("key") != key or not paths or not all(p.is_file() for p in paths):
        return None
    return paths


def _mvn(name: str, props: dict[str, str]) -> list[Path]:
    """Resolves set ``name`` with Maven; returns the JARs in the local Maven repository."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailable("mvn is not installed (apt-get install maven)")
    with tempfile.TemporaryDirectory(prefix="persist-jars-") as tmp:
        out = Path(tmp) / "classpath.txt"
        cmd = [mvn, "-B", "-q", "-f", str(POMS / name / "pom.xml"),
               "dependency:build-classpath", f"-Dmdep.outputFile={out}",
               *(f"-D{k}={v}" for k, v in props.items())]
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if p.returncode != 0 or not out.is_file():
            raise JarsUnavailable(f"`{' '.join(cmd)}` failed ({p.returncode}):\n"
                                  f"{(p.stdout + p.stderr)[-3000:]}")
        return [Path(s) for s in out.read_text().strip().split(os.pathsep) if s]


def _link(name: str, sources: list[Path]) -> list[Path]:
    """Hard-links (or copies, across file systems) ``sources`` into ``.jars/<name>/``."""
    folder = CACHE / name
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for src in sources:
        dst = folder / src.name
        if not (dst.is_file() and dst.stat().st_size == src.stat().st_size):
            tmp = folder / f".{src.name}.{os.getpid()}"
            try:
                os.link(src, tmp)
            except OSError:  # another file system: copy
                shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        out.append(dst)
    return out


def classpath(name: str) -> list[Path]:
    """The JARs of set ``name`` (one of :data:`SETS`), fetched first if need be.

    Raises:
        JarsUnavailable: they cannot be fetched here; the message says why.
        ValueError: an unknown set.
    """
    if name not in SETS:
        raise ValueError(f"unknown JAR set {name!r}; one of {', '.join(SETS)}")
    props = _properties(name)
    key = _key(name, props)
    found = _cached(name, key)
    if found is not None:
        return found
    jars = _link(name, _mvn(name, props))
    record = {"key": key, "properties": props, "jars": [str(p) for p in jars]}
    tmp = CACHE / f".{name}.json.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, CACHE / f"{name}.json")
    return jars


def spark_jars(*names: str) -> str:
    """The JARs of sets ``names``, comma-separated: the value ``spark.jars`` takes.

    Raises:
        JarsUnavailable: a set cannot be fetched here.
        ValueError: an unknown set.
    """
    return ",".join(str(p) for n in names for p in classpath(n))


def with_jars(builder: Any, *names: str) -> Any:
    """``builder`` (a ``SparkSession.Builder``) with the JARs of ``names`` on the driver's and
    executors' classpath (``spark.jars``).

    Raises:
        JarsUnavailable: a set cannot be fetched here.
    """
    return builder.config("spark.jars", spark_jars(*names))


def main(argv: list[str]) -> int:
    """``python -m tests.support.jars [--colon] [SET...]``: fetches each set (default: s3a)
    and prints the JARs of all of them on one line, comma-separated as ``spark.jars`` takes
    them (``--colon``: ``:``-separated, a Java classpath). Needs only Python's standard
    library and ``mvn``."""
    sep = ","
    if "--colon" in argv:
        sep = os.pathsep
        argv = [a for a in argv if a != "--colon"]
    unknown = [a for a in argv if a.startswith("-")]
    if unknown:
        print(f"unknown option {unknown[0]}; usage: jars [--colon] [{'|'.join(SETS)}...]",
              file=sys.stderr)
        return 2
    found: list[Path] = []
    for name in argv or ["s3a"]:
        began = time.monotonic()
        try:
            paths = classpath(name)
        except (JarsUnavailable, ValueError) as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
        size = sum(p.stat().st_size for p in paths) / 1e6
        print(f"{name}: {len(paths)} JARs, {size:.0f} MB, {time.monotonic() - began:.1f} s",
              file=sys.stderr)
        found.extend(paths)
    print(sep.join(str(p) for p in found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
