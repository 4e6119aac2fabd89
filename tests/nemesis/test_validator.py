"""The validator catches each kind of violation (so a green nemesis run means something).

Each test builds a tiny, hand-written history plus final state that breaks exactly one promise,
and checks the validator names it; a correct history yields no problems. The end-to-end
counterpart (a deliberately broken engine caught by a real nemesis run) is in
``test_mutants.py``.
"""

from __future__ import annotations

from persist.errors import Determinate, Fenced, Indeterminate, InvalidUsage, RuntimeShutdown
from tests.nemesis.history import (
    ErrorRecord,
    FrontierRecord,
    History,
    ListenRecord,
    OpenRecord,
    SnapshotRecord,
    WriteRecord,
    contents_hash,
)
from tests.nemesis.validate import FinalCollection, validate


def _write(h: History, wid: int, *, ok: bool = True, error: type[BaseException] | None = None,
           gen: int = 0, t: int = 1, names: tuple[str, ...] = ("c",),
           seals: dict[str, int] | None = None) -> WriteRecord:
    ups = {n: [(f"m{wid}", wid, t, 1), (f"r{wid}.0", wid, t, 2)] for n in names}
    w = WriteRecord(wid, gen, "write", ups, dict(seals or {}), {}, h.stamp())
    w.completed = h.stamp()
    w.ok, w.error = ok, error
    h.add(w)
    return w


def _final(*wids: int, name: str = "c", upper: int = 10) -> dict[str, FinalCollection]:
    contents = {}
    for wid in wids:
        contents[(f"m{wid}", wid)] = 1
        contents[(f"r{wid}.0", wid)] = 2
    return {name: FinalCollection(0, upper, upper - 1, contents)}


def _snap(h: History, as_of: int, rows: dict[tuple[str, int], int], reader: str = "w") -> None:
    items = [(k, v, d) for (k, v), d in rows.items()]
    h.add(SnapshotRecord(reader, 0, "c", as_of, h.stamp(), len(items), contents_hash(items),
                         dict(rows)))


def test_a_correct_history_passes() -> None:
    h = History(0)
    _write(h, 1)
    _write(h, 2, ok=False, error=Indeterminate)  # landed: allowed
    _write(h, 3, ok=False, error=Indeterminate)  # did not land: allowed
    _write(h, 4, ok=False, error=Determinate)
    _snap(h, 1, {("m1", 1): 1, ("r1.0", 1): 2, ("m2", 2): 1, ("r2.0", 2): 2})
    _snap(h, 0, {})
    assert validate(h, _final(1, 2)) == []


def test_lost_acknowledged_write() -> None:
    h = History(0)
    _write(h, 1)
    _write(h, 2)
    problems = validate(h, _final(1))
    assert any(p.startswith("lost: write 2") for p in problems), problems


def test_phantom_write() -> None:
    h = History(0)
    _write(h, 1)
    final = _final(1)
    final["c"].contents[("m99", 99)] = 1
    final["c"].contents[("garbage", 1)] = 1
    problems = validate(h, final)
    assert any("phantom" in p and "m99" in p for p in problems), problems
    assert any("phantom" in p and "garbage" in p for p in problems), problems


def test_definite_failures_must_not_land() -> None:
    for error in (Determinate, InvalidUsage, RuntimeShutdown, Fenced):
        h = History(0)
        _write(h, 1, ok=False, error=error)
        problems = validate(h, _final(1))
        assert any(f"failed with {error.__name__}" in p for p in problems), problems


def test_partial_multi_collection_write() -> None:
    h = History(0)
    _write(h, 1, names=("a", "b"))
    final = _final(1, name="a")
    final["b"] = FinalCollection(0, 10, 9, {})
    problems = validate(h, final)
    assert any(p.startswith("atomicity: write 1") for p in problems), problems


def test_acknowledged_after_takeover() -> None:
    h = History(0)
    h.add(OpenRecord(0, "plain", h.stamp(), h.stamp()))
    h.add(OpenRecord(1, "plain", h.stamp(), h.stamp()))
    _write(h, 1, gen=0)  # invoked after writer 1 opened, yet acknowledged
    problems = validate(h, _final(1))
    assert any(p.startswith("fencing: write 1") for p in problems), problems


def test_snapshot_disagreeing_with_the_writes() -> None:
    h = History(0)
    _write(h, 1, t=1)
    _write(h, 2, t=5)
    _snap(h, 3, {("m1", 1): 1, ("r1.0", 1): 2, ("m2", 2): 1})  # sees a write from the future
    problems = validate(h, _final(1, 2))
    assert any("snapshot of c as of 3" in p for p in problems), problems


def test_snapshots_of_one_time_differ() -> None:
    h = History(0)
    _write(h, 1, t=1)
    _snap(h, 2, {("m1", 1): 1, ("r1.0", 1): 2}, reader="a")
    _snap(h, 2, {("m1", 1): 1}, reader="b")
    problems = validate(h, _final(1))
    assert any(p.startswith("indefinite: snapshots of c as of 2") for p in problems), problems


def test_listener_duplicates_and_gaps() -> None:
    h = History(0)
    _write(h, 1, t=1)
    _write(h, 2, t=3)
    good = ListenRecord("w", "c", 0, [
        ("updates", 1, 2, [("m1", 1, 1, 1), ("r1.0", 1, 1, 2)]), ("progress", 2, 2, []),
        ("updates", 2, 4, [("m2", 2, 3, 1), ("r2.0", 2, 3, 2)]), ("progress", 4, 4, []),
    ])
    dup = ListenRecord("dup", "c", 0, [
        ("updates", 1, 2, [("m1", 1, 1, 1), ("r1.0", 1, 1, 2)]),
        ("updates", 1, 2, [("m1", 1, 1, 1), ("r1.0", 1, 1, 2)]), ("progress", 2, 2, []),
    ])
    gap = ListenRecord("gap", "c", 0, [("progress", 2, 2, []), ("progress", 4, 4, [])])
    for lr in (good, dup, gap):
        h.add(lr)
    problems = validate(h, _final(1, 2))
    assert not any("listen w/" in p for p in problems), problems
    assert any("listen dup/c" in p for p in problems), problems
    assert any("listen gap/c" in p for p in problems), problems


def test_frontiers_going_backwards_or_forgetting_seals() -> None:
    h = History(0)
    _write(h, 1, seals={"c": 5})  # acknowledged seal to 5 by writer 0
    h.add(FrontierRecord("w0", "writer", 0, "c", 0, 5, h.stamp()))
    h.add(FrontierRecord("w0", "writer", 0, "c", 0, 4, h.stamp()))  # backwards
    h.add(FrontierRecord("w1", "writer", 1, "c", 0, 3, h.stamp()))  # a newer writer forgot it
    h.add(FrontierRecord("r", "replica", -1, "c", 3, 2, h.stamp()))  # since > upper
    problems = validate(h, _final(1, upper=4))
    assert any("w0 saw c go backwards" in p for p in problems), problems
    assert any("w1 (writer 1) saw upper 3" in p for p in problems), problems
    assert any("since 3 > upper 2" in p for p in problems), problems
    assert any("final upper of c is 4" in p for p in problems), problems


def test_untyped_errors() -> None:
    h = History(0)
    h.add(ErrorRecord("snapshot", KeyError, "boom", h.stamp()))
    problems = validate(h, {})
    assert any("untyped error from snapshot" in p for p in problems), problems
