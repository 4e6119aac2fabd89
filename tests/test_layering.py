"""The house rules of the import graph: no cycles, and arrows only run downhill.

The layers, bottom up (DESIGN.md §2)::

    ground floor  persist.errors, persist.layout, persist.crashpoints, persist.metrics
    blob          persist.blob.*                    (stores, envelope, AWS plumbing)
    lock          persist.lock.*                    (may use blob)
    indexed       persist.indexed.*                 (may use blob); inside it, bottom up:
                  format, state, read, maintenance, engine
    runtime       persist.runtime.*                 (may use indexed, lock, blob)
    top           persist.location (the composition root: URL -> blob + lock + runtime),
                  persist.distributed.* (the distributed API: reads, stager, committer),
                  persist.aio, persist.cli, persist (the public face)
    operators     operators.*                       (the Spark side: the public faces only)

Every import counts, including the ones inside functions and under ``TYPE_CHECKING``: a lazy
import is still an arrow, and hiding a cycle inside a function only moves where it breaks. No
module imports another's private (``_``-prefixed) name (:func:`private_imports`).

``operators/`` stands on the engine's public API alone, as any other engine would: the names of
``persist.__all__`` and of ``persist.distributed.__all__``, nothing else (:func:`private_uses`);
of the engine's records it reads only their public views, never the storage format's fields of
a part or a plan's internal part lists (:func:`record_reads`), and it learns of a missing part
from the engine, never from Spark's message text.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("persist", "operators")

#: (importer prefix, forbidden prefix, why). A module matches a prefix if it is the prefix or
#: lies below it.
RULES: tuple[tuple[str, str, str], ...] = (
    *(("persist.blob", bad, "the blob layer is the bottom of the engine")
      for bad in ("persist.lock", "persist.indexed", "persist.runtime", "persist.location",
                  "persist.distributed", "persist.cli", "operators")),
    *(("persist.lock", bad, "the lock layer sits on blob only")
      for bad in ("persist.indexed", "persist.runtime", "persist.location",
                  "persist.distributed", "persist.cli", "operators")),
    *(("persist.indexed", bad, "the engine never reaches up into its runtime or Spark")
      for bad in ("persist.runtime", "persist.location", "persist.distributed", "persist.cli",
                  "operators")),
    # Inside the engine: format (what is stored) is its floor; the state machine stands on
    # format; reading on format and state; maintenance on all three; only engine.py (the
    # Indexed facade) ties them together, and nothing inside imports it.
    *(("persist.indexed.format", bad, "the storage format is the engine's floor")
      for bad in ("persist.indexed.state", "persist.indexed.read",
                  "persist.indexed.maintenance", "persist.indexed.engine")),
    *(("persist.indexed.state", bad, "the metadata state stands on the format only")
      for bad in ("persist.indexed.read", "persist.indexed.maintenance",
                  "persist.indexed.engine")),
    *(("persist.indexed.read", bad, "reading stands on the format and the state only")
      for bad in ("persist.indexed.maintenance", "persist.indexed.engine")),
    ("persist.indexed.maintenance", "persist.indexed.engine",
     "maintenance is driven by the engine, never the other way round"),
    *(("persist.runtime", bad, "the runtime is assembled by the composition root, never the "
                               "other way round")
      for bad in ("operators", "persist.cli", "persist.location", "persist.aio")),
    ("persist.runtime", "persist.distributed",
     "the distributed API stands on the runtime (its committer opens writers); the records "
     "both use (StagedPart, Token) live in the engine, under both"),
    *(("persist.distributed", bad, "the distributed API is a face of the engine, for any "
                                   "engine that drives it (Spark is one)")
      for bad in ("operators", "persist.cli", "persist.aio")),
    *((ground, bad, "the ground floor imports nothing of persist but itself")
      for ground in ("persist.errors", "persist.layout", "persist.crashpoints",
                     "persist.metrics")
      for bad in ("persist.blob", "persist.lock", "persist.indexed", "persist.runtime",
                  "persist.location", "persist.distributed", "persist.cli", "operators")),
)


@dataclass(frozen=True)
class Arrow:
    """One import: ``importer`` (a module) imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int


