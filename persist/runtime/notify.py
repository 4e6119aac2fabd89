"""Push notifications: a writer tells subscribed replicas, the moment it commits, to poll now.

Advisory only. A replica learns of commits by reading the metadata log (``replica.Follower``);
a push is a hint that makes it poll *at once*, which cuts the write -> replica-visible latency
from the polling interval to about a millisecond and lets an idle replica poll rarely.
Correctness never depends on it: every state a replica serves comes from the log, and a replica
that cannot reach a writer's notifier (none advertised, stale advert, another machine, a dead or
fenced writer) polls with backoff exactly as it would without push.

Discovery: a writer opened with ``notify=`` binds a socket (a Unix domain socket by default, or
loopback TCP) and advertises it in the small blob ``meta/notify`` (an :class:`Advert`, written
once at open). A replica opened with ``notify=True`` reads the advert, connects, checks the
handshake, and from then on receives sequence numbers. Nothing is ever written by a replica.

Wire protocol, version 1. The replica never sends anything::

    on connect, server -> replica:  b"PNT1" | nonce (16 bytes) | epoch (u64) | seq (u64)
    after each commit:              seq (u64)                  (integers big-endian)

The nonce is the advert's: a replica never takes hints from a stranger that reuses the address
(a later writer on the same port, a socket path that also exists on another machine). Pushes are
coalesced: when commits come faster than the sender runs, intermediate seqs are skipped; only
the newest matters because the replica reads the log from where it is anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import ExternalError, InvalidUsage, PersistError, RuntimeShutdown
from persist.indexed.format.meta import State
from persist.runtime.runtime import Published

log = logging.getLogger("persist.notify")

#: Where a writer advertises its notifier. Outside ``meta/log/`` and ``meta/rollup/``, so the
#: metadata machinery and GC never list it.
ADVERT_KEY = layout.NOTIFY_KEY
ADVERT_VERSION = 1

Transport = Literal["unix", "tcp"]

_MAGIC = b"PNT1"
_HELLO = struct.Struct(">4s16sQQ")
_SEQ = struct.Struct(">Q")
_CONNECT_TIMEOUT = 1.0


class Advert(msgspec.Struct, frozen=True, kw_only=True):
    """The stored advertisement of a writer's notifier (advisory, overwritten by each writer)."""

    version: int = ADVERT_VERSION
    #: ``unix:<path>`` or ``tcp:<host>:<port>``.
    address: str
    #: ``socket.gethostname()`` of the writer: a Unix socket or loopback port only means
    #: something on that machine.
    host: str
    #: Hex of the 16 random bytes the server repeats in its handshake.
    nonce: str
    writer: str
    #: The writer's lock generation. A replica ignores an advert older than the state it reads.
    epoch: int
    pid: int
    wall_ms: int


_ADVERT_DEC = msgspec.msgpack.Decoder(Advert)


def read_advert(blob: BlobRead) -> Advert | None:
    """Returns the stored advert, or None if there is none or it cannot be used.

    NB: an unreadable advert (corrupt, a newer version) is treated as absent: push is a hint,
    and the caller polls without it.
    """
    try:
        data = blob.get(ADVERT_KEY)
        if data is None:
            return None
        ad = _ADVERT_DEC.decode(data)
    except (PersistError, msgspec.DecodeError) as e:
        log.debug("ignoring unusable notify advert: %s", e)
        return None
    return ad if ad.version <= ADVERT_VERSION else None


# -- the writer's side ------------------------------------------------------------------------


