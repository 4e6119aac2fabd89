"""Every public def and class of persist and operators states its contract in a docstring.

Public: a name without a leading underscore, at module level or inside a public class.
A method marked ``@override`` inherits the contract of the method it overrides (the contract is
written once, on the abstract method).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("persist", "operators")


def undocumented(root: Path) -> Iterator[str]:
    """``path:line kind name`` of every public def or class without a docstring."""
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            yield from _walk(tree, str(path.relative_to(root)), "")


def _walk(node: ast.AST, where: str, prefix: str) -> Iterator[str]:
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if child.name.startswith("_"):
            continue
        if isinstance(child, ast.ClassDef):
            if not ast.get_docstring(child):
                yield f"{where}:{child.lineno} class {prefix}{child.name}"
            yield from _walk(child, where, f"{prefix}{child.name}.")
            continue
        decorators = {ast.unparse(d) for d in child.decorator_list}
        if decorators & {"override", "typing.override", "typing_extensions.override"}:
            continue
        if not ast.get_docstring(child):
            yield f"{where}:{child.lineno} def {prefix}{child.name}"


def test_every_public_def_states_its_contract() -> None:
    missing = list(undocumented(ROOT))
    assert missing == [], "public defs without a docstring:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_docstring(tmp_path: Path) -> None:
    (tmp_path / "persist").mkdir()
    (tmp_path / "operators").mkdir()
    (tmp_path / "persist" / "m.py").write_text(
        "class A:\n    '''doc'''\n    def f(self):\n        pass\n"
        "    @override\n    def g(self):\n        pass\n"
        "def _private():\n    pass\n")
    assert list(undocumented(tmp_path)) == ["persist/m.py:3 def A.f"]
