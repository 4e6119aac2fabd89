"""DESIGN.md §2 lists every module of ``persist/`` and ``operators/`` with one line, and only
modules that exist: a module added, moved or removed without the map following fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def listed() -> set[str]:
    """The paths the layout block of DESIGN.md §2 names (``persist/blob/file.py``, ...)."""
    text = (ROOT / "DESIGN.md").read_text()
    section = text[text.index("## 2. Layout of the code"):text.index("## 3.")]
    block = section.split("```")[1]
    out: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if m is None or len(m.group(1)) > 12:  # blank, or a description's second line
            continue
        depth = len(m.group(1)) // 2
        name = m.group(2)
        stack = stack[:depth]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        elif name.endswith(".py"):
            out.add("/".join([*stack, name]))
    return out


def test_design_lists_every_module_and_no_other() -> None:
    names = listed()
    modules = {str(p.relative_to(ROOT)) for pkg in ("persist", "operators")
               for p in (ROOT / pkg).rglob("*.py")}
    missing = sorted(m for m in modules - names if not m.endswith("__init__.py"))
    assert not missing, f"DESIGN.md §2 does not list {missing}"
    stale = sorted(names - modules)
    assert not stale, f"DESIGN.md §2 lists modules that do not exist: {stale}"
