"""The engine driven the way tests drive it: one command per commit, synchronously.

Production code drives :class:`~persist.indexed.engine.Indexed` through the runtime, which
stages groups of commands on a ``Txn`` and runs maintenance rounds through its queue. Tests of
the engine itself want it without threads: :class:`Engine` adds the one-command conveniences
on top of the engine's own API (``Txn``, ``commit``, ``commit_ops``, ``maintain``), and reads
through the one read path (:mod:`persist.indexed.read.scan`), as a client does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

import persist
from persist import distributed
from persist.errors import InvalidUsage
from persist.indexed.engine import Indexed, Txn
from persist.indexed.format import columnar, evolve
from persist.indexed.format.columnar import Codec
from persist.indexed.format.meta import (
    AllowCompaction,
    CollectionMeta,
    Op,
    Seal,
    SetHold,
    State,
)
from persist.indexed.read.filter import Filter
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import Address, CollectionInfo, SnapshotRead, read_task
from persist.indexed.state.transitions import collection

#: Where :class:`Engine`'s reads say they come from (they read through the engine's reader).
ADDRESS = Address.of("test://engine")


class Engine(Indexed):
    """An engine whose every write, seal and evolution is one commit of its own."""

    def register(self, name: str, key_type: Any, value_type: Any) -> CollectionMeta:
        """Registers ``name`` with its types, or checks them if it exists (create_or_load)."""
        if not isinstance(name, str) or not name:
            raise InvalidUsage(f"collection name must be a non-empty string, not {name!r}")
        txn = Txn(self.state)
        txn.register(name, Codec.of(key_type, "key"), Codec.of(value_type, "value"))
        return self.commit(txn).collections[name]

    def evolve_schema(self, name: str, key_type: Any = None, value_type: Any = None, *,
                      expect: int | None = None) -> int:
        """Evolves ``name``'s schema in one commit; returns the new (or unchanged) version."""
        k = None if key_type is None else Codec.of(key_type, "key")
        v = None if value_type is None else Codec.of(value_type, "value")
        txn = Txn(self.state)
        txn.evolve(name, k, v, expect)
        return evolve.version(self.commit(txn).collections[name])

    def write(self, updates: Mapping[str, Any]) -> State:
        """Writes updates to one or more collections atomically (all or nothing)."""
        txn = Txn(self.state)
        with txn.atomically():
            for name, u in updates.items():
                txn.stage_write(name, self.normalize(name, u))
        return self.commit(txn)

    def seal(self, name: str, upper: int) -> State:
        """Advances ``name``'s upper in one commit."""
        return self.commit_ops([Seal(name=name, upper=upper)])

    def allow_compaction(self, name: str, since: int) -> State:
        """Advances ``name``'s since in one commit."""
        return self.commit_ops([AllowCompaction(name=name, since=since)])

    def set_hold(self, name: str, hold_id: str, frontier: int | None) -> State:
        """Sets (None: releases) a durable read hold in one commit."""
        return self.commit_ops([SetHold(name=name, hold_id=hold_id, frontier=frontier)])

    def normalize(self, name: str, updates: Any, state: State | None = None,
                  schema_id: int | None = None) -> pa.Table:
        """``updates`` as a checked table of ``name``'s part schema (of ``schema_id``)."""
        c = collection((state or self.state).collections, name)
        types = evolve.Types.of(c, schema_id)
        return columnar.from_updates(updates, types.schema, types.key, types.value)

    def info(self, name: str, state: State | None = None) -> CollectionInfo:
        """``name`` as ``state`` (default the newest) shows it, to plan reads from."""
        s = state or self.state
        return CollectionInfo(ADDRESS, collection(s.collections, name), s.seq)

    def snapshot(self, name: str, as_of: int, state: State | None = None, *,
                 filter: Filter | None = None, schema_id: int | None = None,
                 reader: PartReader | None = None, audit: bool | None = None) -> SnapshotRead:
        """The contents of ``name`` as of ``as_of``, read as a client reads them (through
        ``reader``, default the engine's own)."""
        scan = self.info(name, state).snapshot(
            as_of, filter=filter, schema_version=schema_id,
            audit=self.options.audit_pruning if audit is None else audit)
        return SnapshotRead(scan, reader or self.reader, self.reload)

    def updates_between(self, name: str, lo: int, hi: int, state: State | None = None, *,
                        held: bool = False, schema_id: int | None = None
                        ) -> Iterator[pa.Table]:
        """The updates of ``name`` with ``lo <= time < hi``, part by part, original times."""
        scan = self.info(name, state).changes(lo, hi, schema_version=schema_id, held=held)
        return read_task(self.reader, scan.task())

    def maintain(self) -> int:
        """Runs maintenance rounds until one commits nothing; returns the commits made."""
        commits = 0

        def commit(ops: Sequence[Op], written_at: float | None) -> None:
            nonlocal commits
            self.commit_ops(ops, written_at)
            commits += 1

        while True:
            before = commits
            self.maintain_round(lambda: self.state, commit)
            if commits == before:
                return commits

    def collect_garbage(self, now_ms: int | None = None) -> int:
        """Deletes retired parts past the grace period (at ``now_ms``) and trims old metadata;
        returns the commits made."""
        done = self.collect_retired(lambda: self.state, lambda ops, _: self.commit_ops(ops),
                                    now_ms=now_ms)
        self.trim_metadata()
        return int(done)


def updates_between(client: persist.Client, name: str, lo: int, hi: int) -> list[pa.Table]:
    """Every update of ``name`` with ``lo <= time < hi`` (original times), as a client's
    distributed read plans and reads it."""
    scan = client.info(name).changes(lo, hi)
    return [t for task in scan.tasks() for t in distributed.read_task(task)]


def stop_leaving_its_log(client: persist.Client) -> None:
    """Stops ``client`` without the rollup a clean stop writes: the commits after its last
    rollup stay for the next open to replay, as a killed writer's do."""
    client._ix.rollup_at_stop = lambda: False  # type: ignore[method-assign]
    client.stop()
