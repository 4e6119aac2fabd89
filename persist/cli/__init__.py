"""The ``persist`` operations command: inspect, verify and repair locations, dump snapshots,
manage the writer lock.

    persist inspect URL [--live] [--json]
    persist verify URL [--delete-leaked [--grace SECONDS]] [--jobs N] [--no-progress] [--json]
    persist snapshot URL COLLECTION [--as-of T] --out FILE.parquet
    persist history URL COLLECTION [--json]
    persist lock [show] URL [--json]      show the writer lock
    persist lock release --force URL      mark the lock released whoever holds it
    persist holds [list] URL [--json]     every hold and tag: time, lease, last renewal
    persist holds release URL COLLECTION NAME [--yes]
    persist restore URL --to-seq N [--yes] [--lock-timeout SECONDS] [--json]
    persist dynamodb create-table NAME [--endpoint-url URL] [--region REGION]

One module per group of commands (:mod:`~persist.cli.inspect`, :mod:`~persist.cli.verify`,
:mod:`~persist.cli.snapshot`, :mod:`~persist.cli.lock`, :mod:`~persist.cli.holds`,
:mod:`~persist.cli.restore`; what they share in
:mod:`~persist.cli.common`); this one builds the parser and runs a command line.

Every command takes ``-o KEY=VALUE`` (``--storage-option``, repeatable), passed as
``storage_options`` to the location (for S3: endpoint_url, region_name, credentials, lock
table, ...); any URL :func:`persist.location.resolve` accepts works, ``s3://`` included.

Exit codes: ``persist --help`` lists them (``_EXIT_CODES``): 0 success, 1 verify found
problems (restore: not restorable), 2 usage, 3 storage or persist error, 4 lock held, 5 missing dependency, 130
interrupted.

Errors are one line on stderr, ``persist: <message>``; ``--traceback`` shows the whole story.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from persist.cli import holds, restore
from persist.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_LOCK_HELD,
    EXIT_MISSING_DEPENDENCY,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CliError,
    storage_options,
)
from persist.cli.inspect import cmd_inspect
from persist.cli.lock import cmd_dynamodb_create_table, cmd_lock_release, cmd_lock_show
from persist.cli.snapshot import cmd_history, cmd_snapshot
from persist.cli.verify import cmd_verify
from persist.errors import InvalidUsage, LockHeld, MissingResource, PersistError
from persist.indexed.engine import Options

_EXIT_CODES = """exit codes:
  0    success; verify found no problem
  1    verify found problems (corruption, missing parts, inconsistent metadata);
       restore: the seq is no longer restorable (the reason is printed)
  2    usage: bad arguments, no location at URL, unknown collection, as-of outside
       [since, upper)
  3    persist or storage error (storage failed, incompatible format, I/O error)
  4    the writer lock is held (lock release without --force while a writer holds it)
  5    an optional dependency is missing (boto3 for s3:// and dynamodb, ...)
  130  interrupted
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit code 2 through ``main``."""

    def error(self, message: str) -> NoReturn:
        # NB: argparse says "argument COMMAND: invalid choice: 'x' (choose from ...)" for an
        # unknown (sub)command; say it as the shortcuts of `lock` and `holds` do.
        unknown = re.match(r"argument COMMAND: invalid choice: (.*) \(choose from (.*)\)$",
                           message)
        if unknown:
            group = self.prog.removeprefix("persist").strip()
            message = (f"unknown {group + ' ' if group else ''}command {unknown.group(1)} "
                       f"(choose from {unknown.group(2)})")
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

    def command(group: Any, name: str, func: Callable[[argparse.Namespace], int], summary: str,
                *args: str, description: str | None = None) -> argparse.ArgumentParser:
        """A subcommand with the shared options, the exit codes and positional ``args``."""
        p: argparse.ArgumentParser = group.add_parser(
            name, parents=[common], help=summary, epilog=_EXIT_CODES, description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        for arg in args:
            p.add_argument(arg, metavar=arg.upper())
        p.set_defaults(func=func)
        return p

    p = command(sub, "inspect", cmd_inspect, "show a location's collections, frontiers, parts, "
                "stored updates (and live rows), lock and format", "url")
    p.add_argument("--live", action="store_true",
                   help="also count each collection's live rows as of upper - 1 ((key, value) "
                        "pairs with a nonzero sum; reads every part) beside its stored updates")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command(sub, "verify", cmd_verify, "read every referenced blob, check every checksum "
                "and the metadata; list (and delete) leaked blobs", "url")
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

    p = command(sub, "snapshot", cmd_snapshot, "write a definite snapshot of a collection to "
                "a Parquet file", "url", "collection")
    p.add_argument("--as-of", type=int, default=None, metavar="T",
                   help="the time (since <= T < upper; default upper - 1)")
    p.add_argument("--out", required=True, metavar="FILE.parquet")

    p = command(sub, "history", cmd_history, "show a collection's recent seals: upper, commit "
                "time, rows added, inserted and retracted", "url", "collection")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("lock", help="show the writer lock, or release it by force",
                       usage="persist lock [show] URL | persist lock release --force URL")
    lsub = p.add_subparsers(dest="lock_command", metavar="COMMAND", parser_class=_Parser,
                            prog="persist lock")
    q = command(lsub, "show", cmd_lock_show, "show the lock (the default)", "url")
    q.add_argument("--json", action="store_true", help="print JSON")
    q = command(lsub, "release", cmd_lock_release, "mark the lock released", "url")
    q.add_argument("--force", action="store_true",
                   help="release even though a writer holds it (required while held)")

    holds.add_parser(sub, command, _Parser)
    restore.add_parser(sub, command)

    p = sub.add_parser("dynamodb", help="DynamoDB administration")
    dsub = p.add_subparsers(dest="dynamodb_command", metavar="COMMAND", parser_class=_Parser,
                            prog="persist dynamodb")
    q = command(dsub, "create-table", cmd_dynamodb_create_table,
                "create the lock/commit table (with TTL) if it does not exist", "name")
    q.add_argument("--endpoint-url", default=None)
    q.add_argument("--region", default=None)
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
    try:
        words = _with_default_subcommand(parser, words)
        args = parser.parse_args(words)
        if not getattr(args, "func", None):
            prog = " ".join(["persist", *words])
            raise CliError(EXIT_USAGE, f"missing command (see `{prog} --help`)")
        _setup_logging(args.verbose)
        args.storage_options = storage_options(args.storage_option_pairs)
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


#: The groups whose first subcommand may be left out: `persist lock URL` is short for `persist
#: lock show URL`, `persist holds URL` for `persist holds list URL`.
_DEFAULT_SUBCOMMAND = {"lock": "show", "holds": "list"}


def _subcommands(parser: argparse.ArgumentParser, *path: str) -> dict[str, Any]:
    """The subparsers below ``path`` (``()``: the top-level commands), by name."""
    def below(p: argparse.ArgumentParser) -> dict[str, Any]:
        actions = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else {}

    choices = below(parser)
    for name in path:
        choices = below(choices[name])
    return choices


def _with_default_subcommand(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """``words`` with a group's default subcommand inserted where it was left out.

    NB: the word after ``lock`` or ``holds`` is a subcommand or the default's URL. A word that
    is neither a subcommand nor usable as that URL is an unknown subcommand, never a URL: the
    default takes one positional word, so a word followed by more positional words (``holds
    relase URL C N``), or one that is not a URL and close to a subcommand's name (``holds
    relase``), is refused naming the subcommands.

    Raises:
        CliError: an unknown subcommand (usage).
    """
    if len(words) < 2 or words[0] not in _DEFAULT_SUBCOMMAND:
        return words
    group, word = words[0], words[1]
    default = _DEFAULT_SUBCOMMAND[group]
    subs = _subcommands(parser, group)
    if word in subs or word in ("-h", "--help"):
        return words
    if not word.startswith("-"):
        takes_value = {opt for a in subs[default]._actions if a.nargs is None
                       and a.option_strings for opt in a.option_strings}
        rest, more = iter(words[2:]), []
        for w in rest:
            if w in takes_value:
                next(rest, None)
            elif not w.startswith("-"):
                more.append(w)
        close = difflib.get_close_matches(word, list(subs), n=1, cutoff=0.6)
        looks_like_url = "://" in word or os.path.exists(word)
        if more or (close and not looks_like_url):
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise CliError(EXIT_USAGE, f"unknown {group} command {word!r} (choose from "
                           f"{', '.join(repr(n) for n in subs)}; `persist {group} URL` is short "
                           f"for `persist {group} {default} URL`){hint}")
    return [group, default, *words[1:]]


def _fail(code: int, message: str, traceback: bool) -> int:
    if traceback:
        import traceback as tb

        tb.print_exc()
    print(f"persist: {message}", file=sys.stderr)
    return code


def run() -> NoReturn:
    """The ``persist`` console script and ``python -m persist``: :func:`main`, then exits
    with its code at once.

    NB: ``os._exit`` after flushing, not ``sys.exit``: pyarrow's native thread pools are torn
    down at interpreter exit, and a worker still alive then aborts the process
    (``terminate called without an active exception``, SIGABRT), seen once in a busy test
    run of ``persist verify`` over a truncated part after it had printed its whole report.
    The exit code is the command's answer to an operator's script, so it must be the
    command's, never the teardown's. Everything the command wrote is flushed first, and every
    client it opened is closed before :func:`main` returns.
    """
    code = main()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_LOCK_HELD", "EXIT_MISSING_DEPENDENCY",
           "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "CliError", "build_parser", "main", "run"]
