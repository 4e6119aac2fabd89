"""The ``persist`` operations command: inspect, verify and repair locations, dump snapshots,
manage the writer lock.

    persist inspect URL [--json]
    persist verify URL [--delete-leaked [--grace SECONDS]] [--jobs N] [--no-progress] [--json]
    persist snapshot URL COLLECTION [--as-of T] --out FILE.parquet
    persist lock [show] URL [--json]      show the writer lock
    persist lock release --force URL      mark the lock released whoever holds it
    persist dynamodb create-table NAME [--endpoint-url URL] [--region REGION]

Every command takes ``-o KEY=VALUE`` (``--storage-option``, repeatable), passed as
``storage_options`` to the location (for S3: endpoint_url, region_name, credentials, lock
table, ...); any URL :func:`persist.location.resolve` accepts works, ``s3://`` included.

Exit codes (also in ``persist --help``):

    0    success; verify found no problem
    1    verify found problems (corruption, missing parts, inconsistent metadata)
    2    usage: bad arguments, no location at URL, unknown collection, as-of outside
         [since, upper), lock release without --force
    3    persist or storage error (storage failed, incompatible format, I/O error)
    4    the writer lock is held (lock release without --force while a writer holds it)
    5    an optional dependency is missing (boto3 for s3:// and dynamodb, ...)
    130  interrupted

Errors are one line on stderr, ``persist: <message>``; ``--traceback`` shows the whole story.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn, TextIO
from urllib.parse import urlparse

import pyarrow as pa

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.blob.envelope import ENVELOPE_VERSION
from persist.errors import (
    Corruption,
    IncompatibleFormat,
    InvalidUsage,
    LockHeld,
    PersistError,
)
from persist.indexed import columnar, gc, meta
from persist.indexed.indexed import Options
from persist.indexed.machine import Machine
from persist.indexed.meta import CollectionMeta, Commit, PartMeta, State
from persist.indexed.read import PartMissing, Snapshot, Types
from persist.indexed.state import apply, collection, effective_since
from persist.location import Location, resolve
from persist.lock.base import LockRecord

log = logging.getLogger("persist.cli")

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_LOCK_HELD = 4
EXIT_MISSING_DEPENDENCY = 5
EXIT_INTERRUPTED = 130

_EXIT_CODES = """exit codes:
  0    success; verify found no problem
  1    verify found problems (corruption, missing parts, inconsistent metadata)
  2    usage: bad arguments, no location at URL, unknown collection, as-of outside
       [since, upper), lock release without --force
  3    persist or storage error (storage failed, incompatible format, I/O error)
  4    the writer lock is held (lock release without --force while a writer holds it)
  5    an optional dependency is missing (boto3 for s3:// and dynamodb, ...)
  130  interrupted
"""


class CliError(Exception):
    """An error with its exit code, reported as one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- locations --------------------------------------------------------------------------------


def open_location(url: str, storage_options: dict[str, Any]) -> Location:
    """Resolves ``url`` without creating anything: a local path must already be a directory.

    NB: ``resolve`` creates a file location's directory (a writer wants that); an operator
    who mistypes a path must get an error instead of a fresh empty location.
    """
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else url
        if not os.path.isdir(path):
            raise CliError(EXIT_USAGE, f"no persist location at {url!r}: not a directory")
    try:
        return resolve(url, storage_options=storage_options)
    except ImportError as e:
        raise CliError(EXIT_MISSING_DEPENDENCY, f"{url!r} needs an optional dependency: {e}") from e


def _require_metadata(blob: BlobRead, url: str) -> None:
    if not blob.list_keys(layout.META_PREFIX):
        raise CliError(EXIT_USAGE, f"no persist location at {url!r}: it holds no metadata")


def _storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(EXIT_USAGE, f"storage option {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


# -- inspect ------------------------------------------------------------------------------------


def _type_name(type_bytes: bytes, codec: str | None) -> str:
    if codec is not None:
        return f"{codec} (msgpack)"
    return str(columnar.deserialize_type(type_bytes))


def _lock_dict(rec: LockRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"holder": rec.holder, "generation": rec.generation, "beat": rec.beat,
            "lease_seconds": rec.lease_ms / 1000, "released": rec.released,
            "last_beat_seconds_ago": round(max(0.0, time.time() - rec.wall_ms / 1000), 3)}


def _lock_info(loc: Location) -> dict[str, Any] | None:
    return _lock_dict(loc.lock().current())


def describe(loc: Location) -> dict[str, Any]:
    """Everything ``inspect`` shows, as plain data."""
    blob = loc.read_half()
    _require_metadata(blob, loc.url)
    logs = blob.list_keys(layout.LOG_PREFIX)
    rollups = blob.list_keys(layout.ROLLUP_PREFIX)
    state = Machine(blob).load()
    collections = []
    for name in sorted(state.collections):
        c = state.collections[name]
        inline = [p for p in c.parts if p.inline is not None]
        blobs = [p for p in c.parts if p.blob_key is not None]
        collections.append({
            "name": name,
            "id": c.id,
            "key_type": _type_name(c.key_type, c.key_codec),
            "value_type": _type_name(c.value_type, c.value_codec),
            "since": c.since,
            "effective_since": effective_since(c),
            "upper": c.upper,
            "parts": len(c.parts),
            "inline_parts": len(inline),
            "blob_parts": len(blobs),
            "rows": sum(p.rows for p in c.parts),
            "bytes": sum(p.nbytes for p in c.parts),
            "inline_bytes": sum(p.nbytes for p in inline),
            "blob_bytes": sum(p.nbytes for p in blobs),
            "holds": dict(c.holds),
        })
    return {
        "url": loc.url,
        "format_version": state.version,
        "reads_up_to_format_version": meta.FORMAT_VERSION,
        "envelope_version": ENVELOPE_VERSION,
        "seq": state.seq,
        "epoch": state.epoch,
        "writer": state.writer,
        "committed_wall_ms": state.wall_ms,
        "log_entries": len(logs),
        "log_range": [layout.seq_of(logs[0]), layout.seq_of(logs[-1])] if logs else None,
        "rollups": len(rollups),
        "newest_rollup": layout.seq_of(rollups[-1]) if rollups else None,
        "next_collection_id": state.next_cid,
        "retired_blobs": len(state.retired),
        "collections": collections,
        "lock": _lock_info(loc),
    }


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _when(wall_ms: int) -> str:
    if not wall_ms:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ms / 1000))
    return f"{stamp} ({max(0.0, time.time() - wall_ms / 1000):.1f}s ago)"


