"""One adapter per system under test, all with the interface of :class:`bench.systems.base.System`."""

from __future__ import annotations

from bench.systems.base import Skip, System
from bench.systems.delta import DeltaSystem
from bench.systems.floor import FloorSystem
from bench.systems.iceberg import IcebergSystem
from bench.systems.persist import PersistSystem

#: Every system, in table order: persist first, then the floor, then the peers.
SYSTEMS: dict[str, type[System]] = {
    s.name: s for s in (PersistSystem, FloorSystem, DeltaSystem, IcebergSystem)
}

PEERS = ("floor", "delta", "iceberg")

__all__ = ["PEERS", "SYSTEMS", "Skip", "System"]
