"""The writer lock: one writer per location, reentrant by reentrance id, fenced by generation."""

from persist.lock.base import Lease, LockRecord, WriterLock
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock

__all__ = ["FileLock", "Lease", "LockRecord", "MemoryLock", "WriterLock"]
