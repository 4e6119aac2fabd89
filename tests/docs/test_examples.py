"""Every ```python block in README.md and docs/*.md runs as written, each in a fresh process.

Each block runs alone (``python -W error tests/docs/example_runner.py``) in an empty temporary
directory that is also its ``TMPDIR``, with the repository on ``PYTHONPATH``, no ``AWS_*`` or
``PERSIST_*`` variables, and a time limit. A failure names the file and line of the block; a
traceback shows the Markdown line that raised. Blocks share nothing: each imports what it uses.
A block that needs somewhere to write makes it itself (``tempfile.mkdtemp()``, or a relative
path), as a user's script would; both land in the test's temporary directory.

The marker convention. A block that needs more than that says so in its prose (the text just
before it), and an HTML comment, invisible on a rendered page, on the last non-blank line
before its opening fence tells this harness to provide it:

    <!-- example: setup=spark -->
        a local SparkSession named ``spark`` (the fast settings of tests/spark/conftest.py),
        stopped afterwards. The prose must mention "`spark`". Marks the test ``spark``.
    <!-- example: setup=pyspark -->
        pyspark and Java are installed, nothing more: the block starts (and stops) its own
        SparkSession, as a user's script does. ``PYSPARK_PYTHON`` is not set for it (the block
        must point Spark's Python workers at its Python itself). The prose must mention
        "`SparkSession`". Marks the test ``spark``.
    <!-- example: setup=s3 bucket=my-bucket dynamodb_table=persist-locks -->
        a fresh moto S3 + DynamoDB server (tests/support/moto_server.py), reached the way boto3
        reaches any endpoint from the environment: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``; the bucket(s) (comma-separated) are
        created, and with ``dynamodb_table`` the table too, by ``python -m persist dynamodb
        create-table``. The prose must name the bucket in backticks and ``AWS_ENDPOINT_URL``.
        Marks the test ``s3`` (and ``dynamodb`` with a table).
    <!-- example: setup=spark,s3 bucket=... -->   both.
    <!-- example: setup=pyspark jars=s3a -->
        the JAR sets of tests/support/jars.py (comma-separated names) fetched, and their JARs
        in ``SPARK_JARS``, comma-separated as ``spark.jars`` takes them (what ``./dev jars``
        prints). The prose must mention ``SPARK_JARS``.
    <!-- example: timeout=120 -->
        a longer limit in seconds than the default (60 s; 300 s with spark).
    <!-- example: skip reason="..." -->
        not run. Only for a block that is not a Python program (a fragment of an interface
        description, say); never for a block a user would copy. No block uses it today.

A marker before anything but a ```python block, an unknown key, or a setup the prose does not
announce fails collection, so the convention cannot rot silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNER = Path(__file__).with_name("example_runner.py")
MOTO_SERVER = REPO / "tests" / "support" / "moto_server.py"

DEFAULT_TIMEOUT = 60.0
SPARK_TIMEOUT = 300.0
SETUPS = {"spark", "pyspark", "s3"}
KEYS = {"setup", "bucket", "dynamodb_table", "jars", "timeout", "skip", "reason"}

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*example:(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    setups: frozenset[str] = frozenset()
    buckets: tuple[str, ...] = ()
    dynamodb_table: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    skip: str | None = None
    jars: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def parse_marker(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        if key not in KEYS:
            raise ValueError(f"{where}: unknown example marker key {key!r} (known: {sorted(KEYS)})")
        out[key] = value
    return out


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    markers: dict[int, dict[str, str]] = {}  # index of the line after the marker -> marker
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if m:
            markers[i] = parse_marker(m.group(1), f"{path.name}:{i + 1}")
    used: set[int] = set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        if lang in ("python", "py"):
            before = i - 1
            while before >= 0 and not lines[before].strip():
                before -= 1
            marker = markers.get(before, {})
            if before in markers:
                used.add(before)
            prose = "\n".join(lines[max(0, before - 15):max(0, before)])
            found.append(make_block(path, i + 1, "\n".join(lines[i + 1:end]) + "\n", marker,
                                    prose))
        i = end + 1
    for stray in sorted(set(markers) - used):
        raise ValueError(f"{path.name}:{stray + 1}: an example marker must be the last line "
                         f"before a ```python block")
    return found


def make_block(path: Path, line: int, code: str, marker: dict[str, str], prose: str) -> Block:
    where = f"{shown(path)}:{line}"
    setups = frozenset(s for s in marker.get("setup", "").split(",") if s)
    if setups - SETUPS:
        raise ValueError(f"{where}: unknown setup {sorted(setups - SETUPS)} (known: {SETUPS})")
    buckets = tuple(b for b in marker.get("bucket", "").split(",") if b)
    table = marker.get("dynamodb_table") or None
    if (buckets or table) and "s3" not in setups:
        raise ValueError(f"{where}: bucket/dynamodb_table need setup=s3")
    if "spark" in setups and "`spark`" not in prose:
        raise ValueError(f"{where}: setup=spark, but the prose before the block does not "
                         f"mention the SparkSession `spark`")
    if "pyspark" in setups and "`SparkSession`" not in prose:
        raise ValueError(f"{where}: setup=pyspark, but the prose before the block does not "
                         f"say the block starts its own `SparkSession`")
    if {"spark", "pyspark"} <= setups:
        raise ValueError(f"{where}: setup=spark provides a session, pyspark makes the block "
                         f"start its own: choose one")
    if "s3" in setups:
        if not buckets:
            raise ValueError(f"{where}: setup=s3 needs bucket=NAME")
        for name in (*buckets, *([table] if table else [])):
            if f"`{name}`" not in prose:
                raise ValueError(f"{where}: the prose before the block must name `{name}`")
        if "AWS_ENDPOINT_URL" not in prose:
            raise ValueError(f"{where}: the prose before the block must say where the S3 "
                             f"endpoint comes from (AWS_ENDPOINT_URL)")
    jars = tuple(j for j in marker.get("jars", "").split(",") if j)
    if jars and "`SPARK_JARS`" not in prose:
        raise ValueError(f"{where}: jars=..., but the prose before the block does not "
                         f"mention `SPARK_JARS`")
    if "skip" in marker and not marker.get("reason"):
        raise ValueError(f"{where}: skip needs reason=\"...\"")
    timeout = float(marker.get("timeout") or (SPARK_TIMEOUT if setups & {"spark", "pyspark"}
                                              else DEFAULT_TIMEOUT))
    return Block(path, line, code, setups, buckets, table, timeout,
                 marker.get("reason") if "skip" in marker else None, jars)


BLOCKS = [b for doc in DOCS for b in blocks_of(doc)]


def params() -> list[object]:
    out: list[object] = []
    for b in BLOCKS:
        marks: list[pytest.MarkDecorator] = [pytest.mark.timeout(b.timeout + 60)]
        if b.setups & {"spark", "pyspark"}:
            marks.append(pytest.mark.spark)
        if "s3" in b.setups:
            marks.append(pytest.mark.s3)
        if b.dynamodb_table:
            marks.append(pytest.mark.dynamodb)
        if b.skip:
            marks.append(pytest.mark.skip(reason=f"{b.where}: {b.skip}"))
        out.append(pytest.param(b, id=b.where, marks=marks))
    return out


def base_env(tmp: Path) -> dict[str, str]:
    # A user's environment: no AWS settings, none of the test suite's PERSIST_* knobs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PERSIST_"))}
    path = os.environ.get("PYTHONPATH")
    env.update(
        PYTHONPATH=str(REPO) + (os.pathsep + path if path else ""),
        TMPDIR=str(tmp),
        PYTHONUNBUFFERED="1",
        # Spark's Python workers: this interpreter, which has persist and operators installed.
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A fresh serialized moto server (S3 + DynamoDB) for one example; yields its URL."""
    # NB: it stops when its stdin closes, so it never outlives a test session that died.
    proc = subprocess.Popen([sys.executable, str(MOTO_SERVER), "--exit-on-stdin-eof"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        port = proc.stdout.readline().decode().strip() if ready else ""
        if not port.isdigit():
            pytest.fail(f"moto server did not start: {port!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def provide_s3(block: Block, endpoint: str, env: dict[str, str]) -> None:
    import boto3

    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        for bucket in block.buckets:
            s3.create_bucket(Bucket=bucket)
    finally:
        s3.close()
    if block.dynamodb_table:
        made = subprocess.run([sys.executable, "-m", "persist", "dynamodb", "create-table",
                               block.dynamodb_table], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert made.returncode == 0, made.stderr


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    spec = json.dumps({"path": str(block.path), "line": block.line, "code": block.code,
                       "setups": sorted(block.setups)})
    proc = subprocess.Popen([sys.executable, "-W", "error", str(RUNNER), spec], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=block.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # NB: the whole process group: a Spark example's JVM is a child of the runner.
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    if timed_out:
        pytest.fail(f"{block.where}: the example did not finish within {block.timeout:g} s "
                    f"(does it wait for something nobody sends?)\n--- stdout ---\n{out[-4000:]}"
                    f"\n--- stderr ---\n{err[-4000:]}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"{block.where}: the example failed (exit {proc.returncode})\n"
                    f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-8000:]}",
                    pytrace=False)


@pytest.mark.parametrize("block", params())
def test_example_runs(block: Block, tmp_path: Path) -> None:
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = base_env(tmp)
    if "pyspark" in block.setups:  # the block says which Python Spark's workers run
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            env.pop(name)
    if block.jars:
        from tests.support import jars

        try:
            env["SPARK_JARS"] = jars.spark_jars(*block.jars)
        except jars.JarsUnavailable as e:
            pytest.fail(f"{block.where}: the JARs {block.jars} cannot be fetched here: {e}")
    if "s3" in block.setups:
        with moto_server() as endpoint:
            provide_s3(block, endpoint, env)
            run_block(block, cwd, env)
    else:
        run_block(block, cwd, env)


def test_every_python_block_is_collected() -> None:
    """The parser sees every block a reader sees (a miscounted fence would hide examples)."""
    for doc in DOCS:
        opening = sum(1 for line in doc.read_text().splitlines()
                      if re.match(r"^(`{3,}|~{3,})\s*(python|py)\s*$", line, re.IGNORECASE))
        assert opening == sum(1 for b in BLOCKS if b.path == doc), doc.name
    assert len(BLOCKS) >= 9
    assert all(b.skip is None for b in BLOCKS), "a skipped example: say why in the report"


@pytest.mark.parametrize(("markdown", "error"), [
    ("<!-- example: setup=spark -->\nSome prose.\n", "must be the last line before"),
    ("<!-- example: setpu=spark -->\n```python\npass\n```\n", "unknown example marker key"),
    ("<!-- example: setup=java -->\n```python\npass\n```\n", "unknown setup"),
    ("No session here.\n<!-- example: setup=spark -->\n```python\npass\n```\n",
     "does not mention the SparkSession"),
    ("Bucket `b1`, AWS_ENDPOINT_URL.\n<!-- example: setup=s3 -->\n```python\npass\n```\n",
     "needs bucket=NAME"),
    ("AWS_ENDPOINT_URL.\n<!-- example: setup=s3 bucket=b1 -->\n```python\npass\n```\n",
     "must name `b1`"),
    ("<!-- example: skip -->\n```python\npass\n```\n", "skip needs reason"),
    ("Start one.\n<!-- example: setup=pyspark -->\n```python\npass\n```\n",
     "starts its own `SparkSession`"),
    ("`spark`, `SparkSession`\n<!-- example: setup=spark,pyspark -->\n```python\npass\n```\n",
     "choose one"),
])
def test_a_bad_marker_fails_collection(tmp_path: Path, markdown: str, error: str) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(markdown)
    with pytest.raises(ValueError, match=re.escape(error)):
        blocks_of(doc)


def test_markers_are_read(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("With a SparkSession `spark`, the bucket `b1` and AWS_ENDPOINT_URL:\n\n"
                   "<!-- example: setup=spark,s3 bucket=b1 timeout=90 -->\n\n"
                   "```python\nprint(spark)\n```\n\n```sh\nls\n```\n\n```py\npass\n```\n")
    first, second = blocks_of(doc)
    assert (first.line, first.code, first.setups) == (5, "print(spark)\n",
                                                      frozenset({"spark", "s3"}))
    assert (first.buckets, first.timeout) == (("b1",), 90.0)
    assert (second.line, second.setups, second.timeout) == (13, frozenset(), DEFAULT_TIMEOUT)
