"""A loopback HTTP proxy that fails chosen requests with a store's own 500 and forwards the rest.

``with FaultyProxy(upstream, fail=is_put) as proxy: ... proxy.url ...`` serves on a free port of
127.0.0.1. A request for which ``fail(method, path, headers)`` is true is answered with a
well-formed ``500 InternalError`` (S3's XML body, or DynamoDB's JSON body when the request
carries ``X-Amz-Target``); every other request is sent on to ``upstream`` (the moto server) and
its answer relayed. The proxy stops when the ``with`` block ends, and by itself after
``max_seconds`` whatever happens, so a hung test cannot leave it running.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

#: ``fail(method, path, headers)``, header names in lower case.
FailWhen = Callable[[str, str, Mapping[str, str]], bool]

_S3_500 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
           b"<Message>We encountered an internal error. Please try again.</Message>"
           b"<RequestId>FAULTYPROXY</RequestId><HostId>faulty-proxy</HostId></Error>")
_DYNAMODB_500 = (b'{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError",'
                 b'"message":"Internal server error"}')
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade",
               "content-length"}


def s3_puts(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Fails every S3 PUT (object writes, conditional ones included)."""
    return method == "PUT"


def dynamodb_put_items(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Fails every DynamoDB ``PutItem``."""
    return method == "POST" and headers.get("x-amz-target") == "DynamoDB_20120810.PutItem"


class Recorder:
    """A ``fail`` for :class:`FaultyProxy` that fails nothing and records every request
    (method, path, user agent): what a test or a benchmark counts requests by."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, headers: Mapping[str, str]) -> bool:
        with self._lock:
            self.requests.append((method, path, headers.get("user-agent", "")))
        return False

    def take(self) -> list[tuple[str, str, str]]:
        with self._lock:
            out, self.requests = self.requests, []
        return out


class FaultyProxy:
    """See the module docstring. ``failed`` counts the requests answered with a 500."""

    def __init__(self, upstream: str, fail: FailWhen, *, max_seconds: float = 120.0) -> None:
        target = urllib.parse.urlsplit(upstream)
        if target.hostname is None or target.port is None:
            raise ValueError(f"upstream needs a host and a port: {upstream!r}")
        host, port = target.hostname, target.port
        self.failed = 0
        self._count = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            # NB: HTTP/1.1 so that ``Expect: 100-continue`` (botocore sends it on PUT) is
            # answered and the body arrives before the 500; each connection then closes.
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                self.close_connection = True
                if fail(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}):
                    with proxy._count:
                        proxy.failed += 1
                    dynamo = "X-Amz-Target" in self.headers
                    self._answer(500, [("Content-Type", "application/x-amz-json-1.0" if dynamo
                                        else "application/xml")],
                                 _DYNAMODB_500 if dynamo else _S3_500)
                    return
                conn = http.client.HTTPConnection(host, port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in _HOP_BY_HOP and k.lower() != "expect"}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    kept = [(k, v) for k, v in response.getheaders()
                            if k.lower() not in _HOP_BY_HOP]
                    if self.command == "HEAD":
                        kept.append(("Content-Length",
                                     response.getheader("Content-Length") or "0"))
                    self._answer(response.status, kept, data, head=self.command == "HEAD")
                finally:
                    conn.close()

            def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes, *,
                        head: bool = False) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="faulty-proxy")
        self._timer = threading.Timer(max_seconds, self._server.shutdown)
        self._timer.daemon = True

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._timer.cancel()
        self._server.shutdown()
        self._thread.join(10)
        self._server.server_close()


__all__ = ["FaultyProxy", "dynamodb_put_items", "s3_puts"]
