"""Pruned reads: which parts and record batches a filtered snapshot can skip, and the audit.

A filtered read (planned by :mod:`persist.indexed.read.scan`) asks, for each part,
whether its stats (:mod:`persist.indexed.format.stats`) prove that none of its rows matches the filter
(:meth:`persist.indexed.read.filter.Bound.may_match`). A part proven empty is not fetched; within a
part that may match, record batches proven empty are not decoded. What is read is then filtered
row by row, so pruning only ever saves work: the rows returned are exactly those of the
unfiltered snapshot that match (stats are conservative: a field without stats may match).

**Schema evolution.** Stats describe a part as written (its schema version,
``PartMeta.schema_id``); a read sees it migrated to the version it reads
(:mod:`persist.indexed.format.evolve`, through the current version). Migration keeps a field's values
exactly when the field exists in every version the migration passes through (it only widens
types, or narrows values that fit), so a field's stats apply only then. A field missing from any
of those versions (added later, or dropped and added again: a new field) is null in every
migrated row, which the read knows without stats.

**Audit** (``Options.audit_pruning``): every part and batch pruning skipped is read anyway and
filtered; a matching row in one raises :class:`~persist.errors.Corruption` naming the part,
since its stored stats do not describe its stored data. The test suites run with it on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import Corruption, SchemaMismatch
from persist.indexed.format import evolve, stats
from persist.indexed.format.meta import PartMeta
from persist.indexed.format.stats import Bounds
from persist.indexed.read.filter import Bound


class BatchSource(Protocol):
    """Decodes parts as written (``read.PartReader``)."""

    def read(self, part: PartMeta, schema: pa.Schema) -> pa.Table:
        """``part``'s table, checked against ``schema``."""
        ...

    def read_batches(self, part: PartMeta, schema: pa.Schema, keep: list[bool],
                     batch_rows: tuple[int, ...]) -> pa.Table:
        """Only the record batches ``i`` of ``part`` with ``keep[i]``."""
        ...


@dataclass
class PruneCounts:
    """What a filtered snapshot read and skipped so far (counted as it reads)."""

    #: Parts fetched (whole or in part) and parts skipped by their stats.
    parts_read: int = 0
    parts_pruned: int = 0
    #: Record batches decoded and skipped, in parts that have per-batch stats.
    batches_read: int = 0
    batches_skipped: int = 0


