"""The native read path (``operators.PersistTable``): Spark's own Parquet reader over the part
files of a snapshot, the other parts through the Python path, consolidation per key range.

Every answer is checked against the client's snapshot and the Python source
(``format("persist")``) on the same collection: raw and consolidated, as of several times,
filtered, records, schema evolution, and inline, old-format (IPC) and v4 parts mixed; plus the
errors (before any job), a flipped byte in a v4 data page, parts GC removed, and ``s3a://``
against each S3 test server.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persist
from operators import PersistTable
from persist.blob.file import FileBlob
from persist.indexed.engine import Options, Txn
from persist.indexed.format.meta import AddPart
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.spark.support import s3a_options
from tests.support.engine import Engine
from tests.support.legacy import legacy_part

pytestmark = pytest.mark.spark

#: No background merging, blob parts (no inline unless a test asks), small row groups.
PINNED = Options(inline_threshold=0, batch_rows=500, stats_bytes=1024,
                 background_compaction=False,
                 compaction=CompactionPolicy(final_rows=500, fanin=1 << 20,
                                             inline_flush_bytes=1 << 62))


def _engine(root: Path) -> Engine:
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=PINNED)
    assert isinstance(ix, Engine)
    ix.fence()
    return ix


def _updates(rng: np.random.Generator, n: int, t: int, keys: int = 400) -> pa.Table:
    return pa.table({"key": pa.array(rng.integers(0, keys, n)),
                     "value": pa.array(rng.integers(0, 3, n)),
                     "time": pa.array(np.full(n, t, dtype=np.int64)),
                     "diff": pa.array(rng.choice(np.array([1, 1, -1]), n))})


def _add_legacy(ix: Engine, name: str, updates: Any) -> None:
    """``updates`` as a part of format 1-3 (enveloped Arrow IPC, unsorted)."""
    c = ix.state.collections[name]
    txn = Txn(ix.state)
    txn.stage(AddPart(name=name, part=legacy_part(ix.blob, c, ix.normalize(name, updates),
                                                  batch_rows=500)))
    ix.commit(txn)


def _mixed(root: Path) -> Engine:
    """v4 parts at times 0-3 (3,000 random int updates each), an old-format part at 4 and an
    inline part at 5; sealed to 6, since 1."""
    rng = np.random.default_rng(7)
    ix = _engine(root)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(4):
        ix.write({"c": _updates(rng, 3000, t)})
    _add_legacy(ix, "c", _updates(rng, 2000, 4))
    ix.set_options(Options(inline_threshold=1 << 20, batch_rows=500, stats_bytes=1024,
                           background_compaction=False, compaction=PINNED.compaction))
    ix.write({"c": _updates(rng, 200, 5)})
    ix.seal("c", 6)
    ix.allow_compaction("c", 1)
    parts = ix.state.collections["c"].parts
    assert sum(p.parquet for p in parts) == 4
    assert sum(p.inline is not None for p in parts) == 1
    return ix


def canon(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows of ``table`` as sorted tuples, values as their repr (records are dicts, which do
    not order; NaN equals NaN as text)."""
    cols = [table.column(c).to_pylist() for c in ("key", "value", "time", "diff")]
    return sorted((repr(k), repr(v), t, d) for k, v, t, d in zip(*cols, strict=True))


def _client(root: Path, as_of: int, *, consolidated: bool) -> list[tuple[Any, ...]]:
    """What the client reads: the contents, or the raw updates with times forwarded."""
    ix = Engine.open(FileBlob(root).read_only())
    snap = ix.snapshot("c", as_of)
    if consolidated:
        return canon(snap.to_arrow())
    return canon(pa.concat_tables([*snap.batches(), snap.schema.empty_table()]))


def _python(spark: Any, url: str, as_of: int, *, consolidated: bool, where: str | None = None
            ) -> list[tuple[Any, ...]]:
    df = (spark.read.format("persist").option("collection", "c").option("as_of", as_of)
          .option("mode", "consolidated" if consolidated else "raw").load(url))
    return canon((df.where(where) if where else df).toArrow())


