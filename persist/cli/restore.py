"""``persist restore``: putting a location's state back to an earlier seq, as a new commit (an
undo; dry-run without ``--yes``; :mod:`persist.indexed.maintenance.restore` plans it)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from persist.cli.common import EXIT_OK, EXIT_PROBLEMS, open_location, wrap
from persist.indexed.maintenance import restore
from persist.indexed.state.machine import Machine
from persist.location import open as open_location_writer


def cmd_restore(args: argparse.Namespace) -> int:
    """``restore``: puts the location back to seq N (dry-run without ``--yes``); exit
    0/1/2/3/4/5 (1: not restorable)."""
    loc = open_location(args.url, args.storage_options)
    state = Machine(loc.read_half()).load()
    plan = restore.plan(loc.read_half(), state, args.to_seq, url=loc.url)
    if args.yes and plan.op is not None:
        with open_location_writer(args.url, storage_options=args.storage_options,
                                  lock_timeout=args.lock_timeout) as client:
            plan = client.restore(args.to_seq)
    _print_plan(plan, done=args.yes and plan.op is not None, as_json=args.json, out=sys.stdout)
    return EXIT_PROBLEMS if plan.problems else EXIT_OK


def _print_plan(plan: restore.RestorePlan, *, done: bool, as_json: bool, out: TextIO) -> None:
    if as_json:
        data = asdict(plan)
        data.pop("op")
        data.update(backwards=plan.backwards, done=done)
        json.dump(data, out, indent=2)
        print(file=out)
        return
    verb = "restored" if done else "would restore"
    if plan.problems:
        print(f"seq {plan.to_seq} of {plan.url} cannot be restored:", file=out)
        for p in plan.problems:
            print(f"  - {p}", file=out)
        print("(`persist verify` lists the seqs that still can)", file=out)
        return
    print(f"{verb} {plan.url} from seq {plan.seq} to the state of seq {plan.to_seq}, as a new "
          f"commit:", file=out)
    for c in plan.changes:
        if c.status == "unchanged":
            continue
        print(f"  {c.name}: {c.status}; since {c.since[0]} -> {c.since[1]}, upper {c.upper[0]} "
              f"-> {c.upper[1]}, parts {c.parts[0]} -> {c.parts[1]}"
              + ("   <- BACKWARDS" if c.backwards else ""), file=out)
        for h in c.holds:
            print(f"    {h}", file=out)
    print(f"  blobs: {plan.unretired} taken back from GC, {plan.retired} retired", file=out)
    if plan.backwards:
        print("WARNING: this is an UNDO. Frontiers move BACKWARDS: readers, listeners and "
              "streams that read past seq "
              f"{plan.to_seq} saw history that no longer exists; restart them (listeners of a "
              f"rewound collection fail; a Spark stream must start from a new checkpoint).",
              file=out)
    if not done:
        print("dry-run: pass --yes to restore", file=out)


def add_parser(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Adds ``restore`` to the ``persist`` parser's subcommands ``sub``."""
    p = command(sub, "restore", cmd_restore, "put a location's state back to an earlier seq, "
                "as a new commit (an undo; dry-run unless --yes)", "url", description=wrap(
                    "Put every collection back as it was at commit N, as a new commit. This is "
                    "an UNDO: frontiers (upper, since) move BACKWARDS, collections registered "
                    "since N disappear, holds and tags return to what they were; readers, "
                    "listeners and streams that read past N must start again. A seq stays "
                    "restorable while its log is not trimmed and the blobs it reads are not "
                    "collected (`persist verify` lists them). Without --yes, only prints what "
                    "would change."))
    p.add_argument("--to-seq", type=int, required=True, metavar="N",
                   help="the seq whose state to restore (see `persist verify` for those "
                        "still restorable)")
    p.add_argument("--yes", action="store_true", help="really restore (takes the writer "
                   "lock)")
    p.add_argument("--lock-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="how long to wait for the writer lock (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON")


__all__ = ["add_parser", "cmd_restore"]
