"""The W2 plot: append latency against append number, one line per system (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_w2(series: dict[str, list[list[float]]], path: Path, *, title: str) -> Path | None:
    """Plots the first round of every system (raw points faint, a rolling median bold)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    colors = {"persist": "tab:blue", "floor": "tab:gray", "delta": "tab:orange",
              "iceberg": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    for name, rounds in series.items():
        if not rounds:
            continue
        ys = np.asarray(rounds[0], dtype=np.float64)
        xs = np.arange(1, len(ys) + 1)
        c: Any = colors.get(name)
        ax.plot(xs, ys, ".", ms=1.5, alpha=0.25, color=c)
        k = max(1, len(ys) // 40)
        if len(ys) >= k:
            med = np.array([np.median(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))])
            ax.plot(xs, med, "-", lw=2, color=c, label=f"{name} (rolling median of {k})")
    ax.set_yscale("log")
    ax.set_xlabel("append number")
    ax.set_ylabel("acknowledged append latency (ms, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
