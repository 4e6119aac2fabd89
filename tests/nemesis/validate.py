"""The validator: checks a nemesis History against the final state of the location.

What it proves about a run (each a list of violations, empty when the run was correct):

1. *Durability*: every acknowledged write is in the final state.
2. *No phantoms*: every record in the final state comes from a write that was attempted, in a
   collection that write targeted, with the value it wrote.
3. *Definite failures are definite*: a write whose future failed with Determinate, InvalidUsage,
   RuntimeShutdown or Fenced is absent; Indeterminate ones may go either way.
4. *Atomicity*: a multi-collection write landed in all of its collections or in none.
5. *Fencing*: no command sent to a writer after a newer writer (same reentrance id) finished
   opening was acknowledged.
6. *Definite reads*: every snapshot as of ``t`` (by any reader, at any moment) equals the
   contents the landed writes give at ``t``; so snapshots of one ``t`` agree across time and
   readers. Every listener delivered exactly the landed updates in the range it covered.
7. *Frontiers*: per observer, ``since`` and ``upper`` never go backwards and ``since <= upper``;
   a writer's ``upper`` covers every seal acknowledged by itself before, and by every older
   writer; the final ``upper`` covers every acknowledged seal.
8. *Typed errors*: every exception the API raised is a PersistError.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from persist.errors import (
    Determinate,
    Fenced,
    Indeterminate,
    InvalidUsage,
    PersistError,
    RuntimeShutdown,
)
from tests.nemesis.history import _MASK, History, Update, WriteRecord, row_hash

#: Failures that promise the write did not happen.
DEFINITE_FAILURES: tuple[type[BaseException], ...] = (
    Determinate, InvalidUsage, RuntimeShutdown, Fenced,
)


@dataclass
class FinalCollection:
    """What the final, clean reader found: the frontiers it opened with (before it sealed past
    every write) and the contents as of ``as_of`` (beyond every write)."""

    since: int
    upper: int
    as_of: int
    contents: dict[tuple[str, int], int]


def parse_key(key: str) -> tuple[bool, int] | None:
    """``"m12"`` -> (True, 12); ``"r12.3"`` -> (False, 12); anything else -> None."""
    try:
        if key.startswith("m"):
            return True, int(key[1:])
        if key.startswith("r"):
            return False, int(key[1:].split(".", 1)[0])
    except ValueError:
        return None
    return None


def landed_writes(
    history: History, final: dict[str, FinalCollection], problems: list[str]
) -> set[int]:
    """The writes whose markers are in the final state (and checks 2 and 4 on the way)."""
    by_wid = {w.wid: w for w in history.writes}
    present: dict[int, set[str]] = defaultdict(set)
    for name, fc in final.items():
        for (key, value), diff in fc.contents.items():
            parsed = parse_key(key)
            if parsed is None:
                problems.append(f"phantom: {name} holds {key!r}, a key no write produced")
                continue
            marker, wid = parsed
            w = by_wid.get(wid)
            if w is None or name not in w.updates:
                problems.append(
                    f"phantom: {name} holds {key!r} of write {wid}, which never wrote to {name}"
                )
                continue
            if value != wid:
                problems.append(f"phantom: {name} holds {key!r} with value {value}, not {wid}")
            if marker:
                if diff != 1:
                    problems.append(f"marker {key!r} in {name} has diff {diff}, not 1")
                present[wid].add(name)
    for wid, names in present.items():
        want = set(by_wid[wid].updates)
        if names != want:
            problems.append(
                f"atomicity: write {wid} landed in {sorted(names)} but not in "
                f"{sorted(want - names)}"
            )
    return set(present)


def validate(history: History, final: dict[str, FinalCollection]) -> list[str]:
    """Returns every violation found (empty: the run was correct)."""
    problems: list[str] = []
    landed = landed_writes(history, final, problems)
    _check_outcomes(history, landed, problems)
    _check_fencing(history, problems)
    expected = _landed_updates(history, landed)
    _check_final_contents(final, expected, problems)
    _check_snapshots(history, expected, problems)
    _check_listens(history, expected, problems)
    _check_frontiers(history, final, problems)
    _check_errors(history, problems)
    return problems


def _check_outcomes(history: History, landed: set[int], problems: list[str]) -> None:
    for w in history.writes:
        if not w.updates:
            continue  # seals and sinces alone leave no marker
        if not w.resolved:
            problems.append(f"liveness: write {w.wid} ({w.kind}) never resolved")
        elif w.ok and w.wid not in landed:
            problems.append(f"lost: write {w.wid} ({w.kind}, writer {w.gen}) was acknowledged "
                            f"but is not in the final state")
        elif w.error is not None and issubclass(w.error, DEFINITE_FAILURES) and w.wid in landed:
            problems.append(
                f"write {w.wid} ({w.kind}, writer {w.gen}) failed with {w.error.__name__} "
                f"({w.message}) but landed"
            )
        elif (w.error is not None and not issubclass(w.error, DEFINITE_FAILURES)
              and not issubclass(w.error, Indeterminate)):
            problems.append(f"write {w.wid} failed with unexpected {w.error.__name__}: {w.message}")


def _check_fencing(history: History, problems: list[str]) -> None:
    opened = sorted((o.completed, o.gen) for o in history.opens
                    if o.error is None and o.completed is not None)
    for w in history.writes:
        if not w.ok or not (w.updates or w.seals or w.sinces):
            continue
        newer = [stamp for stamp, gen in opened if gen > w.gen and stamp < w.invoked]
        if newer:
            problems.append(
                f"fencing: write {w.wid} ({w.kind}) sent to writer {w.gen} after a newer writer "
                f"opened (stamp {newer[0]} < {w.invoked}) was acknowledged"
            )


def _landed_updates(history: History, landed: set[int]) -> dict[str, list[Update]]:
    """Per collection, the updates of every landed write, sorted by time."""
    out: dict[str, list[Update]] = defaultdict(list)
    for w in history.writes:
        if w.wid in landed:
            for name, ups in w.updates.items():
                out[name].extend(ups)
    for ups in out.values():
        ups.sort(key=lambda u: u[2])
    return out


def contents_as_of(updates: list[Update], as_of: int) -> dict[tuple[str, int], int]:
    acc: dict[tuple[str, int], int] = defaultdict(int)
    for k, v, t, d in updates:
        if t <= as_of:
            acc[(k, v)] += d
    return {kv: d for kv, d in acc.items() if d}


def _check_final_contents(
    final: dict[str, FinalCollection], expected: dict[str, list[Update]], problems: list[str]
) -> None:
    for name, fc in final.items():
        want = contents_as_of(expected.get(name, []), fc.as_of)
        if want != fc.contents:
            missing = sorted(set(want.items()) - set(fc.contents.items()))[:5]
            extra = sorted(set(fc.contents.items()) - set(want.items()))[:5]
            problems.append(f"final contents of {name} differ from the landed writes: "
                            f"missing {missing}, unexpected {extra}")


def _check_snapshots(
    history: History, expected: dict[str, list[Update]], problems: list[str]
) -> None:
    by_point: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    for s in history.snapshots:
        by_point[(s.collection, s.as_of)].add((s.rows, s.digest))
    for (name, t), seen in sorted(by_point.items()):
        if len(seen) > 1:
            problems.append(f"indefinite: snapshots of {name} as of {t} differ across readers or "
                            f"time: (rows, digest) {sorted(seen)}")
    # One sweep through time per collection, keeping the expected contents and their digest.
    for name in {s.collection for s in history.snapshots}:
        ups = expected.get(name, [])
        snaps = sorted((s for s in history.snapshots if s.collection == name),
                       key=lambda s: s.as_of)
        counts: dict[tuple[str, int], int] = {}
        digest = 0
        i = 0
        for s in snaps:
            while i < len(ups) and ups[i][2] <= s.as_of:
                k, v, _, d = ups[i]
                old = counts.get((k, v), 0)
                new = old + d
                if old:
                    digest = (digest - row_hash(k, v, old)) & _MASK
                if new:
                    digest = (digest + row_hash(k, v, new)) & _MASK
                    counts[(k, v)] = new
                else:
                    counts.pop((k, v), None)
                i += 1
            if (s.rows, s.digest) != (len(counts), digest):
                detail = ""
                if s.contents is not None:
                    missing = sorted(set(counts.items()) - set(s.contents.items()))[:5]
                    extra = sorted(set(s.contents.items()) - set(counts.items()))[:5]
                    detail = f": missing {missing}, unexpected {extra}"
                problems.append(
                    f"snapshot of {name} as of {s.as_of} by {s.reader} (stamp {s.stamp}) has "
                    f"{s.rows} rows, the landed writes give {len(counts)}{detail}"
                )


def _check_listens(
    history: History, expected: dict[str, list[Update]], problems: list[str]
) -> None:
    for lr in history.listens:
        frontier = lr.as_of + 1
        got: dict[tuple[str, int, int], int] = defaultdict(int)
        for kind, lower, upper, rows in lr.events:
            if kind == "progress":
                if upper <= frontier:
                    problems.append(f"listen {lr.reader}/{lr.collection}: progress went from "
                                    f"{frontier} to {upper}")
                frontier = max(frontier, upper)
                continue
            if lower != frontier:
                problems.append(f"listen {lr.reader}/{lr.collection}: updates for "
                                f"[{lower}, {upper}) arrived at frontier {frontier}")
            for k, v, t, d in rows:
                if not lower <= t < upper:
                    problems.append(f"listen {lr.reader}/{lr.collection}: update at {t} outside "
                                    f"[{lower}, {upper})")
                got[(k, v, t)] += d
        lo, hi = lr.as_of + 1, frontier
        if hi <= lo:
            continue
        ups = expected.get(lr.collection, [])
        times = [u[2] for u in ups]
        want: dict[tuple[str, int, int], int] = defaultdict(int)
        for k, v, t, d in ups[bisect.bisect_left(times, lo):bisect.bisect_left(times, hi)]:
            want[(k, v, t)] += d
        got_nz = {x: d for x, d in got.items() if d}
        want_nz = {x: d for x, d in want.items() if d}
        if got_nz != want_nz:
            missing = sorted(set(want_nz.items()) - set(got_nz.items()))[:5]
            extra = sorted(set(got_nz.items()) - set(want_nz.items()))[:5]
            problems.append(f"listen {lr.reader}/{lr.collection} over [{lo}, {hi}) delivered "
                            f"other updates than landed: missing {missing}, unexpected {extra}")


class _SealIndex:
    """Answers "the highest seal of ``name`` acknowledged by an older writer, or by writer
    ``gen`` itself before ``stamp``" in O(log n)."""

    def __init__(self, writes: list[WriteRecord]) -> None:
        per: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        self.all: list[tuple[str, int]] = []
        for w in writes:
            if w.ok:
                for name, u in w.seals.items():
                    per[(name, w.gen)].append((w.completed or 0, u))
                    self.all.append((name, u))
        # (name, gen) -> stamps and running maxima of the seals that writer acknowledged
        self._own: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for key, items in per.items():
            items.sort()
            stamps, maxima, best = [], [], 0
            for done, u in items:
                best = max(best, u)
                stamps.append(done)
                maxima.append(best)
            self._own[key] = (stamps, maxima)
        # name -> sorted gens and, for each, the max seal acknowledged by any older writer
        self._older: dict[str, tuple[list[int], list[int]]] = {}
        for name in {n for n, _ in per}:
            gens = sorted(g for n, g in per if n == name)
            below, best = [], 0
            for g in gens:
                below.append(best)
                best = max(best, self._own[(name, g)][1][-1])
            self._older[name] = ([*gens, 1 << 62], [*below, best])

    def need(self, name: str, gen: int, stamp: int) -> int:
        best = 0
        if name in self._older:
            gens, below = self._older[name]
            best = below[bisect.bisect_left(gens, gen)]
        own = self._own.get((name, gen))
        if own is not None:
            i = bisect.bisect_left(own[0], stamp)
            if i:
                best = max(best, own[1][i - 1])
        return best


