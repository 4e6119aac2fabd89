"""Part format 4: Parquet parts round-trip every record type exactly, are sorted where they are
made, open in any Parquet reader with the properties the format promises, are verified by
their checksum before a byte is decoded, and are refused by a persist that predates them."""

from __future__ import annotations

import datetime
import decimal
import math
import struct
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persist import layout
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import ChecksumMismatch, Corruption, Determinate, IncompatibleFormat
from persist.indexed.engine import Options
from persist.indexed.format import columnar, meta, parquet, records, sorting, write
from persist.indexed.format.meta import CollectionMeta
from persist.indexed.format.write import new_part
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.parts import PartReader
from tests.indexed.test_records import arrow_types
from tests.support.engine import Engine

# -- random arrays of every record type, with raw values ----------------------------------------


def _ints(rng: np.random.Generator, t: pa.DataType, n: int) -> pa.Array:
    info = np.iinfo(t.to_pandas_dtype())
    edges = np.array([info.min, info.max, 0, 1], dtype=info.dtype)
    vals = rng.integers(info.min, info.max, n, dtype=info.dtype, endpoint=True)
    pick = rng.random(n) < 0.3
    vals[pick] = rng.choice(edges, int(pick.sum()))
    return pa.array(vals, t)


def _floats(rng: np.random.Generator, t: pa.DataType, n: int) -> pa.Array:
    wide = t == pa.float64()
    bits = rng.integers(0, 2**64 if wide else 2**32, n, dtype=np.uint64, endpoint=False)
    specials = ([0x8000000000000000, 0x7FF8000000000001, 0xFFF0000000000001,
                 0x7FF0000000000000, 0] if wide else
                [0x80000000, 0x7FC00001, 0xFF800001, 0x7F800000, 0])
    pick = rng.random(n) < 0.5
    bits[pick] = rng.choice(np.array(specials, dtype=np.uint64), int(pick.sum()))
    raw = bits.astype(np.uint64 if wide else np.uint32)
    return pa.array(raw.view(np.float64 if wide else np.float32), t)


