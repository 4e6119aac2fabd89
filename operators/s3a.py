"""Spark's S3A connector seen from the operators: which S3A settings a session sets itself,
which a read or write used, and the Java classes of a failure. Shared by the native read
(:mod:`operators.native`) and the native write (:mod:`operators.native_write`); the mapping of
``storage_options`` to ``fs.s3a.*`` keys and of failures to persist's errors is the engine's
(:func:`persist.distributed.hadoop_options`, :func:`persist.distributed.s3a_failure`)."""

from __future__ import annotations

from typing import Any

import persist


def session_unset(spark: Any, options: dict[str, str]) -> dict[str, str]:
    """``options`` without the keys the session sets itself: a ``spark.hadoop.<key>`` setting,
    or a key of its Hadoop configuration set other than by Hadoop's ``*-default.xml``."""
    conf = getattr(getattr(spark, "_jsc", None), "hadoopConfiguration", None)
    hadoop = conf() if conf is not None else None

    def session_sets(key: str) -> bool:
        if spark.conf.get(f"spark.hadoop.{key}", None) is not None:
            return True
        # NB: a key unset after it was set keeps its source: look at the value too
        if hadoop is None or hadoop.get(key) is None:
            return False
        sources = hadoop.getPropertySources(key)
        return sources is not None and any(not str(src).endswith("-default.xml")
                                           for src in sources)

    return {k: v for k, v in options.items() if not session_sets(k)}


def effective(spark: Any, options: dict[str, str]) -> dict[str, str]:
    """The S3A settings a read used, for a failure's message: its own options, else the
    session's Hadoop configuration."""
    conf = getattr(getattr(spark, "_jsc", None), "hadoopConfiguration", None)
    hadoop = conf() if conf is not None else None
    out: dict[str, str] = {}
    for key in persist.distributed.S3A_SOURCES:
        value = options.get(key)
        if value is None and hadoop is not None:
            got = hadoop.get(key)
            value = None if got is None else str(got)
        if value is not None:
            out[key] = value
    return out


def java_classes(e: BaseException) -> tuple[list[str], str]:
    """The Java exception class names of ``e``'s cause chain (a Py4J error's, or a PySpark
    error captured from the JVM), outermost first, and the innermost one's first line."""
    throwable = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
    names: list[str] = []
    last = ""
    seen = 0
    while throwable is not None and seen < 32:
        try:
            names.append(str(throwable.getClass().getName()))
            last = str(throwable.toString()).splitlines()[0] if throwable.toString() else last
            throwable = throwable.getCause()
        except Exception:  # not a Java object after all
            break
        seen += 1
    return names, last


__all__ = ["effective", "java_classes", "session_unset"]
