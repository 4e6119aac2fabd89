"""The README's "Set up" against what it names: exactly two commands a newcomer runs (the demo
and the test suite), both real ``./dev`` commands installing what the text says, CI running
what the text says it runs, and the Spark extra named next to them. And the speed the docs
claim for Spark's native path against the W9 measurements of bench/README.md."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DEV = (REPO / "dev").read_text()
SPARK_DOC = (REPO / "docs" / "spark.md").read_text()
BENCH = (REPO / "bench" / "README.md").read_text()


def section(text: str, heading: str) -> str:
    """The text of the Markdown section ``heading`` (up to the next heading of its level)."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def dev_case(name: str) -> str:
    """The body of ``./dev``'s ``case`` branch ``name``."""
    m = re.search(rf"^  {re.escape(name)}\)\n(.*?)^    ;;", DEV, re.MULTILINE | re.DOTALL)
    assert m, f"./dev has no command {name!r}"
    return m.group(1)


def extras() -> dict[str, list[str]]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["project"]["optional-dependencies"])


def test_setup_keeps_two_commands_and_both_are_dev_commands() -> None:
    setup = section(README, "## Set up")
    blocks = re.findall(r"```sh\n(.*?)```", setup, re.DOTALL)
    assert len(blocks) == 1, blocks
    commands = [line.split("#")[0].strip() for line in blocks[0].splitlines() if line.strip()]
    assert commands == ["./dev demo", "./dev test"]
    assert "ensure_venv \"\"" in dev_case("demo")          # persist alone: no extras
    assert "ensure_venv \"test,bench\"" in dev_case("test")
    # CI runs the README's test command, after the newcomer's install check the text names
    ci = [shlex.split(line) for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.startswith(("./dev", "exec ./dev"))]
    assert [c[c.index("./dev"):][:2] for c in ci] == [["./dev", "check-install"],
                                                      ["./dev", "test"]]
    assert "(`.ci/run` calls it)" in setup
    assert "`./dev check-install`" in setup
    dev_case("check-install")


def test_setup_names_how_to_add_spark_to_the_venv() -> None:
    setup = section(README, "## Set up")
    assert "`.venv/bin/pip install -e '.[spark]'`" in setup
    names = {re.split(r"[<>=\[ ]", dep)[0] for dep in extras()["spark"]}
    assert "pyspark" in names
    # what the text says of the two commands: the demo installs no pyspark, the tests do
    assert "`./dev test` also installs pyspark" in setup
    assert "pyspark" in {re.split(r"[<>=\[ ]", dep)[0] for dep in extras()["test"]}
    assert "[docs/spark.md](docs/spark.md) starts with a local SparkSession" in setup
    # and docs/spark.md does: its first example starts its own session, run by CI as written
    first = SPARK_DOC[SPARK_DOC.index("```python"):]
    marker = SPARK_DOC[:SPARK_DOC.index("```python")].rstrip().splitlines()[-1]
    assert marker == "<!-- example: setup=pyspark -->"
    for needed in ('.master("local[2]")', 'os.environ["PYSPARK_PYTHON"] = sys.executable',
                   "operators.register(spark)"):
        assert needed in first[:first.index("```", 3)]


def w9_ratios(row: str) -> list[float]:
    """The persist/floor ratios of W9's table row ``row`` in bench/README.md, one per run (the
    run columns: between the row's name and its target)."""
    table = section(BENCH, "## The native read path (issue 22): W9")
    header = next(ln for ln in table.splitlines() if ln.startswith("| row "))
    runs = len(header.split("|")) - 4  # "", the name, the runs..., the target, ""
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| {row} |"))
    cells = line.split("|")[2:2 + runs]
    return [float(re.findall(r"(\d+\.\d+)", c.split("=")[-1])[0]) for c in cells]


DASH, TIMES = "\u2013", "\u00d7"  # the docs' en dash and multiplication sign


def span(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}{DASH}{max(ratios):.2f}{TIMES}"


def test_the_native_path_speed_the_docs_claim_is_the_measured_one() -> None:
    """Raw reads at Parquet's speed, consolidated ones not: the docs say both, with W9's
    numbers (the spans over bench/README.md's runs)."""
    raw = w9_ratios("native raw / Parquet raw")
    one = w9_ratios("native one column (`value`) / Parquet's one column")
    consolidated = w9_ratios("native consolidated / Parquet raw")
    assert len(raw) == len(one) == len(consolidated) >= 3
    assert max(consolidated) < 0.5 < min(raw)  # what the prose says: consolidated is slow
    opening = SPARK_DOC[:SPARK_DOC.index("\n## ")]
    assert f"**raw reads** (`consolidated=False`) and one-column reads run at Parquet's speed:\n" \
           f"    {span(raw)} and {span(one)}" in opening
    assert f"**consolidated reads** (the default) do not: {span(consolidated)}" in opening
    python_source = w9_ratios("Python source consolidated / Parquet raw")
    assert max(consolidated) < min(python_source)  # hence "slower even than": keep it true
    assert f"consolidated read in those runs ({span(python_source)})" in opening
    assert "fastest" not in opening
    measured = section(SPARK_DOC, "## Measured")
    assert f"raw {span(raw)}, one column {span(one)}, consolidated {span(consolidated)}" in measured
    spark = section(README, "### Spark")
    lo, hi = min(raw + one), max(raw + one)
    assert f"{span([lo, hi])} `spark.read.parquet`" in spark
    assert f"at only {span(consolidated)}" in spark