class Notifier:
    """Serves push notifications for one writer runtime until closed.

    Two daemon threads: one accepts replicas (sending each the handshake), one waits on the
    runtime's :class:`Published` state and sends every new seq to every replica. A replica whose
    socket does not take a message at once is dropped (it falls back to polling and reconnects).
    The notifier closes itself when the runtime stops or goes fail-stop (fenced, poisoned), so
    replicas notice a dead or superseded writer by the closed connection.
    """

    def __init__(
        self, blob: Blob, published: Published, *, epoch: int, writer: str,
        transport: Transport = "unix",
    ) -> None:
        self._published = published
        self._epoch = epoch
        self._nonce = os.urandom(16)
        self._closing = threading.Event()
        self._close_lock = threading.Lock()
        self._lock = threading.Lock()
        self._clients: list[socket.socket] = []
        self._tmpdir: str | None = None
        self.broadcasts = 0
        self.accepted = 0
        try:
            self._server, self.address = self._bind(transport)
        except BaseException:
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            raise
        self._threads = [
            threading.Thread(target=self._accept_loop, name="persist-notify-accept", daemon=True),
            threading.Thread(target=self._push_loop, name="persist-notify-push", daemon=True),
        ]
        for t in self._threads:
            t.start()
        try:
            blob.set(ADVERT_KEY, msgspec.msgpack.encode(Advert(
                address=self.address, host=socket.gethostname(), nonce=self._nonce.hex(),
                writer=writer, epoch=epoch, pid=os.getpid(), wall_ms=int(time.time() * 1000),
            )))
        except BaseException:
            self.close()
            raise

    @classmethod
    def start(
        cls, blob: Blob, published: Published, *, epoch: int, writer: str,
        transport: Transport = "unix",
    ) -> Notifier | None:
        """Starts a notifier, or returns None (logging why) if it cannot: push is optional."""
        try:
            return cls(blob, published, epoch=epoch, writer=writer, transport=transport)
        except (OSError, ExternalError) as e:
            log.warning("push notifications disabled (replicas will poll): %s", e)
            return None

    def _bind(self, transport: Transport) -> tuple[socket.socket, str]:
        if transport == "unix":
            # NB: a fresh private directory: socket paths are limited to ~108 bytes (so not
            # under the location), and nobody else can have a file at this name.
            self._tmpdir = tempfile.mkdtemp(prefix="persist-notify-")
            path = os.path.join(self._tmpdir, "sock")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: str | tuple[str, int] = path
        elif transport == "tcp":
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = ("127.0.0.1", 0)
        else:
            raise InvalidUsage(f"notify transport must be 'unix' or 'tcp', not {transport!r}")
        try:
            server.bind(target)
            server.listen(64)
            server.settimeout(0.25)
        except BaseException:
            server.close()
            raise
        if transport == "unix":
            return server, f"unix:{target}"
        host, port = server.getsockname()
        return server, f"tcp:{host}:{port}"

    def describe(self) -> dict[str, Any]:
        """Counters: the address, replicas connected now and ever, seqs broadcast."""
        with self._lock:
            clients = len(self._clients)
        return {"address": self.address, "clients": clients, "accepted": self.accepted,
                "broadcasts": self.broadcasts, "closed": self._closing.is_set()}

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._closing.is_set():
                    return
                log.warning("notify accept failed: %s", e)
                time.sleep(0.1)
                continue
            # NB: the handshake's seq is read and the socket joins the list under the lock the
            # pusher sends under, so every commit after that seq reaches this replica.
            with self._lock:
                try:
                    conn.settimeout(_CONNECT_TIMEOUT)
                    conn.sendall(_HELLO.pack(_MAGIC, self._nonce, self._epoch,
                                             self._published.state.seq))
                    conn.setblocking(False)
                except OSError:
                    conn.close()
                    continue
                self._clients.append(conn)
                self.accepted += 1

    def _push_loop(self) -> None:
        last = self._published.state.seq

        def newer(s: State) -> bool:
            return s.seq > last

        while not self._closing.is_set():
            try:
                state = self._published.wait_for(newer, timeout=0.25)
            except RuntimeShutdown:
                break  # the writer stopped or went fail-stop: tell replicas by hanging up
            if state is None:
                continue
            last = state.seq
            self._send(_SEQ.pack(last))
        self.close()

    def _send(self, msg: bytes) -> None:
        with self._lock:
            keep = []
            for c in self._clients:
                try:
                    if c.send(msg) == len(msg):
                        keep.append(c)
                        continue
                except OSError:  # gone, or its buffer is full: it will reconnect
                    pass
                c.close()
            self._clients = keep
            self.broadcasts += 1

    def close(self) -> None:
        """Stops serving: closes every connection and removes the socket. Idempotent.

        The advert is left in place: deleting it could race with a successor's advert, and a
        stale one costs replicas one failed connect.
        """
        with self._close_lock:
            if self._closing.is_set():
                return
            self._closing.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            for c in self._clients:
                c.close()
            self._clients = []
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(2.0)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


