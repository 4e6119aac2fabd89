"""Writes the golden file of a manifest whose pieces count their forks (``PieceRef.forks``, no
format version of its own: a trailing element an older persist ignores). Run once; never
regenerate.

    python -m tests.golden.make_golden_forks
"""

from __future__ import annotations

from pathlib import Path

from persist.indexed.format import meta
from tests.golden.records_v6 import fixed_counted_manifest

HERE = Path(__file__).parent


def main() -> None:
    (HERE / "forks-manifest.bin").write_bytes(meta.encode_manifest(fixed_counted_manifest()))


if __name__ == "__main__":
    main()
