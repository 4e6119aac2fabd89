"""Smoke test of the benchmark suite: ``python -m bench.run --quick`` runs to the end and writes
a complete results.json. It asserts *nothing* about speed: absolute numbers on a shared CI
machine mean nothing, and the ratios are for people to read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {"persist", "floor", "delta", "iceberg"}
WORKLOADS = {"W1", "W2", "W3", "W4", "W5", "W6", "W7"}


def _run(args: list[str], *, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Runs the bench CLI in a fresh interpreter; ``block`` makes those modules unimportable."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = "import sys; " + "".join(f"sys.modules[{m!r}] = None; " for m in block)
    code += "from bench.run import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _load(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def test_quick_mode_covers_every_workload_and_system(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(["--quick", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = _load(out)
    assert set(doc["systems"]) == SYSTEMS
    assert set(doc["workloads"]) == WORKLOADS
    for wid, w in doc["workloads"].items():
        assert set(w["status"]) == SYSTEMS, (wid, w["status"])
        for system, status in w["status"].items():
            assert status.startswith(("ok", "skipped: ")), (wid, system, status)
        for system in ("persist", "floor"):
            assert w["status"][system].startswith("ok"), (wid, system, w["status"][system])
        assert w["metrics"], wid
    for name, info in doc["systems"].items():
        assert info["available"] or info["reason"], name
    assert doc["targets"], "the targets are reported (met or not: not asserted)"
    assert (out / "table.txt").read_text().strip()
    assert "Targets" in proc.stdout
    assert "p/floor" in proc.stdout


def test_missing_peer_packages_are_skipped_with_a_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(["--quick", "--workloads", "W1", "--out", str(out)],
                block=("deltalake", "pyiceberg"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = _load(out)
    for peer in ("delta", "iceberg"):
        assert not doc["systems"][peer]["available"]
        assert "not installed" in doc["systems"][peer]["reason"]
        assert doc["workloads"]["W1"]["status"][peer].startswith("skipped: ")
    for system in ("persist", "floor"):
        assert doc["workloads"]["W1"]["status"][system] == "ok"
