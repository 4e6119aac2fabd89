"""What a newcomer types wrong at the ``persist`` command: unknown subcommands are usage errors
naming the valid ones (never taken for a URL), each subcommand's help has its own usage line,
and a missing location gets the API's message. The installed console script, as a
subprocess."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist import cli
from persist.errors import MissingResource
from tests.cli.test_cli import run


@pytest.fixture(scope="module")
def loc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("usage") / "loc"
    with persist.open(root) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1)], upper=1).result()
        client.tag("events", "q3", as_of=0).result()
    return root


@pytest.mark.parametrize(("words", "group", "valid", "suggested"), [
    (["holds", "relase", "{loc}", "events", "q3"], "holds", ("list", "release"), "release"),
    (["holds", "relase", "{loc}", "events", "q3", "--yes"], "holds", ("list", "release"),
     "release"),
    (["holds", "relase"], "holds", ("list", "release"), "release"),
    (["holds", "lst", "{loc}"], "holds", ("list", "release"), "list"),
    (["lock", "relase", "--force", "{loc}"], "lock", ("show", "release"), "release"),
    (["lock", "sho", "{loc}"], "lock", ("show", "release"), "show"),
    (["holds", "drop", "-o", "fsync=false", "{loc}", "events"], "holds", ("list", "release"),
     None),
])
def test_an_unknown_subcommand_is_never_taken_for_the_url(
        loc: Path, words: list[str], group: str, valid: tuple[str, ...],
        suggested: str | None) -> None:
    before = run("holds", str(loc), "--json").stdout
    err = run(*(w.replace("{loc}", str(loc)) for w in words), expect=cli.EXIT_USAGE).stderr
    assert f"unknown {group} command {words[1]!r}" in err
    for name in valid:
        assert repr(name) in err
    if suggested:
        assert f"did you mean {suggested!r}" in err
    assert run("holds", str(loc), "--json").stdout == before  # nothing released


@pytest.mark.parametrize(("words", "says"), [
    (["inspec", "x"], "unknown command 'inspec' (choose from 'inspect', 'verify'"),
    (["dynamodb", "creat-table", "t"], "unknown dynamodb command 'creat-table' (choose from "
                                       "'create-table')"),
    (["lock", "show"], "the following arguments are required: URL (see `persist lock show "
                       "--help`)"),
    (["holds", "release", "x"], "required: COLLECTION, NAME (see `persist holds release "
                                "--help`)"),
])
def test_usage_errors_name_what_is_valid(words: list[str], says: str) -> None:
    assert says in run(*words, expect=cli.EXIT_USAGE).stderr


def test_the_default_subcommands_still_take_a_url(loc: Path) -> None:
    assert "q3" in run("holds", str(loc)).stdout
    assert "q3" in run("holds", "-o", "fsync=false", str(loc), "--json").stdout
    assert "lock:" in run("lock", str(loc)).stdout
    assert "lock:" in run("lock", f"file://{loc}").stdout


@pytest.mark.parametrize("words", [["holds", "release"], ["holds", "list"], ["lock", "release"],
                                   ["lock", "show"], ["dynamodb", "create-table"]])
def test_subcommand_help_has_its_own_usage_line(words: list[str]) -> None:
    out = run(*words, "--help").stdout
    first = out.splitlines()[0]
    assert first.startswith(f"usage: persist {' '.join(words)} [-h]"), first
    assert "|" not in out.split("\n\n")[0], out  # not the group's usage, glued in front


def test_a_missing_path_says_what_the_api_says(tmp_path: Path) -> None:
    where = tmp_path / "nowhere"
    with pytest.raises(MissingResource) as api:
        persist.open(where, read_only=True)
    said = str(api.value).split(";")[0]  # the API adds how to open a replica that waits
    assert said == (f"no persist location at {str(where)!r}: nothing was ever committed there "
                    f"(a mistyped URL?)")
    empty = tmp_path / "empty"
    empty.mkdir()
    for words in (["inspect", str(where)], ["verify", str(where)], ["holds", str(where)],
                  ["holds", "release", str(where), "c", "n"], ["lock", str(where)],
                  ["restore", str(where), "--to-seq", "1"],
                  ["snapshot", str(where), "c", "--out", str(tmp_path / "o.parquet")],
                  ["history", str(where), "c"]):
        assert run(*words, expect=cli.EXIT_USAGE).stderr == f"persist: {said}\n", words
    assert not where.exists()
    # an existing directory where nothing was committed: the same words, its own URL
    for words in (["inspect", str(empty)], ["verify", str(empty)], ["holds", str(empty)],
                  ["restore", str(empty), "--to-seq", "1"]):
        err = run(*words, expect=cli.EXIT_USAGE).stderr
        assert err == (f"persist: no persist location at {str(empty)!r}: nothing was ever "
                       f"committed there (a mistyped URL?)\n"), words
    assert list(empty.iterdir()) == []
