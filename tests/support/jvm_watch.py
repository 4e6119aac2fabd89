"""Watches the Spark session's JVM of this test process (a child the pyspark gateway started),
so a test after which it is gone is named, with how it went, instead of leaving only py4j's
``Connection refused`` in every later Spark test of the worker."""

from __future__ import annotations

import os
import sys
from typing import Any

#: What was found, once: later tests of the worker do not repeat it.
LOST: list[str] = []
#: The JVM process first seen, kept: code that ends a JVM may also drop pyspark's reference
#: to it (bench/workloads/w9_spark.py's ``_end_jvm`` does), which must not hide its end.
_SEEN: list[Any] = []


def _gateway_proc() -> Any:
    if _SEEN:
        return _SEEN[0]
    for name in ("pyspark.core.context", "pyspark.context"):
        ctx = getattr(sys.modules.get(name), "SparkContext", None)
        proc = getattr(getattr(ctx, "_gateway", None), "proc", None)
        if proc is not None:
            _SEEN.append(proc)
            return proc
    return None


def _describe_alive(pid: int) -> str:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            status = {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
        return (f"alive: {fds} open fds, {status.get('Threads')} threads, "
                f"VmRSS {status.get('VmRSS')}, state {status.get('State')}")
    except OSError as e:
        return f"not readable: {e}"


def check(nodeid: str, *, call: bool) -> str | None:
    """None if the JVM is running (and, with ``call``, answers a py4j call), else what is
    wrong, naming ``nodeid``. ``call`` costs one round trip; without it only the process is
    looked at (cheap enough for every test)."""
    if LOST:
        return None
    proc = _gateway_proc()
    if proc is None:
        return None
    code = proc.poll()
    stdin = "closed" if proc.stdin is None or proc.stdin.closed else "open"
    if code is not None:
        LOST.append(nodeid)
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return (f"the Spark session's JVM (pid {proc.pid}) {how} during or before {nodeid} "
                f"(its stdin pipe, whose end makes it exit, is {stdin} here)")
    if not call:
        return None
    try:
        from pyspark.sql import SparkSession

        jvm: Any = getattr(SparkSession._instantiatedSession, "_jvm", None)
        if jvm is not None:
            jvm.java.lang.System.currentTimeMillis()
    except Exception as e:  # any failure to reach the JVM is the finding
        LOST.append(nodeid)
        return (f"the Spark session's JVM (pid {proc.pid}) no longer answers py4j after "
                f"{nodeid}: {type(e).__name__}: {e}; the process is "
                f"{_describe_alive(proc.pid)}; its stdin is {stdin}")
    return None