def _leaf(rng: np.random.Generator, t: pa.DataType, n: int) -> pa.Array:
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_integer(t):
        return _ints(rng, t, n)
    if pa.types.is_floating(t):
        return _floats(rng, t, n)
    if pa.types.is_decimal(t):
        top = 10 ** t.precision - 1
        ints = [int.from_bytes(rng.bytes(16)) % (2 * top + 1) - top for _ in range(n)]
        ints = [top if i % 7 == 0 else -top if i % 7 == 1 else v for i, v in enumerate(ints)]
        # NB: built from digits: Decimal arithmetic rounds at its context's 28 digits
        return pa.array([decimal.Decimal((int(v < 0), tuple(int(d) for d in str(abs(v))),
                                          -t.scale)) for v in ints], t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        pool = ["", "a", "é", "\U0001f600", "x" * 40, "\x00"]
        return pa.array([pool[i] for i in rng.integers(0, len(pool), n)], t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([rng.bytes(int(k)) for k in rng.integers(0, 5, n)], t)
    if pa.types.is_date32(t):
        return _ints(rng, pa.int32(), n).view(t)
    assert pa.types.is_timestamp(t)
    return _ints(rng, pa.int64(), n).view(t)


def random_array(rng: np.random.Generator, t: pa.DataType, n: int,
                 nullable: bool = True) -> pa.Array:
    """``n`` values of ``t``: raw extremes (every int's range, NaN payloads, ``-0.0``, any
    timestamp), nulls where allowed, null structs and null and empty lists."""
    mask = pa.array(rng.random(n) < 0.25) if nullable and n else None
    if pa.types.is_struct(t):
        children = [random_array(rng, f.type, n, f.nullable) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = rng.integers(0, 3, n)
        if mask is not None:
            lengths[np.asarray(mask.to_numpy(zero_copy_only=False))] = 0
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        items = random_array(rng, t.value_type, int(offsets[-1]), t.value_field.nullable)
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        off = pa.array(offsets, pa.int64() if pa.types.is_large_list(t) else pa.int32())
        return cls.from_arrays(off, items, type=t, mask=mask)
    arr = _leaf(rng, t, n)
    if mask is not None:
        arr = pc.if_else(mask, pa.scalar(None, t), arr)
    return arr


def _bits(arr: pa.Array) -> pa.Array:
    """``arr`` with every float leaf as its bit pattern, so ``to_pylist`` compares bits (NaN
    payloads, ``-0.0``), and dates and timestamps as their integers; nulls and structure as
    they are. (Types are compared apart.)"""
    t = arr.type
    if pa.types.is_floating(t):
        return arr.view(pa.uint64() if t == pa.float64() else pa.uint32())
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):  # any value, not only datetime's
        return arr.view(pa.int64() if pa.types.is_timestamp(t) else pa.int32())
    if pa.types.is_struct(t):
        children = [_bits(arr.field(i)) for i in range(t.num_fields)]
        fields = [f.with_type(c.type) for f, c in zip(t, children, strict=True)]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = _bits(arr.values)
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        new = (pa.large_list if pa.types.is_large_list(t) else pa.list_)(
            t.value_field.with_type(values.type))
        mask = arr.is_null() if arr.null_count else None
        return cls.from_arrays(arr.offsets, values, type=new, mask=mask)
    return arr


def same(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> bool:
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    b = b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b
    return bool(a.type == b.type and _bits(a).to_pylist() == _bits(b).to_pylist())


def table_of(rng: np.random.Generator, kt: pa.DataType, vt: pa.DataType, n: int,
             big_times: bool) -> pa.Table:
    times = rng.integers(0, 2**64 if big_times else 50, n, dtype=np.uint64, endpoint=False)
    if big_times and n:
        times[0] = 2**64 - 1
    return pa.Table.from_arrays(
        [random_array(rng, kt, n), random_array(rng, vt, n), pa.array(times, pa.uint64()),
         _ints(rng, pa.int64(), n)], schema=columnar.part_schema(kt, vt))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrow_types(2), arrow_types(2), st.integers(0, 70), st.booleans(), st.integers(0, 2**32),
       st.sampled_from([1, 3, 64]))
def test_every_record_type_round_trips_exactly(kt: pa.DataType, vt: pa.DataType, n: int,
                                               big_times: bool, seed: int,
                                               batch_rows: int) -> None:
    rng = np.random.default_rng(seed)
    table = table_of(rng, kt, vt, n, big_times)
    hi = columnar.time_range(table)[1] if n else 0
    encoded = parquet.encode(table, batch_rows=batch_rows, schema_id=0, sorted=False,
                             max_time=hi)
    assert [n for n in encoded.batch_rows if n] == [
        len(b) for b in table.to_batches(batch_rows) if len(b)]
    decoded = parquet.decode("p", encoded.data, table.schema)
    assert decoded.table.schema.equals(table.schema, check_metadata=False)
    for name in table.column_names:
        assert same(decoded.table.column(name), table.column(name)), name
    # only some row groups
    keep = [i % 2 == 0 for i in range(len(encoded.batch_rows))]
    some = parquet.decode("p", encoded.data, table.schema, keep=keep, rows=encoded.batch_rows)
    kept = [b for b, k in zip([b for b in table.to_batches(batch_rows) if len(b)], keep,
                              strict=False) if k]
    want = pa.Table.from_batches(kept, schema=table.schema)
    for name in table.column_names:
        assert same(some.table.column(name), want.column(name)), name
    kv = pq.ParquetFile(pa.BufferReader(encoded.data)).metadata.metadata
    assert kv[parquet.TAG] == b"4"
    assert kv[parquet.TIME] == (b"uint64" if big_times and n else b"int64")


def test_nan_zero_and_null_keep_their_bits() -> None:
    bits = [0x7FF8000000000001, 0xFFF8000000000000, 0x8000000000000000, 0, 0x7FF0000000000001]
    f = pa.array(np.array(bits, dtype=np.uint64).view(np.float64))
    f = pc.if_else(pa.array([True, True, True, True, False]), f, pa.scalar(None, pa.float64()))
    t = pa.Table.from_arrays([f, f, pa.array([0] * 5, pa.uint64()), pa.array([1] * 5)],
                             schema=columnar.part_schema(pa.float64(), pa.float64()))
    enc = parquet.encode(t, batch_rows=2, schema_id=0, sorted=False, max_time=0)
    got = parquet.decode("p", enc.data, t.schema).table
    assert got.column("key").combine_chunks().view(pa.uint64()).to_pylist()[:4] == bits[:4]
    assert got.column("value").null_count == 1


def test_seconds_timestamps_beyond_milliseconds_are_kept() -> None:
    """Parquet has no seconds: they are stored in milliseconds, or, when a value does not
    fit, as int64 seconds; both read back as the seconds they were."""
    for values in ([0, 1_700_000_000, -5], [2**62, -(2**62), None]):
        ts = pa.array(values, pa.timestamp("s", tz="Europe/Paris"))
        t = pa.Table.from_arrays([ts, pa.array([{"a": v} for v in values],
                                                pa.struct([("a", pa.timestamp("s"))])),
                                  pa.array([0] * 3, pa.uint64()), pa.array([1] * 3)],
                                 schema=columnar.part_schema(ts.type, pa.struct(
                                     [("a", pa.timestamp("s"))])))
        enc = parquet.encode(t, batch_rows=8, schema_id=0, sorted=False, max_time=0)
        assert parquet.decode("p", enc.data, t.schema).table.equals(t)
        stored = pq.ParquetFile(pa.BufferReader(enc.data)).schema_arrow.field("key").type
        assert stored == (pa.timestamp("ms", tz="Europe/Paris") if values[1] == 1_700_000_000
                          else pa.int64())


# -- sorted where made --------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([pa.int64(), pa.int32(), pa.uint64(), pa.uint8(), pa.date32(),
                        pa.timestamp("us"), pa.int16()]),
       st.sampled_from([2, 100, 2**20, 2**40, 2**64]), st.integers(0, 20_000),
       st.integers(0, 2**32), st.booleans())