def _print_lock(info: dict[str, Any] | None, out: TextIO) -> None:
    if info is None:
        print("lock:       never taken", file=out)
    elif info["released"]:
        print(f"lock:       free (released by {info['holder']!r}, generation "
              f"{info['generation']})", file=out)
    else:
        print(f"lock:       held by {info['holder']!r}, generation {info['generation']} "
              f"(beat {info['beat']}, lease {info['lease_seconds']:g}s, last beat "
              f"{info['last_beat_seconds_ago']:.1f}s ago)", file=out)


def cmd_inspect(args: argparse.Namespace) -> int:
    loc = open_location(args.url, args.storage_options)
    info = describe(loc)
    out = sys.stdout
    if args.json:
        json.dump(info, out, indent=2)
        print(file=out)
        return EXIT_OK
    print(f"location:   {info['url']}", file=out)
    print(f"format:     metadata v{info['format_version']} (this persist reads up to "
          f"v{info['reads_up_to_format_version']}), envelope v{info['envelope_version']}",
          file=out)
    print(f"seq:        {info['seq']} (epoch {info['epoch']}, writer {info['writer']!r}, "
          f"committed {_when(info['committed_wall_ms'])})", file=out)
    rng = info["log_range"]
    logs = f"{info['log_entries']} log entries" + (f" (seq {rng[0]}..{rng[1]})" if rng else "")
    rollups = f"{info['rollups']} rollups" + (
        f" (newest seq {info['newest_rollup']})" if info["rollups"] else "")
    print(f"metadata:   {logs}, {rollups}", file=out)
    _print_lock(info["lock"], out)
    print(f"retired:    {info['retired_blobs']} blobs awaiting garbage collection", file=out)
    print(f"collections: {len(info['collections'])}", file=out)
    if info["collections"]:
        header = ("name", "id", "key", "value", "since", "upper", "parts", "inline", "blob",
                  "rows", "bytes")
        rows = [header] + [
            (c["name"], str(c["id"]), c["key_type"], c["value_type"],
             str(c["since"]) + ("*" if c["holds"] else ""), str(c["upper"]), str(c["parts"]),
             str(c["inline_parts"]), str(c["blob_parts"]), str(c["rows"]),
             _human_bytes(c["bytes"]))
            for c in info["collections"]
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(),
                  file=out)
        if any(c["holds"] for c in info["collections"]):
            print("  * durable read holds keep compaction behind since:", file=out)
            for c in info["collections"]:
                for hold, frontier in sorted(c["holds"].items()):
                    print(f"    {c['name']}: {hold} at {frontier}", file=out)
    return EXIT_OK


