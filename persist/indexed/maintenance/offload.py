"""Merges in a worker process: a writer's big merges run outside its runtime's GIL.

A merge (:func:`persist.indexed.maintenance.compact.merge`) is reads, CPU and blob writes, and
no commit: it returns a ``ReplaceParts`` op that the maintenance thread commits afterwards. Much
of its CPU holds the GIL (the Python loop over key ranges, numpy, msgspec; pyarrow's kernels
release it), so in the writer's process a merge of millions of rows competes with the runtime
thread preparing and committing appends. A :class:`MergeWorker` runs it in a separate process
instead: the maintenance thread sends a :class:`MergeJob` (the collection's metadata, the
parts, the merge's arguments), the worker opens the same location's store, reads the parts,
writes the merged parts and sends back the op (msgspec-encoded: every record is a frozen
``msgspec.Struct``), which the maintenance thread commits exactly as an in-process merge's.

The process: a fresh interpreter (``python -m <entry>``: fork-exec, as ``multiprocessing``'s
*spawn* does, never a bare ``fork`` of the threaded writer, and without re-importing the
caller's ``__main__``), started on the first merge, kept for the following ones (a pool of
one) and ended by :meth:`MergeWorker.close`. It opens the location itself from an opaque
address the composition root gives (``persist.location``: a store is resolved above this
layer); the entry module is :mod:`persist.distributed.merge_worker`. It exits when its input
ends (the writer closed it, or died) and, mid-merge, when its parent process is gone.

Errors travel back typed: a ``PersistError`` the merge raised in the worker (``DiffOverflow``,
``ExternalError`` and its kinds, ``Corruption``) is raised again in the writer as the same
class with the same message. A worker that dies (kill -9, out of memory) or sends something
undecodable raises :class:`~persist.errors.MergeWorkerLost`, a ``Determinate``: the merge did
not happen, nothing was committed, and the next merge starts a fresh worker. Parts a dead worker
had already written are referenced by no commit: the leaked-blob sweep
(:class:`~persist.indexed.maintenance.gc.LeakSweeper`) deletes them after its grace, as it does a
crashed writer's. A worker that has not answered within the commit deadline is killed
(``CommitDeadline``: its commit would be refused anyway).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

import msgspec

from persist import crashpoints, errors
from persist.blob.base import Blob
from persist.errors import CommitDeadline, MergeWorkerLost, PersistError
from persist.indexed.format.meta import CollectionMeta, PartMeta, ReplaceParts
from persist.indexed.maintenance import compact
from persist.indexed.read.parts import PartReader

log = logging.getLogger(__name__)

#: The default ``Options.merge_worker_rows``: merges of this many input rows or more (about
#: 0.1 s of CPU, the ones the rewrite budget already paces) run in the worker.
WORKER_ROWS = compact.BUDGETED_ROWS

_HEADER = struct.Struct(">Q")
#: How long a fresh worker may take to say it is ready (importing pyarrow, opening the store).
START_SECONDS = 60.0


class MergeJob(msgspec.Struct, frozen=True, kw_only=True):
    """One merge, as :func:`persist.indexed.maintenance.compact.merge` takes it (a message
    between the writer and its worker; never stored)."""

    collection: CollectionMeta
    parts: tuple[PartMeta, ...]
    inline_threshold: int
    frontier: int | None
    stats_bytes: int
    batch_rows: int
    part_target_bytes: int | None
    base: bool
    keep_full: bool

    @property
    def rows(self) -> int:
        """The input rows."""
        return sum(p.rows for p in self.parts)

    def run(self, blob: Blob, reader: PartReader) -> ReplaceParts:
        """Merges in this process (see :func:`persist.indexed.maintenance.compact.merge`)."""
        return compact.merge(blob, reader, self.collection, self.parts,
                             inline_threshold=self.inline_threshold, frontier=self.frontier,
                             stats_bytes=self.stats_bytes, batch_rows=self.batch_rows,
                             part_target_bytes=self.part_target_bytes, base=self.base,
                             keep_full=self.keep_full)


class _Failure(msgspec.Struct, frozen=True):
    """An error the merge raised in the worker: its class (a ``persist.errors`` name, else the
    builtin's), message and plain attributes (a ``Corruption``'s ``key``, say)."""

    kind: str
    message: str
    attrs: dict[str, str | int | float | bool | None] = {}
    persist: bool = True


class _Reply(msgspec.Struct, frozen=True):
    op: ReplaceParts | None = None
    failure: _Failure | None = None


_JOB_DEC = msgspec.msgpack.Decoder(MergeJob)
_REPLY_DEC = msgspec.msgpack.Decoder(_Reply)
_ENC = msgspec.msgpack.Encoder()


def _failure(e: BaseException) -> _Failure:
    plain = {k: v for k, v in vars(e).items()
             if isinstance(v, (str, int, float, bool)) or v is None}
    return _Failure(type(e).__name__, str(e), plain,
                    isinstance(e, PersistError) and type(e).__module__ == errors.__name__)


def _raise(f: _Failure, pid: int) -> None:
    cls = getattr(errors, f.kind, None) if f.persist else None
    if isinstance(cls, type) and issubclass(cls, PersistError):
        e = cls.__new__(cls)
        e.args = (f.message,)
        with contextlib.suppress(AttributeError, TypeError):
            e.__dict__.update(f.attrs)
        raise e
    raise MergeWorkerLost(f"the merge worker (pid {pid}) failed: {f.kind}: {f.message}; "
                          f"nothing was committed")


# -- the writer's side --------------------------------------------------------------------------


class MergeWorker:
    """A writer's merge worker process, started on first use and kept across merges.

    Thread-safe: merges are sent one at a time (the maintenance thread's rounds already are).
    """

    def __init__(self, entry: str, where: bytes) -> None:
        """A worker running ``python -m entry`` (a module whose ``main`` calls :func:`serve`),
        opening the location described by ``where`` (opaque bytes the entry decodes). Starts
        nothing yet."""
        self.entry = entry
        self.where = where
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: The process that made this worker: a forked child never uses its parent's worker.
        self._owner = os.getpid()
        #: How many workers were started (a restart after one died counts).
        self.started = 0
        #: Why a worker could not start (then no other is tried), or None.
        self.broken: str | None = None
        #: How long the last worker took to start and open the location (seconds), or None.
        self.start_seconds: float | None = None
        #: How long the last merge took, from sending it to its answer (seconds), or None.
        self.merge_seconds: float | None = None

    @property
    def pid(self) -> int | None:
        """The worker's process id while one runs (None before the first merge)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def usable(self) -> bool:
        """Whether merges can go to the worker: not closed, in the process that made it, and
        no worker failed to start (an interpreter that cannot start one, say an embedding
        whose ``sys.executable`` is not Python: its merges then run in-process)."""
        return not self._closed and self.broken is None and os.getpid() == self._owner

    def merge(self, job: MergeJob, *, timeout: float | None = None) -> ReplaceParts:
        """Runs ``job`` in the worker and returns its op (not committed).

        Args:
            timeout: seconds to wait for the result (None: no limit); the worker is killed
                after that.

        Raises:
            MergeWorkerLost: the worker died or could not start; the merge did not happen.
            CommitDeadline: no answer within ``timeout`` (the worker was killed).
            PersistError: what the merge raised in the worker (``DiffOverflow``, an
                ``ExternalError``, ``Corruption``...), as the same class.
        """
        with self._lock:
            if not self.usable:
                raise MergeWorkerLost("the merge worker was closed; nothing was committed")
            proc = self._ensure()
            deadline = None if timeout is None else time.monotonic() + timeout
            sent = time.monotonic()
            try:
                assert proc.stdin is not None
                assert proc.stdout is not None
                _send(proc.stdin, _ENC.encode(job))
                data = _receive(proc.stdout, deadline)
            except TimeoutError:
                self._kill(proc)
                raise CommitDeadline(
                    f"the merge of {len(job.parts)} parts of {job.collection.name!r} ran past "
                    f"{timeout:g}s in the merge worker (pid {proc.pid}), which was stopped; "
                    f"nothing was committed") from None
            except (OSError, EOFError, ValueError) as e:
                # NB: ValueError: close() (another thread) closed the pipe under this merge
                raise self._lost(proc, e) from e
            self.merge_seconds = time.monotonic() - sent
            try:
                reply = _REPLY_DEC.decode(data)
            except msgspec.DecodeError as e:
                self._kill(proc)
                raise MergeWorkerLost(f"the merge worker (pid {proc.pid}) sent an undecodable "
                                      f"reply: {e}; nothing was committed") from e
        if reply.failure is not None:
            _raise(reply.failure, proc.pid)
        assert reply.op is not None
        # NB: the same seam as an in-process merge's: its parts are written, not committed.
        crashpoints.hit("compact.part_written")
        return reply.op

    def _ensure(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            self._reap(proc)
        self._proc = proc = self._start()
        return proc

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # NB: a test arms crash points for the writer; the worker is not the writer (the
        # writer hits ``compact.part_written`` itself once a merge's parts are written) ...
        env.pop("PERSIST_CRASH_AT", None)
        # ... and arms the worker's with PERSIST_WORKER_CRASH_AT (a kill -9 mid-merge).
        armed = env.pop("PERSIST_WORKER_CRASH_AT", None)
        if armed:
            env["PERSIST_CRASH_AT"] = armed
        # NB: the worker imports the same persist as this process, wherever it came from.
        root = os.path.dirname(os.path.dirname(os.path.abspath(errors.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH", "")) if p)
        began = time.monotonic()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.entry, str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
                start_new_session=True)
        except OSError as e:
            raise self._broken(f"could not start the merge worker: {e}") from e
        self.started += 1
        try:
            assert proc.stdin is not None
            assert proc.stdout is not None
            _send(proc.stdin, self.where)
            ready = _receive(proc.stdout, time.monotonic() + START_SECONDS)
        except (OSError, EOFError, TimeoutError) as e:
            lost = self._lost(proc, e)
            raise self._broken(f"the merge worker did not start: {lost}") from e
        if ready != b"ready":
            self._kill(proc)
            raise self._broken(f"the merge worker (pid {proc.pid}) could not open the "
                               f"location: {ready.decode(errors='replace')}")
        self.start_seconds = time.monotonic() - began
        log.debug("merge worker started (pid %d) in %.2fs", proc.pid, self.start_seconds)
        return proc

    def _broken(self, why: str) -> MergeWorkerLost:
        """The error for a worker that could not start: later merges run in-process (a
        worker that cannot start once would not start the next time either, and merges
        must go on)."""
        self.broken = why
        log.warning("%s; this writer's merges run in-process from now on", why)
        return MergeWorkerLost(f"{why}; nothing was committed (later merges run in-process)")

    def _lost(self, proc: subprocess.Popen[bytes], e: BaseException) -> MergeWorkerLost:
        """The error for a worker that stopped answering (it is killed and reaped)."""
        self._kill(proc)
        code = proc.returncode
        how = (f"killed by signal {-code}" if code is not None and code < 0
               else f"exited with status {code}")
        return MergeWorkerLost(
            f"the merge worker (pid {proc.pid}) {how} before it finished ({e or type(e)}): the "
            f"merge did not happen and nothing was committed (parts it wrote are left for the "
            f"leaked-blob sweep); the next merge starts a new worker")

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGKILL)
        self._reap(proc)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if self._proc is proc:
            self._proc = None

    def close(self, timeout: float = 5.0) -> None:
        """Ends the worker: closes its input (it exits once idle), and kills it if it has not
        within ``timeout``. A merge under way fails with ``MergeWorkerLost``. Idempotent;
        later merges are refused."""
        self._closed = True
        proc = self._proc
        if proc is None or os.getpid() != self._owner:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        self._kill(proc)


def _send(out: IO[bytes], payload: bytes) -> None:
    out.write(_HEADER.pack(len(payload)))
    out.write(payload)
    out.flush()


def _receive(src: IO[bytes], deadline: float | None) -> bytes:
    """One frame from ``src``.

    Raises:
        EOFError: the stream ended (the other side is gone).
        TimeoutError: ``deadline`` (monotonic) passed first.
    """
    fd = src.fileno()
    (n,) = _HEADER.unpack(_read(fd, _HEADER.size, deadline))
    return _read(fd, n, deadline)


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the stream ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the worker's side --------------------------------------------------------------------------


def serve(open_blob: Callable[[bytes], Blob]) -> None:
    """The worker's loop (its entry module's ``main``): reads the location's address, opens
    its store with ``open_blob``, then answers each :class:`MergeJob` with a reply, until its
    input ends. Exits at once if the process that started it (``argv[1]``) is gone."""
    stdin = sys.stdin.buffer
    # NB: the replies go to a private copy of stdout; anything else printing to stdout (a
    # library's warning) goes to stderr and cannot break the frames.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the writer decides when its worker ends
    _lower_priority()
    threading.Thread(target=_watch_parent, args=(parent,), name="persist-merge-watch",
                     daemon=True).start()
    try:
        where = _receive(stdin, None)
    except EOFError:
        return
    try:
        blob = open_blob(where)
    except Exception as e:  # the writer raises it as MergeWorkerLost
        _send(out, f"{type(e).__name__}: {e}".encode())
        return
    _send(out, b"ready")
    reader = PartReader(blob, cache_bytes=0)  # a merge reads each part once
    while True:
        try:
            data = _receive(stdin, None)
        except EOFError:
            return
        reply = _answer(blob, reader, data)
        _send(out, _ENC.encode(reply))


#: How much the worker lowers its CPU priority (``os.nice``): a merge is background work, and
#: at the same priority a merge on one core of a busy machine delayed the writer's appends.
WORKER_NICE = 10


def _lower_priority() -> None:
    """Lowers this process's CPU priority by :data:`WORKER_NICE` where the OS has niceness
    (a merge then takes the cores the writer leaves; its result is the same)."""
    nice = getattr(os, "nice", None)
    if nice is None:  # pragma: no cover - Windows
        return
    with contextlib.suppress(OSError):
        nice(WORKER_NICE)


def _answer(blob: Blob, reader: PartReader, data: bytes) -> _Reply:
    try:
        job = _JOB_DEC.decode(data)
        return _Reply(op=job.run(blob, reader))
    except Exception as e:
        if not isinstance(e, PersistError):
            log.exception("merge failed in the merge worker")
        return _Reply(failure=_failure(e))


def _watch_parent(parent: int) -> None:
    # NB: a worker mid-merge does not read its input, so it would not notice a dead writer
    # until the merge ended; its parts would then be written for nobody.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


__all__ = ["WORKER_ROWS", "MergeJob", "MergeWorker", "serve"]
