"""What every workload gets: the flags, the scratch directory and the systems to run."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from bench.common import SCHEMA, fresh_dir, remove
from bench.systems import SYSTEMS, System


@dataclass
class Context:
    args: argparse.Namespace
    work: Path
    #: Systems that can run here, in table order.
    systems: list[str]
    #: Systems that cannot run here, with the reason (recorded in every workload).
    unavailable: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def repeats(self) -> int:
        return int(self.args.repeats)

    def peer_skips_round(self, name: str, r: int) -> bool:
        """delta-rs and pyiceberg run only ``--peer-repeats`` rounds of the slow workloads."""
        return name in ("delta", "iceberg") and r >= int(self.args.peer_repeats)

    def log(self, msg: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def new_system(self, name: str, tag: str, *, schema: pa.Schema = SCHEMA) -> System:
        """A created, empty table of ``name`` in a fresh directory, with columns ``schema``."""
        root = fresh_dir(self.work, f"{tag}-{name}")
        s = SYSTEMS[name](root, schema=schema)
        s.create()
        return s

    def dispose(self, s: System) -> None:
        s.close()
        remove(s.root)
