"""Child process for the incremental-rollup crash tests: the crash-point workload
(:mod:`tests.nemesis.seam_writer`) at a location of 13 collections whose rollups are manifests
(two collections per piece here, so each rollup rewrites a piece and references the others).

Prints ``{"others": true}`` once those are acknowledged, then the workload's lines.

Usage: ``PERSIST_CRASH_AT=<seam>:<n> python -m tests.runtime.pieces_writer LOCATION``
"""

from __future__ import annotations

import sys

import pyarrow as pa

import persist
from persist.indexed.state import pieces
from tests.nemesis import seam_writer

#: Collections besides the workload's ``c``: each is written once, before the workload.
OTHERS = 12


def main() -> None:
    pieces.COLLECTIONS_PER_PIECE = 2
    with persist.open(sys.argv[1], reentrance_id=seam_writer.RID,
                      options=seam_writer.OPTIONS) as client:
        for i in range(OTHERS):
            write, _ = client.create_or_load(f"x{i}", key_type=pa.int64(),
                                             value_type=pa.int64())
            write.append([((i, i), 0, 1)], 1).result()
    sys.stdout.write('{"others": true}\n')
    sys.stdout.flush()
    seam_writer.main()


if __name__ == "__main__":
    main()
