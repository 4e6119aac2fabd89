"""Writes the golden file of a rollup recording the metadata trim's progress (``State.trim``,
no format version of its own: an older persist ignores it). Run once; never regenerate.

    python -m tests.golden.make_golden_trim
"""

from __future__ import annotations

from pathlib import Path

from persist.indexed.format import meta
from tests.golden.records import fixed_state, fixed_trim

HERE = Path(__file__).parent


def main() -> None:
    (HERE / "trim-state.bin").write_bytes(meta.encode_rollup(fixed_state(), fixed_trim()))


if __name__ == "__main__":
    main()
