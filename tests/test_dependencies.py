"""Every import of the package is covered by its declared dependencies (pyproject.toml).

A module's third-party imports must be installed by what a user installs to use it:

* ``import persist`` runs the modules it imports at module level (the *eager closure* of
  ``persist``); their imports must be core ``dependencies``: ``pip install persist`` alone has
  to import and run it.
* ``import operators`` likewise needs only core plus the ``spark`` extra.
* every other import (inside a function, guarded by ``except ImportError``, or in a module
  only a lazy import reaches, such as the S3 client) must be declared somewhere: core or an
  extra.

A distribution a declared one merely depends on does not count: pyarrow stopped requiring
numpy once, and such an import then breaks on a fresh install. The check is static (the
import graph, read with ``ast``) and maps import names to distributions through the test
environment's metadata; ``./dev check-install`` (run by ``.ci/run``) proves the same on a
fresh virtualenv with ``pip install .`` alone.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("persist", "operators")
#: What importing each package may need, beyond core (extras of pyproject.toml).
EAGER_EXTRAS = {"persist": (), "operators": ("spark",)}


@dataclass(frozen=True)
class Import:
    """Module ``importer`` imports the top-level module ``name`` at ``path:line``."""

    importer: str
    name: str
    path: str
    line: int
    #: Runs when ``importer`` is imported (module level, not guarded by ``except
    #: ImportError``, not under ``TYPE_CHECKING``).
    eager: bool


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m is not None, req
    return _normalize(m.group(1))


def declared(root: Path) -> tuple[set[str], dict[str, set[str]]]:
    """Core dependencies and each extra's, as normalized distribution names."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project.get("dependencies", [])}
    extras = {name: {_requirement_name(r) for r in reqs}
              for name, reqs in project.get("optional-dependencies", {}).items()}
    return core, extras


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _guards_import_error(node: ast.Try) -> bool:
    names: list[str] = []
    for h in node.handlers:
        t = h.type
        if isinstance(t, ast.Tuple):
            names += [e.id for e in t.elts if isinstance(e, ast.Name)]
        elif isinstance(t, ast.Name):
            names.append(t.id)
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(body: list[ast.stmt], eager: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement under ``body`` with whether it runs at import time."""
    for node in body:
        yield node, eager
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(node.body, False)
        elif isinstance(node, ast.ClassDef):
            yield from _walk(node.body, eager)
        elif isinstance(node, ast.If):
            yield from _walk(node.body, eager and not _is_type_checking(node.test))
            yield from _walk(node.orelse, eager)
        elif isinstance(node, ast.Try):
            yield from _walk(node.body, eager and not _guards_import_error(node))
            for h in node.handlers:
                yield from _walk(h.body, False)
            yield from _walk(node.orelse, eager)
            yield from _walk(node.finalbody, eager)
        else:
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    yield from _walk(inner, eager)


def imports(root: Path, packages: tuple[str, ...] = PACKAGES
            ) -> tuple[list[Import], dict[str, set[str]]]:
    """The third-party imports of ``packages``, and each module's eager imports of modules
    of ``packages`` (the import graph that runs at import time)."""
    modules = {_module_name(root, p) for pkg in packages for p in (root / pkg).rglob("*.py")}
    found: list[Import] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            importer = _module_name(root, path)
            here = importer.split(".") if path.name == "__init__.py" else \
                importer.split(".")[:-1]
            tree = ast.parse(path.read_text(), filename=str(path))
            for node, eager in _walk(tree.body, True):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        anchor = here[: len(here) - (node.level - 1)]
                        base = ".".join([*anchor, base] if base else anchor)
                    names = [base] + [f"{base}.{a.name}" for a in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".", 1)[0]
                    if top in packages:
                        # an import of a.b.c runs a, a.b and a.b.c
                        parts = name.split(".")
                        for i in range(1, len(parts) + 1):
                            sub = ".".join(parts[:i])
                            if sub in modules and eager and sub != importer:
                                graph[importer].add(sub)
                    elif top and top not in sys.stdlib_module_names and top != "__future__":
                        found.append(Import(importer, top, str(path.relative_to(root)),
                                            node.lineno, eager))
    # NB: ``from x import a, b`` lists x and x.a, x.b: keep one record per line and name
    unique = {(i.importer, i.name, i.line): i for i in found}
    return list(unique.values()), graph


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``import start`` runs (``start``'s parents included, as Python runs them)."""
    todo = [start]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen or m not in graph:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(graph[m])
    return seen


@functools.cache
def _providers() -> dict[str, set[str]]:
    return {name: {_normalize(d) for d in dists}
            for name, dists in importlib.metadata.packages_distributions().items()}


def distributions_of(name: str) -> set[str]:
    """The installed distributions that provide top-level module ``name``."""
    return _providers().get(name, set())


def problems(root: Path) -> list[str]:
    """Every import not covered by what pyproject.toml declares for it, one line each."""
    core, extras = declared(root)
    anywhere = core.union(*extras.values())
    found, graph = imports(root)
    eager_needs: dict[str, set[str]] = {}
    for pkg, allowed in EAGER_EXTRAS.items():
        ok = core.union(*(extras[e] for e in allowed))
        for m in closure(graph, pkg):
            eager_needs.setdefault(m, ok)
    out = []
    for i in sorted(found, key=lambda i: (i.path, i.line, i.name)):
        dists = distributions_of(i.name)
        if not dists:
            out.append(f"{i.path}:{i.line}: {i.name}: no installed distribution provides it")
            continue
        if i.eager and i.importer in eager_needs:
            need = eager_needs[i.importer]
            if not dists & need:
                root_pkg = i.importer.split(".", 1)[0]
                where = "core dependencies" + "".join(
                    f" or the [{e}] extra" for e in EAGER_EXTRAS[root_pkg])
                out.append(f"{i.path}:{i.line}: {i.importer} imports {i.name} when "
                           f"`import {root_pkg}` runs, but {'/'.join(sorted(dists))} is not "
                           f"in the {where}")
        elif not dists & anywhere:
            out.append(f"{i.path}:{i.line}: {i.importer} imports {i.name}, but "
                       f"{'/'.join(sorted(dists))} is declared nowhere in pyproject.toml")
    return out


def test_every_import_is_covered_by_declared_dependencies() -> None:
    found = problems(ROOT)
    assert found == [], "imports not covered by pyproject.toml:\n" + "\n".join(found)


def test_the_check_catches_an_undeclared_import(tmp_path: Path) -> None:
    """Issue 21 finding 1: numpy imported by the engine, declared only in the bench extra."""
    (tmp_path / "persist" / "indexed").mkdir(parents=True)
    (tmp_path / "operators").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\ndependencies = ["pyarrow>=15"]\n'
        '[project.optional-dependencies]\nbench = ["numpy"]\nspark = ["pyspark"]\n'
        's3 = ["boto3"]\ncli = ["tqdm"]\n')
    (tmp_path / "persist" / "__init__.py").write_text("from persist.indexed import columnar\n")
    (tmp_path / "persist" / "indexed" / "__init__.py").write_text("")
    (tmp_path / "persist" / "indexed" / "columnar.py").write_text(
        "import numpy as np\nimport pyarrow as pa\n")
    (tmp_path / "persist" / "aws.py").write_text("import boto3\n")   # lazy: an extra is enough
    (tmp_path / "persist" / "late.py").write_text(
        "def f():\n    import msgspec\n")                           # declared nowhere
    (tmp_path / "operators" / "__init__.py").write_text(
        "import pyspark\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import boto3\n"
        "try:\n    import tqdm\nexcept ImportError:\n    tqdm = None\n")
    assert problems(tmp_path) == [
        "persist/indexed/columnar.py:1: persist.indexed.columnar imports numpy when `import "
        "persist` runs, but numpy is not in the core dependencies",
        "persist/late.py:2: persist.late imports msgspec, but msgspec is declared nowhere in "
        "pyproject.toml",
    ]