def test_the_fast_sort_is_consolidations_order(kt: pa.DataType, span: int, n: int, seed: int,
                                               nested_value: bool) -> None:
    rng = np.random.default_rng(seed)
    phys = kt if pa.types.is_integer(kt) else pa.int32() if kt == pa.date32() else pa.int64()
    info = np.iinfo(phys.to_pandas_dtype())
    lo = int(rng.integers(info.min, info.max, dtype=info.dtype, endpoint=True)) \
        if span < 2**64 else int(info.min)
    lo = min(lo, int(info.max) - min(span, 2**phys.bit_width) + 1)
    top = lo + min(span, 2**phys.bit_width) - 1
    raw = rng.integers(lo, top, n, dtype=info.dtype, endpoint=True)
    key = pa.array(raw, phys)
    if not pa.types.is_integer(kt):
        key = key.view(kt)
    vt = pa.struct([("a", pa.int8())]) if nested_value else pa.int8()
    value = random_array(rng, vt, n)
    times = pa.array(rng.integers(0, 3, n, dtype=np.uint64), pa.uint64())
    t = pa.Table.from_arrays([key, value, times, pa.array(np.ones(n, dtype=np.int64))],
                             schema=columnar.part_schema(kt, vt))
    got = sorting.sort_updates(t)
    assert sorting.is_sorted(got)
    assert len(got) == n
    want = t.take(columnar.sort_indices(t))
    for name in ("key", "time"):
        assert got.column(name).equals(want.column(name))


