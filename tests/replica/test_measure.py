"""The measurement script keeps working (its figures are in docs/replicas.md)."""

from __future__ import annotations

from tests.replica import measure_latency


def test_measure_latency_smoke() -> None:
    results = measure_latency.run(modes=("push",), writes={"steady": 5}, idle=0.2,
                                  settle=0.1)
    (push,) = results
    assert push["push"]["live"]
    assert push["steady"]["seen"] == push["steady"]["writes"] == 5
    assert push["idle_listening_per_s"]["total"] >= 0
    assert "push" in measure_latency.report(results)
