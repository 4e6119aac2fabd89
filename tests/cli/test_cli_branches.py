"""``persist holds``, ``persist holds release``, ``persist restore``, and what ``inspect`` and
``verify`` show of forks, tags and holds: the installed console script, as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

import persist
from persist import cli
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.cli.test_cli import run

OPTIONS = persist.Options(inline_threshold=0, gc_grace_seconds=3600, background_compaction=False,
                          compaction=CompactionPolicy(fanin=2))


def _build(root: Path) -> int:
    """A location with a tag, a consumer hold, a plain hold, a fork; returns an early seq."""
    with persist.open(root, options=OPTIONS) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{t}-{i}", i), t, 1) for i in range(50)], t + 1).result()
        early = client.state.seq
        client.tag("events", "q3-close", as_of=1).result()
        client.hold("events", "billing-export", 2, lease=6 * 3600)
        w.hold("plain", 3).result()
        w.allow_compaction(3).result()
        client.maintain()
        client.fork("events", into="copy", as_of=3).result()  # after: it reads e's blobs
        return early


def test_holds_list_and_release(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    _build(loc)
    rows = json.loads(run("holds", str(loc), "--json").stdout)
    by = {r["name"]: r for r in rows}
    assert by["q3-close"]["kind"] == "tag"
    assert by["q3-close"]["time"] == 1
    assert by["billing-export"]["lease_seconds"] == 6 * 3600
    assert by["billing-export"]["renewed_at"]
    assert by["billing-export"]["expires_at"]
    assert by["plain"]["kind"] == "plain"
    assert by["plain"]["lease_seconds"] is None
    text = run("holds", "list", str(loc)).stdout
    assert "billing-export" in text
    assert "21600s" in text
    assert "live until" in text
    # dry-run by default: nothing changes
    out = run("holds", "release", str(loc), "events", "billing-export").stdout
    assert "would release" in out
    assert "--yes" in out
    assert len(json.loads(run("holds", str(loc), "--json").stdout)) == 3
    before = json.loads(run("inspect", str(loc), "--json").stdout)["seq"]
    out = run("holds", "release", str(loc), "events", "q3-close", "--yes").stdout
    assert "released tag 'q3-close'" in out
    # an undo of the release would bring the tag back: its dry run says so
    assert "    tag 'q3-close' returns at 1" in run("restore", str(loc), "--to-seq",
                                                   str(before)).stdout.splitlines()
    assert {r["name"] for r in json.loads(run("holds", str(loc), "--json").stdout)} == {
        "billing-export", "plain"}
    run("holds", "release", str(loc), "events", "nope", "--yes", expect=cli.EXIT_USAGE)
    run("holds", "release", str(loc), "missing", "x", expect=cli.EXIT_USAGE)


def test_holds_release_while_a_writer_runs(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    _build(loc)
    with persist.open(loc, options=OPTIONS) as client:  # holds the lock: served by request
        out = run("holds", "release", str(loc), "events", "billing-export", "--yes").stdout
        assert "released hold 'billing-export'" in out
        assert "billing-export" not in {h.name for h in client.holds("events")}


def test_inspect_shows_what_forks_tags_and_holds_keep(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    _build(loc)
    info = json.loads(run("inspect", str(loc), "--json").stdout)
    costs = {c["name"]: c["costs"] for c in info["collections"]}
    assert costs["copy"]["forked_from"] == {"collection": "events", "location": None,
                                            "as_of": 3, "seq": costs["copy"]["forked_from"]["seq"]}
    assert costs["copy"]["borrowed_bytes"] > 0
    assert costs["copy"]["shared_bytes"]["events"] > 0
    assert costs["events"]["tags"] == {"q3-close": 1}
    assert costs["events"]["held_bytes"] > 0  # history between the tag and since
    text = run("inspect", str(loc)).stdout
    assert "fork of 'events' as of 3" in text
    assert "held" in text
    assert "q3-close@1" in text
    # since 3, held back to 1 by the tag: both shown, and what the column means
    events = {c["name"]: c for c in info["collections"]}["events"]
    assert (events["since"], events["effective_since"]) == (3, 1)
    row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["events"])
    assert row[4:7] == ["1", "(3*)", "4"], row  # since, then upper
    assert "'E (S*)': the effective since E, held back from S" in text
    assert "events: q3-close at 1" in text
    with persist.open(loc, read_only=True) as replica:
        _, r = replica.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert r.since == 1  # the effective since is what the API calls since


def test_restore_is_a_dry_run_unless_yes(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    early = _build(loc)
    verify_out = run("verify", str(loc), "--no-progress").stdout
    assert "restorable seqs" in verify_out
    dry = run("restore", str(loc), "--to-seq", str(early)).stdout
    assert "would restore" in dry
    # the holds and tags the undo takes away are listed under their collection
    lines = dry.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  events: rewound"))
    assert lines[at + 1:at + 4] == ["    hold 'billing-export' at 2 disappears",
                                    "    plain hold 'plain' at 3 disappears",
                                    "    tag 'q3-close' at 1 disappears"], dry
    assert "BACKWARDS" in dry
    assert "UNDO" in dry
    assert "--yes" in dry
    with persist.open(loc, read_only=True) as replica:
        assert "copy" in replica.collections  # unchanged
        seq = replica.state.seq
    data = json.loads(run("restore", str(loc), "--to-seq", str(early), "--json").stdout)
    assert data["backwards"]
    assert not data["done"]
    changes = {c["name"]: c for c in data["changes"]}
    assert changes["events"]["holds"] == [
        {"name": "billing-export", "kind": "hold", "now": 2, "then": None},
        {"name": "plain", "kind": "plain", "now": 3, "then": None},
        {"name": "q3-close", "kind": "tag", "now": 1, "then": None}]
    assert data["problems"] == []
    done = run("restore", str(loc), "--to-seq", str(early), "--yes").stdout
    assert done.startswith("restored")
    assert "BACKWARDS" in done
    with persist.open(loc, read_only=True) as replica:
        assert replica.state.seq == seq + 2  # the restore writer's fence, then the restore
        assert replica.collections == ["events"]
        _, r = replica.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert r.upper == 4
        assert r.tags == {}
    # not restorable: says why, exit 1; not a seq at all: usage
    bad = run("restore", str(loc), "--to-seq", "99999", expect=cli.EXIT_USAGE)
    assert "not before the current seq" in bad.stderr
    with persist.open(loc, options=OPTIONS):  # the lock is held: restore --yes waits, fails
        run("restore", str(loc), "--to-seq", str(early), "--yes", expect=cli.EXIT_LOCK_HELD)


def test_restore_dry_run_lists_a_hold_that_moves(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    with persist.open(loc, options=OPTIONS) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{t}", t), t, 1)], t + 1).result()
        w.hold("export", 1).result()
        before = client.state.seq
        w.hold("export", 3).result()
    dry = run("restore", str(loc), "--to-seq", str(before)).stdout
    assert "    plain hold 'export' moves 3 -> 1" in dry.splitlines(), dry
    data = json.loads(run("restore", str(loc), "--to-seq", str(before), "--json").stdout)
    assert data["changes"][0]["holds"] == [{"name": "export", "kind": "plain", "now": 3,
                                            "then": 1}]