@pytest.mark.parametrize(("kt", "lo", "hi"), [
    (pa.int64(), 0, 1 << 40),  # W1's keys: the words hold the whole key
    (pa.int64(), -(2**63), 2**63 - 1),  # every bit: words keep the top bits, ties re-sorted
    (pa.uint64(), 2**63, 2**64 - 1),
    (pa.int32(), -1000, 1000),  # many ties: Arrow's sort
    (pa.timestamp("us", tz="UTC"), -(2**40), 2**40),
])
def test_the_fast_sort_of_big_parts(kt: pa.DataType, lo: int, hi: int) -> None:
    rng = np.random.default_rng(5)
    n = 300_000
    phys = pa.int64() if not pa.types.is_integer(kt) else kt
    raw = rng.integers(lo, hi, n, dtype=phys.to_pandas_dtype(), endpoint=True)
    raw[:100] = raw[100:200]  # some equal keys
    key = pa.array(raw, phys)
    key = key.view(kt) if phys != kt else key
    t = pa.Table.from_arrays([key, pa.array(rng.integers(0, 3, n)),
                              pa.array(rng.integers(0, 2, n, dtype=np.uint64), pa.uint64()),
                              pa.array(np.ones(n, dtype=np.int64))],
                             schema=columnar.part_schema(kt, pa.int64()))
    got = sorting.sort_updates(t)
    want = t.take(columnar.sort_indices(t))
    for name in t.column_names:
        assert got.column(name).equals(want.column(name)), name


def test_is_sorted_sees_a_misorder() -> None:
    t = pa.table({"key": [1, 2, 2], "value": [0, 5, 4], "time": pa.array([0, 0, 0], pa.uint64()),
                  "diff": [1, 1, 1]})
    assert not sorting.is_sorted(t)
    assert sorting.is_sorted(sorting.sort_updates(t))
    nan = pa.table({"key": [0.0, -0.0, math.nan, math.nan, None], "value": [1, 2, 3, 3, 0],
                    "time": pa.array([0] * 5, pa.uint64()), "diff": [1] * 5})
    assert sorting.is_sorted(nan)  # -0.0 ties 0.0, NaN after numbers, null last


# -- stored parts -------------------------------------------------------------------------------


def _collection() -> CollectionMeta:
    return CollectionMeta(id=1, name="c", key_type=columnar.serialize_type(pa.int64()),
                          value_type=columnar.serialize_type(pa.int64()))


def _bulk(n: int, seed: int = 1, t: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.Table.from_arrays(
        [pa.array(rng.integers(0, 1 << 40, n)), pa.array(rng.integers(0, 1000, n)),
         pa.array(np.full(n, t, dtype=np.uint64)), pa.array(np.ones(n, dtype=np.int64))],
        schema=columnar.part_schema(pa.int64(), pa.int64()))


def test_a_blob_part_is_a_sorted_parquet_file_any_reader_opens(tmp_path: Path) -> None:
    blob = FileBlob(tmp_path)
    table = _bulk(10_000)
    part = new_part(blob, _collection(), table, inline_threshold=0, consolidated=False,
                    batch_rows=1000, schema_id=0)
    assert part.parquet
    assert part.sorted is True
    assert isinstance(part.checksum, int)
    assert part.blob_key is not None
    url = blob.external_url(part.blob_key)
    assert url is not None
    path = Path(url.removeprefix("file://"))
    assert path.read_bytes()[:4] == b"PAR1"
    f = pq.ParquetFile(path, page_checksum_verification=True)
    md = f.metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [1000] * 10
    assert isinstance(part.stats, msgspec.Struct)
    assert part.stats.batch_rows == (1000,) * 10  # type: ignore[attr-defined]
    assert md.metadata[b"persist.part"] == b"4"
    assert md.metadata[b"persist.schema_id"] == b"0"
    assert md.metadata[b"persist.time"] == b"int64"
    assert f.schema_arrow.field("time").type == pa.int64()  # Spark's long
    assert f.schema_arrow.field("diff").type == pa.int64()
    rg = md.row_group(0)
    assert [(s.column_index, s.descending) for s in rg.sorting_columns] == [
        (0, False), (1, False), (2, False)]
    for j in range(md.num_columns):
        col = rg.column(j)
        assert col.compression == "ZSTD"
        assert col.statistics is not None
        assert col.statistics.has_min_max
        assert col.has_column_index
        assert col.has_offset_index
    assert "DELTA_BINARY_PACKED" in rg.column(0).encodings
    read = f.read()
    assert read.column("key").to_pylist() == sorted(table.column("key").to_pylist())
    # a flipped byte in a data page: the page checksum catches it for any reader that checks
    raw = bytearray(path.read_bytes())
    start = rg.column(1).data_page_offset
    raw[start + 40] ^= 0x04
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(raw))
    with pytest.raises(OSError, match=r"(?i)crc|checksum"):
        pq.ParquetFile(bad, page_checksum_verification=True).read()


