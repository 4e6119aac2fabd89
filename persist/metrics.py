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
    persist_leaked_blobs_reclaimed_total   counter    leaked data blobs the maintenance deleted

Pushed from the blob edge by :class:`persist.blob.metered.MeteredBlob` (wrap a store to get
them):

    persist_blob_bytes_written_total       counter    framed bytes sent to storage
    persist_blob_bytes_read_total          counter    framed bytes read from storage
    persist_blob_errors_total{op,kind}     counter    storage errors by operation and class

Computed when scraped: each live writer runtime publishes them from its newest state
(:class:`GaugeSource`; nothing on the commit path):

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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
        self.leaked_reclaimed = prom.Counter(
            "persist_leaked_blobs_reclaimed",
            "Leaked data blobs (written for a commit that never landed) the writer deleted")
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
    """A group's commit failed with ``error`` (counted by error class)."""
    m = _get()
    if m is not None:
        m.commit_failures.labels(type(error).__name__).inc()


def fail_stop(error: BaseException) -> None:
    """A runtime went fail-stop because of ``error``."""
    m = _get()
    if m is not None:
        m.fail_stops.labels(type(error).__name__).inc()


def heartbeat(ok: bool) -> None:
    """A lease renewal succeeded (``ok``) or failed."""
    m = _get()
    if m is not None:
        m.heartbeats.labels("ok" if ok else "error").inc()


def lock_lost() -> None:
    """A writer lost the writer lock (a newer writer fenced it)."""
    m = _get()
    if m is not None:
        m.lock_losses.inc()


def leaked_blobs_reclaimed(n: int) -> None:
    """The writer's maintenance deleted ``n`` leaked data blobs."""
    m = _get()
    if m is not None:
        m.leaked_reclaimed.inc(n)


def blob_bytes(direction: Literal["read", "written"], n: int) -> None:
    """``n`` framed bytes crossed the blob edge (see :class:`persist.blob.metered.MeteredBlob`)."""
    m = _get()
    if m is not None:
        (m.bytes_read if direction == "read" else m.bytes_written).inc(n)


def blob_error(op: str, error: BaseException) -> None:
    """A blob operation ``op`` failed with ``error``."""
    m = _get()
    if m is not None:
        m.blob_errors.labels(op, type(error).__name__).inc()


# -- scrape-time gauges -------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectionGauges:
    """What a writer shows of one collection when scraped."""

    collection: str
    since: int
    upper: int
    parts: int
    #: Parts compaction wants to merge now.
    backlog: int


@dataclass(frozen=True)
class WriterGauges:
    """What a live writer shows when scraped (see :class:`GaugeSource`)."""

    writer: str
    retired_blobs: int
    collections: tuple[CollectionGauges, ...]


class GaugeSource(Protocol):
    """Something that publishes scrape-time gauges: a writer runtime.

    NB: the runtime computes its own gauges from its newest published state; this module never
    reads another layer's insides, so the metrics stay on the ground floor.
    """

    def gauges(self) -> WriterGauges | None:
        """Returns the gauges now, or None when the source has stopped."""


_sources: weakref.WeakSet[GaugeSource] = weakref.WeakSet()


def track(source: GaugeSource) -> None:
    """Includes ``source``'s gauges in scrapes for as long as it lives (a weak reference)."""
    if _get() is not None:
        _sources.add(source)


def gauge_samples() -> Iterator[WriterGauges]:
    """The gauges of every live, tracked source."""
    for source in list(_sources):
        g = source.gauges()
        if g is not None:
            yield g


class _StateCollector:
    """A prometheus collector asking each tracked source for its gauges at scrape time."""

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
        for g in gauge_samples():
            for c in g.collections:
                since.add_metric([g.writer, c.collection], c.since)
                upper.add_metric([g.writer, c.collection], c.upper)
                parts.add_metric([g.writer, c.collection], c.parts)
                backlog.add_metric([g.writer, c.collection], c.backlog)
            retired.add_metric([g.writer], g.retired_blobs)
        yield from (since, upper, parts, backlog, retired)

    def describe(self) -> list[Any]:
        # NB: no descriptions up front: the registry then calls collect() lazily at scrape time
        # instead of once at registration.
        return []


__all__ = [
    "CollectionGauges",
    "GaugeSource",
    "WriterGauges",
    "blob_bytes",
    "blob_error",
    "commit_done",
    "commit_failed",
    "enabled",
    "fail_stop",
    "gauge_samples",
    "heartbeat",
    "leaked_blobs_reclaimed",
    "lock_lost",
    "track",
]