def _native(spark: Any, url: str, as_of: int | None, *, consolidated: bool,
            where: str | None = None, **kw: Any) -> list[tuple[Any, ...]]:
    df = PersistTable.forPath(spark, url, "c", **kw).toDF(as_of=as_of,
                                                          consolidated=consolidated)
    return canon((df.where(where) if where else df).toArrow())


def test_native_reads_answer_as_the_client_and_the_python_source(
        spark: Any, tmp_path: Path) -> None:
    _mixed(tmp_path)
    url = str(tmp_path)
    for as_of in (1, 3, 5):
        for consolidated in (True, False):
            want = _client(tmp_path, as_of, consolidated=consolidated)
            assert want
            assert _native(spark, url, as_of, consolidated=consolidated) == want
            assert _python(spark, url, as_of, consolidated=consolidated) == want
    assert _native(spark, url, None, consolidated=True) == _client(tmp_path, 5,
                                                                 consolidated=True)
    # filters: applied by Spark after the read (pushed into the Parquet scan of raw reads)
    for consolidated in (True, False):
        where = "key >= 100 AND key < 250 AND value != 1"
        assert _native(spark, url, 4, consolidated=consolidated, where=where) == \
            _python(spark, url, 4, consolidated=consolidated, where=where)


def test_the_v4_parts_are_read_by_spark_the_others_by_persist(spark: Any,
                                                              tmp_path: Path) -> None:
    ix = _mixed(tmp_path)
    files = {FileBlob(tmp_path).external_url(p.blob_key).removeprefix("file://")
             for p in ix.state.collections["c"].parts if p.parquet and p.blob_key}
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    for consolidated in (True, False):
        df = table.toDF(consolidated=consolidated)
        assert {f.removeprefix("file://") for f in df.inputFiles()} == files
    # consolidated: one range per Spark partition, summed there by Spark's own aggregation
    # (int keys and values group in Spark as in persist), no shuffle
    plan = table.toDF(partitions=4)._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan
    assert "HashAggregate" in plan


def test_key_ranges_give_the_same_contents_as_one(spark: Any, tmp_path: Path) -> None:
    """v4 parts (random keys: each spans every key) and a small inline part: several key
    ranges, each read by its own Spark partition, together the contents."""
    rng = np.random.default_rng(11)
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(4):
        ix.write({"c": _updates(rng, 4000, t, keys=100_000)})
    ix.set_options(Options(inline_threshold=1 << 20, batch_rows=500, stats_bytes=1024,
                           background_compaction=False, compaction=PINNED.compaction))
    ix.write({"c": _updates(rng, 50, 4, keys=100_000)})
    ix.seal("c", 5)
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    want = _client(tmp_path, 4, consolidated=True)
    for n in (1, 2, 3, 8):
        assert canon(table.toDF(partitions=n).toArrow()) == want
    # several ranges were planned: one Spark partition each
    assert table.toDF(partitions=8).rdd.getNumPartitions() > 2


RECORD_V1 = pa.struct([pa.field("a", pa.int32()), pa.field("tags", pa.list_(pa.string()))])
RECORD_V2 = pa.struct([pa.field("a", pa.int64()), pa.field("tags", pa.list_(pa.string())),
                       pa.field("score", pa.float64())])


def _record(i: int, t: int, *, v2: bool) -> dict[str, Any]:
    r: dict[str, Any] = {"a": i % 5 if i % 9 else None, "tags": [f"t{i % 3}"] * (i % 3)}
    if v2:
        r["score"] = float("nan") if i % 13 == 0 else i / 4 + t
    return r