def test_a_flipped_byte_anywhere_is_never_a_wrong_sum(tmp_path: Path) -> None:
    """On persist's path a v4 part is verified whole before it is decoded: every flipped
    byte (footer, page headers, pages, magic) is ChecksumMismatch, never rows."""
    blob = MemoryBlob()
    table = _bulk(3000)
    part = new_part(blob, _collection(), table, inline_threshold=0, consolidated=False,
                    batch_rows=500)
    assert part.blob_key is not None
    good = bytes(blob._get(part.blob_key) or b"")
    schema = table.schema
    assert pc.sum(PartReader(blob).read(part, schema).column("value")).as_py() == \
        pc.sum(table.column("value")).as_py()
    positions = sorted({*range(0, len(good), max(1, len(good) // 300)), 0, 3, len(good) - 1,
                        len(good) - 5, len(good) - 9})
    for at in positions:
        for bit in (0x01, 0x80):
            raw = bytearray(good)
            raw[at] ^= bit
            blob._set(part.blob_key, bytes(raw))
            reader = PartReader(blob, cache_bytes=0)
            with pytest.raises(ChecksumMismatch, match=part.blob_key.split("/")[-1]):
                reader.read(part, schema)
            with pytest.raises(ChecksumMismatch):
                reader.read_batches(part, schema, [True] + [False] * 5, (500,) * 6)
    blob._set(part.blob_key, good[:-1])
    with pytest.raises(ChecksumMismatch, match="length"):
        PartReader(blob, cache_bytes=0).read(part, schema)


def test_parquet_bytes_that_pass_the_checksum_are_still_checked() -> None:
    """Bytes persist did not write (a part forged with a matching checksum, or a writer bug)
    are Corruption, never decoded as rows of another schema."""
    table = _bulk(10)
    enc = parquet.encode(table, batch_rows=4, schema_id=0, sorted=True, max_time=3)
    with pytest.raises(Corruption, match="columns"):
        parquet.decode("p", enc.data, columnar.part_schema(pa.int64(), pa.string()).remove(0))
    with pytest.raises(Corruption, match="cannot be string"):
        parquet.decode("p", enc.data, columnar.part_schema(pa.int64(), pa.string()))
    with pytest.raises(Corruption, match="cannot be int32"):
        parquet.decode("p", enc.data, columnar.part_schema(pa.int64(), pa.int32()))
    plain = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(None), plain)
    with pytest.raises(Corruption, match="format tag"):
        parquet.decode("p", plain.getvalue(), table.schema)
    older = pa.BufferOutputStream()
    pq.write_table(table, older)  # tagged as an Arrow stream part (format 1)
    with pytest.raises(Corruption, match=r"tagged persist\.part=1"):
        parquet.decode("p", older.getvalue(), table.schema)
    newer = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata({b"persist.part": b"5"}), newer)
    with pytest.raises(IncompatibleFormat, match="format version 5"):
        parquet.decode("p", newer.getvalue(), table.schema)
    with pytest.raises(Corruption, match="undecodable"):
        parquet.decode("p", b"PAR1 not really", table.schema)
    with pytest.raises(Corruption, match="stats say"):
        parquet.decode("p", enc.data, table.schema, keep=[True, False, True],
                       rows=(4, 3, 3))
    with pytest.raises(Corruption, match="row groups"):
        parquet.decode("p", enc.data, table.schema, keep=[True, True])