def _check_frontiers(
    history: History, final: dict[str, FinalCollection], problems: list[str]
) -> None:
    seals = _SealIndex(history.writes)
    for name, u in seals.all:
        if name in final and final[name].upper < u:
            problems.append(f"final upper of {name} is {final[name].upper}, below the "
                            f"acknowledged seal to {u}")
    last: dict[tuple[str, str], tuple[int, int]] = {}
    for f in sorted(history.frontiers, key=lambda f: f.stamp):
        if f.since > f.upper:
            problems.append(f"{f.observer} saw {f.collection} with since {f.since} > upper "
                            f"{f.upper}")
        prev = last.get((f.observer, f.collection))
        if prev is not None and (f.since < prev[0] or f.upper < prev[1]):
            problems.append(f"{f.observer} saw {f.collection} go backwards: (since, upper) "
                            f"{prev} -> {(f.since, f.upper)}")
        last[(f.observer, f.collection)] = (f.since, f.upper)
        if f.kind != "writer":
            continue
        need = seals.need(f.collection, f.gen, f.stamp)
        if f.upper < need:
            problems.append(f"{f.observer} (writer {f.gen}) saw upper {f.upper} of "
                            f"{f.collection} at stamp {f.stamp}, below the acknowledged seal "
                            f"to {need}")
    for name, fc in final.items():
        if fc.since > fc.upper:
            problems.append(f"final {name}: since {fc.since} > upper {fc.upper}")


def _check_errors(history: History, problems: list[str]) -> None:
    for e in history.errors:
        if not issubclass(e.error, PersistError):
            problems.append(f"untyped error from {e.op}: {e.error.__module__}."
                            f"{e.error.__qualname__}: {e.message}")
    for lr in history.listens:
        if lr.error is not None and not issubclass(lr.error, PersistError):
            problems.append(f"untyped error from listen: {lr.error.__qualname__}")
