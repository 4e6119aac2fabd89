"""A moto S3 + DynamoDB server whose requests are applied one at a time.

Run as ``python -m tests.support.moto_server [--host 127.0.0.1] [--port 0]``; it binds, prints
the chosen port on one line of stdout, then serves until killed or, with ``--exit-on-stdin-eof``,
until its stdin reaches end of file (the test session that started it ended or died).

NB: moto checks a condition and then writes without a lock, so two racing conditional writes can
both "win" against a bare moto server. Every request here runs under one ``threading.Lock``, held
while the application runs *and* while its response body is joined (moto may do work lazily in
the body iterator). Connections are still accepted and parsed concurrently by werkzeug's threads,
so clients see real concurrency on the wire and the server applies requests atomically, as S3 and
DynamoDB do.
"""

from __future__ import annotations

import argparse
import io
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Serialized:
    """WSGI middleware: one request at a time through ``app``, body included."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        _buffer_body(environ)
        with self._lock:
            result = self._app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]


def _buffer_body(environ: dict[str, Any]) -> None:
    """Reads the request body off the socket *before* the request takes the lock.

    NB: moto reads the body inside the application. A client paused between sending its headers
    and its body (SIGSTOP in the fencing tests, a GC pause) would otherwise hold the lock, and so
    stall every other client, until it resumed.
    """
    stream = environ.get("wsgi.input")
    if stream is None:
        return
    length = environ.get("CONTENT_LENGTH")
    if length:
        body = stream.read(int(length))
    elif environ.get("wsgi.input_terminated"):
        body = stream.read()
    else:
        return
    environ["wsgi.input"] = io.BytesIO(body)


def _shutdown_on_stdin_eof(server: Any) -> None:
    """Stops ``server`` once stdin reaches end of file (the parent closed it or died)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    server.shutdown()


class QuietHandler(MotoRequestHandler):
    """moto's request handler without a log line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    """Serves moto until killed, after printing the bound port."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="stop when stdin reaches end of file (the parent is gone)")
    args = parser.parse_args(argv)
    app = Serialized(DomainDispatcherApplication(create_backend_app))
    server = make_server(args.host, args.port, app, threaded=True, request_handler=QuietHandler)
    if args.exit_on_stdin_eof:
        threading.Thread(target=_shutdown_on_stdin_eof, args=(server,), daemon=True).start()
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
