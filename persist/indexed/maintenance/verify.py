"""Verifying a location (``persist verify``): every referenced blob read and checked, the
metadata replayed and cross-checked, leaked blobs found and, safely, deleted.

The engine of the fsck lives here; :mod:`persist.cli` only parses arguments and prints. Verifying
never writes; :func:`delete_leaked` is the one function that deletes, and only blobs that stay
unreferenced for a grace period longer than any writer's commit deadline (DESIGN.md §9).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import crc32c
import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import Corruption, IncompatibleFormat, MissingResource, PersistError
from persist.indexed.format import columnar, evolve, meta, parquet, sorting
from persist.indexed.format.meta import CollectionMeta, Commit, PartMeta, State
from persist.indexed.maintenance import gc
from persist.indexed.read.parts import PartReader
from persist.indexed.state import lease, pieces, pins, refs
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import apply

log = logging.getLogger("persist.verify")


class Progress(Protocol):
    """Told how far a verify got (the CLI draws a bar with it)."""

    def start(self, total: int) -> None:
        """``total`` blobs are to be read."""

    def update(self, n: int = 1) -> None:
        """``n`` more were read."""

    def close(self) -> None:
        """Verification ended."""


class _NoProgress:
    def start(self, total: int) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def require_metadata(blob: BlobRead, url: str) -> None:
    """Checks that ``blob`` holds a persist location.

    Raises:
        MissingResource: it holds no metadata at all (the message
            :meth:`MissingResource.nothing_committed`, as ``persist.open`` says it).
    """
    if not blob.list_keys(layout.META_PREFIX):
        raise MissingResource.nothing_committed(url)


@dataclass
class VerifyReport:
    """What ``verify`` found."""

    url: str
    seq: int = 0
    problems: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    metadata_blobs: int = 0
    data_blobs: int = 0
    inline_parts: int = 0
    bytes_read: int = 0
    #: The seqs ``persist restore --to-seq`` can put the location back to, as ``[lo, hi]``
    #: ranges: replayable from a rollup and the log, with every blob of this location their
    #: parts read still stored (blobs of other locations are checked when restoring).
    restorable: list[tuple[int, int]] = field(default_factory=list)
    #: Seqs still replayable from the metadata whose blobs GC already deleted.
    blobs_gone: list[tuple[int, int]] = field(default_factory=list)


def check_state(state: State, where: str) -> list[str]:
    """Returns the problems of the metadata's internal consistency (frontiers, ids, parts,
    references, retired list) of ``state``, each prefixed with ``where``; empty when
    consistent."""
    problems: list[str] = []
    ids: dict[int, str] = {}
    blob_keys: dict[str, str] = {}
    if state.version > meta.FORMAT_VERSION:
        problems.append(f"{where}: format version {state.version} is newer than this persist")
    for name, c in state.collections.items():
        here = f"{where}: collection {name!r}"
        if c.name != name:
            problems.append(f"{here} is stored under another name ({c.name!r})")
        if c.id in ids:
            problems.append(f"{here} shares id {c.id} with {ids[c.id]!r}")
        ids[c.id] = name
        if c.id >= state.next_cid:
            problems.append(f"{here} has id {c.id}, not below next id {state.next_cid}")
        if c.since > c.upper:
            problems.append(f"{here} has since {c.since} beyond upper {c.upper}")
        part_ids: set[str] = set()
        blobs: set[tuple[str | None, str]] = set()
        for p in c.parts:
            problems.extend(_check_part_meta(here, c, p, part_ids, blobs, blob_keys))
    retired = [r.key for r in state.retired]
    if len(set(retired)) != len(retired):
        problems.append(f"{where}: a blob is retired twice")
    live = set(blob_keys)
    for key in retired:
        if key in live:
            problems.append(f"{where}: retired blob {key!r} is still referenced by "
                            f"{blob_keys[key]!r}")
    return problems


def _check_part_meta(here: str, c: CollectionMeta, p: PartMeta, part_ids: set[str],
                     blobs: set[tuple[str | None, str]],
                     blob_keys: dict[str, str]) -> Iterator[str]:
    if p.id in part_ids:
        yield f"{here}: part id {p.id} appears twice"
    part_ids.add(p.id)
    if (p.inline is None) == (p.blob_key is None):
        yield f"{here}: part {p.id} must be either inline or in a blob"
    if p.rows < 0 or p.nbytes < 0:
        yield f"{here}: part {p.id} has negative rows or bytes"
    if p.rows and p.min_time > p.max_time:
        yield f"{here}: part {p.id} has min_time {p.min_time} > max_time {p.max_time}"
    if p.inline is not None and len(p.inline) != p.nbytes:
        yield f"{here}: inline part {p.id} says {p.nbytes} bytes but holds {len(p.inline)}"
    if p.blob_key is not None:
        try:
            root, key, _ = layout.parse_ref(p.blob_key)
        except ValueError as e:
            yield f"{here}: part {p.id} has a malformed reference: {e}"
            return
        # NB: only a fork reads blobs it does not own (the state transitions refuse others).
        if (root is not None or not key.startswith(layout.data_prefix(c.id))) and \
                not refs.is_fork(c):
            yield f"{here}: part {p.id} is stored outside its collection: {p.blob_key!r}"
        if (root, key) in blobs:
            yield f"{here}: blob {p.blob_key!r} is referenced twice"
        blobs.add((root, key))
        if root is None:
            blob_keys.setdefault(key, c.name)
        m = p.marks
        if m is not None and m.count:
            m_root, m_key, _ = layout.parse_ref(m.key)
            if m_root is None:
                blob_keys.setdefault(m_key, c.name)


class _Data:
    """The stored bytes of one part (verified already), read as an ``evolve.PartSource`` (a
    fork's cut applied)."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data

    def read(self, part: PartMeta, schema: pa.Schema) -> pa.Table:
        """Decodes the bytes as ``part``, checked against ``schema``."""
        if part.blob_key is None:
            return columnar.decode_part(f"inline part {part.id}", self.data, schema)
        _, key, upto = layout.parse_ref(part.blob_key)
        if part.parquet:
            s = part.stats
            rows = s.batch_rows if not isinstance(s, msgspec.UnsetType) and s.batch_rows \
                else None
            table = parquet.decode(key, self.data, schema, rows=rows).table
        else:
            table = columnar.decode_part(key, self.data, schema)
        if upto is None:
            return table
        return table.filter(pc.less_equal(table.column("time"), pa.scalar(upto, pa.uint64())))


def _check_part_data(name: str, c: CollectionMeta, p: PartMeta,
                     data: bytes | memoryview) -> list[str]:
    where = p.blob_key or f"inline part {p.id}"
    problems: list[str] = []
    if len(data) != p.nbytes:
        problems.append(f"{name}: {where} holds {len(data)} bytes, metadata says {p.nbytes}")
    tail = None if isinstance(p.stats, msgspec.UnsetType) else p.stats.tail
    if tail is not None:
        # NB: the bytes verified whole already: a wrong tail record is the writer's bug, and
        # it would make the native path refuse a sound file (or check the wrong bytes).
        view = memoryview(data)
        if not 4 <= tail.offset < len(view) or crc32c.crc32c(view[tail.offset:]) != tail.crc:
            problems.append(f"{name}: {where}'s recorded Parquet tail (from byte "
                            f"{tail.offset}, crc32c {tail.crc:#010x}) is not its tail")
    groups = None if isinstance(p.stats, msgspec.UnsetType) else p.stats.groups
    if groups is not None:
        # NB: as the tail: a wrong record would make a ranged read refuse a sound part
        view = memoryview(data)
        offsets = groups.offsets
        if (len(offsets) != len(groups.crcs) + 1 or offsets[0] < 4
                or (tail is not None and offsets[-1] != tail.offset)
                or any(b <= a for a, b in itertools.pairwise(offsets))
                or offsets[-1] > len(view)
                or any(crc32c.crc32c(view[a:b]) != crc for crc, (a, b)
                       in zip(groups.crcs, itertools.pairwise(offsets), strict=False))):
            problems.append(f"{name}: {where}'s recorded row groups (bytes {offsets[0]}-"
                            f"{offsets[-1]} in {len(groups.crcs)}) are not its row groups")
    try:
        table = evolve.View.of(c).stored(_Data(data), p)
    except Corruption as e:
        return [*problems, f"{name}: {e}"]
    cut = p.blob_key is not None and layout.parse_ref(p.blob_key)[2] is not None
    # NB: a fork's cut part counts the rows its blob holds; it shows at most that many.
    if len(table) > p.rows or (len(table) != p.rows and not cut):
        problems.append(f"{name}: {where} holds {len(table)} rows, metadata says {p.rows}")
    if len(table):
        lo, hi = columnar.time_range(table)
        if lo < p.min_time or hi > p.max_time:
            problems.append(f"{name}: {where} has times [{lo}, {hi}] outside its declared "
                            f"[{p.min_time}, {p.max_time}]")
        if p.consolidated and len(columnar.consolidate(table)) != len(table):
            problems.append(f"{name}: {where} is marked consolidated but is not")
        if p.ordered and not sorting.is_sorted(table):
            problems.append(f"{name}: {where} is marked sorted but is not")
    return problems


def _replay_problems(
    commits: dict[int, Commit], rollups: dict[int, State],
    listed: set[str] | None = None, report: VerifyReport | None = None,
) -> list[str]:
    """Replays every connected stretch of the log and checks each rollup it reaches equals
    the replayed state (a rollup is a cache of the log; they must agree). With ``listed``
    (the data blobs stored), records in ``report`` which seqs are restorable."""
    problems: list[str] = []
    ok: set[int] = set()
    gone: set[int] = set()

    def note(st: State) -> None:
        if listed is not None:
            (ok if refs.referenced(st.collections.values()) <= listed else gone).add(st.seq)

    bases = dict(rollups)
    if 1 in commits:
        bases.setdefault(0, State())
    done: set[int] = set()
    for base_seq in sorted(bases):
        if base_seq in done:
            continue
        state = bases[base_seq]
        seq = base_seq
        if base_seq in rollups:
            note(state)
        while seq + 1 in commits:
            try:
                state = apply(state, commits[seq + 1])
            except Corruption as e:
                problems.append(f"replaying the log from seq {base_seq}: {e}")
                break
            seq += 1
            note(state)
            if seq in rollups:
                done.add(seq)
                # NB: a record's version is stamped when it is encoded (the lowest that can
                # carry it), so a replayed state's own version field says nothing; compare the
                # contents.
                if msgspec.structs.replace(rollups[seq], version=state.version) != state:
                    problems.append(f"rollup {seq} disagrees with the log replayed from "
                                    f"seq {base_seq}")
    if report is not None:
        report.restorable = _ranges(ok)
        report.blobs_gone = _ranges(gone - ok)
    return problems


_Got = bytes | memoryview | PersistError | None


def _ranges(seqs: set[int]) -> list[tuple[int, int]]:
    """``seqs`` as sorted ``(lo, hi)`` runs of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for s in sorted(seqs):
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _fetch_all(blob: BlobRead, keys: Iterable[str], jobs: int, progress: Progress,
               plain: dict[str, PartMeta] | None = None) -> Iterator[tuple[str, _Got]]:
    """Reads ``keys`` with ``jobs`` threads; yields (key, payload | None | error) as they come.
    A key of ``plain`` is a plain value (a Parquet part), verified against its part's
    checksum; every other key is enveloped.

    NB: at most ``2 * jobs`` reads are in flight and a payload is dropped once yielded, so
    verifying a location never holds more than a few blobs in memory.
    """
    plain = plain or {}

    def get(key: str) -> bytes | memoryview | PersistError | None:
        try:
            part = plain.get(key)
            if part is None:
                return blob.get(key)
            if not isinstance(part.checksum, int):
                return Corruption(key, "a Parquet part without a checksum in its metadata")
            return blob.get_plain(key, part.checksum, size=part.nbytes)
        except PersistError as e:
            if isinstance(e, IncompatibleFormat):
                raise
            return e

    pending = iter(keys)
    window = max(1, jobs) * 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running: dict[concurrent.futures.Future[_Got], str] = {}
        while True:
            for key in pending:
                running[pool.submit(get, key)] = key
                if len(running) >= window:
                    break
            if not running:
                return
            done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
            for fut in done:
                key = running.pop(fut)
                progress.update()
                yield key, fut.result()


def verify(blob: BlobRead, *, url: str = "", jobs: int = 4,
           progress: Progress | None = None) -> VerifyReport:
    """Reads every blob the metadata references and checks it; lists leaked data blobs.

    Nothing is written. Problems (corruption, missing parts, inconsistent metadata, a rollup
    that disagrees with the log) are collected in the report, never raised.

    Args:
        blob: the location's store (a read-only view is enough).
        url: the location's URL, for messages.
        jobs: parallel reads.
        progress: told the number of blobs to read, then of each one read.

    Raises:
        MissingResource: the location holds no metadata (no location there).
        IncompatibleFormat: the location is newer than this persist.
        ExternalError: storage failed while listing (reads that fail are reported as problems).
    """
    report = VerifyReport(url)
    require_metadata(blob, url)
    # NB: list the data blobs before loading the state: a blob a live writer commits in between
    # is then referenced, not "leaked"; one written after the listing is simply not seen.
    data_keys = blob.list_keys(layout.DATA_PREFIX)
    log_keys = blob.list_keys(layout.LOG_PREFIX)
    rollup_keys = blob.list_keys(layout.ROLLUP_PREFIX)
    try:
        state = Machine(blob).load()
    except Corruption as e:
        report.problems.append(f"the current state cannot be loaded: {e}")
        state = None
    if state is not None:
        report.seq = state.seq
        report.problems.extend(check_state(state, f"state at seq {state.seq}"))
    parts = [(name, c, p) for name, c in (state.collections.items() if state else ())
             for p in c.parts]
    referenced = gc.referenced(state) if state else set()
    # NB: a blob may be read by several parts (a fork and its source), possibly in another
    # location of the store (a fork across locations): fetched once, checked for each.
    blob_parts: dict[tuple[str | None, str], list[tuple[str, CollectionMeta, PartMeta]]] = {}
    for name, c, p in parts:
        b = refs.blob_of(p) if p.blob_key is not None else None
        if b is not None:
            blob_parts.setdefault(b, []).append((name, c, p))
    listed = set(data_keys)
    # NB: a retired blob is only counted as present, not read: nothing references it any
    # more, and a retired Parquet part cannot be verified (its checksum left with its part).
    retired_present = [r.key for r in (state.retired if state else ()) if r.key in listed]
    missing: list[tuple[str | None, str]] = []
    bar = progress or _NoProgress()
    roots = sorted({r for r, _ in blob_parts if r is not None})
    bar.start(len(log_keys) + len(rollup_keys) + len(parts))
    report.data_blobs += len(retired_present)
    try:
        commits, rollups = _verify_metadata(blob, log_keys, rollup_keys, jobs, bar, report)
        fetches: list[tuple[str | None, BlobRead]] = [(None, blob)]
        fetches.extend((r, blob.sibling(r)) for r in roots)
        for root, store in fetches:
            keys = [k for r, k in blob_parts if r == root]
            plain = {k: ps[0][2] for (r, k), ps in blob_parts.items()
                     if r == root and ps[0][2].parquet}
            for key, got in _fetch_all(store, keys, jobs, bar, plain):
                where = key if root is None else f"{key} (of location {root})"
                if isinstance(got, PersistError):
                    report.problems.append(f"{where}: {got}")
                    continue
                if got is None:
                    missing.append((root, key))
                    continue
                report.data_blobs += 1
                report.bytes_read += len(got)
                for name, c, p in blob_parts[(root, key)]:
                    report.problems.extend(_check_part_data(name, c, p, got))
        for name, c, p in parts:
            if p.inline is not None:
                report.inline_parts += 1
                report.problems.extend(_check_part_data(name, c, p, p.inline))
                bar.update()
        marks_reader = PartReader(blob, cache_bytes=0)
        for name, _c, p in parts:
            if p.marks is not None and p.marks.count:
                # NB: its checksum, its positions within the part's rows, increasing
                try:
                    marks_reader.marks(p)
                except PersistError as e:
                    if isinstance(e, IncompatibleFormat):
                        raise
                    report.problems.append(f"{name}: part {p.id}'s marks: {e}")
    finally:
        bar.close()
    report.problems.extend(_replay_problems(commits, rollups, listed, report))
    if missing:
        # NB: a part that vanished while we read is only a problem if it is still a live part
        # of the newest state: a live writer's compaction may have retired it and its GC
        # deleted it meanwhile, and a retired key stays in the state (in ``retired``) until
        # the GC's Forget commits, which a failed delete or commit can put off for a while.
        newest = Machine(blob).load().collections.values()
        now: set[tuple[str | None, str]] = {(None, k) for k in refs.referenced(newest)}
        now.update((r, k) for r, ks in refs.foreign(newest).items() for k in ks)
        report.problems.extend(
            f"{key if root is None else f'{key} (of location {root})'}: referenced by "
            f"{blob_parts[(root, key)][0][0]!r} but missing"
            for root, key in missing if (root, key) in now)
    # NB: without a state nothing is known to be referenced; calling everything leaked would
    # invite deleting the whole location. A blob a fork in another location pins is not
    # leaked either.
    if state is not None:
        pinned = pins.pinned(blob)
        report.leaked = [k for k in data_keys if k not in referenced and k not in pinned]
    return report


def _verify_metadata(blob: BlobRead, log_keys: list[str], rollup_keys: list[str], jobs: int,
                     bar: Progress, report: VerifyReport
                     ) -> tuple[dict[int, Commit], dict[int, State]]:
    commits: dict[int, Commit] = {}
    rollups: dict[int, State] = {}
    vanished: list[str] = []
    newest_rollup = layout.seq_of(rollup_keys[-1]) if rollup_keys else 0
    for key, got in _fetch_all(blob, [*log_keys, *rollup_keys], jobs, bar):
        if isinstance(got, PersistError):
            report.problems.append(f"{key}: {got}")
            continue
        if got is None:
            vanished.append(key)  # trimmed by a live writer while we read? checked below
            continue
        report.metadata_blobs += 1
        report.bytes_read += len(got)
        try:
            record = bytes(got)  # metadata is enveloped: get() returned bytes already
            if key.startswith(layout.LOG_PREFIX):
                commits[layout.seq_of(key)] = meta.decode_commit(key, record)
            else:
                # NB: a manifest's pieces are read here, each checked against its digest.
                rollup = pieces.read_rollup(blob, key, record, check=True).state
                rollups[rollup.seq] = rollup
                report.problems.extend(check_state(rollup, f"rollup {rollup.seq}"))
        except Corruption as e:
            report.problems.append(str(e))
    if vanished:
        # NB: a live writer trims log entries and rollups once a newer rollup is old enough;
        # one that vanished is only a problem if no rollup covers it now.
        now_rollups = blob.list_keys(layout.ROLLUP_PREFIX)
        covered = layout.seq_of(now_rollups[-1]) if now_rollups else 0
        report.problems.extend(f"{key}: listed but missing" for key in vanished
                               if layout.seq_of(key) > covered)
        newest_rollup = max(newest_rollup, covered)
    if commits:
        top = max(commits)
        gaps = [s for s in range(max(newest_rollup, min(commits)) + 1, top + 1)
                if s not in commits]
        if gaps:
            report.problems.append(f"metadata log has gaps after the newest rollup "
                                   f"{newest_rollup}: missing seq {gaps[:10]}")
    return commits, rollups


def delete_leaked(blob: Blob, first: list[str], grace: float,
                  say: Callable[[str], None]) -> list[str]:
    """Deletes data blobs that are unreferenced now and still unreferenced ``grace`` seconds
    later, after reloading the state. Returns the keys deleted.

    Args:
        blob: the location's store.
        first: the leaked keys found by :func:`verify` (a first listing).
        grace: seconds to wait before listing again; must exceed the writers' commit deadline
            plus a commit's latency.
        say: told what is happening (the wait).

    NB: a live writer writes a part's blob *before* the commit that references it; waiting a
    grace period and listing again means only blobs abandoned for that long are deleted. A
    writer sends no commit referencing a blob older than its commit deadline
    (``Options.commit_deadline_seconds``), so a grace longer than that deadline plus a
    commit's latency cannot delete a blob a commit will still claim. Parts staged under a
    staging lease are held to the lease's rules instead (:mod:`persist.indexed.state.lease`): left
    alone while it lives, and deleted only a grace after its revocation.
    """
    # NB: a part staged under a live lease belongs to a job still running, however old it
    # is; one whose lease lapsed is revoked now, before the grace starts (persist.indexed.state.lease).
    judge = lease.Judge(blob)
    live = [k for k in first if layout.lease_of(k) is not None and not judge.reclaimable(k)]
    if live:
        say(f"{len(live)} unreferenced parts belong to staging leases still alive "
            f"({len({layout.lease_of(k) for k in live})} jobs); left alone")
    first = [k for k in first if k not in set(live)]
    if not first:
        return []
    say(f"{len(first)} leaked blobs; waiting {grace:g}s (the grace period) before checking "
        f"them again, since a live writer may be about to commit a blob it just wrote")
    time.sleep(grace)
    # NB: list again before reloading the state, as in verify (see there).
    still_listed = set(blob.list_keys(layout.DATA_PREFIX))
    referenced = gc.referenced(Machine(blob).load()) | pins.pinned(blob).keys()
    doomed = [k for k in first if k in still_listed and k not in referenced]
    for key in doomed:
        blob.delete(key)
        log.info("deleted leaked blob %s", key)
    return doomed


__all__ = ["Progress", "VerifyReport", "check_state", "delete_leaked", "require_metadata",
           "verify"]