# -- verify -------------------------------------------------------------------------------------


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


class _Progress:
    """A tqdm bar on stderr when tqdm is installed and wanted; otherwise nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # the optional 'cli' extra is not installed
                log.debug("tqdm is not installed: no progress bar")
            else:
                self._bar = tqdm(total=total, desc="verify", unit="blob", file=sys.stderr,
                                 dynamic_ncols=True, leave=True)

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def check_state(state: State, where: str) -> list[str]:
    """The metadata's internal consistency: frontiers, ids, parts, retired list."""
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
        for p in c.parts:
            problems.extend(_check_part_meta(here, c, p, part_ids, blob_keys))
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
        if not p.blob_key.startswith(layout.data_prefix(c.id)):
            yield f"{here}: part {p.id} is stored outside its collection: {p.blob_key!r}"
        if p.blob_key in blob_keys:
            yield f"{here}: blob {p.blob_key!r} is referenced twice"
        blob_keys[p.blob_key] = c.name


def _check_part_data(name: str, c: CollectionMeta, p: PartMeta, data: bytes) -> list[str]:
    where = p.blob_key or f"inline part {p.id}"
    problems: list[str] = []
    if len(data) != p.nbytes:
        problems.append(f"{name}: {where} holds {len(data)} bytes, metadata says {p.nbytes}")
    try:
        table = columnar.decode_part(where, data, Types.of(c).schema)
    except Corruption as e:
        return [*problems, f"{name}: {e}"]
    if len(table) != p.rows:
        problems.append(f"{name}: {where} holds {len(table)} rows, metadata says {p.rows}")
    if len(table):
        lo, hi = columnar.time_range(table)
        if lo < p.min_time or hi > p.max_time:
            problems.append(f"{name}: {where} has times [{lo}, {hi}] outside its declared "
                            f"[{p.min_time}, {p.max_time}]")
        if p.consolidated and len(columnar.consolidate(table)) != len(table):
            problems.append(f"{name}: {where} is marked consolidated but is not")
    return problems


