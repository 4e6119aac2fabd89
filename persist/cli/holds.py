"""``persist holds``: every hold and tag of a location, and releasing one; and what ``persist
inspect`` shows of forks, tags and holds (:func:`costs_of`, :func:`print_costs`).

    persist holds [list] URL [--json]                     every hold: time, lease, last renewal
    persist holds release URL COLLECTION NAME [--yes]     release one (dry-run without --yes)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import msgspec

from persist.cli.common import EXIT_OK, open_location, wrap
from persist.distributed.holds import request
from persist.errors import UnknownHold
from persist.indexed.format.meta import State
from persist.indexed.state import holds, pins, refs
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection


def _iso(at: datetime.datetime | None) -> str | None:
    return None if at is None else at.isoformat(timespec="milliseconds")


def hold_rows(state: State) -> list[dict[str, Any]]:
    """Every hold of every collection of ``state``, as plain data."""
    rows = []
    for name in sorted(state.collections):
        for h in holds.listing(state.collections[name]):
            rows.append({"collection": h.collection, "name": h.name, "kind": h.kind,
                         "time": h.frontier, "lease_seconds": h.lease_seconds,
                         "renewed_at": _iso(h.renewed_at), "expires_at": _iso(h.expires_at),
                         "lapsed": h.lapsed})
    return rows


def cmd_holds_list(args: argparse.Namespace) -> int:
    """``holds [list]``: prints every hold (tags, consumer holds, plain holds); exit 0/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    rows = hold_rows(Machine(loc.read_half()).load())
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no holds")
        return EXIT_OK
    header = ("collection", "name", "kind", "time", "lease", "last renewal (UTC)", "state")
    table = [header] + [
        (r["collection"], r["name"], r["kind"], str(r["time"]),
         "-" if r["lease_seconds"] is None else f"{r['lease_seconds']:g}s",
         r["renewed_at"] or "-",
         "LAPSED (holds nothing)" if r["lapsed"] else
         f"live until {r['expires_at']}" if r["expires_at"] else "live")
        for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(header))]
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())
    return 0


def cmd_holds_release(args: argparse.Namespace) -> int:
    """``holds release``: releases one hold or tag (dry-run without ``--yes``); exit
    0/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    state = Machine(loc.read_half()).load()
    c = collection(state.collections, args.collection)
    found = [h for h in holds.listing(c) if h.name == args.name]
    if not found:
        raise UnknownHold(f"{args.collection!r} has no hold or tag named {args.name!r}; "
                                f"it has {[h.name for h in holds.listing(c)][:20]}")
    h = found[0]
    what = (f"{h.kind} {h.name!r} of {args.collection!r} at {h.frontier}"
            + (" (lapsed)" if h.lapsed else ""))
    if not args.yes:
        print(f"would release {what}: compaction may then forward times past {h.frontier}, "
              f"and its consumer's next advance fails (dry-run: pass --yes to release)")
        return EXIT_OK
    seq = request(args.url, args.collection, args.name, "release",
                  storage_options=args.storage_options, timeout=args.timeout)
    print(f"released {what} (seq {seq})")
    return EXIT_OK


def add_parser(sub: Any, command: Callable[..., argparse.ArgumentParser],
               parser_class: type) -> None:
    """Adds ``holds`` (with ``list``, the default, and ``release``) to the ``persist`` parser's
    subcommands ``sub``, through its ``command`` helper."""
    p = sub.add_parser("holds", help="list every hold and tag (time, lease, last renewal), or "
                       "release one", usage="persist holds [list] URL | persist holds release "
                       "URL COLLECTION NAME [--yes]")
    hsub = p.add_subparsers(dest="holds_command", metavar="COMMAND", parser_class=parser_class,
                            prog="persist holds")
    q = command(hsub, "list", cmd_holds_list, "list every hold (the default)", "url",
                description=wrap(
                    "List every hold of every collection: tags (a pinned time), consumer "
                    "holds (with a lease, live or lapsed) and plain read holds, with the time "
                    "each holds at, its lease and its last renewal (the committing writer's "
                    "clock)."))
    q.add_argument("--json", action="store_true", help="print JSON")
    q = command(hsub, "release", cmd_holds_release, "release a hold or delete a tag (dry-run "
                "unless --yes)", "url", "collection", "name", description=wrap(
                    "Release a hold or delete a tag: compaction may then forward times past "
                    "it, and a consumer that still advances it gets HoldLapsed. Without --yes, "
                    "only says what it would do. With a writer running, the writer commits it "
                    "(a request it answers); with none, this command takes the lock briefly."))
    q.add_argument("--yes", action="store_true", help="really release it")
    q.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for a running writer to commit the release "
                        "(default 30)")


# -- inspect ---------------------------------------------------------------------------------


def costs_of(blob: Any, state: State) -> dict[str, dict[str, Any]]:
    """Per collection, what ``inspect`` shows of forks, tags and holds, as plain data."""
    pinned = pins.pinned(blob)
    out: dict[str, dict[str, Any]] = {}
    for name, k in refs.costs(state, pinned).items():
        c = state.collections[name]
        lin = c.lineage if refs.is_fork(c) and c.lineage is not msgspec.UNSET else None
        out[name] = {
            "live_bytes": k.live, "held_bytes": k.held, "shared_bytes": dict(k.shared),
            "borrowed_bytes": k.borrowed, "kept_for_forks_bytes": k.for_forks,
            "tags": holds.tags(c),
            "forked_from": None if lin is None else {
                "collection": lin.source, "location": lin.location, "as_of": lin.as_of,
                "seq": lin.seq},
            "restored_at_seq": refs.restored_at(c),
        }
    return out


def print_costs(costs: dict[str, dict[str, Any]], pinned: int, size: Callable[[float], str],
                out: TextIO) -> None:
    """Prints ``costs`` (:func:`costs_of`) below ``inspect``'s table."""
    if not costs:
        return
    print("  bytes each collection keeps alive (live: read by its state; held: history only "
          "its holds and tags keep uncompacted; shared: also read by another collection or "
          "pinned by a fork elsewhere; borrowed: owned by its fork source; kept for forks: "
          "its old blobs only forks read):", file=out)
    for name, k in costs.items():
        shared = ", ".join(f"{size(v)} with {o}" for o, v in sorted(k["shared_bytes"].items()))
        extra = []
        if k["forked_from"]:
            f = k["forked_from"]
            where = "" if f["location"] is None else f" of location {f['location']}"
            extra.append(f"fork of {f['collection']!r}{where} as of {f['as_of']} "
                         f"(seq {f['seq']})")
        if k["tags"]:
            extra.append("tags " + ", ".join(f"{t}@{v}" for t, v in k["tags"].items()))
        if k["restored_at_seq"] is not None:
            extra.append(f"restored at seq {k['restored_at_seq']}")
        print(f"    {name}: live {size(k['live_bytes'])}; held {size(k['held_bytes'])}; "
              f"shared {shared or '0 B'}; borrowed {size(k['borrowed_bytes'])}; kept for forks "
              f"{size(k['kept_for_forks_bytes'])}" + (f" ({'; '.join(extra)})" if extra else ""),
              file=out)
    if pinned:
        print(f"  pins: {pinned} blobs of this location are read by forks in other locations "
              f"(kept until those forks no longer read them)", file=out)


__all__ = ["add_parser", "cmd_holds_list", "cmd_holds_release", "costs_of", "hold_rows",
           "print_costs"]