def test_records_and_schema_evolution(spark: Any, tmp_path: Path) -> None:
    """Parts of an older schema version (widened int, a field added) read as the current one
    through persist; the current version's parts through Spark."""
    ix = _engine(tmp_path)
    ix.register("c", pa.string(), RECORD_V1)
    for t in range(2):
        ix.write({"c": [((f"k{(i * 7 + t) % 40:02d}", _record(i, t, v2=False)), t,
                         -1 if i % 5 == 4 else 1) for i in range(300)]})
    ix.seal("c", 2)
    ix.evolve_schema("c", value_type=RECORD_V2)
    for t in range(2, 4):
        ix.write({"c": [((f"k{(i * 7 + t) % 40:02d}", _record(i, t, v2=True)), t,
                         -1 if i % 4 == 3 else 1) for i in range(300)]})
        ix.seal("c", t + 1)
    # a retraction of a version-0 record, written under version 1
    ix.write({"c": [(("k00", {"a": 0, "tags": [], "score": None}), 4, -1)]})
    ix.seal("c", 5)
    url = str(tmp_path)
    table = PersistTable.forPath(spark, url, "c")
    assert table.toDF().schema["value"].dataType.simpleString() == \
        "struct<a:bigint,tags:array<string>,score:double>"
    new = {p.blob_key for p in ix.state.collections["c"].parts if p.schema_id == 1}
    assert len({f.rsplit("/", 1)[1] for f in table.toDF().inputFiles()}) == len(new)

    for as_of in (1, 3, 4):
        for consolidated in (True, False):
            want = _client(tmp_path, as_of, consolidated=consolidated)
            assert _native(spark, url, as_of, consolidated=consolidated) == want
            assert _python(spark, url, as_of, consolidated=consolidated) == want


def test_wrong_arguments_are_typed_errors_before_any_job(spark: Any, tmp_path: Path) -> None:
    _mixed(tmp_path)
    url = str(tmp_path)
    with pytest.raises(persist.UnknownCollection):
        PersistTable.forPath(spark, url, "nope")
    with pytest.raises(persist.MissingResource):
        PersistTable.forPath(spark, str(tmp_path / "nowhere"), "c")
    with pytest.raises(persist.InvalidUsage, match="SparkSession"):
        PersistTable.forPath(object(), url, "c")
    with pytest.raises(persist.InvalidUsage, match="storage_options"):
        PersistTable.forPath(spark, url, "c", storage_options=["a"])  # type: ignore[arg-type]
    table = PersistTable.forPath(spark, url, "c")
    for as_of in (0, 6, 100):  # since is 1, upper 6
        with pytest.raises(persist.InvalidUsage, match=r"since|upper"):
            table.toDF(as_of=as_of)
    for bad in ({"as_of": "3"}, {"as_of": True}, {"consolidated": "yes"}, {"partitions": 0}):
        with pytest.raises(persist.InvalidUsage):
            table.toDF(**bad)
    # a typo in a keyword names it and the valid ones
    with pytest.raises(persist.InvalidUsage,
                       match="toDF: unknown keyword asof; the keywords are as_of, "
                             "consolidated, partitions"):
        table.toDF(asof=3)
    with pytest.raises(persist.InvalidUsage, match="unknown keyword storage_option;"):
        PersistTable.forPath(spark, url, "c", storage_option={})


