"""A ministack S3 + DynamoDB server (one port, both services) served by hypercorn.

Run as ``python -m tests.support.ministack_server [--host 127.0.0.1] [--port 0]``; it binds,
prints the chosen port on one line of stdout, then serves until killed (SIGTERM, SIGINT) or, with
``--exit-on-stdin-eof``, until its stdin reaches end of file: the test session that started it
with a pipe on stdin ended or died, and the server does not outlive it.

Unlike moto's, ministack's server applies conditional writes atomically by itself (measured
with ministack 1.5.33: races of 100 rounds x 8 threads had exactly one winner), so it runs bare: no
serializing middleware. The socket is bound here and handed to hypercorn as ``fd://``, so the
port is known before the first request and no other process can take it in between.

Only S3 and DynamoDB are loaded (``SERVICES``); ministack's optional listeners on fixed ports
(IoT MQTT on 8883, SFTP) are off, so any number of servers can run side by side; state is in
memory only (nothing under /tmp/ministack-data).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import threading

ENVIRONMENT = {
    "SERVICES": "s3,dynamodb",
    "IOT_MTLS_ENABLED": "0",
    "SFTP_ENABLED": "0",
    "PERSIST_STATE": "0",
    "S3_PERSIST": "0",
    "LOG_LEVEL": "WARNING",
}


def main(argv: list[str] | None = None) -> None:
    """Serves ministack until killed or until stdin closes, after printing the bound port."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="stop when stdin reaches end of file (the parent is gone)")
    args = parser.parse_args(argv)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    port = sock.getsockname()[1]
    # ministack reads its configuration at import time; GATEWAY_PORT is the port it reports in
    # URLs it generates (e.g. Location headers).
    os.environ.update(ENVIRONMENT)
    os.environ["GATEWAY_PORT"] = str(port)
    os.environ.setdefault("MINISTACK_HOST", args.host)

    from hypercorn.asyncio import serve
    from hypercorn.config import Config
    from ministack.app import app

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.keep_alive_timeout = 75
    config.loglevel = "WARNING"
    config.accesslog = None

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if args.exit_on_stdin_eof:
            threading.Thread(target=_watch_stdin, args=(loop, stop), daemon=True).start()
        print(port, flush=True)
        await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    asyncio.run(run())


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Stops the server once stdin reaches end of file (the parent closed it or died)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    loop.call_soon_threadsafe(stop.set)


if __name__ == "__main__":
    sys.exit(main())
