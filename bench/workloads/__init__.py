"""The workloads W1..W12, each a module with ``WID``, ``TITLE`` and ``run(ctx) -> WorkloadResult``."""

from __future__ import annotations

from types import ModuleType

from bench.workloads import (
    w1_bulk,
    w2_small_appends,
    w4_concurrent,
    w5_listen,
    w6_metadata,
    w7_memory,
    w8_s3,
    w9_spark,
    w10_records,
    w11_fork,
    w12_scale,
)

#: W3 (time travel) runs inside W2's appends, so ``w2_small_appends`` produces both W2 and W3.
WORKLOADS: dict[str, ModuleType] = {
    "W1": w1_bulk,
    "W2": w2_small_appends,
    "W4": w4_concurrent,
    "W5": w5_listen,
    "W6": w6_metadata,
    "W7": w7_memory,
    "W11": w11_fork,
    # NB: W12 (issue 29's metadata at scale, about 10 minutes) is persist alone on local
    # files, so it runs with the local measurements.
    "W12": w12_scale,
    # NB: W8, W9 and W10 run last: the moto server and the JVMs they start (and end) then
    # compete with none of the local measurements (W10 starts its JVM at its very end).
    "W8": w8_s3,
    "W9": w9_spark,
    "W10": w10_records,
}

ALL_IDS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W12")
