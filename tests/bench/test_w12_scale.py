"""W12, issue 29's metadata at scale (``bench/workloads/w12_scale.py``): its rows become the
issue's targets as ratios of the same run (cheap: the report only), and each part's quick
mode does what its row says (behaviour, never timing): the steady run saw a trim with a
window before and after it, the sessions left every session's metadata and opened both
locations in turn, the many-collections location is rolled up in pieces and its retained
bytes were sampled. The whole workload through ``bench.run --quick``:
tests/bench/test_bench_smoke.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.report import targets
from bench.results import WorkloadResult
from bench.workloads import w12_scale as w12
from bench.workloads.context import Context

B = w12.BASELINE


def _ctx(tmp_path: Path) -> Context:
    return Context(argparse.Namespace(repeats=1, peer_repeats=1), tmp_path, ["persist"])


def _res() -> WorkloadResult:
    return WorkloadResult("W12", "metadata at scale",
                          params={"sessions": 100, "commits": 1000, "collections": 10_000,
                                  "bin_s": 10.0, "retained_from": 40.0})


def test_issue_29s_rows_are_its_targets_as_ratios() -> None:
    res = _res()
    res.add(w12.TRIM_RATE, "1/s", "higher", "persist", 700.0)
    res.add(w12.TRIM_RATE, "1/s", "higher", B, 1000.0)
    for ms in (40.0, 48.0, 90.0):  # the median is compared, not the mean
        res.add(w12.OPEN_SESSIONS, "ms", "lower", "persist", ms)
    for ms in (30.0, 40.0, 35.0):
        res.add(w12.OPEN_SESSIONS, "ms", "lower", B, ms)
    res.add(w12.COLLECTIONS_P50, "ms", "lower", "persist", 1.1)
    res.add(w12.COLLECTIONS_P50, "ms", "lower", B, 1.0)
    res.add(w12.COLLECTIONS_OPEN, "ms", "lower", "persist", 62.0)
    res.add(w12.COLLECTIONS_OPEN, "ms", "lower", B, 20.0)
    res.add(w12.RETAINED, "MB", "lower", "persist", 230.0)
    res.add(w12.RETAINED, "MB", "lower", B, 140.0)
    got = {t.id: t for t in targets({"W12": res})}
    assert got["W12.trim-window"].value == pytest.approx(0.7)
    assert got["W12.trim-window"].met is False
    assert got["W12.open-100/1"].value == pytest.approx(48 / 35)
    assert got["W12.open-100/1"].met
    assert got["W12.open-ms"].value == pytest.approx(48.0)
    assert got["W12.open-ms"].met
    assert got["W12.collections-p50"].value == pytest.approx(1.1)
    assert got["W12.collections-p50"].met
    assert got["W12.collections-open"].value == pytest.approx(3.1)
    assert got["W12.collections-open"].met is False
    # the bytes retained at 10,000 collections themselves, not over one collection's
    assert got["W12.retained-mb"].value == pytest.approx(230.0)
    assert got["W12.retained-mb"].met is False
    assert "100 sessions of 1,000 commits" in got["W12.open-100/1"].description
    assert "10,000 collections" in got["W12.collections-p50"].description


def test_rows_not_measured_are_targets_without_a_value() -> None:
    # a steady run that saw no trim adds no row: its target is reported, neither met nor missed
    got = {t.id: t for t in targets({"W12": _res()})}
    assert {"W12.trim-window", "W12.open-100/1", "W12.open-ms", "W12.collections-p50",
            "W12.collections-open", "W12.retained-mb"} <= set(got)
    assert all(got[i].met is None for i in got if i.startswith("W12."))
    assert not any(i.startswith("W12.") for i in {t.id for t in targets({})})


def test_w2_has_issue_29s_target_beside_the_older_one() -> None:
    res = WorkloadResult("W2", "small appends")
    res.add("median latency (ms)", "ms", "lower", "persist", 1.4)
    res.add("median latency (ms)", "ms", "lower", "floor", 1.0)
    got = {t.id: t for t in targets({"W2": res})}
    assert got["W2.median/floor"].threshold == 1.5
    assert got["W2.median/floor"].met
    assert got["W2.median/floor-29"].threshold == 1.3
    assert got["W2.median/floor-29"].value == pytest.approx(1.4)
    assert got["W2.median/floor-29"].met is False


def test_quick_steady_run_sees_a_trim_between_windows(tmp_path: Path) -> None:
    res = WorkloadResult("W12", "metadata at scale")
    # NB: a grace of 1.5 s: the rollup the writer's open writes (just before the appends
    # start) ripens after the first 1 s window has ended
    out = w12.steady(_ctx(tmp_path), res, tmp_path, seconds=5.0, grace=1.5, bin_s=1.0)
    bins = out["bins"]
    assert len(bins) >= 5
    assert all(b["rate"] > 0 for b in bins)
    # a rollup ripened and the trim deleted log entries inside the run, after a first window
    assert out["first_trim_s"] is not None
    assert bins[0]["end_s"] <= out["first_trim_s"] < bins[-1]["end_s"]
    assert out["appends"] > bins[-1]["log_entries"]
    assert res.metrics[w12.TRIM_RATE].samples == {"persist": [out["lowest_after"]],
                                                  B: [out["before"]]}
    assert out["ratio"] == pytest.approx(out["lowest_after"] / out["before"])
    assert res.series["trim_bins"] == bins


def test_quick_sessions_open_both_locations_in_turn(tmp_path: Path) -> None:
    res = WorkloadResult("W12", "metadata at scale")
    out = w12.sessions(_ctx(tmp_path), res, tmp_path, count=3, commits=50, opens=2)
    # nothing trimmed inside the default grace: every session's commits are in the log
    assert out["log_entries"] >= 3 * 50
    assert out["rows"][-1]["session"] == 3
    assert out["after_one"].is_dir()
    samples = res.metrics[w12.OPEN_SESSIONS].samples
    assert samples == {"persist": out["opens"]["many"], B: out["opens"]["one"]}
    assert len(samples["persist"]) == len(samples[B]) == 2
    assert all(ms > 0 for ms in samples["persist"] + samples[B])


def test_quick_collections_are_rolled_up_in_pieces(tmp_path: Path) -> None:
    res = WorkloadResult("W12", "metadata at scale")
    one, many = w12.collections(_ctx(tmp_path), res, tmp_path, count=100, seconds=3.0,
                                grace=1.0, retained_from=1.0, blocks=1, block=20, opens=1)
    assert (one["collections"], many["collections"]) == (1, 100)
    # past 64 collections a rollup is a manifest and pieces, and a rollup during the appends
    # to one collection rewrote few of them; one collection's rollups are whole
    assert many["pieces_per_rollup"] >= 1
    assert one["pieces_per_rollup"] == 0
    assert many["whole_rollup_bytes"] > one["whole_rollup_bytes"]
    for r in (one, many):
        assert r["appends"] > 0
        assert r["rollups"] > 0
        assert r["steady_peak_meta_bytes"] > 0
        assert r["steady_peak_meta_bytes"] == (r["steady_log_bytes"] + r["steady_rollup_bytes"]
                                               + r["steady_piece_bytes"])
    for metric in (w12.COLLECTIONS_P50, w12.COLLECTIONS_OPEN, w12.COLLECTIONS_OPEN_AFTER,
                   w12.RETAINED):
        assert set(res.metrics[metric].samples) == {"persist", B}, metric
    assert res.median(w12.RETAINED, "persist") == many["steady_peak_meta_bytes"] / 1e6
    assert not (tmp_path / "collections").exists()
