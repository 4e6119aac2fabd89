"""``persist verify``: reads every referenced blob, checks every checksum and the metadata, and
lists (``--delete-leaked``: deletes) data blobs no commit references. The checks themselves are
:mod:`persist.indexed.maintenance.verify`; this parses and prints."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from typing import Any

from persist.blob.base import Blob
from persist.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CliError,
    human_bytes,
    open_location,
)
from persist.indexed.engine import Options
from persist.indexed.maintenance.verify import delete_leaked, verify

log = logging.getLogger("persist.cli")


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
              f"{human_bytes(report.bytes_read)} read")
        for p in report.problems:
            print(f"PROBLEM: {p}")
        if report.leaked:
            # NB: not only a crash: a fenced writer, a commit that failed, a staging job that
            # never committed, or a writer still running (its merge or append written, not
            # yet committed) leave blobs unreferenced too; a clean stop leaves none.
            print(f"leaked: {len(report.leaked)} unreferenced data blobs (not referenced by the "
                  f"metadata: left by a crash, a fenced writer, a failed commit or a staging "
                  f"job that never committed, or not yet committed by a writer still running; "
                  f"`--delete-leaked` removes only those still unreferenced after --grace)")
            for key in report.leaked[:50]:
                print(f"  {key}")
            if len(report.leaked) > 50:
                print(f"  ... and {len(report.leaked) - 50} more")
        if args.delete_leaked:
            print(f"deleted: {len(report.deleted)} leaked blobs")
        spans = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in report.restorable)
        print(f"restorable seqs (persist restore --to-seq): {spans or 'none'}")
        if report.blobs_gone:
            gone = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in report.blobs_gone)
            print(f"not restorable (blobs garbage collected): {gone}")
        print("no problems found" if not report.problems else
              f"{len(report.problems)} problems found")
    return EXIT_PROBLEMS if report.problems else EXIT_OK