def module_name(root: Path, path: Path) -> str:
    """``persist/blob/s3.py`` -> ``persist.blob.s3``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def arrows(root: Path, packages: tuple[str, ...] = PACKAGES) -> Iterator[Arrow]:
    """Every import inside ``packages`` under ``root`` that names a module of ``packages``."""
    modules = {module_name(root, p) for pkg in packages for p in (root / pkg).rglob("*.py")}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            importer = module_name(root, path)
            is_package = path.name == "__init__.py"
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                for target in _targets(node, importer, is_package, modules):
                    yield Arrow(importer, target, str(path.relative_to(root)), node.lineno)


def _targets(node: ast.AST, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if _top(a.name) in PACKAGES]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        here = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = here[: len(here) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    if _top(base) not in PACKAGES:
        return []
    # NB: ``from persist import layout`` imports the module persist.layout; ``from
    # persist.errors import X`` imports persist.errors. Both are arrows to the module named.
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in modules else base)
    return out


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(found: list[Arrow]) -> list[str]:
    """The arrows that break a rule, each as one readable line."""
    out = []
    for a in found:
        for importer, forbidden, why in RULES:
            if _within(a.importer, importer) and _within(a.imported, forbidden):
                out.append(f"{a.path}:{a.line}: {a.importer} imports {a.imported}, but "
                           f"{importer} must not import {forbidden} ({why})")
    return out


def cycles(found: list[Arrow]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a in found:
        if a.imported != a.importer:
            graph.setdefault(a.importer, set()).add(a.imported)
            graph.setdefault(a.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_face(module: str) -> bool:
    # NB: ``persist/__init__.py`` re-exports the public names, so every ``from persist import
    # X`` of a submodule passes through the package; the package itself is the face, not a
    # layer, and importing *from* it is how operators are meant to reach the engine.
    return module in PACKAGES


#: The engine's public faces: each a package whose ``__all__`` is all another engine may use.
FACES = ("persist", "persist.distributed")


def public_names(root: Path, face: str = "persist") -> set[str]:
    """``<face>.__all__``, read from the face's ``__init__.py`` without importing it."""
    tree = ast.parse((root / face.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            return {str(v) for v in value}
    return set()


def private_uses(root: Path) -> list[str]:
    """Every place ``operators/`` reaches past the public faces of persist (:data:`FACES`): an
    import of any other persist module, a name imported from a face that its ``__all__``
    lacks, or an attribute of a face (``persist.X``, ``persist.distributed.X``, or ``X`` of a
    name a face was imported as) that it lacks; one readable line each."""
    faces = {face: public_names(root, face) for face in FACES if
             (root / face.replace(".", "/") / "__init__.py").exists()}
    out = []
    for path in sorted((root / "operators").rglob("*.py")):
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(), filename=str(path))
        #: Local names bound to a face module (``from persist import distributed as d``).
        aliases = {"persist": "persist"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in faces and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module in faces:
                for a in node.names:
                    if f"{node.module}.{a.name}" in faces:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [f"{rel}:{node.lineno}: import {a.name} (only the faces: "
                        f"{', '.join(FACES)})"
                        for a in node.names if _top(a.name) == "persist" and a.name not in faces]
            elif isinstance(node, ast.ImportFrom) and node.module and \
                    _top(node.module) == "persist":
                if node.module not in faces:
                    out.append(f"{rel}:{node.lineno}: from {node.module} import ... (a persist "
                               f"internal; use the names of {' or '.join(FACES)}.__all__)")
                else:
                    out += [f"{rel}:{node.lineno}: from {node.module} import {a.name} (not in "
                            f"{node.module}.__all__)" for a in node.names
                            if a.name not in faces[node.module]]
            elif isinstance(node, ast.Attribute):
                face = _face_of(node.value, aliases)
                if face is not None and face in faces and node.attr not in faces[face] and \
                        f"{face}.{node.attr}" not in faces:
                    out.append(f"{rel}:{node.lineno}: {face}.{node.attr} (not in "
                               f"{face}.__all__)")
    # NB: ast.walk goes breadth first; report in file and line order
    return sorted(out, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


#: Attributes only the engine's own records have (``PartMeta``'s storage-format fields, a
#: ``Scan``'s and a ``PartHandle``'s internal records): their public views are ``PartHandle``
#: (id, rows, nbytes, min_time, max_time, stats), ``Scan.parts``/``skipped``/``counts``,
#: ``ReadTask.handles``/``rows``, and the native plan's ``Residual``. (Names Spark or
#: operators' own types also use, ``parquet`` and ``schema_id``, are left out.)
RECORD_FIELDS = frozenset({
    "blob_key", "inline", "full", "inserted", "retracted", "checksum", "sorted", "ordered",
    "consolidated", "kept", "skipped_parts", "part",
})
#: Text of Spark's (or Hadoop's) errors that would tell of a missing part: the engine does
#: (``NativePlan.missing``), from the store, never operators from a message.
MISSING_TEXT = ("PATH_NOT_FOUND", "Path does not exist", "FileNotFound", "No such file")


def record_reads(root: Path) -> list[str]:
    """Every place ``operators/`` reads an attribute only the engine's internal records have
    (:data:`RECORD_FIELDS`), or matches error text that tells of a missing file
    (:data:`MISSING_TEXT`); one readable line each."""
    out = []
    for path in sorted((root / "operators").rglob("*.py")):
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr in RECORD_FIELDS:
                out.append(f"{rel}:{node.lineno}: .{node.attr} (an engine record's own field; "
                           f"use its public view)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out += [f"{rel}:{node.lineno}: matches {t!r} (the engine reports a missing "
                        f"part, as PartMissing)" for t in MISSING_TEXT if t in node.value]
    return sorted(out, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def _face_of(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The face module ``node`` names (``persist``, ``persist.distributed``, or a local
    alias of one), else None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _face_of(node.value, aliases)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def private_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every import of a private (``_``-prefixed, not dunder) name from another module of
    ``packages``: a private name is its module's own business. One readable line each."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        _top(node.module) in packages:
                    out += [f"{path.relative_to(root)}:{node.lineno}: from {node.module} "
                            f"import {a.name} (a private name)" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_operators_use_only_the_public_engine_api() -> None:
    problems = private_uses(ROOT)
    assert problems == [], "operators/ reaches into persist internals:\n" + "\n".join(problems)


def test_the_boundary_check_catches_private_uses(tmp_path: Path) -> None:
    (tmp_path / "persist" / "distributed").mkdir(parents=True)
    (tmp_path / "operators").mkdir()
    (tmp_path / "persist" / "__init__.py").write_text('__all__ = ["distributed", "open"]\n')
    (tmp_path / "persist" / "distributed" / "__init__.py").write_text(
        '__all__ = ["describe"]\n')
    (tmp_path / "operators" / "x.py").write_text(
        "import persist\nfrom persist import distributed, layout\n"
        "from persist.indexed import read\nimport persist.location\n"
        "def f():\n    return persist.open, persist.Machine\n"
        "from persist.distributed import describe, _stripped\n"
        "import persist.distributed as pd\n"
        "def g():\n    return persist.distributed.describe, persist.distributed.Stager\n"
        "def h():\n    return distributed.describe, distributed.Machine, pd.lease\n")
    assert private_uses(tmp_path) == [
        "operators/x.py:2: from persist import layout (not in persist.__all__)",
        "operators/x.py:3: from persist.indexed import ... (a persist internal; use the names "
        "of persist or persist.distributed.__all__)",
        "operators/x.py:4: import persist.location (only the faces: persist, "
        "persist.distributed)",
        "operators/x.py:6: persist.Machine (not in persist.__all__)",
        "operators/x.py:7: from persist.distributed import _stripped (not in "
        "persist.distributed.__all__)",
        "operators/x.py:10: persist.distributed.Stager (not in persist.distributed.__all__)",
        "operators/x.py:12: persist.distributed.Machine (not in persist.distributed.__all__)",
        "operators/x.py:12: persist.distributed.lease (not in persist.distributed.__all__)",
    ]


def test_operators_read_only_public_views_of_engine_records() -> None:
    problems = record_reads(ROOT)
    assert problems == [], "operators/ restates engine rules:\n" + "\n".join(problems)


def test_the_record_check_catches_internal_fields_and_error_text(tmp_path: Path) -> None:
    (tmp_path / "operators").mkdir()
    (tmp_path / "operators" / "x.py").write_text(
        "def f(scan, p, e, h):\n"
        "    if len(scan.kept) == 1 and p.consolidated:\n"
        "        return h.part.min_time, h.min_time, scan.counts\n"
        "    if 'PATH_NOT_FOUND' in str(e):\n"
        "        raise e\n")
    assert record_reads(tmp_path) == [
        "operators/x.py:2: .consolidated (an engine record's own field; use its public view)",
        "operators/x.py:2: .kept (an engine record's own field; use its public view)",
        "operators/x.py:3: .part (an engine record's own field; use its public view)",
        "operators/x.py:4: matches 'PATH_NOT_FOUND' (the engine reports a missing part, as "
        "PartMissing)",
    ]


def test_no_module_imports_a_private_name() -> None:
    problems = private_imports(ROOT)
    assert problems == [], "private names imported across modules:\n" + "\n".join(problems)


def test_the_private_import_check_catches_one(tmp_path: Path) -> None:
    (tmp_path / "persist").mkdir()
    (tmp_path / "operators").mkdir()
    (tmp_path / "persist" / "a.py").write_text(
        "from persist.b import _hidden, public, __version__\nfrom os import _exit\n")
    assert private_imports(tmp_path) == [
        "persist/a.py:1: from persist.b import _hidden (a private name)"]


def test_no_import_cycles() -> None:
    found = [a for a in arrows(ROOT) if not _is_face(a.importer) and not _is_face(a.imported)]
    assert cycles(found) == [], "import cycles (each list is one circle of modules)"


def test_layers_import_only_downhill() -> None:
    problems = violations(list(arrows(ROOT)))
    assert problems == [], "wrong-way imports:\n" + "\n".join(problems)


def test_the_checks_catch_a_wrong_way_import_and_a_cycle(tmp_path: Path) -> None:
    """The checks themselves: a blob module importing the lock layer, and a two-module circle,
    are both reported (so a green run above means something)."""
    (tmp_path / "persist" / "blob").mkdir(parents=True)
    (tmp_path / "persist" / "lock").mkdir(parents=True)
    (tmp_path / "operators").mkdir()
    for pkg in ("persist", "persist/blob", "persist/lock", "operators"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "persist" / "blob" / "s3.py").write_text(
        "def location():\n    from persist.lock.s3 import S3Lock\n    return S3Lock\n")
    (tmp_path / "persist" / "lock" / "s3.py").write_text(
        "from persist.blob import s3\nclass S3Lock: ...\n")
    found = list(arrows(tmp_path))
    assert violations(found) == [
        "persist/blob/s3.py:2: persist.blob.s3 imports persist.lock.s3, but persist.blob must "
        "not import persist.lock (the blob layer is the bottom of the engine)"
    ]
    assert cycles(found) == [["persist.blob.s3", "persist.lock.s3"]]


@pytest.mark.parametrize(("importer", "is_package", "node", "expected"), [
    ("persist.blob.s3", False, "from . import envelope", ["persist.blob.envelope"]),
    ("persist.blob", True, "from .s3 import S3Blob", ["persist.blob.s3"]),
    ("persist.indexed.read", False, "from ..errors import Corruption", ["persist.errors"]),
    ("operators.sink", False, "import persist", ["persist"]),
    ("operators.sink", False, "import numpy", []),
])
def test_relative_and_absolute_imports_resolve(
    importer: str, is_package: bool, node: str, expected: list[str]
) -> None:
    modules = {"persist.blob.envelope", "persist.blob.s3", "persist.errors"}
    parsed = ast.parse(node).body[0]
    assert _targets(parsed, importer, is_package, modules) == expected