# -- the replica's side -------------------------------------------------------------------------


class Subscriber:
    """Keeps a replica subscribed to whichever writer currently advertises a notifier.

    A daemon thread reads the advert, connects, and calls ``on_push(seq)`` for the handshake and
    every message; when the connection ends it calls ``on_change(False)`` and rediscovers with
    backoff (``rediscover`` min, max seconds). Every advert read is one storage GET.
    """

    def __init__(
        self,
        blob: BlobRead,
        *,
        on_push: Callable[[int], None],
        on_change: Callable[[bool], None],
        min_epoch: Callable[[], int],
        rediscover: tuple[float, float] = (0.05, 30.0),
    ) -> None:
        self._blob = blob
        self._on_push = on_push
        self._on_change = on_change
        self._min_epoch = min_epoch
        self._rediscover = rediscover
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._sock_lock = threading.Lock()
        #: The epoch of the writer we are connected to (None when not connected).
        self.epoch: int | None = None
        self.pushes = 0
        self.adverts_read = 0
        self.connects = 0
        self._thread = threading.Thread(target=self._run, name="persist-subscriber", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        """True while connected to an advertised writer (after its handshake); read from any
        thread, it may lag the subscriber thread by a moment."""
        return self.epoch is not None

    def drop(self) -> None:
        """Hangs up (the writer we listen to was superseded); the thread rediscovers."""
        with self._sock_lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Ends the subscription: hangs up (``on_change(False)`` follows if connected) and joins
        the thread for up to 5 s (not when called from it, i.e. from a callback). Idempotent."""
        self._stopping.set()
        self.drop()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        lo, hi = self._rediscover
        delay = lo
        while not self._stopping.is_set():
            sock = self._connect()
            if sock is not None:
                delay = lo
                self._on_change(True)
                try:
                    self._serve(sock)
                finally:
                    with self._sock_lock:
                        self._sock = None
                    self.epoch = None
                    sock.close()
                    self._on_change(False)
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, hi)

    def _connect(self) -> socket.socket | None:
        """Reads the advert and connects to it; None if there is nothing usable."""
        self.adverts_read += 1
        ad = read_advert(self._blob)
        if ad is None or ad.epoch < self._min_epoch():
            return None  # none, or left behind by a writer that has since been superseded
        kind, _, rest = ad.address.partition(":")
        try:
            if kind == "unix":
                if ad.host != socket.gethostname():
                    return None
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                target: str | tuple[str, int] = rest
            elif kind == "tcp":
                host, _, port = rest.rpartition(":")
                if ad.host != socket.gethostname():
                    return None  # loopback is only this machine's
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                target = (host, int(port))
            else:
                return None
        except (ValueError, OSError) as e:
            log.debug("unusable notify address %r: %s", ad.address, e)
            return None
        try:
            sock.settimeout(_CONNECT_TIMEOUT)
            sock.connect(target)
            magic, nonce, epoch, seq = _HELLO.unpack(_recv_exactly(sock, _HELLO.size))
        except (OSError, EOFError, struct.error) as e:
            log.debug("notify connect to %s failed: %s", ad.address, e)
            sock.close()
            return None
        if magic != _MAGIC or nonce.hex() != ad.nonce:
            sock.close()
            return None
        with self._sock_lock:
            if self._stopping.is_set():
                sock.close()
                return None
            self._sock = sock
        self.epoch = epoch
        self.connects += 1
        self._on_push(seq)
        return sock

    def _serve(self, sock: socket.socket) -> None:
        # NB: a timeout only so a lost shutdown() cannot wedge the thread; drop() and stop()
        # wake the recv at once by shutting the socket down. Bytes are buffered across
        # timeouts, so a message split over two reads is never misframed.
        sock.settimeout(1.0)
        buf = b""
        while not self._stopping.is_set():
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            whole = len(buf) - len(buf) % _SEQ.size
            if not whole:
                continue
            seqs = [s for (s,) in _SEQ.iter_unpack(buf[:whole])]
            buf = buf[whole:]
            self.pushes += len(seqs)
            self._on_push(max(seqs))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf
