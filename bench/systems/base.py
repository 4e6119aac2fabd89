"""The one small interface every system under test implements.

A system stores one table of updates (``bench.common.SCHEMA`` unless given another schema of
the same four columns, e.g. W10's records) under its own directory. Every
``append`` is *acknowledged* when it returns: durable for persist and the floor (fsync'd),
committed for the peers (whatever their commit guarantees; delta-rs does not fsync locally).
Reads always *open afresh* (a new handle, as another process would) and return the raw rows
visible at a version, so metadata loading is part of every read's cost for every system.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from bench.common import SCHEMA


class Skip(Exception):
    """A system cannot run (part of) a workload; the message is recorded as the reason."""


class System(ABC):
    #: The name used in tables, JSON and ``--systems``.
    name: ClassVar[str]
    #: Modules that must import for this system to run.
    requires: ClassVar[tuple[str, ...]] = ()
    #: One line on what an append guarantees when it returns.
    guarantee: ClassVar[str] = ""

    def __init__(self, root: Path, *, schema: pa.Schema = SCHEMA) -> None:
        self.root = root
        #: The table's columns: ``key, value, time, diff`` (``time`` and ``diff`` int64).
        self.schema = schema

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this system cannot run here (a module missing), or None."""
        for mod in cls.requires:
            try:
                importlib.import_module(mod)
            except ImportError as e:
                return f"{mod} is not installed ({e}); install the 'bench' extra"
        return None

    @abstractmethod
    def create(self) -> None:
        """Creates the empty table (not timed)."""

    @abstractmethod
    def append(self, table: pa.Table, upper: int) -> Any:
        """Appends ``table`` (every time < ``upper``) and returns a version token that ``read``
        accepts. Returns once the append is acknowledged."""

    @abstractmethod
    def read(self, version: Any = None) -> pa.Table:
        """Opens the table afresh and returns every row visible at ``version`` (None: latest),
        unconsolidated (the peers' native answer)."""

    def compact(self) -> str:
        """Runs the system's manual compaction; returns what it did."""
        return "none"

    def concurrent_appender(self) -> Callable[[pa.Table], int]:
        """A thread-safe ``append(table) -> conflicts retried`` for W4; times are assigned by
        the system (the table's time column is overwritten where the system needs that)."""
        raise Skip(f"{self.name} has no concurrent append")

    # -- W11: a zero-copy fork ----------------------------------------------------------------

    def fork(self, version: Any, into: str) -> int:
        """Makes a new writable line of the table as of ``version`` named ``into``, copying no
        data if the system can; returns the data files (blobs) it wrote."""
        raise Skip(f"{self.name} has no fork")

    # -- W5: another process following the table --------------------------------------------

    def visible_appends(self) -> int:
        """(In a follower process, on an adapter made by ``attach``.) How many appends are
        visible now. Persist uses its listen API instead."""
        raise Skip(f"{self.name} cannot be followed")

    @classmethod
    def attach(cls, root: Path) -> System:
        """An adapter on an existing table (in another process), for reading only."""
        s = cls(root)
        s._attach()
        return s

    def _attach(self) -> None:
        raise Skip(f"{self.name} cannot attach")

    # -- W6: scale of metadata ----------------------------------------------------------------

    def add_collections(self, n: int) -> None:
        """Creates ``n`` more collections/tables next to the measured one."""
        raise Skip(f"{self.name} has no notion of several collections in one location")

    def add_history(self, n: int) -> None:
        """Makes ``n`` prior commits (seals, no data) on the measured table."""
        raise Skip(f"{self.name}: building {n} prior commits is not supported")

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Releases handles, threads and locks."""
