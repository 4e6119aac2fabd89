"""Prometheus metrics for persist. Optional: without ``prometheus_client`` every call is a no-op.

Install the ``metrics`` extra and expose the default registry as usual (for example
``prometheus_client.start_http_server(9100)``); persist registers its metrics there when the
first writer starts (or the first metered blob is used).

Pushed from the commit path (one cheap call per event):

    persist_commit_seconds                 histogram  time to make one group durable
    persist_group_commit_commands          histogram  commands per durable step (group size)
    persist_commit_failures_total{kind}    counter    failed steps by error class
    persist_fail_stops_total{kind}         counter    runtimes that went fail-stop, by cause
    persist_lock_heartbeats_total{result}  counter    lease renewals: ok / error
    persist_lock_losses_total              counter    writers that lost the lock (fenced)

Pushed from the blob edge by :class:`MeteredBlob` (wrap a store to get them):

    persist_blob_bytes_written_total       counter    framed bytes sent to storage
    persist_blob_bytes_read_total          counter    framed bytes read from storage
    persist_blob_errors_total{op,kind}     counter    storage errors by operation and class

Computed when scraped, from every live runtime's newest state (nothing on the commit path):

    persist_since{writer,collection}                   gauge  the collection's effective since
    persist_upper{writer,collection}                   gauge  the collection's upper
    persist_parts{writer,collection}                   gauge  parts (inline and blob)
    persist_compaction_backlog_parts{writer,collection} gauge parts compaction wants to merge
    persist_retired_blobs{writer}                      gauge  blobs waiting for GC
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from persist.blob.base import Blob
from persist.blob.envelope import Framed
from persist.errors import PersistError

if TYPE_CHECKING:
    from persist.runtime.runtime import Runtime

log = logging.getLogger("persist.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                    5.0, 10.0, 30.0)
_GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class _Metrics:
    """The registered metric objects (exist only when prometheus_client does)."""

    def __init__(self, prom: Any) -> None:
        self.prom = prom
        self.commit_seconds = prom.Histogram(
            "persist_commit_seconds", "Seconds to make one group of commands durable",
            buckets=_LATENCY_BUCKETS)
        self.group_commands = prom.Histogram(
            "persist_group_commit_commands", "Commands made durable by one commit (group size)",
            buckets=_GROUP_BUCKETS)
        self.commit_failures = prom.Counter(
            "persist_commit_failures", "Commits that failed, by error class", ["kind"])
        self.fail_stops = prom.Counter(
            "persist_fail_stops", "Runtimes that stopped themselves, by the error that caused it",
            ["kind"])
        self.heartbeats = prom.Counter(
            "persist_lock_heartbeats", "Writer-lock lease renewals, by result", ["result"])
        self.lock_losses = prom.Counter(
            "persist_lock_losses", "Writers that lost the writer lock (fenced by a newer writer)")
        self.bytes_written = prom.Counter(
            "persist_blob_bytes_written", "Framed bytes written to blob storage")
        self.bytes_read = prom.Counter(
            "persist_blob_bytes_read", "Framed bytes read from blob storage")
        self.blob_errors = prom.Counter(
            "persist_blob_errors", "Blob storage errors, by operation and error class",
            ["op", "kind"])
        prom.REGISTRY.register(_StateCollector())


_metrics: _Metrics | None = None
_loaded = False
_load_lock = threading.Lock()


def _get() -> _Metrics | None:
    """The metrics, created on first use.

    NB: importing prometheus_client costs ~50 ms; deferring it to the first event keeps
    ``import persist`` (every CLI call, every replica, every test process) from paying it.
    """
    global _metrics, _loaded
    if _loaded:
        return _metrics
    with _load_lock:
        if not _loaded:
            try:
                import prometheus_client
            except ImportError:
                log.debug("prometheus_client is not installed: persist metrics are disabled")
            else:
                _metrics = _Metrics(prometheus_client)
            _loaded = True
    return _metrics


def enabled() -> bool:
    """True when prometheus_client is installed (the metrics are then registered)."""
    return _get() is not None


def commit_done(seconds: float, commands: int) -> None:
    """One group of ``commands`` became durable in ``seconds``."""
    m = _get()
    if m is not None:
        m.commit_seconds.observe(seconds)
        m.group_commands.observe(commands)


def commit_failed(error: BaseException) -> None:
    m = _get()
    if m is not None:
        m.commit_failures.labels(type(error).__name__).inc()


def fail_stop(error: BaseException) -> None:
    m = _get()
    if m is not None:
        m.fail_stops.labels(type(error).__name__).inc()


def heartbeat(ok: bool) -> None:
    m = _get()
    if m is not None:
        m.heartbeats.labels("ok" if ok else "error").inc()


def lock_lost() -> None:
    m = _get()
    if m is not None:
        m.lock_losses.inc()


# -- the blob edge ----------------------------------------------------------------------------


class MeteredBlob(Blob):
    """Wraps a store and counts bytes and errors into the blob metrics (below the envelope,
    so byte counts are what actually crosses the wire). Transparent otherwise."""

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local

    @staticmethod
    def _error(op: str, e: PersistError) -> None:
        m = _get()
        if m is not None:
            m.blob_errors.labels(op, type(e).__name__).inc()

    @staticmethod
    def _count(counter: str, n: int) -> None:
        m = _get()
        if m is not None:
            getattr(m, counter).inc(n)

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        try:
            data = self.inner._get(key)
        except PersistError as e:
            self._error("get", e)
            raise
        if data is not None:
            self._count("bytes_read", len(data))
        return data

    @override
    def _list(self, prefix: str) -> list[str]:
        try:
            return self.inner._list(prefix)
        except PersistError as e:
            self._error("list", e)
            raise

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        try:
            self.inner._set(key, data)
        except PersistError as e:
            self._error("set", e)
            raise
        self._count("bytes_written", len(data))

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        try:
            created = self.inner._set_if_absent(key, data)
        except PersistError as e:
            self._error("set_if_absent", e)
            raise
        if created:
            self._count("bytes_written", len(data))
        return created

    @override
    def _delete(self, key: str) -> None:
        try:
            self.inner._delete(key)
        except PersistError as e:
            self._error("delete", e)
            raise

    @override
    def close(self) -> None:
        self.inner.close()


# -- scrape-time gauges -------------------------------------------------------------------------

_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()


def track_runtime(runtime: Runtime) -> None:
    """Includes ``runtime``'s collections in the scrape-time gauges while it lives."""
    if _get() is not None:
        _runtimes.add(runtime)


