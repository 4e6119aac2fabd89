"""The knob matrix: named sets of behaviour-preserving options the suites run under.

Every ``persist.Options`` field and the file store's ``map_min_bytes`` change what persist costs
(files, fsyncs, bytes rewritten, parts a read touches), never what it returns. A bug that hides
behind one setting (an inline part, a group of commits, a rollup cadence) shows up under
another, so the core, runtime, replica and nemesis suites run under each set of
:data:`KNOB_SETS` (Materialize runs every persist test once per set of "dyncfgs" the same way).

How a set reaches the code: while it is *active*, ``Options(...)`` and ``CompactionPolicy(...)``
fill every field the caller did not pass from the set, and a file location opened without a
``map_min_bytes`` storage option gets the set's. A test that passes a value explicitly keeps
it: that is how a test that asserts a knob-dependent count pins the knob it needs (say
``Options(group_commit=True)`` for "one commit per group"), with a comment saying why. The
nemesis applies its set on top of its own options instead (:meth:`KnobSet.apply`: the set
wins), and its agitator flips sets on the live writer with ``Client.set_options``.

Choosing the set (``PERSIST_KNOBS``):

* unset or ``rotate``: the fast CI slice, one set per day of the year (printed in the pytest
  header, so a failure is reproducible with ``PERSIST_KNOBS=<name>``);
* a set's name: that set;
* ``python -m tests.knobs [pytest args]`` runs pytest once per set (the full matrix) and
  prints one line per set.

Only tests under :data:`MATRIX_DIRS` run under the set (the hook is in the root conftest);
subprocesses those tests start call :func:`activate_from_env` (``PERSIST_KNOBS`` is exported
with the resolved name).

:data:`BASE_OPTIONS` apply to every ``Options`` the test process makes, under every set and
outside the matrix too (installed when this module is imported): the suite runs with
``audit_pruning`` on, so every filtered read also reads what its stats let it skip and fails
loudly if pruning was wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import persist.location
from persist.blob.file import MAP_MIN_BYTES, FileBlob
from persist.indexed.engine import MAX_INLINE_THRESHOLD, Options
from persist.indexed.maintenance.compact import CompactionPolicy

ENV = "PERSIST_KNOBS"
#: ``Options`` fields every test process gets unless the caller passes them (any set or none).
BASE_OPTIONS: Mapping[str, Any] = {"audit_pruning": True}
#: The suites run under the active set (paths relative to the repository root).
MATRIX_DIRS = ("tests/indexed", "tests/runtime", "tests/replica", "tests/nemesis")


@dataclass(frozen=True)
class KnobSet:
    name: str
    why: str
    #: ``Options`` fields.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: ``CompactionPolicy`` fields.
    compaction: Mapping[str, Any] = field(default_factory=dict)
    #: File locations' storage options (``map_min_bytes``): fixed per open, so the nemesis
    #: varies them per reopen, not live.
    storage: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, base: Options) -> Options:
        """``base`` with this set's values (the set wins over ``base``)."""
        policy = dataclasses.replace(base.compaction, **self.compaction)
        return dataclasses.replace(base, **self.options, compaction=policy)

    def storage_options(self, url: str) -> dict[str, Any]:
        """The storage options for opening ``url`` under this set (none for ``mem://``)."""
        return {} if url.startswith(("mem://", "s3://")) else dict(self.storage)

    def describe(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.options.items()]
        parts += [f"compaction.{k}={v!r}" for k, v in self.compaction.items()]
        parts += [f"storage.{k}={v!r}" for k, v in self.storage.items()]
        return ", ".join(parts) or "the defaults"


#: The matrix. "default" is what users get; every other set stresses one mechanism.
KNOB_SETS: dict[str, KnobSet] = {k.name: k for k in (
    KnobSet("default", "the shipped defaults"),
    KnobSet("inline-0", "every part is a data blob, and every blob read is memory-mapped",
            options={"inline_threshold": 0}, storage={"map_min_bytes": 1}),
    KnobSet("inline-max", "every part rides inline in its commit (and in every rollup); "
            "nothing is memory-mapped",
            options={"inline_threshold": MAX_INLINE_THRESHOLD}, storage={"map_min_bytes": None}),
    KnobSet("tiny-parts", "parts as small as the knobs allow: 64-byte inline threshold, parts "
            "final at 16 rows, inline parts flushed at 256 bytes, merges cut into 512-byte "
            "parts of 4-row record batches, stats cut to 200 bytes",
            options={"inline_threshold": 64, "stats_bytes": 200, "batch_rows": 4},
            compaction={"final_rows": 16, "inline_flush_bytes": 256,
                        "part_target_bytes": 512}),
    KnobSet("compact-aggressive", "merge at fanin 2, flush inline parts as soon as there "
            "are two, rewrite old parts with no pause",
            compaction={"fanin": 2, "inline_flush_bytes": 1, "rewrite_share": 1.0}),
    KnobSet("compact-none", "no background compaction: parts pile up until maintain()",
            options={"background_compaction": False}),
    KnobSet("marks", "compaction takes its marks step on any base (not only from 256 Ki "
            "rows): small runs below the since become a delta plus marks on the base parts "
            "(format 8) instead of a merge", compaction={"marks_rows": 1}),
    KnobSet("rollup-1", "a rollup after every commit", options={"rollup_every": 1}),
    KnobSet("no-group-commit", "one command per commit", options={"group_commit": False}),
)}


