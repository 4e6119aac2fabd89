"""``persist snapshot`` (a definite snapshot of a collection, to Parquet) and ``persist history``
(its recent seals): the commands that read one collection."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from typing import Any

from persist.cli.common import EXIT_OK, open_location
from persist.indexed.format.evolve import Types
from persist.indexed.format.meta import CollectionMeta, State
from persist.indexed.maintenance.verify import require_metadata
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import Address, CollectionInfo, SnapshotRead, resolve_as_of
from persist.indexed.state import history
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection, effective_since
from persist.location import Location


def _load(loc: Location, name: str) -> tuple[Machine, State, CollectionMeta]:
    """The location's newest state and collection ``name`` in it (no lock, no runtime).

    Raises:
        MissingResource: no metadata at the location.
        UnknownCollection: no such collection.
    """
    blob = loc.read_half()
    require_metadata(blob, loc.url)
    machine = Machine(blob)
    state = machine.load()
    return machine, state, collection(state.collections, name)


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``snapshot``: writes a definite snapshot to Parquet by atomic rename; exit 0/2/3/5."""
    import pyarrow.parquet as pq

    loc = open_location(args.url, args.storage_options)
    machine, state, c = _load(loc, args.collection)
    as_of = resolve_as_of(c, args.as_of)  # InvalidUsage: exit 2 (EXIT_USAGE)
    info = CollectionInfo(Address.of(loc.url, args.storage_options), c, state.seq)
    # NB: read as a client reads a snapshot: planned on this state and, if GC removes a part
    # meanwhile, planned again on a newer one (the answer is definite, so the same).
    table = SnapshotRead(info.snapshot(as_of), PartReader(machine.blob), machine.load).to_arrow()
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


def cmd_history(args: argparse.Namespace) -> int:
    """``history``: prints a collection's recent seals (``DESCRIBE HISTORY``); exit 0/2/3/5."""
    loc = open_location(args.url, args.storage_options)
    _, _, c = _load(loc, args.collection)
    seals = history.entries(c)
    if args.json:
        rows: list[dict[str, Any]] = [
            {"upper": e.upper, "committed_at": e.committed_at.isoformat(), "seq": e.seq,
             "updates": e.updates, "inserted": e.inserted, "retracted": e.retracted}
            for e in seals]
        print(json.dumps(rows, indent=2))
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
