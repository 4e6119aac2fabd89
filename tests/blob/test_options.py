"""Storage-option parsing: one set of rules for every store, strings and Python values alike."""

from __future__ import annotations

from typing import Any

import pytest

from persist.blob.options import option_bool, option_float, option_int, option_size_or_off
from persist.errors import InvalidUsage
from persist.location import resolve


@pytest.mark.parametrize(("parse", "value", "expected"), [
    (option_int, 3, 3), (option_int, "3", 3),
    (option_float, 2.5, 2.5), (option_float, "2.5", 2.5), (option_float, 2, 2.0),
    (option_bool, True, True), (option_bool, "false", False), (option_bool, "ON", True),
    (option_bool, 0, False), (option_size_or_off, None, None), (option_size_or_off, "0", None),
    (option_size_or_off, False, None), (option_size_or_off, "1024", 1024),
])
def test_values_and_their_spellings_parse(parse: Any, value: Any, expected: Any) -> None:
    assert parse("opt", value) == expected


@pytest.mark.parametrize(("parse", "value"), [
    (option_int, True), (option_int, "3.5"), (option_int, None), (option_float, False),
    (option_float, "fast"), (option_bool, "maybe"), (option_bool, 2), (option_bool, None),
    (option_size_or_off, -1), (option_size_or_off, True), (option_size_or_off, "big"),
])
def test_a_bad_value_names_the_option(parse: Any, value: Any) -> None:
    with pytest.raises(InvalidUsage, match="'opt'"):
        parse("opt", value)


def test_file_locations_read_fsync_as_a_bool(tmp_path: Any) -> None:
    """``fsync="false"`` (a string, as Spark options and environment variables are) used to be
    read as True by ``bool("false")``."""
    blob = resolve(tmp_path, storage_options={"fsync": "false"}).blob
    assert blob._fsync is False  # type: ignore[attr-defined]
    with pytest.raises(InvalidUsage, match="fsync"):
        resolve(tmp_path, storage_options={"fsync": "sometimes"})