def _replay_problems(
    commits: dict[int, Commit], rollups: dict[int, State]
) -> list[str]:
    """Replays every connected stretch of the log and checks each rollup it reaches equals
    the replayed state (a rollup is a cache of the log; they must agree)."""
    problems: list[str] = []
    bases = dict(rollups)
    if 1 in commits:
        bases.setdefault(0, State())
    done: set[int] = set()
    for base_seq in sorted(bases):
        if base_seq in done:
            continue
        state = bases[base_seq]
        seq = base_seq
        while seq + 1 in commits:
            try:
                state = apply(state, commits[seq + 1])
            except Corruption as e:
                problems.append(f"replaying the log from seq {base_seq}: {e}")
                break
            seq += 1
            if seq in rollups:
                done.add(seq)
                if rollups[seq] != state:
                    problems.append(f"rollup {seq} disagrees with the log replayed from "
                                    f"seq {base_seq}")
    return problems


def _fetch_all(blob: BlobRead, keys: Iterable[str], jobs: int,
               progress: _Progress) -> Iterator[tuple[str, bytes | PersistError | None]]:
    """Reads ``keys`` with ``jobs`` threads; yields (key, payload | None | error) as they come.

    NB: at most ``2 * jobs`` reads are in flight and a payload is dropped once yielded, so
    verifying a location never holds more than a few blobs in memory.
    """

    def get(key: str) -> bytes | PersistError | None:
        try:
            return blob.get(key)
        except PersistError as e:
            if isinstance(e, IncompatibleFormat):
                raise
            return e

    pending = iter(keys)
    window = max(1, jobs) * 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running: dict[concurrent.futures.Future[bytes | PersistError | None], str] = {}
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


def verify(loc: Location, *, jobs: int = 4, progress: bool = True) -> VerifyReport:
    """Reads every blob the metadata references and checks it; lists leaked data blobs.

    Raises:
        CliError: no location at the URL.
        IncompatibleFormat: the location is newer than this persist.
        ExternalError: storage failed while listing (reads that fail are reported as problems).
    """
    blob = loc.read_half()
    report = VerifyReport(loc.url)
    _require_metadata(blob, loc.url)
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
    blob_parts = {p.blob_key: (name, c, p) for name, c, p in parts if p.blob_key}
    listed = set(data_keys)
    retired_present = [r.key for r in (state.retired if state else ()) if r.key in listed]
    missing: list[str] = []
    bar = _Progress(len(log_keys) + len(rollup_keys) + len(parts) + len(retired_present),
                    progress)
    try:
        commits, rollups = _verify_metadata(blob, log_keys, rollup_keys, jobs, bar, report)
        for key, got in _fetch_all(blob, [*blob_parts, *retired_present], jobs, bar):
            if isinstance(got, PersistError):
                report.problems.append(f"{key}: {got}")
                continue
            if got is None:
                if key in blob_parts:
                    missing.append(key)
                continue  # a retired blob deleted meanwhile: fine
            report.data_blobs += 1
            report.bytes_read += len(got)
            if key in blob_parts:
                name, c, p = blob_parts[key]
                report.problems.extend(_check_part_data(name, c, p, got))
        for name, c, p in parts:
            if p.inline is not None:
                report.inline_parts += 1
                report.problems.extend(_check_part_data(name, c, p, p.inline))
                bar.update()
    finally:
        bar.close()
    report.problems.extend(_replay_problems(commits, rollups))
    if missing:
        # NB: a part that vanished while we read is only a problem if it is still a live part
        # of the newest state: a live writer's compaction may have retired it and its GC
        # deleted it meanwhile, and a retired key stays in the state (in ``retired``) until
        # the GC's Forget commits, which a failed delete or commit can put off for a while.
        newest = {p.blob_key for c in Machine(blob).load().collections.values()
                  for p in c.parts if p.blob_key}
        report.problems.extend(f"{key}: referenced by {blob_parts[key][0]!r} but missing"
                               for key in missing if key in newest)
    # NB: without a state nothing is known to be referenced; calling everything leaked would
    # invite deleting the whole location.
    report.leaked = [k for k in data_keys if k not in referenced] if state is not None else []
    return report


