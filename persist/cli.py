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

Exit codes: ``persist --help`` lists them (``_EXIT_CODES``): 0 success, 1 verify found
problems, 2 usage, 3 storage or persist error, 4 lock held, 5 missing dependency, 130
interrupted.

Errors are one line on stderr, ``persist: <message>``; ``--traceback`` shows the whole story.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, NoReturn, TextIO
from urllib.parse import urlparse

import pyarrow as pa

from persist import layout
from persist.blob.base import Blob
from persist.blob.envelope import ENVELOPE_VERSION
from persist.errors import (
    InvalidUsage,
    LockHeld,
    MissingResource,
    PartMissing,
    PersistError,
)
from persist.indexed.engine import Options
from persist.indexed.format import columnar, evolve, meta
from persist.indexed.maintenance.verify import delete_leaked, require_metadata, verify
from persist.indexed.read.parts import Snapshot, Types
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection, effective_since
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
       [since, upper)
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
    arrow_type = columnar.deserialize_type(type_bytes)
    if codec is None:
        return str(arrow_type)
    if arrow_type == pa.binary():
        return f"{codec} (msgpack)"
    return f"{codec} ({arrow_type})"  # a msgspec Struct stored as the matching Arrow struct


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
    require_metadata(blob, loc.url)
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
            "schema_version": evolve.version(c),
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
        "format_version": meta.required_version(state),
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
    """``inspect``: prints metadata, frontiers, parts and the lock (``--json``); exit 0/2/3/5."""
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


class _Progress:
    """A tqdm bar on stderr when tqdm is installed and wanted; otherwise nothing."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._bar: Any = None

    def start(self, total: int) -> None:
        if not self._enabled:
            return
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


def cmd_verify(args: argparse.Namespace) -> int:
    """``verify``: checks every blob and the metadata, lists (deletes) leaks; exit 0/1/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    jobs = args.jobs or (2 if loc.blob.is_local else 16)
    report = verify(loc.read_half(), url=loc.url, jobs=jobs,
                    progress=_Progress(not args.no_progress))
    if args.delete_leaked and report.leaked and report.problems:
        print("not deleting leaked blobs: verify found problems; fix those first",
              file=sys.stderr)
    elif args.delete_leaked and report.leaked:
        if not isinstance(loc.blob, Blob):
            raise CliError(EXIT_USAGE, "this location cannot be written")
        grace = args.grace if args.grace is not None else Options().gc_grace_seconds
        report.deleted = delete_leaked(loc.blob, report.leaked, grace,
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
    """``snapshot``: writes a definite snapshot to Parquet by atomic rename; exit 0/2/3/5."""
    import pyarrow.parquet as pq

    from persist.indexed.engine import Indexed

    loc = open_location(args.url, args.storage_options)
    require_metadata(loc.read_half(), loc.url)
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


# -- history --------------------------------------------------------------------------------------


def cmd_history(args: argparse.Namespace) -> int:
    """``history``: prints a collection's recent seals (``DESCRIBE HISTORY``); exit 0/2/3/5."""
    from persist.indexed.engine import Indexed
    from persist.indexed.state import history

    loc = open_location(args.url, args.storage_options)
    require_metadata(loc.read_half(), loc.url)
    c = collection(Indexed.open(loc.read_half()).state.collections, args.collection)
    seals = history.entries(c)
    if args.json:
        print(json.dumps([{"upper": e.upper, "committed_at": e.committed_at.isoformat(),
                           "seq": e.seq, "updates": e.updates, "inserted": e.inserted,
                           "retracted": e.retracted} for e in seals], indent=2))
        return EXIT_OK
    print(f"{args.collection!r}: since {effective_since(c)}, upper {c.upper}; "
          f"{len(seals)} recorded seals (newest last)")
    if seals:
        print(f"{'upper':>12}  {'committed at (UTC)':<26} {'seq':>8} {'updates':>10} "
              f"{'inserted':>10} {'retracted':>10}")
    for e in seals:
        ins = "?" if e.inserted is None else e.inserted
        ret = "?" if e.retracted is None else e.retracted
        print(f"{e.upper:>12}  {e.committed_at.isoformat(timespec='milliseconds'):<26} "
              f"{e.seq:>8} {e.updates:>10} {ins:>10} {ret:>10}")
    return EXIT_OK


# -- lock -----------------------------------------------------------------------------------------


def cmd_lock_show(args: argparse.Namespace) -> int:
    """``lock show``: prints the writer lock record (``--json``); exit 0/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    lock = loc.lock()
    try:
        info = _lock_dict(lock.current())
    finally:
        lock.close()
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        _print_lock(info, sys.stdout)
    return EXIT_OK


def cmd_lock_release(args: argparse.Namespace) -> int:
    """``lock release``: marks a held lock released, only with ``--force``; exit 0/2/3/4/5."""
    return _lock_release(args.url, args)


def _lock_release(url: str, args: argparse.Namespace) -> int:
    loc = open_location(url, args.storage_options)
    lock = loc.lock()
    try:
        rec = lock.current()
        if rec is None or rec.released:
            print("the writer lock is not held; nothing to release")
            return EXIT_OK
        if not args.force:
            raise CliError(EXIT_LOCK_HELD, f"the writer lock is held by {rec.holder!r} "
                                           f"(generation {rec.generation}); pass --force to "
                                           f"release it anyway")
        print(f"WARNING: force-releasing the writer lock held by {rec.holder!r} (generation "
              f"{rec.generation}). If that writer is still running it loses the lock at its "
              f"next heartbeat and stops (fail-stop); the next writer's first commit fences it "
              f"for good. Nothing committed is lost, but its in-flight writes fail.",
              file=sys.stderr)
        old = lock.force_release()
    finally:
        lock.close()
    gone = old or rec
    print(f"released the writer lock of {gone.holder!r} (generation {gone.generation})")
    return EXIT_OK


# -- dynamodb -------------------------------------------------------------------------------------


def cmd_dynamodb_create_table(args: argparse.Namespace) -> int:
    """``dynamodb create-table``: creates the lock table (TTL on) if absent; exit 0/2/3/5."""
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
    """The ``persist`` parser; each subcommand sets ``func`` to its ``cmd_*``.

    Usage errors raise :class:`CliError` (exit 2) instead of exiting.
    """
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
                   help="how long a blob must stay leaked before deletion (default: the "
                        f"engine's GC grace, {Options().gc_grace_seconds:g}s); must exceed the "
                        "writers' commit deadline (Options.commit_deadline_seconds, "
                        f"{Options().commit_deadline_seconds:g}s unless configured)")
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

    p = sub.add_parser("history", parents=[common], help="show a collection's recent seals: "
                       "upper, commit time, rows added, inserted and retracted",
                       epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("collection")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_history)

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
    except (InvalidUsage, MissingResource) as e:
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
