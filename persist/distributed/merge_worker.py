"""The entry point of a writer's merge worker process: ``python -m persist.distributed.merge_worker``.

A writer of a file or S3 location runs its big merges here, outside its own GIL
(:mod:`persist.indexed.maintenance.offload` owns the protocol and the process;
``persist.location`` names this module). The worker opens the location from its
:class:`~persist.indexed.read.scan.Address` (its URL and storage options, as every process of
:mod:`persist.distributed` does), writes merged parts there and never commits: the writer does.
"""

from __future__ import annotations

import msgspec

from persist.blob.base import Blob
from persist.distributed import stores
from persist.indexed.maintenance import offload
from persist.indexed.read.scan import Address


def _open(data: bytes) -> Blob:
    return stores.writable(msgspec.msgpack.decode(data, type=Address))


def main() -> None:
    """Serves merges until the writer closes the worker's input."""
    offload.serve(_open)


if __name__ == "__main__":
    main()
