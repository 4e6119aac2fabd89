"""The maintenance round's work index: which collections a round must look at.

A round used to visit every collection of the location: compaction planning (memoized by
identity, still a pass over the map, up to :data:`~persist.indexed.engine.MAX_CASCADE` times a
round), the rewrite planner (a pass over every part, no memo) and the named holds' lapses (a
pass over every hold). With 10,000 collections that was milliseconds of the GIL per round,
after every commit, taken from the commit path. The index makes a round's cost follow what
changed:

* the engine tells it the names each commit changed (:meth:`WorkIndex.touched`, from the
  commit's ops) and when its state was replaced wholesale (:meth:`WorkIndex.everything`: an
  open, a reload, a restore);
* a round (:meth:`WorkIndex.sync`) re-plans only those names, against the state it is given,
  and keeps per collection what is pending: its compaction plan (non-empty only), its oldest
  part to rewrite, and when its first consumer hold's lease runs out (so lapses are found by
  due time, :meth:`WorkIndex.lapsing`, not by a pass over every hold).

Correctness rests on two rules. A name touched by a commit newer than the state a round sees
stays marked until a round sees that commit (the published state may trail the engine's by a
moment). And every memo is keyed by the identity of the (frozen) ``CollectionMeta`` it was
made from, so visiting a name twice costs a lookup and never re-plans stale metadata as new.
Visiting too much costs time; visiting too little would leave work undone, which is why
anything that replaces the state other than by a commit marks everything.

A mark of everything is worked off in chunks by the background's rounds
(:meth:`WorkIndex.allow`, set by the runtime for each of its rounds): the names changed by
commits first, then at most :data:`VISIT_BUDGET` of the others a round. The first background
round after a writer's open at 10,000 collections visited them all before anything else (the
plans 118-140 ms of the GIL, decoding every piece 164-200 ms more), and merged nothing meanwhile,
not even the collection being appended to; chunked, that collection's merges go on while the
rest is looked at over the next rounds (a round that leaves some behind asks for the next one
at once, :attr:`WorkIndex.behind`). An explicit round (``Client.maintain``) still visits
everything.

Thread-safety: ``touched``/``everything`` run on the commit thread, everything else on the
maintenance thread (rounds are serialized by the runtime's maintenance lock); the marks are
handed over under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from persist.indexed.format.meta import CollectionMeta, PartMeta, State
from persist.indexed.maintenance import compact
from persist.indexed.state import holds

#: Collections a background round looks at, at most, of those a mark of everything named
#: (besides those commits changed): ~12-14 ms of plans (10,000 took 118-140 ms).
VISIT_BUDGET = 1_000


def lapse_due_ms(c: CollectionMeta) -> int | None:
    """The wall-clock time (ms) after which a consumer hold of ``c`` has lapsed (the earliest
    of them); None if it has none that can (the rule of :func:`holds.lapses`)."""
    due = [t.renewed_ms + t.lease_ms for h, t in holds.terms_of(c).items()
           if t.kind == holds.HOLD and t.lease_ms > 0 and t.lapsed_at is None and h in c.holds]
    return min(due) if due else None


class WorkIndex:
    """What a maintenance round must look at, by collection (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Held by a sync and a query: a round and a direct call (a test's ``plan_compaction``)
        #: may run at once.
        self._sync_lock = threading.RLock()
        #: Names changed by a commit, with the seq of the newest commit that changed each.
        self._touched: dict[str, int] = {}
        #: Visit every collection once a round sees a state at or past this seq (None: no).
        self._all: int | None = 0
        #: The metadata each name was last planned from (identity is the memo's key).
        self._seen: dict[str, CollectionMeta] = {}
        self._policy: compact.CompactionPolicy | None = None
        #: Work pending, by name: non-empty compaction plans, parts to rewrite, lapse due times.
        self._plans: dict[str, tuple[PartMeta, ...]] = {}
        self._rewrites: dict[str, PartMeta] = {}
        self._due: dict[str, int] = {}
        #: Names a mark of everything left to visit (the background visits a budget a round).
        self._backlog: list[str] = []
        #: How many of the backlog syncs may still visit (None: all; see :meth:`allow`).
        self._allowance: int | None = None
        #: How many collections rounds re-planned (for tests and diagnostics).
        self.visited = 0

    # -- the commit thread --------------------------------------------------------------------

    def touched(self, names: Iterable[str], seq: int) -> None:
        """Marks ``names`` as changed by commit ``seq``."""
        with self._lock:
            for name in names:
                self._touched[name] = seq

    def everything(self, seq: int) -> None:
        """Marks every collection of the state at ``seq`` (replaced other than by a commit)."""
        with self._lock:
            self._all = seq if self._all is None else min(self._all, seq)

    # -- the maintenance thread ---------------------------------------------------------------

    def allow(self, visits: int | None) -> None:
        """Lets the syncs from now on visit at most ``visits`` of the collections a mark of
        everything named, in all (None: every one). The names commits changed are always
        visited. The runtime allows :data:`VISIT_BUDGET` for each background round and None
        after it."""
        with self._sync_lock:
            self._allowance = visits

    def sync(self, state: State, policy: compact.CompactionPolicy) -> None:
        """Re-plans the collections marked since the last sync (every one after
        :meth:`everything`, or under a new ``policy``, as far as :meth:`allow` lets) from
        ``state``."""
        with self._sync_lock:
            self._sync(state, policy)
            backlog = self._backlog
            if backlog:
                take = len(backlog) if self._allowance is None else min(self._allowance,
                                                                         len(backlog))
                chunk = backlog[len(backlog) - take:]
                del backlog[len(backlog) - take:]
                if self._allowance is not None:
                    self._allowance -= take
                colls = state.collections
                for name in reversed(chunk):
                    self._check(colls, name)

    @property
    def behind(self) -> bool:
        """Whether collections a mark of everything named are still to be visited."""
        return bool(self._backlog)

    def _sync(self, state: State, policy: compact.CompactionPolicy) -> None:
        colls = state.collections
        with self._lock:
            every = self._all is not None and state.seq >= self._all
            if every:
                self._all = None
            names = list(self._touched)
            # NB: every marked name is visited, but a mark of a commit this state does not
            # include yet stays for a later round too (its newer metadata is not here yet)
            for n in names:
                if self._touched[n] <= state.seq:
                    del self._touched[n]
        if policy is not self._policy:
            # NB: a plan made under another policy (set_options) is stale for every collection
            self._policy, every = policy, True
            self._seen.clear()
        if every:
            for gone in [n for n in self._seen if n not in colls]:
                self._forget(gone)
            # NB: visited last to first (``sync``): the map's order, as a whole pass had it
            self._backlog = list(colls)[::-1]
        for name in names:
            self._check(colls, name)

    def _check(self, colls: Mapping[str, CollectionMeta], name: str) -> None:
        c = colls.get(name)
        if c is None:
            self._forget(name)
        elif self._seen.get(name) is not c:
            self._visit(name, c, self._policy or compact.CompactionPolicy())

    def _visit(self, name: str, c: CollectionMeta, policy: compact.CompactionPolicy) -> None:
        self.visited += 1
        self._seen[name] = c
        chosen = compact.plan(c, policy)
        _put(self._plans, name, tuple(chosen) if chosen else None)
        _put(self._rewrites, name, compact.plan_rewrite(c))
        _put(self._due, name, lapse_due_ms(c))

    def _forget(self, name: str) -> None:
        for memo in (self._seen, self._plans, self._rewrites, self._due):
            memo.pop(name, None)

    def compactions(self, state: State) -> list[tuple[str, tuple[PartMeta, ...]]]:
        """The non-empty compaction plans of ``state``'s collections (call :meth:`sync`
        first), in the map's order (by id, the order of registration, when few among many)."""
        with self._sync_lock:
            return self._ordered(state.collections, self._plans)

    def rewrites(self, state: State) -> list[tuple[str, PartMeta]]:
        """The collections of ``state`` with a part to rewrite, and that part (:meth:`sync`
        first), in the map's order (by id, the order of registration, when few among many)."""
        with self._sync_lock:
            return self._ordered(state.collections, self._rewrites)

    def lapsing(self, now_ms: int) -> list[str]:
        """The collections with a consumer hold whose lease ran out by ``now_ms`` (as of the
        last :meth:`sync`)."""
        with self._sync_lock:
            return [n for n, due in self._due.items() if now_ms > due]

    def _ordered(self, colls: Mapping[str, CollectionMeta], pending: dict[str, Any]
                 ) -> list[tuple[str, Any]]:
        # NB: a last check of what is returned (cheap: pending work only) that it was planned
        # from this very metadata; then in the map's order, or by id (the order of
        # registration) when few are pending among many, without a pass over the map. (Order
        # only by id failed the nemesis mutant test_compaction_forwarding_past_since_is_caught
        # at its fixed seed: the merges it schedules differ, and the mutant went unexercised.)
        for name in list(pending):
            self._check(colls, name)
        if len(pending) * 8 < len(colls):
            return sorted(((n, v) for n, v in pending.items() if n in colls),
                          key=lambda nv: colls[nv[0]].id)
        return [(n, pending[n]) for n in colls if n in pending]


def _put(memo: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        memo.pop(name, None)
    else:
        memo[name] = value


__all__ = ["VISIT_BUDGET", "WorkIndex", "lapse_due_ms"]
