"""The commands the README tells a newcomer to run, each in a fresh process: the demo
(``./dev demo`` runs ``python -m persist.demo``) and ``python -m persist``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

import persist

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_demo_refuses_a_directory_it_did_not_create(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("a user's file")
    done = run("-m", "persist.demo", str(target), cwd=tmp_path)
    assert done.returncode == 2, done
    assert "was not created by the demo" in done.stderr
    assert str(target) in done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "a user's file"


def test_demo_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me")
    done = run("-m", "persist.demo", str(target), cwd=tmp_path)
    assert done.returncode == 2, done
    assert "is not a directory" in done.stderr
    assert target.read_text() == "keep me"


def test_demo_runs_and_resets_only_its_own_directory(tmp_path: Path) -> None:
    first = run("-m", "persist.demo", cwd=tmp_path)  # the default, ./demo-location
    assert first.returncode == 0, first.stderr
    assert first.stdout.rstrip().endswith("done")
    location = tmp_path / "demo-location"
    assert (location / ".persist-demo").is_file()
    again = run("-m", "persist.demo", "demo-location", cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # a fresh run: writing at time 0 works again
    assert again.stdout.rstrip().endswith("done")
    assert (location / ".persist-demo").is_file()


def test_python_m_persist_is_the_cli(tmp_path: Path) -> None:
    done = run("-m", "persist", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: persist ")
    for command in ("inspect", "verify", "snapshot", "lock", "dynamodb"):
        assert command in done.stdout
    location = tmp_path / "loc"
    with persist.open(location, reentrance_id="docs") as client:
        write, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        write.append([(("a", 1), 0, 1)], upper=1).result()
    done = run("-m", "persist", "inspect", str(location), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"events"' in done.stdout
    missing = run("-m", "persist", "inspect", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.startswith("persist: ")