# -- the metadata version -------------------------------------------------------------------------


def test_a_record_referencing_a_parquet_part_is_version_4(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(columnar, "INLINE_PACK_SHARE", 0.0)  # plain streams: before format 9
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w",
                      options=Options(inline_threshold=1 << 20))
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    ix.write({"c": [((1, 1), 0, 1)]})  # inline: an Arrow stream, as before
    # NB: what the collections need; the state of a sharded log (format 7) is 7 as a whole
    assert meta.required_version(msgspec.structs.replace(ix.state, log_from=msgspec.UNSET)) == 1
    ix.set_options(Options(inline_threshold=0))
    ix.write({"c": [((2, 2), 1, 1)]})  # a Parquet part
    assert meta.required_version(msgspec.structs.replace(ix.state, log_from=msgspec.UNSET)) == 4
    blob = FileBlob(tmp_path)
    versions = [meta.decode_commit(k, bytes(blob.get(k) or b"")).version
                for k in blob.list_keys(layout.LOG_PREFIX)]
    assert versions == [7, 1, 1, 4]  # the fence shards the log
    commit_4 = blob.list_keys(layout.LOG_PREFIX)[-1]
    ix.maybe_rollup()
    monkeypatch.setattr(meta, "FORMAT_VERSION", 6)
    with pytest.raises(IncompatibleFormat, match="format version 7"):
        Engine.open(FileBlob(tmp_path).read_only())
    monkeypatch.setattr(meta, "FORMAT_VERSION", 3)
    with pytest.raises(IncompatibleFormat, match="format version 4"):
        meta.decode_commit(commit_4, bytes(blob.get(commit_4) or b""))


def test_time_at_or_above_two_to_the_63_is_kept(tmp_path: Path) -> None:
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=Options(inline_threshold=0))
    ix.fence()
    ix.register("c", pa.string(), pa.int64())
    big = 2**64 - 5
    ix.write({"c": [(("a", 1), big, 1), (("b", 2), 2**63, 1)]})
    ix.seal("c", big + 1)
    (part,) = ix.state.collections["c"].parts
    assert part.parquet
    got = ix.reader.read(part, columnar.part_schema(pa.string(), pa.int64()))
    assert sorted(got.column("time").to_pylist()) == [2**63, big]
    assert ix.snapshot("c", big).to_python() == [(("a", 1), big, 1), (("b", 2), big, 1)]


def test_inline_parts_stay_arrow_streams() -> None:
    ix = Engine.open(MemoryBlob(), epoch=1, writer="w", options=Options(inline_threshold=1 << 16))
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    ix.write({"c": [((k, k), 0, 1) for k in range(100)]})
    (part,) = ix.state.collections["c"].parts
    assert part.inline is not None
    assert part.checksum is msgspec.UNSET
    assert bytes(part.inline[:4]) != b"PAR1"


def _utc(*a: int) -> datetime.datetime:
    return datetime.datetime(*a, tzinfo=datetime.UTC)