def test_nothing_sealed_is_an_error(spark: Any, tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    with pytest.raises(persist.InvalidUsage, match="nothing sealed"):
        PersistTable.forPath(spark, str(tmp_path), "c").toDF()


def test_an_empty_snapshot_reads_empty(spark: Any, tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    ix.seal("c", 3)
    for consolidated in (True, False):
        df = PersistTable.forPath(spark, str(tmp_path), "c").toDF(consolidated=consolidated)
        assert df.count() == 0
        assert df.columns == ["key", "value", "time", "diff"]


def _v4_files(root: Path) -> list[Path]:
    ix = Engine.open(FileBlob(root).read_only())
    return [Path(FileBlob(root).external_url(p.blob_key).removeprefix("file://"))
            for p in ix.state.collections["c"].parts if p.parquet and p.blob_key]


def test_a_flipped_byte_in_a_v4_data_page_is_an_error(spark: Any, tmp_path: Path) -> None:
    _mixed(tmp_path)
    path = _v4_files(tmp_path)[0]
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(0).column(0)
    assert meta.path_in_schema == "key"
    start = meta.dictionary_page_offset or meta.data_page_offset
    data[meta.data_page_offset + (start + meta.total_compressed_size
                                  - meta.data_page_offset) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    for consolidated in (False, True):
        with pytest.raises(Exception, match=r"(?i)checksum|corrupt|decompress"):
            table.toDF(consolidated=consolidated).selectExpr("sum(key)").collect()


def test_a_part_gc_removed_is_an_error_never_an_empty_read(spark: Any,
                                                           tmp_path: Path) -> None:
    _mixed(tmp_path)
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    df = table.toDF(consolidated=False)
    gone = _v4_files(tmp_path)[0]
    gone.unlink()
    # planned before: the query fails (Spark never skips a missing file on this path) ...
    with pytest.raises(Exception, match=r"(?i)not exist|not found|FileNotFound"):
        df.count()
    # ... planned after: the plan is retried, then refused with persist's error
    with pytest.raises(persist.PartMissing, match="disappearing"):
        table.toDF(consolidated=False)


@pytest.mark.s3
def test_native_reads_on_s3a(spark: Any, s3a: None, s3_connection: dict[str, str],
                             bucket: str) -> None:
    url = f"s3://{bucket}/loc"
    rng = np.random.default_rng(3)
    with persist.open(url, storage_options=dict(s3_connection),
                      options=persist.Options(inline_threshold=0,
                                              background_compaction=False)) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(3):
            t_rows = _updates(rng, 2000, t)
            w.append([((k, v), t, d) for k, v, d in zip(
                t_rows.column("key").to_pylist(), t_rows.column("value").to_pylist(),
                t_rows.column("diff").to_pylist(), strict=True)], upper=t + 1).result()
        want = canon(r.snapshot(2).to_arrow())
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection),
                                 reader_options=s3a_options(s3_connection))
    df = table.toDF()
    assert all(f.startswith("s3a://") for f in df.inputFiles())
    assert len(df.inputFiles()) == 3
    assert canon(df.toArrow()) == want
    raw = table.toDF(as_of=1, consolidated=False)
    assert raw.count() == 4000
    # a Spark without the S3A connector (here: its class made unloadable for this read)
    broken = PersistTable.forPath(
        spark, url, "c", storage_options=dict(s3_connection),
        reader_options={**s3a_options(s3_connection), "fs.s3a.impl": "org.example.NoS3A",
                        "fs.s3a.impl.disable.cache": "true"})
    with pytest.raises(persist.InvalidUsage, match=r"cannot read s3a://.*format\(\"persist\"\)"):
        broken.toDF()


# -- the property: native == Python source == client ------------------------------------------

KEYS = st.integers(0, 30)


@st.composite
def _histories(draw: st.DrawFn) -> dict[str, Any]:
    record = draw(st.booleans())
    times = draw(st.integers(2, 4))
    writes = []
    for t in range(times):
        n = draw(st.integers(0, 60))
        rows = [(draw(KEYS), draw(st.integers(0, 3)), draw(st.sampled_from([1, 1, -1])))
                for _ in range(n)]
        kind = draw(st.sampled_from(["v4", "v4", "inline", "legacy"]))
        writes.append((t, kind, rows))
    evolve_at = draw(st.one_of(st.none(), st.integers(1, times - 1))) if record else None
    since = draw(st.integers(0, times - 1))
    as_of = draw(st.integers(since, times - 1))
    key_below = draw(st.one_of(st.none(), st.integers(0, 30)))
    return {"record": record, "writes": writes, "evolve_at": evolve_at, "since": since,
            "as_of": as_of, "key_below": key_below}


def _build(root: Path, h: dict[str, Any]) -> None:
    ix = _engine(root)
    v1 = pa.struct([pa.field("n", pa.int32())])
    v2 = pa.struct([pa.field("n", pa.int64()), pa.field("s", pa.string())])
    ix.register("c", pa.int64(), v1 if h["record"] else pa.int64())
    evolved = False
    for t, kind, rows in h["writes"]:
        if h["evolve_at"] == t:
            ix.evolve_schema("c", value_type=v2)
            evolved = True

        def value(v: int, evolved: bool = evolved) -> Any:
            if not h["record"]:
                return v
            return {"n": v, "s": f"s{v}" if v % 2 else None} if evolved else {"n": v}

        updates = [((k, value(v)), t, d) for k, v, d in rows]
        inline = 1 << 20 if kind == "inline" else 0
        ix.set_options(Options(inline_threshold=inline, batch_rows=16, stats_bytes=1024,
                               background_compaction=False, compaction=PINNED.compaction))
        # NB: an old-format part records no schema version (version 0): only before evolving
        if kind == "legacy" and updates and not evolved:
            _add_legacy(ix, "c", updates)
        elif updates:
            ix.write({"c": updates})
        ix.seal("c", t + 1)
    ix.allow_compaction("c", h["since"])


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(h=_histories())
def test_native_python_source_and_client_agree(spark: Any, tmp_path_factory: Any,
                                               h: dict[str, Any]) -> None:
    root = tmp_path_factory.mktemp("prop")
    _build(root, h)
    url = str(root)
    as_of = h["as_of"]
    where = None if h["key_below"] is None else f"key < {h['key_below']}"
    ix = Engine.open(FileBlob(root).read_only())
    f = None if h["key_below"] is None else persist.col("key") < h["key_below"]
    for consolidated in (True, False):
        snap = ix.snapshot("c", as_of, filter=f)
        client = canon(snap.to_arrow() if consolidated else
                       pa.concat_tables([*snap.batches(), snap.schema.empty_table()]))
        native = _native(spark, url, as_of, consolidated=consolidated, where=where)
        python = _python(spark, url, as_of, consolidated=consolidated, where=where)
        assert native == python == client, (consolidated, h)


def test_types_as_the_python_source_declares_them(spark: Any, tmp_path: Path) -> None:
    """Decimals, unsigned ints, NaN, lists, zoned and naive timestamps, dates in a record:
    Spark's reader gives the Python source's types and values."""
    from tests.spark.test_parquet_parts import _write

    _write(tmp_path)
    url = str(tmp_path)
    table = PersistTable.forPath(spark, url, "c")
    python = spark.read.format("persist").option("collection", "c").load(url)
    assert table.toDF().schema.simpleString() == python.schema.simpleString()
    assert len(table.toDF().inputFiles()) == 4
    for consolidated in (True, False):
        assert _native(spark, url, 3, consolidated=consolidated) == \
            _python(spark, url, 3, consolidated=consolidated)


@pytest.mark.parametrize("kind", ["float", "string"])
def test_key_ranges_of_floats_and_strings(spark: Any, tmp_path: Path, kind: str) -> None:
    """NaN, -0.0, 0.0 and null float keys, and string keys, split into several ranges: each
    key in exactly one (Spark's pushed range filter keeps every row the engine's cut needs)."""
    rng = np.random.default_rng(5)
    ix = _engine(tmp_path)
    key_type = pa.float64() if kind == "float" else pa.string()
    ix.register("c", key_type, pa.int64())
    special: list[Any] = [float("nan"), -0.0, 0.0, None] if kind == "float" else ["", None]
    for t in range(4):
        keys = [float(k) / 7 - 50 if kind == "float" else f"k{k:05d}é"
                for k in rng.integers(0, 2000, 2000)]
        keys[: len(special)] = special
        ix.write({"c": [((k, int(v)), t, 1 if i % 3 else -1)
                        for i, (k, v) in enumerate(zip(keys, rng.integers(0, 2, 2000),
                                                       strict=True))]})
    ix.seal("c", 4)
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    assert table.toDF(partitions=6).rdd.getNumPartitions() > 2  # ranges, and the Python child
    plan = table.toDF(partitions=6)._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan
    # floats: Spark would group -0.0 with 0.0, so persist sums; strings: Spark does
    assert ("MapInArrow _Consolidate" in plan) == (kind == "float")
    want = _client(tmp_path, 3, consolidated=True)
    assert canon(table.toDF(partitions=6).toArrow()) == want


def test_uint64_collections_read_through_persist(spark: Any, tmp_path: Path) -> None:
    """Spark's reader makes a uint64 ``decimal(20, 0)``, the Python source a checked long: such
    a collection's parts are all read by persist, with the Python source's answer."""
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.struct([pa.field("n", pa.uint64())]))
    for t in range(2):
        ix.write({"c": [((k, {"n": k * 3 + t}), t, 1) for k in range(100)]})
    ix.seal("c", 2)
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    assert table.toDF().inputFiles() == []
    for consolidated in (True, False):
        assert _native(spark, str(tmp_path), 1, consolidated=consolidated) == \
            _python(spark, str(tmp_path), 1, consolidated=consolidated) == \
            _client(tmp_path, 1, consolidated=consolidated)


