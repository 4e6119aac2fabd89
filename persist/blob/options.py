"""Parsing ``storage_options`` values: one set of rules for every store.

Users pass storage options as Python values or as strings (Spark options and environment
variables are strings), so each parser accepts both and names the option when a value does not
fit. Every store (file, S3, the AWS connection settings) parses its options with these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from persist.errors import InvalidUsage

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def option_int(name: str, value: Any) -> int:
    """Returns storage option ``name`` as an int.

    Raises:
        InvalidUsage: ``value`` is not an integer (a bool is not one either) nor a string of one.
    """
    return _number(name, value, int, "an integer")


def option_float(name: str, value: Any) -> float:
    """Returns storage option ``name`` as a float.

    Raises:
        InvalidUsage: ``value`` is not a number (a bool is not one either) nor a string of one.
    """
    return _number(name, value, float, "a number")


def _number(name: str, value: Any, kind: Callable[[Any], T], noun: str) -> T:
    # NB: bools are ints to Python, but True as a size or a timeout is a caller's mistake.
    if isinstance(value, bool):
        raise InvalidUsage(f"storage option {name!r} must be {noun}, not {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise InvalidUsage(f"storage option {name!r} must be {noun}, not {value!r}") from e


def option_bool(name: str, value: Any) -> bool:
    """Returns storage option ``name`` as a bool (``"true"``, ``"1"``, ``"on"``, ... count).

    Raises:
        InvalidUsage: ``value`` is neither a bool, 0/1, nor a recognized string.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise InvalidUsage(f"storage option {name!r} must be true or false, not {value!r}")


def option_size_or_off(name: str, value: Any) -> int | None:
    """Returns storage option ``name`` as a positive size in bytes, or None for "off".

    None, False, 0 and ``"0"`` mean off.

    Raises:
        InvalidUsage: anything else that is not a positive integer.
    """
    if value is None or value is False or value in (0, "0"):
        return None
    n = -1 if isinstance(value, bool) else _int_or(value, -1)
    if n < 1:
        raise InvalidUsage(f"storage option {name!r} must be a size in bytes or None, "
                           f"not {value!r}")
    return n


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


__all__ = ["option_bool", "option_float", "option_int", "option_size_or_off"]
