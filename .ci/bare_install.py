#!/usr/bin/env python3
"""The install a newcomer gets: ``pip install .`` alone, then ``.[spark]`` alone, each into a
fresh virtual environment, then what the README promises on each.

    python3 .ci/bare_install.py            # both stages (what .ci/run runs)
    python3 .ci/bare_install.py core       # one stage: core or spark

Stages:

* **core**: ``pip install .`` (no extras). ``import persist``, the ``persist`` command, the
  demo (``python -m persist.demo``) and the README's Quick start block, run from an empty
  directory so the checkout is not on ``sys.path``: only what the install put there counts.
* **spark**: ``pip install '.[spark]'`` (that extra alone). ``import operators``, then the
  README's Spark block in a local SparkSession whose workers run this environment's Python
  (``PYSPARK_PYTHON``, as the README tells users), which also runs ``operators.register``'s
  check that the workers can import persist.

Each stage prints how long its install and its checks took. pip's own cache (``~/.cache/pip``)
is left on, so a warm machine reinstalls from cached wheels; the environments themselves are
made afresh every time (in a temporary directory, removed afterwards). Needs only the Python
standard library, so it runs before ``./dev test`` has made ``.venv``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RUNNER = REPO / "tests" / "docs" / "example_runner.py"
FENCE = re.compile(r"^```(\w*)\s*$")


def step(msg: str) -> None:
    print(f"==> bare install: {msg}", file=sys.stderr, flush=True)


def readme_block(heading: str) -> tuple[int, str]:
    """The first ```python block after the README heading ``heading``: (fence line, code)."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    for i in range(start + 1, len(lines)):
        m = FENCE.match(lines[i])
        if m and m.group(1) == "python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            return i + 1, "\n".join(lines[i + 1:end]) + "\n"
    raise SystemExit(f"no python block after {heading!r} in {README}")


def clean_env(venv: Path, tmp: Path) -> dict[str, str]:
    """The environment a user's shell would have with the venv activated: nothing of this
    checkout on the path, no test or AWS settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PERSIST_", "AWS_", "PYSPARK_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["TMPDIR"] = str(tmp)
    return env


def run(what: str, cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 900) -> float:
    """Runs ``cmd``; exits with its output if it fails. Returns the seconds it took."""
    began = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout, check=False)
    took = time.monotonic() - began
    if p.returncode != 0:
        print(p.stdout, file=sys.stderr)
        step(f"FAILED: {what} (exit {p.returncode} after {took:.1f} s): {' '.join(cmd)}")
        raise SystemExit(1)
    step(f"{what}: ok in {took:.1f} s")
    return took


def make_venv(tmp: Path, spec: str) -> tuple[Path, float]:
    venv = tmp / "venv"
    run("python -m venv", [sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    # NB: not editable: a wheel built from the checkout, as `pip install persist` gives users.
    took = run(f"pip install '{spec}'", [str(venv / "bin" / "pip"), "install", "-q",
                                        "--disable-pip-version-check", spec], cwd=REPO)
    return venv, took


def example(python: Path, heading: str, setups: list[str], *, cwd: Path,
            env: dict[str, str]) -> float:
    line, code = readme_block(heading)
    spec = json.dumps({"path": str(README), "line": line, "code": code, "setups": setups})
    return run(f"README {heading!r} block", [str(python), str(RUNNER), spec], cwd=cwd, env=env)


def core(tmp: Path) -> None:
    venv, _ = make_venv(tmp, str(REPO))
    py, work = venv / "bin" / "python", tmp / "work"
    work.mkdir()
    env = clean_env(venv, tmp)
    run("import persist (from the install, not the checkout)",
        [str(py), "-c", "import persist, sys; f = persist.__file__; "
         f"sys.exit(0 if f.startswith({str(venv)!r}) else f'persist came from {{f}}')"],
        cwd=work, env=env)
    run("persist --help", [str(venv / "bin" / "persist"), "--help"], cwd=work, env=env)
    run("the demo", [str(py), "-m", "persist.demo", str(work / "demo-location")], cwd=work,
        env=env)
    example(py, "## Quick start", [], cwd=work, env=env)


def spark(tmp: Path) -> None:
    venv, _ = make_venv(tmp, f"{REPO}[spark]")
    py, work = venv / "bin" / "python", tmp / "work"
    work.mkdir()
    env = clean_env(venv, tmp)
    run("import operators", [str(py), "-c", "import operators"], cwd=work, env=env)
    # NB: what the README asks of users: Spark's workers run this environment's Python
    env["PYSPARK_PYTHON"] = str(py)
    example(py, "### Spark", ["spark"], cwd=work, env=env)


STAGES = {"core": core, "spark": spark}


def main(argv: list[str]) -> int:
    names = argv or list(STAGES)
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        print(f"usage: {sys.argv[0]} [{' '.join(STAGES)}] (unknown: {unknown})", file=sys.stderr)
        return 2
    began = time.monotonic()
    for name in names:
        stage_began = time.monotonic()
        step(f"stage {name}")
        with tempfile.TemporaryDirectory(prefix=f"persist-bare-{name}-") as tmp:
            STAGES[name](Path(tmp))
        step(f"stage {name}: passed in {time.monotonic() - stage_began:.1f} s")
    step(f"passed in {time.monotonic() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
