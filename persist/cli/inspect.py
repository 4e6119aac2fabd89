"""``persist inspect``: a location's metadata, frontiers, parts and lock, from its metadata alone
(``--live`` also reads the data, to count live rows)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import pyarrow as pa

from persist import layout
from persist.blob.base import BlobRead
from persist.blob.envelope import ENVELOPE_VERSION
from persist.cli.common import EXIT_OK, human_bytes, open_location, when
from persist.cli.holds import costs_of, print_costs
from persist.cli.lock import lock_dict, print_lock
from persist.indexed.format import columnar, evolve, meta
from persist.indexed.format.meta import CollectionMeta
from persist.indexed.maintenance.verify import require_metadata
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import Address, CollectionInfo, read_task
from persist.indexed.state import pins
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import effective_since
from persist.location import Location


def _type_name(type_bytes: bytes, codec: str | None) -> str:
    arrow_type = columnar.deserialize_type(type_bytes)
    if codec is None:
        return str(arrow_type)
    if arrow_type == pa.binary():
        return f"{codec} (msgpack)"
    return f"{codec} ({arrow_type})"  # a msgspec Struct stored as the matching Arrow struct


def live_rows(blob: BlobRead, info: CollectionInfo) -> int | None:
    """The collection's live rows: how many ``(key, value)`` have a nonzero summed diff as of
    ``upper - 1``, counted by reading its consolidated contents (every part, in key-hash
    buckets or key ranges, so memory stays bounded). None if no time is readable (nothing
    sealed yet, or since has reached upper).

    Raises:
        PartMissing: GC removed parts faster than every retry could plan again.
        Corruption, ExternalError: damaged bytes; storage failed.
    """
    if info.upper == 0 or info.since >= info.upper:
        return None
    reader = PartReader(blob, cache_bytes=0)
    machine = Machine(blob)
    return sum(len(t) for task in info.snapshot().tasks(consolidated=True)
               for t in read_task(reader, task, machine.load))


def _collection(c: CollectionMeta) -> dict[str, Any]:
    inline = [p for p in c.parts if p.inline is not None]
    blobs = [p for p in c.parts if p.blob_key is not None]
    updates = sum(p.rows for p in c.parts)
    return {
        "name": c.name,
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
        # NB: stored updates, before consolidation: an insert and its retraction are two
        # until compaction cancels them. "rows" is the name scripts written before "updates"
        # read, with the same number.
        "updates": updates,
        "rows": updates,
        "bytes": sum(p.nbytes for p in c.parts),
        "inline_bytes": sum(p.nbytes for p in inline),
        "blob_bytes": sum(p.nbytes for p in blobs),
        "holds": dict(c.holds),
    }


def describe(loc: Location, *, live: bool = False,
             storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``inspect`` shows, as plain data; ``live``: each collection's live rows too
    (:func:`live_rows`: reads every part)."""
    blob = loc.read_half()
    require_metadata(blob, loc.url)
    logs = blob.list_keys(layout.LOG_PREFIX)
    rollups = blob.list_keys(layout.ROLLUP_PREFIX)
    pieces = blob.list_keys(layout.PIECE_PREFIX)
    machine = Machine(blob)
    state = machine.load()
    # NB: a location whose newest rollup is a manifest is version 6 on disk, whatever its
    # collections need (an older persist refuses it).
    version = max(meta.required_version(state),
                  meta.MANIFEST_FORMAT_VERSION if machine.pieces.buckets else 0)
    address = Address.of(loc.url, storage_options)
    collections = []
    costs = costs_of(blob, state)
    for name in sorted(state.collections):
        c = state.collections[name]
        entry = _collection(c)
        entry["costs"] = costs[name]
        if live:
            entry["live_rows"] = live_rows(blob, CollectionInfo(address, c, state.seq))
        collections.append(entry)
    return {
        "url": loc.url,
        "format_version": version,
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
        "rollup_pieces": len(pieces),
        "next_collection_id": state.next_cid,
        "retired_blobs": len(state.retired),
        "pinned_blobs": len(pins.pinned(blob)),
        "collections": collections,
        "lock": lock_dict(loc.lock().current()),
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    """``inspect``: prints metadata, frontiers, parts and the lock (``--json``; ``--live``
    counts live rows, reading the data); exit 0/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    info = describe(loc, live=args.live, storage_options=args.storage_options)
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
          f"committed {when(info['committed_wall_ms'])})", file=out)
    rng = info["log_range"]
    logs = f"{info['log_entries']} log entries" + (f" (seq {rng[0]}..{rng[1]})" if rng else "")
    rollups = f"{info['rollups']} rollups" + (
        f" (newest seq {info['newest_rollup']})" if info["rollups"] else "")
    pieces = f", {info['rollup_pieces']} rollup pieces" if info["rollup_pieces"] else ""
    print(f"metadata:   {logs}, {rollups}{pieces}", file=out)
    print_lock(info["lock"], out)
    print(f"retired:    {info['retired_blobs']} blobs awaiting garbage collection", file=out)
    print(f"collections: {len(info['collections'])}", file=out)
    if info["collections"]:
        _print_collections(info["collections"], args.live, out)
        print_costs({c["name"]: c["costs"] for c in info["collections"]},
                    info["pinned_blobs"], human_bytes, out)
    return EXIT_OK


def _print_collections(collections: list[dict[str, Any]], live: bool, out: TextIO) -> None:
    header = ("name", "id", "key", "value", "since", "upper", "parts", "inline", "blob",
              "updates", *(("live rows",) if live else ()), "bytes")
    rows = [header] + [
        (c["name"], str(c["id"]), c["key_type"], c["value_type"],
         _since(c), str(c["upper"]), str(c["parts"]),
         str(c["inline_parts"]), str(c["blob_parts"]), str(c["updates"]),
         *((("-" if c["live_rows"] is None else str(c["live_rows"])),) if live else ()),
         human_bytes(c["bytes"]))
        for c in collections
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(),
              file=out)
    print("  updates: stored updates, before consolidation (an insert and its retraction "
          "count twice until compaction cancels them)" + (
              "; live rows: (key, value) pairs with a nonzero sum as of upper - 1" if live else
              "; --live counts live rows (reads the data)"), file=out)
    if any(c["holds"] for c in collections):
        print("  since: the lowest readable time (ReadHandle.since); 'E (S*)': the effective "
              "since E, held back from S (where allow_compaction put it) by the durable read "
              "holds and tags below; 'S*': holds and tags at or above S hold nothing back yet:",
              file=out)
        for c in collections:
            for hold, frontier in sorted(c["holds"].items()):
                print(f"    {c['name']}: {hold} at {frontier}", file=out)


def _since(c: dict[str, Any]) -> str:
    """The since column: the effective since, and the since it is held back from."""
    if not c["holds"]:
        return str(c["since"])
    if c["effective_since"] == c["since"]:
        return f"{c['since']}*"
    return f"{c['effective_since']} ({c['since']}*)"
