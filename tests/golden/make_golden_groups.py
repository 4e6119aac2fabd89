"""Writes the golden file of Parquet parts that record their row groups
(``PartStats.groups``). Run once; never regenerate.

    python -m tests.golden.make_golden_groups
"""

from __future__ import annotations

from pathlib import Path

from persist.indexed.format import meta
from tests.golden.records_groups import fixed_commit

HERE = Path(__file__).parent


def main() -> None:
    (HERE / "groups-commit.bin").write_bytes(meta.encode(fixed_commit()))


if __name__ == "__main__":
    main()
