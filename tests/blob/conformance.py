"""The Blob contract as tests. Every implementation subclasses ``BlobConformance`` and provides
the ``blob`` fixture (a fresh, empty store); a store whose values another program can reach
(``external_url``) by a scheme other than ``file://`` also provides ``read_external``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import crc32c
import pyarrow as pa
import pytest

from persist.blob.base import Blob
from persist.errors import ChecksumMismatch, Corruption, ExternalError, InvalidUsage

#: Reads the bytes at a URL ``external_url`` gave, as another program would (None: absent).
ReadExternal = Callable[[str], bytes | None]


def read_file_url(url: str) -> bytes | None:
    """The bytes of a ``file://`` URL, or None if no file is there."""
    parsed = urlparse(url)
    assert parsed.scheme == "file", url
    path = Path(url2pathname(parsed.path))
    return path.read_bytes() if path.exists() else None


class BlobConformance:
    @pytest.fixture
    def blob(self) -> Blob:
        raise NotImplementedError("subclasses provide a fresh, empty store")

    @pytest.fixture
    def read_external(self) -> ReadExternal:
        """How another program reads a URL of this store (default: ``file://`` URLs)."""
        return read_file_url

    def test_get_missing_is_none(self, blob: Blob) -> None:
        assert blob.get("nope") is None

    def test_set_get_roundtrip(self, blob: Blob) -> None:
        blob.set("a/b", b"hello")
        assert blob.get("a/b") == b"hello"
        blob.set("a/b", b"")
        assert blob.get("a/b") == b""

    def test_set_replaces(self, blob: Blob) -> None:
        blob.set("k", b"one")
        blob.set("k", b"two")
        assert blob.get("k") == b"two"

    def test_large_value(self, blob: Blob) -> None:
        value = bytes(range(256)) * 40_000  # ~10 MiB
        blob.set("big", value)
        assert blob.get("big") == value

    def test_any_buffer_is_stored_as_it_was_when_set(self, blob: Blob) -> None:
        """``set`` and ``set_if_absent`` take any buffer (the engine hands an Arrow buffer's
        view, unjoined to its envelope header); what is stored is its content at the call."""
        arrow = pa.py_buffer(bytes(range(256)) * 1_000)
        blob.set("arrow", memoryview(arrow))
        assert blob.get("arrow") == arrow.to_pybytes()
        scratch = bytearray(b"before")
        blob.set("b", memoryview(scratch))
        assert blob.set_if_absent("c", scratch)
        scratch[:] = b"after!"
        assert blob.get("b") == blob.get("c") == b"before"

    def test_get_view_is_the_verified_payload(self, blob: Blob) -> None:
        assert blob.get_view("nope") is None
        value = bytes(range(256)) * 4_000
        blob.set("v", value)
        view = blob.get_view("v")
        assert isinstance(view, memoryview)
        assert view == value
        raw = bytearray(blob._get("v") or b"")
        raw[-1] ^= 0x01
        blob._set("v", bytes(raw))
        with pytest.raises(ChecksumMismatch, match="'v'"):
            blob.get_view("v")

    def test_set_if_absent_creates_once(self, blob: Blob) -> None:
        assert blob.set_if_absent("x", b"first") is True
        assert blob.set_if_absent("x", b"second") is False
        assert blob.get("x") == b"first"

    def test_racing_creators_exactly_one_wins(self, blob: Blob) -> None:
        for round_ in range(5):
            key = f"race/{round_}"
            barrier = threading.Barrier(8)
            wins: list[int] = []

            def go(
                i: int, key: str = key, barrier: threading.Barrier = barrier,
                wins: list[int] = wins,
            ) -> None:
                barrier.wait()
                if blob.set_if_absent(key, str(i).encode()):
                    wins.append(i)

            threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(wins) == 1
            assert blob.get(key) == str(wins[0]).encode()

    def test_delete_is_idempotent(self, blob: Blob) -> None:
        blob.set("d", b"v")
        blob.delete("d")
        assert blob.get("d") is None
        blob.delete("d")
        blob.delete("never/existed")
        assert blob.set_if_absent("d", b"again") is True

    def test_list_keys_by_prefix_sorted(self, blob: Blob) -> None:
        keys = ["meta/log/002", "meta/log/001", "meta/rollup/001", "data/1/abc", "data/10/x"]
        for k in keys:
            blob.set(k, b"v")
        assert blob.list_keys("meta/log/") == ["meta/log/001", "meta/log/002"]
        assert blob.list_keys("meta/") == ["meta/log/001", "meta/log/002", "meta/rollup/001"]
        assert blob.list_keys("data/1/") == ["data/1/abc"]
        assert blob.list_keys("data/1") == ["data/1/abc", "data/10/x"]
        assert sorted(blob.list_keys("")) == sorted(keys)
        assert blob.list_keys("zzz") == []

    def test_list_is_paginated_past_a_thousand(self, blob: Blob) -> None:
        for i in range(1100):
            blob.set(f"many/{i:05d}", b"")
        assert len(blob.list_keys("many/")) == 1100
        assert blob.list_keys("many/", start_after="many/00050") == [
            f"many/{i:05d}" for i in range(51, 1100)]
        assert blob.list_keys("many/", start_after="many/01098") == ["many/01099"]

    def test_list_keys_after_a_key(self, blob: Blob) -> None:
        keys = ["meta/log/001", "meta/log/002", "meta/log/003", "meta/rollup/002",
                "data/1/abc", "data/1/sub/x", "data/10/x", "data/2"]
        for k in keys:
            blob.set(k, b"v")
        log = "meta/log/"
        assert blob.list_keys(log, start_after="meta/log/001") == ["meta/log/002", "meta/log/003"]
        assert blob.list_keys(log, start_after="meta/log/0015") == ["meta/log/002", "meta/log/003"]
        assert blob.list_keys(log, start_after="meta/log/003") == []
        assert blob.list_keys(log, start_after="meta/log/999") == []
        assert blob.list_keys(log, start_after="") == blob.list_keys(log)
        assert blob.list_keys(log, start_after="a") == blob.list_keys(log)  # before the prefix
        assert blob.list_keys(log, start_after="z") == []  # past the prefix
        assert blob.list_keys("meta/", start_after="meta/log/003") == ["meta/rollup/002"]
        # nested keys and prefixes that are not a directory
        assert blob.list_keys("data/1", start_after="data/1/abc") == ["data/1/sub/x", "data/10/x"]
        assert blob.list_keys("data/", start_after="data/1/sub/x") == ["data/10/x", "data/2"]
        assert blob.list_keys("", start_after="data/2") == [
            "meta/log/001", "meta/log/002", "meta/log/003", "meta/rollup/002"]
        assert blob.list_keys("zzz", start_after="a") == []
        assert blob.read_only().list_keys(log, start_after="meta/log/002") == ["meta/log/003"]

    def test_list_keys_after_a_key_in_a_shard(self, blob: Blob) -> None:
        """A sharded log (format 7): flat entries, then shards whose names sort after them."""
        keys = ["meta/log/004", "meta/log/005", "meta/log/s000/006", "meta/log/s000/007",
                "meta/log/s008/008", "meta/log/s008/009", "meta/log/s016/016", "meta/rollup/1"]
        for k in keys:
            blob.set(k, b"v")
        log = "meta/log/"
        assert blob.list_keys(log) == keys[:-1]
        assert blob.list_keys(log, start_after="meta/log/004") == keys[1:-1]
        assert blob.list_keys(log, start_after="meta/log/005") == keys[2:-1]
        assert blob.list_keys(log, start_after="meta/log/s000/006") == keys[3:-1]
        assert blob.list_keys(log, start_after="meta/log/s000/007") == keys[4:-1]
        assert blob.list_keys(log, start_after="meta/log/s008/009") == keys[6:-1]
        assert blob.list_keys(log, start_after="meta/log/s016/016") == []
        blob.delete("meta/log/s008/008")
        blob.delete("meta/log/s008/009")  # an emptied shard (a file store removes it or not)
        assert blob.list_keys(log, start_after="meta/log/s000/007") == ["meta/log/s016/016"]
        assert blob.list_keys(log) == [*keys[:4], "meta/log/s016/016"]

    def test_read_only_view_cannot_write(self, blob: Blob) -> None:
        blob.set("r", b"v")
        ro = blob.read_only()
        assert ro.get("r") == b"v"
        assert ro.list_keys("r") == ["r"]
        for name in ("set", "set_if_absent", "delete"):
            assert not hasattr(ro, name)

    # -- corruption: every value is verified on read ------------------------------------------

    def test_flipped_byte_is_detected(self, blob: Blob) -> None:
        blob.set("c", b"some payload bytes")
        raw = bytearray(blob._get("c") or b"")
        raw[-3] ^= 0x40
        blob._set("c", bytes(raw))
        with pytest.raises(ChecksumMismatch, match="'c'"):
            blob.get("c")

    def test_truncation_is_detected(self, blob: Blob) -> None:
        blob.set("t", b"0123456789" * 10)
        raw = blob._get("t") or b""
        for cut in (0, 5, 23, len(raw) - 1):
            blob._set("t", raw[:cut])
            with pytest.raises(Corruption, match="'t'"):
                blob.get("t")

    def test_swapped_values_are_detected(self, blob: Blob) -> None:
        blob.set("one", b"value of one")
        blob.set("two", b"value of two")
        a, b = blob._get("one") or b"", blob._get("two") or b""
        blob._set("one", b)
        blob._set("two", a)
        with pytest.raises(ChecksumMismatch):
            blob.get("one")
        with pytest.raises(ChecksumMismatch):
            blob.get("two")

    # -- plain values: stored as given, checksum kept by the caller ----------------------------

    def test_plain_value_is_stored_as_given(self, blob: Blob) -> None:
        value = bytes(range(256)) * 1_000
        crc = blob.set_plain("data/1/p", memoryview(pa.py_buffer(value)))  # an Arrow view
        assert crc == crc32c.crc32c(value)
        assert bytes(blob._get("data/1/p") or b"") == value  # no envelope
        got = blob.get_plain("data/1/p", crc, size=len(value))
        assert isinstance(got, memoryview)
        assert got == value
        assert blob.get_plain("data/1/missing", crc) is None
        assert blob.set_plain("data/1/p", b"") == 0  # replaces, like set
        assert blob.get_plain("data/1/p", 0, size=0) == b""

    def test_large_plain_value(self, blob: Blob) -> None:
        value = bytes(range(256)) * 40_000  # ~10 MiB: a file store maps it
        crc = blob.set_plain("data/1/big", value)
        assert blob.get_plain("data/1/big", crc) == value

    def test_plain_value_is_verified_against_its_checksum(self, blob: Blob) -> None:
        value = bytes(range(256)) * 64
        crc = blob.set_plain("data/1/v", value)
        with pytest.raises(ChecksumMismatch, match="'data/1/v'"):
            blob.get_plain("data/1/v", crc ^ 1)
        for at in (0, 1, len(value) // 2, len(value) - 1):
            flipped = bytearray(value)
            flipped[at] ^= 0x10
            blob._set("data/1/v", bytes(flipped))
            with pytest.raises(ChecksumMismatch, match="'data/1/v'"):
                blob.get_plain("data/1/v", crc, size=len(value))
        for cut in (0, 1, len(value) - 1):
            blob._set("data/1/v", value[:cut])
            with pytest.raises(ChecksumMismatch, match="length mismatch"):
                blob.get_plain("data/1/v", crc, size=len(value))
            with pytest.raises(ChecksumMismatch):
                blob.get_plain("data/1/v", crc)
        other = bytes(reversed(value))
        blob.set_plain("data/1/w", other)
        blob._set("data/1/v", other)  # another key's value, same length
        with pytest.raises(ChecksumMismatch):
            blob.get_plain("data/1/v", crc, size=len(value))

    def test_get_range_reads_a_stretch_as_stored(self, blob: Blob) -> None:
        value = bytes(range(256)) * 40  # 10,240 bytes
        blob.set_plain("data/1/r", value)
        n = len(value)
        for start, end in ((0, None), (0, n), (7, None), (n - 9, None), (100, 612), (5, 5),
                           (n, None), (n + 10, None), (n - 3, n + 50), (0, 1)):
            got = blob.get_range("data/1/r", start, end)
            assert isinstance(got, bytes)
            assert got == value[start:end], (start, end)
        assert blob.read_only().get_range("data/1/r", 10, 20) == value[10:20]
        assert blob.get_range("data/1/missing", 0) is None
        assert blob.get_range("data/1/missing", 3, 9) is None
        blob.set_plain("data/1/empty", b"")
        assert blob.get_range("data/1/empty", 0) == b""
        assert blob.get_range("data/1/empty", 4) == b""
        # unverified: what is stored, flipped bits included (the caller keeps the checksum)
        flipped = bytearray(value)
        flipped[-2] ^= 0x01
        blob._set("data/1/r", bytes(flipped))
        assert blob.get_range("data/1/r", n - 4) == bytes(flipped[-4:])
        for start, end in ((-1, None), (5, 4)):
            with pytest.raises(InvalidUsage):
                blob.get_range("data/1/r", start, end)

    def test_plain_value_is_no_enveloped_value(self, blob: Blob) -> None:
        crc = blob.set_plain("data/1/p", b"a plain value, no envelope")
        with pytest.raises(Corruption):
            blob.get("data/1/p")
        blob.set("data/1/e", b"enveloped")
        with pytest.raises(ChecksumMismatch):
            blob.get_plain("data/1/e", crc)

    def test_external_url(self, blob: Blob, read_external: ReadExternal) -> None:
        value = b"PAR1 ... a file another program opens"
        crc = blob.set_plain("data/7/part", value)
        url = blob.external_url("data/7/part")
        # wrappers and the read-only view name the same place
        assert blob.read_only().external_url("data/7/part") == url
        if url is None:
            return  # a store no other process can reach (memory)
        assert url.endswith("/data/7/part")
        assert read_external(url) == value
        assert blob.get_plain("data/7/part", crc) == value
        blob.delete("data/7/part")
        assert read_external(url) is None

    def test_garbage_is_detected(self, blob: Blob) -> None:
        blob._set("g", b"not an envelope at all, just bytes")
        with pytest.raises(Corruption):
            blob.get("g")

    def test_errors_are_persist_errors(self, blob: Blob) -> None:
        assert issubclass(ExternalError, Exception)