def rotation() -> KnobSet:
    """The fast CI slice: one set per day of the year."""
    names = list(KNOB_SETS)
    return KNOB_SETS[names[datetime.date.today().timetuple().tm_yday % len(names)]]


def following(ks: KnobSet) -> KnobSet:
    """The set after ``ks`` in the rotation (a second set for the same run)."""
    names = list(KNOB_SETS)
    return KNOB_SETS[names[(names.index(ks.name) + 1) % len(names)]]


def from_env() -> tuple[KnobSet, str]:
    """The set ``PERSIST_KNOBS`` names, and how it was chosen.

    Raises:
        ValueError: an unknown name.
    """
    name = os.environ.get(ENV, "").strip()
    if name in ("", "rotate"):
        return rotation(), f"rotation, day {datetime.date.today().timetuple().tm_yday}"
    if name not in KNOB_SETS:
        raise ValueError(f"{ENV}={name!r}: not a knob set; one of {', '.join(KNOB_SETS)}")
    return KNOB_SETS[name], f"{ENV}={name}"


# -- making a set the default --------------------------------------------------------------

_active: KnobSet | None = None
_installed = False


def _fill_defaults(cls: type, overrides: Callable[[KnobSet | None], Mapping[str, Any]]
                   ) -> None:
    """Wraps ``cls.__init__`` (a dataclass) so fields the caller did not pass come from the
    active set (and the base options)."""
    names = [f.name for f in dataclasses.fields(cls)]
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kw: Any) -> None:
        for name, value in overrides(_active).items():
            if name not in kw and names.index(name) >= len(args):
                kw[name] = value
        original(self, *args, **kw)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, "__init__", __init__)  # noqa: B010


def _install() -> None:
    global _installed
    if not _installed:
        _fill_defaults(Options, lambda ks: {**BASE_OPTIONS, **(ks.options if ks else {})})
        _fill_defaults(CompactionPolicy, lambda ks: ks.compaction if ks else {})
        _installed = True


def activate(ks: KnobSet | None) -> None:
    """Makes ``ks`` the default for every ``Options``, ``CompactionPolicy`` and file location
    made from now on (None: the shipped defaults)."""
    global _active
    _install()
    _active = ks
    storage = ks.storage if ks is not None else {}
    threshold = storage.get("map_min_bytes", MAP_MIN_BYTES)
    # NB: location.resolve reads its module global at each call; FileBlob(root) its default.
    persist.location.MAP_MIN_BYTES = threshold  # type: ignore[attr-defined]
    kwdefaults = FileBlob.__init__.__kwdefaults__
    assert kwdefaults is not None
    kwdefaults["map_min_bytes"] = threshold


def active() -> KnobSet | None:
    return _active


@contextlib.contextmanager
def using(ks: KnobSet | None) -> Iterator[None]:
    before = _active
    activate(ks)
    try:
        yield
    finally:
        activate(before)


def activate_from_env() -> None:
    """For subprocesses of matrix tests: activates the set ``PERSIST_KNOBS`` names."""
    if os.environ.get(ENV):
        activate(from_env()[0])


def in_matrix(relpath: str) -> bool:
    return relpath.replace(os.sep, "/").startswith(MATRIX_DIRS)


# -- the full matrix, one pytest run per set ------------------------------------------------


def main(argv: list[str]) -> int:
    """``python -m tests.knobs [pytest args]``: pytest once per knob set, one after another."""
    args = argv or ["-q", "-p", "no:cacheprovider", "-m", "not slow", *MATRIX_DIRS]
    results = []
    for name in KNOB_SETS:
        began = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "pytest", *args],
                             env={**os.environ, ENV: name})
        results.append((name, rc, time.monotonic() - began))
        print(f"== knobs {name}: exit {rc} in {time.monotonic() - began:.0f}s", flush=True)
    for name, rc, took in results:
        print(f"{name:20} {'ok' if rc == 0 else f'FAILED (exit {rc})':16} {took:6.0f}s")
    return max(rc for _, rc, _ in results)


_install()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
