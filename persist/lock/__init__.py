"""The writer lock: one writer per location, reentrant by reentrance id, fenced by generation.

``S3Lock`` and ``DynamoLock`` (``s3://`` locations) are exported lazily, so importing this
package does not need boto3 (the ``s3`` extra).
"""

from typing import TYPE_CHECKING, Any

from persist.lock.base import Lease, LockRecord, WriterLock
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock

if TYPE_CHECKING:
    from persist.lock.dynamodb import DynamoLock as DynamoLock
    from persist.lock.s3 import S3Lock as S3Lock

_LAZY = {"S3Lock": "persist.lock.s3", "DynamoLock": "persist.lock.dynamodb"}


def __getattr__(name: str) -> Any:
    """Imports ``S3Lock`` / ``DynamoLock`` on first use (they need boto3)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


# NB: the lazy names are left out of __all__ so ``from persist.lock import *`` works without boto3.
__all__ = ["FileLock", "Lease", "LockRecord", "MemoryLock", "WriterLock"]
