"""Nemesis settings from the environment.

``PERSIST_NEMESIS_SEED``: replay one seed (otherwise every run draws fresh seeds and prints
them). ``PERSIST_NEMESIS_OPS``: operations per run in the slow mode (default 50,000).
"""

from __future__ import annotations

import os
import random

import pytest


def nemesis_seed(salt: int) -> int:
    fixed = os.environ.get("PERSIST_NEMESIS_SEED")
    if fixed:
        return int(fixed)
    return random.SystemRandom().randrange(2**31) ^ salt


@pytest.fixture
def slow_ops() -> int:
    return int(os.environ.get("PERSIST_NEMESIS_OPS", "50000"))