def test_records_through_the_engine_round_trip(tmp_path: Path) -> None:
    kt = pa.struct([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    vt = pa.struct([("x", pa.float64()), ("tags", pa.list_(pa.string())),
                    ("when", pa.timestamp("s")), ("amount", pa.decimal128(20, 4))])
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=Options(inline_threshold=0))
    ix.fence()
    ix.register("r", kt, vt)
    rows = [(({"id": i % 3, "at": _utc(2024, 1, 1 + i % 2)},
              {"x": [math.nan, -0.0, 1.5][i % 3], "tags": [] if i % 2 else ["a", None][: i % 3],
               "when": datetime.datetime(2000, 1, 1) if i % 4 else None,
               "amount": decimal.Decimal("1.2500")}), 0, 1) for i in range(12)]
    ix.write({"r": rows})
    ix.seal("r", 1)
    (part,) = ix.state.collections["r"].parts
    assert part.parquet
    got = ix.snapshot("r", 0).to_arrow()
    want = columnar.contents_at(ix.normalize("r", rows), 0)
    assert got.schema.equals(want.schema)
    for name in got.column_names:
        assert same(records.frame(got.column(name))[0], records.frame(want.column(name))[0])
    assert struct.pack("<d", got.column("value").combine_chunks().field("x")[0].as_py()) \
        == struct.pack("<d", want.column("value").combine_chunks().field("x")[0].as_py())


# -- big appends: key-disjoint parts written in parallel ------------------------------------------


@pytest.mark.parametrize("kt", [pa.int64(), pa.string(), pa.float64()])
def test_a_big_append_is_cut_into_key_disjoint_parts(kt: pa.DataType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "PARALLEL_ROWS", 1000)
    monkeypatch.setattr(write, "PARALLEL_PARTS", 2)
    ix = Engine.open(MemoryBlob(), epoch=1, writer="w",
                      options=Options(inline_threshold=0,
                                      compaction=CompactionPolicy(final_rows=4000)))
    ix.fence()
    ix.register("c", kt, pa.int64())
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 3000, 5000)
    keys: Any = ([f"k{k:05d}" for k in raw] if kt == pa.string() else
                 [math.nan if k % 97 == 0 else (-0.0 if k == 0 else float(k)) for k in raw]
                 if kt == pa.float64() else [int(k) for k in raw])
    rows = [((k, i % 3), 0, 1) for i, k in enumerate(keys)]
    ix.write({"c": rows})
    ix.seal("c", 1)
    parts = ix.state.collections["c"].parts
    assert len(parts) == 2
    assert all(p.full is True and p.parquet and p.sorted for p in parts)
    assert sum(p.rows for p in parts) == 5000
    schema = columnar.part_schema(kt, pa.int64())
    a, b = (ix.reader.read(p, schema).column("key") for p in parts)
    both = {repr(x) for x in a.to_pylist()} & {repr(x) for x in b.to_pylist()}
    assert not both  # no key in both parts
    want = columnar.contents_at(ix.normalize("c", rows), 0)
    got = ix.snapshot("c", 0).to_arrow()
    assert same(got.column("key"), want.column("key"))
    assert got.column("diff").equals(want.column("diff"))
    # small appends, or below the final size, stay one part
    ix.write({"c": [((k, v), 1, d) for (k, v), _, d in rows[:1500]]})
    assert len(ix.state.collections["c"].parts) == 3


def test_a_failed_piece_leaves_no_blob_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "PARALLEL_ROWS", 1000)
    monkeypatch.setattr(write, "PARALLEL_PARTS", 2)

    class SecondSetFails(MemoryBlob):
        def __init__(self) -> None:
            super().__init__()
            self.sets = 0
            self.lock = threading.Lock()

        def _set(self, key: str, data: Any) -> None:
            with self.lock:
                self.sets += 1
                fail = key.startswith("data/") and self.sets == 2
            if fail:
                raise Determinate(f"injected: {key}")
            super()._set(key, data)

    blob = SecondSetFails()
    c = _collection()
    with pytest.raises(Determinate, match="injected"):
        write.new_parts(blob, c, _bulk(5000), inline_threshold=0, final_rows=4000)
    assert blob.list_keys("data/") == []
