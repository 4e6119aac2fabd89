"""Result records: per workload, named metrics with per-system samples, then summaries.

JSON shape (``results.json``)::

    {"meta": {...}, "systems": {name: {"available": bool, "reason": str | null, ...}},
     "workloads": {"W1": {"title": str, "params": {...}, "status": {system: "ok" | "skipped: why"},
                          "metrics": [{"name", "unit", "better": "higher"|"lower"|null,
                                       "values": {system: {"median","min","max","n","samples"}}}],
                          "notes": [str], "series": {...},
                          "columns": {system: heading}, "extra": [column]}},
     "targets": [{"id", "description", "value", "threshold", "op", "met": bool | null}]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bench.common import summary

Better = Literal["higher", "lower"] | None


@dataclass
class Metric:
    name: str
    unit: str
    better: Better
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, system: str, value: float) -> None:
        self.samples.setdefault(system, []).append(float(value))

    def median(self, system: str) -> float | None:
        s = summary(self.samples.get(system, []))
        return s["median"]  # type: ignore[no-any-return]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "better": self.better,
            "values": {s: summary(v) for s, v in self.samples.items()},
        }


@dataclass
class WorkloadResult:
    wid: str
    title: str
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    #: Column headings that differ from the system name in this workload, e.g. W9 reports
    #: ``spark.read.parquet`` in the floor's column (explained in a note).
    columns: dict[str, str] = field(default_factory=dict)
    #: Columns measured by this workload only, shown after the systems' with a ratio column
    #: each (W10's ``parquet``: pyarrow.parquet files). They are not systems: no status.
    extra: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def metric(self, name: str, unit: str, better: Better) -> Metric:
        m = self.metrics.get(name)
        if m is None:
            m = self.metrics[name] = Metric(name, unit, better)
        return m

    def add(self, name: str, unit: str, better: Better, system: str, value: float) -> None:
        self.metric(name, unit, better).add(system, value)
        if system in self.extra:
            return
        st = self.status.get(system)
        if st is None:
            self.status[system] = "ok"
        elif st.startswith("skipped"):
            self.status[system] = "ok (partly skipped)"

    def skip(self, system: str, why: str) -> None:
        """Records that ``system`` did not run (part of) this workload, and why."""
        st = self.status.get(system)
        if st is None:
            self.status[system] = f"skipped: {why}"
        elif st == "ok":
            self.status[system] = "ok (partly skipped)"
        note = f"{system}: {why}"
        if note not in self.notes:
            self.notes.append(note)

    def median(self, name: str, system: str) -> float | None:
        m = self.metrics.get(name)
        return None if m is None else m.median(system)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "params": self.params,
            "status": self.status,
            "metrics": [m.to_json() for m in self.metrics.values()],
            "notes": self.notes,
            "series": self.series,
            "columns": self.columns,
            "extra": self.extra,
            "seconds": self.seconds,
        }
