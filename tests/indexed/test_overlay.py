"""The staging working copy (``transitions.Overlay``) behaves as a copy of its base dict would,
and never changes the base (a reader of the published state must never see a staged op)."""

from __future__ import annotations

import random

from persist.indexed.format.meta import CollectionMeta
from persist.indexed.state.transitions import Overlay


def _meta(name: str, cid: int) -> CollectionMeta:
    return CollectionMeta(id=cid, name=name, key_type="int64", value_type="int64")


def test_an_overlay_reads_like_a_copy_of_its_base() -> None:
    rng = random.Random(29)
    for _ in range(200):
        base = {f"c{i}": _meta(f"c{i}", i) for i in range(rng.randrange(0, 12))}
        frozen = dict(base)
        model, overlay = dict(base), Overlay(base)
        saved: list[tuple[dict[str, CollectionMeta], Overlay]] = []
        for step in range(rng.randrange(1, 20)):
            name = f"c{rng.randrange(0, 16)}"
            action = rng.choice(["set", "set", "del", "clear", "save", "restore"])
            if action == "set":
                model[name] = overlay[name] = _meta(name, 100 + step)
            elif action == "del" and name in model:
                del model[name]
                del overlay[name]
            elif action == "clear" and rng.random() < 0.2:
                model.clear()
                overlay.clear()
            elif action == "save":
                saved.append((dict(model), overlay.copy()))
            elif action == "restore" and saved:
                model, overlay = saved.pop()
                model, overlay = dict(model), overlay.copy()
            assert list(overlay) == list(model)
            assert list(overlay.values()) == list(model.values())
            assert list(overlay.items()) == list(model.items())
            assert len(overlay) == len(model)
            assert all((f"c{i}" in overlay) == (f"c{i}" in model) for i in range(16))
            assert dict(overlay) == model
            assert set(overlay.changed()) >= {n for n in model if frozen.get(n) is not model[n]}
        assert base == frozen
        assert all(base[n] is frozen[n] for n in base)
