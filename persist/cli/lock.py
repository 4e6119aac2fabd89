"""``persist lock`` (show the writer lock, release it by force) and ``persist dynamodb
create-table`` (the lock and commit table of S3 locations)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from persist.cli.common import (
    EXIT_LOCK_HELD,
    EXIT_MISSING_DEPENDENCY,
    EXIT_OK,
    CliError,
    open_location,
)
from persist.lock.base import LockRecord


def lock_dict(rec: LockRecord | None) -> dict[str, Any] | None:
    """The lock record as plain data (None: the lock was never taken)."""
    if rec is None:
        return None
    return {"holder": rec.holder, "generation": rec.generation, "beat": rec.beat,
            "lease_seconds": rec.lease_ms / 1000, "released": rec.released,
            "last_beat_seconds_ago": round(max(0.0, time.time() - rec.wall_ms / 1000), 3)}


def print_lock(info: dict[str, Any] | None, out: TextIO) -> None:
    """One line: who holds the lock (or that it is free, or was never taken)."""
    if info is None:
        print("lock:       never taken", file=out)
    elif info["released"]:
        print(f"lock:       free (released by {info['holder']!r}, generation "
              f"{info['generation']})", file=out)
    else:
        print(f"lock:       held by {info['holder']!r}, generation {info['generation']} "
              f"(beat {info['beat']}, lease {info['lease_seconds']:g}s, last beat "
              f"{info['last_beat_seconds_ago']:.1f}s ago)", file=out)


def cmd_lock_show(args: argparse.Namespace) -> int:
    """``lock show``: prints the writer lock record (``--json``); exit 0/2/3/5."""
    loc = open_location(args.url, args.storage_options, must_exist=False)
    lock = loc.lock()
    try:
        info = lock_dict(lock.current())
    finally:
        lock.close()
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        print_lock(info, sys.stdout)
    return EXIT_OK


def cmd_lock_release(args: argparse.Namespace) -> int:
    """``lock release``: marks a held lock released, only with ``--force``; exit 0/2/3/4/5."""
    loc = open_location(args.url, args.storage_options, must_exist=False)
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