def _verify_metadata(blob: BlobRead, log_keys: list[str], rollup_keys: list[str], jobs: int,
                     bar: _Progress, report: VerifyReport
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
            if key.startswith(layout.LOG_PREFIX):
                commits[layout.seq_of(key)] = meta.decode_commit(key, got)
            else:
                rollup = meta.decode_state(key, got)
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


def delete_leaked(loc: Location, first: list[str], grace: float,
                  say: Callable[[str], None]) -> list[str]:
    """Deletes data blobs that are unreferenced now and still unreferenced ``grace`` seconds
    later, after reloading the state.

    NB: a live writer writes a part's blob *before* the commit that references it; waiting a
    grace period and listing again means only blobs abandoned for that long are deleted. A
    writer sends no commit referencing a blob older than its commit deadline
    (``Options.commit_deadline_seconds``), so a grace longer than that deadline plus a
    commit's latency cannot delete a blob a commit will still claim.
    """
    if not first:
        return []
    say(f"{len(first)} leaked blobs; waiting {grace:g}s (the grace period) before checking "
        f"them again, since a live writer may be about to commit a blob it just wrote")
    time.sleep(grace)
    blob = loc.blob
    # NB: list again before reloading the state, as in verify (see there).
    still_listed = set(blob.list_keys(layout.DATA_PREFIX))
    referenced = gc.referenced(Machine(blob).load())
    doomed = [k for k in first if k in still_listed and k not in referenced]
    for key in doomed:
        blob.delete(key)
        log.info("deleted leaked blob %s", key)
    return doomed


def cmd_verify(args: argparse.Namespace) -> int:
    loc = open_location(args.url, args.storage_options)
    jobs = args.jobs or (2 if loc.blob.is_local else 16)
    report = verify(loc, jobs=jobs, progress=not args.no_progress)
    if args.delete_leaked and report.leaked and report.problems:
        print("not deleting leaked blobs: verify found problems; fix those first",
              file=sys.stderr)
    elif args.delete_leaked and report.leaked:
        if not isinstance(loc.blob, Blob):
            raise CliError(EXIT_USAGE, "this location cannot be written")
        grace = args.grace if args.grace is not None else Options().gc_grace_seconds
        report.deleted = delete_leaked(loc, report.leaked, grace,
                                       lambda s: print(s, file=sys.stderr))
    if args.json:
        json.dump(asdict(report), sys.stdout, indent=2)
        print()
    else:
        print(f"verified {report.url} at seq {report.seq}: {report.metadata_blobs} metadata "
              f"blobs, {report.data_blobs} data blobs, {report.inline_parts} inline parts, "
              f"{_human_bytes(report.bytes_read)} read")
        for p in report.problems:
            print(f"PROBLEM: {p}")
        if report.leaked:
            print(f"leaked: {len(report.leaked)} unreferenced data blobs (a crash or a fenced "
                  f"writer left them; `--delete-leaked` removes them safely)")
            for key in report.leaked[:50]:
                print(f"  {key}")
            if len(report.leaked) > 50:
                print(f"  ... and {len(report.leaked) - 50} more")
        if args.delete_leaked:
            print(f"deleted: {len(report.deleted)} leaked blobs")
        print("no problems found" if not report.problems else
              f"{len(report.problems)} problems found")
    return EXIT_PROBLEMS if report.problems else EXIT_OK


# -- snapshot -----------------------------------------------------------------------------------


def cmd_snapshot(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from persist.indexed.indexed import Indexed

    loc = open_location(args.url, args.storage_options)
    _require_metadata(loc.read_half(), loc.url)
    ix = Indexed.open(loc.read_half())
    c = collection(ix.state.collections, args.collection)
    as_of = args.as_of
    if as_of is None:
        if c.upper == 0:
            raise CliError(EXIT_USAGE, f"{args.collection!r} has nothing sealed yet (upper 0)")
        as_of = c.upper - 1
    table: pa.Table | None = None
    for attempt in range(5):
        try:
            table = Snapshot(c, as_of, ix.reader).to_arrow()
            break
        except PartMissing:
            # NB: GC removed a part of the state we read; the answer is definite, so the newer
            # state gives the same contents.
            if attempt == 4:
                raise
            c = collection(ix.reload().collections, args.collection)
    assert table is not None
    types = Types.of(c)
    md = {b"persist.collection": args.collection.encode(), b"persist.as_of": str(as_of).encode()}
    if types.key.name:
        md[b"persist.key_codec"] = types.key.name.encode()
    if types.value.name:
        md[b"persist.value_codec"] = types.value.name.encode()
    table = table.replace_schema_metadata(md)
    out = os.path.abspath(args.out)
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    print(f"wrote {len(table)} rows of {args.collection!r} as of {as_of} "
          f"(since {effective_since(c)}, upper {c.upper}) to {out}")
    return EXIT_OK


# -- lock -----------------------------------------------------------------------------------------


def cmd_lock_show(args: argparse.Namespace) -> int:
    loc = open_location(args.url, args.storage_options)
    info = _lock_dict(loc.lock().current())
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        _print_lock(info, sys.stdout)
    return EXIT_OK


def cmd_lock_release(args: argparse.Namespace) -> int:
    return _lock_release(args.url, args)


def _lock_release(url: str, args: argparse.Namespace) -> int:
    loc = open_location(url, args.storage_options)
    lock = loc.lock()
    rec = lock.current()
    if rec is None or rec.released:
        print("the writer lock is not held; nothing to release")
        return EXIT_OK
    if not args.force:
        raise CliError(EXIT_LOCK_HELD, f"the writer lock is held by {rec.holder!r} (generation "
                                       f"{rec.generation}); pass --force to release it anyway")
    print(f"WARNING: force-releasing the writer lock held by {rec.holder!r} (generation "
          f"{rec.generation}). If that writer is still running it loses the lock at its next "
          f"heartbeat and stops (fail-stop); the next writer's first commit fences it for good. "
          f"Nothing committed is lost, but its in-flight writes fail.", file=sys.stderr)
    old = lock.force_release()
    lock.close()
    gone = old or rec
    print(f"released the writer lock of {gone.holder!r} (generation {gone.generation})")
    return EXIT_OK


# -- dynamodb -------------------------------------------------------------------------------------


def cmd_dynamodb_create_table(args: argparse.Namespace) -> int:
    try:
        from persist.lock.dynamodb import create_table
    except ImportError as e:
        raise CliError(EXIT_MISSING_DEPENDENCY,
                       f"DynamoDB support is unavailable ({e}); install persist[s3]") from e
    opts = dict(args.storage_options)
    if args.endpoint_url:
        opts["endpoint_url"] = args.endpoint_url
    if args.region:
        opts["region_name"] = args.region
    try:
        create_table(opts, args.name)
    except ImportError as e:
        raise CliError(EXIT_MISSING_DEPENDENCY,
                       f"DynamoDB support is unavailable ({e}); install persist[s3]") from e
    print(f"DynamoDB table {args.name!r} is ready (TTL enabled)")
    return EXIT_OK


# -- the parser and main --------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit code 2 through ``main``."""

    def error(self, message: str) -> NoReturn:
        raise CliError(EXIT_USAGE, f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    from persist import __version__

    common = _Parser(add_help=False)
    common.add_argument("-o", "--storage-option", action="append", default=[],
                        metavar="KEY=VALUE", dest="storage_option_pairs",
                        help="a storage option for the location (repeatable), e.g. "
                             "endpoint_url=http://localhost:5000")
    common.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v: info, -vv: debug) on stderr")
    common.add_argument("--traceback", action="store_true",
                        help="show the full traceback of an error")

    # NB: the shared options live on the subcommands only: argparse lets a subparser's
    # defaults overwrite what the main parser parsed, so declaring them twice loses values.
    parser = _Parser(prog="persist", description="Inspect, verify and repair persist locations; dump definite "
                     "snapshots; manage the writer lock.",
                     epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"persist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("inspect", parents=[common], help="show a location's collections, "
                       "frontiers, parts, lock and format",
                       epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", parents=[common], help="read every referenced blob, check "
                       "every checksum and the metadata; list (and delete) leaked blobs",
                       epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--delete-leaked", action="store_true",
                   help="delete unreferenced data blobs that stay unreferenced for --grace")
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="how long a blob must stay leaked before deletion; must exceed the "
                        "writers' commit deadline (default "
                        f"{Options().commit_deadline_seconds:g}s) (default: the engine's GC "
                        f"grace, {Options().gc_grace_seconds:g}s)")
    p.add_argument("--jobs", type=int, default=0, help="parallel reads (default: 2 local, "
                   "16 remote)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("snapshot", parents=[common], help="write a definite snapshot of a "
                       "collection to a Parquet file",
                       epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("collection")
    p.add_argument("--as-of", type=int, default=None, metavar="T",
                   help="the time (since <= T < upper; default upper - 1)")
    p.add_argument("--out", required=True, metavar="FILE.parquet")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("lock", help="show the writer lock, or release it by force",
                       usage="persist lock [show] URL | persist lock release --force URL")
    lsub = p.add_subparsers(dest="lock_command", metavar="COMMAND", parser_class=_Parser)
    q = lsub.add_parser("show", parents=[common], help="show the lock (the default)")
    q.add_argument("url")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_lock_show)
    q = lsub.add_parser("release", parents=[common], help="mark the lock released",
                        epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("url")
    q.add_argument("--force", action="store_true",
                   help="release even though a writer holds it (required while held)")
    q.set_defaults(func=cmd_lock_release)

    p = sub.add_parser("dynamodb", help="DynamoDB administration")
    dsub = p.add_subparsers(dest="dynamodb_command", metavar="COMMAND", parser_class=_Parser)
    q = dsub.add_parser("create-table", parents=[common],
                        help="create the lock/commit table (with TTL) if it does not exist")
    q.add_argument("name")
    q.add_argument("--endpoint-url", default=None)
    q.add_argument("--region", default=None)
    q.set_defaults(func=cmd_dynamodb_create_table)
    return parser


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("persist: %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("persist")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    traceback = "--traceback" in words
    # NB: `persist lock URL` is short for `persist lock show URL`.
    if len(words) >= 2 and words[0] == "lock" and words[1] not in ("show", "release", "-h",
                                                                     "--help"):
        words.insert(1, "show")
    try:
        args = parser.parse_args(words)
        if not getattr(args, "func", None):
            prog = " ".join(["persist", *words])
            raise CliError(EXIT_USAGE, f"missing command (see `{prog} --help`)")
        _setup_logging(args.verbose)
        args.storage_options = _storage_options(args.storage_option_pairs)
        code: int = args.func(args)
        return code
    except CliError as e:
        return _fail(e.code, str(e), traceback)
    except LockHeld as e:
        return _fail(EXIT_LOCK_HELD, str(e), traceback)
    except InvalidUsage as e:
        return _fail(EXIT_USAGE, str(e), traceback)
    except PersistError as e:
        return _fail(EXIT_ERROR, f"{type(e).__name__}: {e}", traceback)
    except OSError as e:
        return _fail(EXIT_ERROR, f"I/O error: {e}", traceback)
    except KeyboardInterrupt:
        return _fail(EXIT_INTERRUPTED, "interrupted", False)
    except Exception as e:  # a bug: still one line unless asked
        return _fail(EXIT_ERROR, f"internal error: {type(e).__name__}: {e} (rerun with "
                                 f"--traceback and report it)", traceback)


def _fail(code: int, message: str, traceback: bool) -> int:
    if traceback:
        import traceback as tb

        tb.print_exc()
    print(f"persist: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
