"""Push notifications: a hint that makes replicas poll now; polling whenever it is unusable."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal

import msgspec
import pytest

import persist
from persist.blob.file import FileBlob
from persist.runtime.notify import ADVERT_KEY, Advert, read_advert
from tests.replica.helpers import append_times, events, eventually
from tests.support.patience import PATIENCE

#: Replicas in these tests poll once an hour: only a push can make them see a write within the
#: tests' patience (tests/support/patience.py), which is far less.
SLOW = (3600.0, 3600.0)
assert SLOW[0] > 2 * PATIENCE


def _becomes_visible(writer_handle: Any, replica_read: Any, t: int) -> None:
    """Appends time ``t`` and waits until the replica's upper shows it."""
    append_times(writer_handle, t, t + 1)
    eventually(lambda: replica_read.upper > t, what=f"the replica seeing time {t}")


@pytest.mark.parametrize("transport", [True, "tcp"])
def test_push_makes_a_rarely_polling_replica_see_writes_at_once(
    loc: str, transport: Literal[True, "tcp"]
) -> None:
    with persist.open(loc, notify=transport) as writer:
        w, _ = events(writer)
        with persist.open(loc, read_only=True, notify=True, poll_interval=SLOW) as replica:
            _, rr = events(replica)
            eventually(lambda: replica.stats["push"]["live"], what="subscribed")
            polls = replica.stats["polls"]
            for t in range(5):
                _becomes_visible(w, rr, t)
            stats = replica.stats
            assert stats["push"]["pushes"] >= 5
            assert writer.stats["notify"]["clients"] == 1
            # one poll per push (plus at most a few for the handshake): no polling in between
            assert stats["polls"] - polls <= 5 + 2


def test_no_advert_means_polling(loc: str) -> None:
    with persist.open(loc) as writer, \
            persist.open(loc, read_only=True, notify=True, poll_interval=(0.005, 0.05)) as replica:
        w, _ = events(writer)
        _, rr = events(replica)
        append_times(w, 0, 3)
        eventually(lambda: rr.upper == 3)
        assert replica.stats["push"]["live"] is False
        assert replica.stats["push"]["connects"] == 0


def _advertise(loc: str, address: str, *, epoch: int, nonce: str = "00" * 16) -> None:
    FileBlob(loc).set(ADVERT_KEY, msgspec.msgpack.encode(Advert(
        address=address, host=socket.gethostname(), nonce=nonce, writer="x", epoch=epoch,
        pid=0, wall_ms=0)))


def test_unreachable_or_foreign_adverts_fall_back_to_polling(loc: str) -> None:
    with persist.open(loc) as writer:
        w, _ = events(writer)
        epoch = writer.state.epoch
        # a server that speaks the protocol but with another nonce: not the advertised writer
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]

        def impostor() -> None:
            try:
                conn, _ = server.accept()
                conn.sendall(b"PNT1" + b"\x01" * 16 + (epoch).to_bytes(8, "big") * 2)
                time.sleep(0.5)
                conn.close()
            except OSError:
                pass

        t = threading.Thread(target=impostor, daemon=True)
        t.start()
        try:
            for address in (f"tcp:127.0.0.1:{port}", "unix:/nonexistent/sock", "bogus"):
                _advertise(loc, address, epoch=epoch)
                with persist.open(loc, read_only=True, notify=True,
                                  poll_interval=(0.005, 0.05)) as replica:
                    _, rr = events(replica)
                    u = rr.upper
                    append_times(w, u, u + 2)
                    _becomes_visible(w, rr, u + 2)  # by polling
                    time.sleep(0.1)
                    assert replica.stats["push"]["connects"] == 0, address
        finally:
            server.close()
            t.join(2)


def test_a_stale_advert_from_a_superseded_writer_is_ignored(loc: str) -> None:
    with persist.open(loc, reentrance_id="svc", notify=True) as old:
        events(old)
        ad = read_advert(FileBlob(loc))
        assert ad is not None
    # the new writer does not push; the old advert (lower epoch) stays behind
    with persist.open(loc, reentrance_id="svc") as new, \
            persist.open(loc, read_only=True, notify=True, poll_interval=(0.005, 0.05)) as replica:
        assert read_advert(FileBlob(loc)) == ad
        assert new.state.epoch > ad.epoch
        w, _ = events(new)
        _, rr = events(replica)
        append_times(w, 0, 2)
        eventually(lambda: rr.upper == 2)
        assert replica.stats["push"]["connects"] == 0


def test_writer_stop_hangs_up_and_the_replica_moves_to_the_next_writer(loc: str) -> None:
    blue = persist.open(loc, reentrance_id="svc", notify=True)
    wb, _ = events(blue)
    with persist.open(loc, read_only=True, notify=True, poll_interval=SLOW) as replica:
        _, _rr = events(replica)
        eventually(lambda: replica.stats["push"]["live"], what="subscribed to blue")
        # green takes over with the same id; blue learns it is fenced at its next commit and
        # hangs up, so the replica rediscovers and subscribes to green
        green = persist.open(loc, reentrance_id="svc", notify=True)
        wg, rg = events(green)
        with pytest.raises(persist.Fenced):
            append_times(wb, 0, 1)
        eventually(lambda: replica.stats["push"]["connects"] >= 2, what="subscribed to green")
        eventually(lambda: replica.stats["push"]["live"])
        for t in range(3):
            _becomes_visible(wg, rg, t)
        green.stop()
        eventually(lambda: not replica.stats["push"]["live"], what="hang-up on stop")
    blue.stop()
