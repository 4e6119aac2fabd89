"""What every ``persist`` command shares: exit codes, the one-line error, opening a location
without creating it, and the small formatters of the human output."""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from persist.errors import MissingResource
from persist.indexed.maintenance.verify import require_metadata
from persist.location import Location, resolve

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_LOCK_HELD = 4
EXIT_MISSING_DEPENDENCY = 5
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error with its exit code, reported as one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def open_location(url: str, storage_options: dict[str, Any], *,
                  must_exist: bool = True) -> Location:
    """Resolves ``url`` without creating anything: a local path must already exist and, with
    ``must_exist`` (all but the lock commands: a lock may be taken before the first commit),
    hold a location's metadata.

    NB: ``resolve`` creates a file location's directory (a writer wants that); an operator
    who mistypes a path must get an error instead of a fresh empty location, and the same one
    the API gives (``persist.open(url, read_only=True)``).

    Raises:
        MissingResource: no such path, or (``must_exist``) no metadata there: nothing was
            ever committed there (usage).
        InvalidUsage: the path is a file, or a malformed URL (usage).
        CliError: a missing optional dependency.
    """
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else url
        if path and not os.path.exists(path):
            raise MissingResource.nothing_committed(url)
    try:
        loc = resolve(url, storage_options=storage_options)
    except ImportError as e:
        raise CliError(EXIT_MISSING_DEPENDENCY, f"{url!r} needs an optional dependency: {e}") from e
    if must_exist:
        require_metadata(loc.read_half(), loc.url)
    return loc


def storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``-o KEY=VALUE`` pairs as a ``storage_options`` mapping.

    Raises:
        CliError: a pair without ``=`` or without a key (usage).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(EXIT_USAGE, f"storage option {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def wrap(text: str) -> str:
    """``text`` wrapped for a command's description (the help keeps line breaks as written)."""
    return textwrap.fill(text, 88)


def human_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def when(wall_ms: int) -> str:
    """A wall-clock time in ms as UTC and how long ago (``never`` for 0)."""
    if not wall_ms:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ms / 1000))
    return f"{stamp} ({max(0.0, time.time() - wall_ms / 1000):.1f}s ago)"