class Pruner:
    """Decides and performs the pruned reads of one filtered snapshot. Not thread-safe (its
    counts), like a snapshot's iteration."""

    def __init__(self, bound: Bound, view: evolve.View, *, audit: bool = False,
                 counts: PruneCounts | None = None) -> None:
        """Prunes reads of ``view`` (its target version, through the current one) filtered by
        ``bound`` (bound to the target version's types); ``audit`` reads what it skips;
        ``counts``: where to count what it reads and skips (default: counts of its own)."""
        self.bound = bound
        self.view = view
        self.audit = audit
        self.counts = PruneCounts() if counts is None else counts
        self._paths = bound.paths()

    # -- decisions -----------------------------------------------------------------------------

    def _lookup(self, p: PartMeta, known: dict[str, Bounds], rows: int
                ) -> Callable[[str], Bounds | None]:
        """What a filter may assume about the fields of ``p`` migrated to the target version,
        given ``known`` (the part's stats by field, as written)."""
        sid = evolve.part_version(p)
        kept = _continuous(self.view.schemas, sid, self.view.target)

        def lookup(path: str) -> Bounds | None:
            if kept is None or path in kept:
                return known.get(path)
            # NB: not in every version on the way: the migration nulls it in every row.
            return Bounds(rows, rows, 0, None, None)
        return lookup

    def part_may_match(self, p: PartMeta) -> bool:
        """False if ``p``'s stats prove it holds no matching row (no stats: True)."""
        s = p.stats
        if not isinstance(s, stats.PartStats):
            return True
        return self.bound.may_match(self._lookup(p, stats.part_bounds(s, p.rows), p.rows))

    def batches_to_read(self, p: PartMeta) -> list[bool] | None:
        """Per record batch of ``p``, whether it may hold a matching row; None if ``p`` has
        no per-batch stats (read it whole)."""
        s = p.stats
        if not isinstance(s, stats.PartStats) or not s.batch_rows:
            return None
        if sum(s.batch_rows) != p.rows:
            # NB: batch stats that do not add up to the part cannot be placed on its rows;
            # reading it whole is always right (the audit reports the part-level stats).
            return None
        return [self.bound.may_match(self._lookup(p, b, n))
                for b, n in zip(stats.batch_bounds(s), s.batch_rows, strict=True)]

    # -- reads ---------------------------------------------------------------------------------

    def load(self, reader: BatchSource, p: PartMeta, *, current: bool = False
             ) -> pa.Table | None:
        """``p``'s rows that may match, migrated to the target version (``current``: to the
        current version), or None if its stats rule it out. Not yet filtered row by row.

        Raises:
            Corruption: (auditing) a skipped part or batch holds a matching row.
            PartMissing, ExternalError: as ``PartReader.read``.
        """
        if not self.part_may_match(p):
            self.counts.parts_pruned += 1
            if self.audit:
                self._check_skipped(p, self.view.stored(reader, p), "the part")
            return None
        self.counts.parts_read += 1
        keep = self.batches_to_read(p)
        s = p.stats
        if keep is None or not isinstance(s, stats.PartStats):
            table = self.view.stored(reader, p)
        else:
            self.counts.batches_read += sum(keep)
            self.counts.batches_skipped += len(keep) - sum(keep)
            schema = self.view.schemas.part_schema(evolve.part_version(p))
            if all(keep):
                table = reader.read(p, schema)
            else:
                table = reader.read_batches(p, schema, keep, s.batch_rows)
                if self.audit:
                    skipped = reader.read_batches(p, schema, [not k for k in keep],
                                                  s.batch_rows)
                    self._check_skipped(p, skipped, "a record batch of the part")
        return self._migrate(table, p, current=current)

    def check_skipped_part(self, reader: BatchSource, p: PartMeta) -> None:
        """The audit of a part a planner's pruning skipped (with this filter and the same
        stats): reads it whole and raises if it holds a matching row. Counts nothing (the
        planner counted the skip).

        Raises:
            Corruption: it holds a matching row.
            PartMissing, ExternalError: as ``PartReader.read``.
        """
        self._check_skipped(p, self.view.stored(reader, p), "the part")

    def _migrate(self, table: pa.Table, p: PartMeta, *, current: bool) -> pa.Table:
        v = self.view
        to = v.schemas.current if current else v.target
        return evolve.migrate(table, v.schemas, evolve.part_version(p), to, v.name)

    def _check_skipped(self, p: PartMeta, stored: pa.Table, what: str) -> None:
        """The audit: ``stored`` (rows of ``p`` as written, which pruning skipped) must hold no
        row matching the filter."""
        try:
            rows = self._migrate(stored, p, current=False)
        except SchemaMismatch:
            # NB: a read as of an older schema version migrates consolidated records, and a
            # raw row that cancels out may not fit the older version: such rows cannot be
            # audited one by one (the read itself never meets them).
            return
        if len(rows) and pc.any(self.bound.mask(rows)).as_py():
            where = p.blob_key or f"inline part {p.id}"
            raise Corruption(where, f"pruning skipped {what}, but it holds a row matching "
                                    f"{self.bound.filter!r}: its stats do not describe its "
                                    f"data")


def _continuous(schemas: evolve.Schemas, sid: int, target: int) -> frozenset[str] | None:
    """The fields (stats names) whose values a migration from version ``sid`` to ``target``
    keeps: those in every version from ``min(sid, target)`` to the current one. None: every
    field (no migration at all)."""
    if sid == target == schemas.current:
        return None
    return _continuous_cached(schemas.types, min(sid, target))


@functools.lru_cache(maxsize=256)
def _continuous_cached(types: tuple[tuple[pa.DataType, pa.DataType], ...], lo: int
                       ) -> frozenset[str]:
    out: frozenset[str] | None = None
    for kt, vt in types[lo:]:
        here = frozenset(_names(kt, ("key",)) | _names(vt, ("value",)))
        out = here if out is None else out & here
    return out or frozenset()


def _names(t: pa.DataType, segments: tuple[str, ...]) -> set[str]:
    """Stats names of ``t`` and its struct fields, as :mod:`persist.indexed.format.stats` names them."""
    out = {stats.path_key(segments)}
    if pa.types.is_struct(t):
        for f in t:
            out |= _names(f.type, (*segments, f.name))
    return out


__all__ = ["BatchSource", "PruneCounts", "Pruner"]