def frontier_samples() -> Iterator[tuple[str, str, Mapping[str, int]]]:
    """(writer, collection, {since, upper, parts, backlog}) for every live runtime."""
    from persist.indexed import compact
    from persist.indexed.state import effective_since

    for rt in list(_runtimes):
        if rt.stopped:
            continue
        state = rt.published.state
        policy = rt.ix.options.compaction
        for name, c in state.collections.items():
            yield rt.ix.writer, name, {
                "since": effective_since(c),
                "upper": c.upper,
                "parts": len(c.parts),
                "backlog": len(compact.plan(c, policy)),
            }


class _StateCollector:
    """A prometheus collector reading each live runtime's newest published state."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["writer", "collection"]
        since = GaugeMetricFamily("persist_since", "Effective since of a collection", labels=labels)
        upper = GaugeMetricFamily("persist_upper", "Upper of a collection", labels=labels)
        parts = GaugeMetricFamily("persist_parts", "Parts of a collection", labels=labels)
        backlog = GaugeMetricFamily("persist_compaction_backlog_parts",
                                    "Parts compaction wants to merge now", labels=labels)
        retired = GaugeMetricFamily("persist_retired_blobs", "Blobs waiting for GC",
                                    labels=["writer"])
        for writer, name, v in frontier_samples():
            since.add_metric([writer, name], v["since"])
            upper.add_metric([writer, name], v["upper"])
            parts.add_metric([writer, name], v["parts"])
            backlog.add_metric([writer, name], v["backlog"])
        for rt in list(_runtimes):
            if not rt.stopped:
                retired.add_metric([rt.ix.writer], len(rt.published.state.retired))
        yield from (since, upper, parts, backlog, retired)

    def describe(self) -> list[Any]:
        # NB: no descriptions up front: the registry then calls collect() lazily at scrape time
        # instead of once at registration.
        return []


__all__ = [
    "MeteredBlob",
    "commit_done",
    "commit_failed",
    "enabled",
    "fail_stop",
    "frontier_samples",
    "heartbeat",
    "lock_lost",
    "track_runtime",
]