def test_one_consolidated_part_at_one_time_is_read_without_consolidating(
        spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(3):
        ix.write({"c": _updates(rng, 2000, t)})
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    ix.set_options(Options(inline_threshold=0, batch_rows=500, stats_bytes=1024,
                           background_compaction=False,
                           compaction=CompactionPolicy(final_rows=1 << 30, fanin=2,
                                                       inline_flush_bytes=1 << 62)))
    ix.maintain()
    parts = ix.state.collections["c"].parts
    assert len(parts) == 1
    assert parts[0].consolidated
    assert parts[0].min_time == parts[0].max_time == 2
    df = PersistTable.forPath(spark, str(tmp_path), "c").toDF()
    assert "MapInArrow" not in df._jdf.queryExecution().executedPlan().toString()
    assert canon(df.toArrow()) == _client(tmp_path, 2, consolidated=True)


def test_forks_read_their_cut_through_the_files_or_persist(spark: Any, tmp_path: Path) -> None:
    """A fork's parts reference its source's files, hiding rows past the fork's time: Spark
    reads such a file only where the as-of time hides them anyway (else persist reads it); a
    fork into another location reads the source location's files."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    opts = persist.Options(inline_threshold=0, background_compaction=False)
    rng = np.random.default_rng(17)

    def rows(t: int) -> list[Any]:
        u = _updates(rng, 500, t, keys=60)
        return [((k, v), t, d) for k, v, d in zip(u.column("key").to_pylist(),
                                                  u.column("value").to_pylist(),
                                                  u.column("diff").to_pylist(), strict=True)]

    with persist.open(src, options=opts) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append(rows(0) + rows(1), upper=2).result()  # one part of times 0 and 1
        w.append(rows(2) + rows(3), upper=4).result()
        client.fork("c", into="f", as_of=0).result()   # its part: c's first, cut at 0
        f, _ = client.create_or_load("f", key_type=pa.int64(), value_type=pa.int64())
        f.append(rows(1), upper=2).result()
    persist.fork(src, "c", dst, into="g", as_of=2)
    # (location, collection, as_of, part files Spark reads)
    for url, name, as_of, n in ((src, "f", 0, 1), (src, "f", 1, 1), (dst, "g", 2, 2),
                                (dst, "g", 1, 1)):
        with persist.open(url, read_only=True) as client:
            _, r = client.create_or_load(name, key_type=pa.int64(), value_type=pa.int64())
            want = canon(r.snapshot(as_of).to_arrow())
        df = PersistTable.forPath(spark, str(url), name).toDF(as_of=as_of)
        assert canon(df.toArrow()) == want, (url, name, as_of)
        python = (spark.read.format("persist").option("collection", name)
                  .option("as_of", as_of).load(str(url)))
        assert canon(python.toArrow()) == want
        files = df.inputFiles()
        assert len(files) == n, (url, name, as_of, files)
        if name == "g":  # the source location's files
            assert all("/src/" in f for f in files)


def test_a_sum_beyond_int64_is_persists_error_never_a_wrapped_sum(spark: Any,
                                                                  tmp_path: Path) -> None:
    """Spark's own aggregation (an int key: no float anywhere, so the native path sums by
    groupBy) raises persist's DiffOverflow where the diffs of one (key, value) leave int64."""
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    big = (1 << 62) + 1
    for t in range(2):
        ix.write({"c": pa.table({"key": pa.array([1, 2], pa.int64()),
                                 "value": pa.array([0, 0], pa.int64()),
                                 "time": pa.array([t, t], pa.uint64()),
                                 "diff": pa.array([big, 1], pa.int64())})})
    ix.seal("c", 2)
    table = PersistTable.forPath(spark, str(tmp_path), "c")
    df = table.toDF(as_of=1)
    assert "try_sum" in df._jdf.queryExecution().executedPlan().toString()
    with pytest.raises(Exception, match="DiffOverflow: the diffs of one"):
        df.collect()
    raw = table.toDF(as_of=1, consolidated=False)  # raw rows each fit: read as they are
    assert sorted(r.diff for r in raw.collect()) == [1, 1, big, big]
    assert sorted(r.diff for r in table.toDF(as_of=0).collect()) == [1, big]
