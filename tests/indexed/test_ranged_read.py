"""A ranged read of a Parquet part (``PartReader.read_groups``): only the tail and the row
groups it keeps are fetched, each verified against the checksum its metadata records
(``PartStats.groups``, ``PartStats.tail``) before a byte is decoded, and the decode reads
nothing else. A distributed compaction's task reads its key range so: a flipped byte inside
its range is a ``ChecksumMismatch``, one outside it is never read."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import crc32c
import msgspec
import numpy as np
import pyarrow as pa
import pytest

import persist
from persist import distributed
from persist.blob.file import FileBlob
from persist.errors import ChecksumMismatch, Corruption, PartMissing
from persist.indexed.engine import Options, Txn
from persist.indexed.format import columnar, parquet, stats
from persist.indexed.format.meta import AddPart, PartMeta
from persist.indexed.maintenance import verify
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.parts import PartReader
from persist.location import resolve
from tests.support.engine import Engine

PINNED = Options(inline_threshold=0, batch_rows=300, stats_bytes=1024,
                 background_compaction=False,
                 compaction=CompactionPolicy(final_rows=300, fanin=1 << 20,
                                             inline_flush_bytes=1 << 62))
SCHEMA = columnar.part_schema(pa.int64(), pa.int64())


def _part(root: Path) -> PartMeta:
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=PINNED)
    assert isinstance(ix, Engine)
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    rng = np.random.default_rng(1)
    ix.write({"c": pa.table({
        "key": pa.array(rng.integers(0, 500, 2000)),
        "value": pa.array(rng.integers(0, 3, 2000)),
        "time": pa.array(rng.integers(0, 4, 2000).astype(np.uint64)),
        "diff": pa.array(np.ones(2000, dtype=np.int64))})})
    ix.seal("c", 4)
    (p,) = ix.state.collections["c"].parts
    return p


def _groups(p: PartMeta) -> tuple[tuple[int, ...], tuple[int, ...]]:
    assert not isinstance(p.stats, msgspec.UnsetType)
    assert p.stats.groups is not None
    return p.stats.groups.offsets, p.stats.groups.crcs


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_the_row_groups_are_recorded_with_their_checksums(tmp_path: Path) -> None:
    p = _part(tmp_path)
    assert p.blob_key is not None
    offsets, crcs = _groups(p)
    data = (tmp_path / p.blob_key).read_bytes()
    assert not isinstance(p.stats, msgspec.UnsetType)
    assert p.stats.tail is not None
    assert len(crcs) == len(p.stats.batch_rows) == 7
    assert offsets[0] == 4
    assert offsets[-1] == p.stats.tail.offset
    assert list(crcs) == [crc32c.crc32c(data[a:b]) for a, b in itertools.pairwise(offsets)]
    assert verify.verify(FileBlob(tmp_path)).problems == []


@pytest.mark.parametrize("keep", [
    [True] * 7, [False, True, True, False, False, True, False], [False] * 6 + [True],
    [True] + [False] * 6])
def test_a_ranged_read_decodes_what_a_whole_read_does(tmp_path: Path, keep: list[bool]) -> None:
    p = _part(tmp_path)
    assert not isinstance(p.stats, msgspec.UnsetType)
    rows = p.stats.batch_rows
    reader = PartReader(FileBlob(tmp_path), cache_bytes=0)
    want = reader.decode_batches(p, reader.fetch(p), SCHEMA, keep, rows)
    assert reader.read_groups(p, SCHEMA, keep, rows).equals(want)


def test_a_flipped_byte_in_a_kept_row_group_or_the_tail_is_a_checksum_mismatch(
        tmp_path: Path) -> None:
    p = _part(tmp_path)
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    offsets, _ = _groups(p)
    path = tmp_path / p.blob_key
    keep = [False, False, True, True, False, False, False]
    reader = PartReader(FileBlob(tmp_path), cache_bytes=0)
    want = reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows)
    good = path.read_bytes()
    for at in (offsets[2], (offsets[2] + offsets[3]) // 2, offsets[4] - 1,
               offsets[-1], (offsets[-1] + p.nbytes) // 2, p.nbytes - 1):
        _flip(path, at)
        with pytest.raises(ChecksumMismatch, match=p.id):
            reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows)
        path.write_bytes(good)
    # a flipped byte in a row group it does not keep is never read
    for at in (4, offsets[1] + 7, offsets[4], offsets[6] + 3):
        _flip(path, at)
        assert reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows).equals(want)
        with pytest.raises(ChecksumMismatch):
            reader.fetch(p)  # a whole read sees it
        path.write_bytes(good)
    path.write_bytes(good[:offsets[3]])
    with pytest.raises(ChecksumMismatch, match="truncated"):
        reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows)
    path.unlink()
    with pytest.raises(PartMissing):
        reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows)


def test_a_part_without_recorded_row_groups_is_read_whole_and_verified(
        tmp_path: Path) -> None:
    p = _part(tmp_path)
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    offsets, _ = _groups(p)
    old = msgspec.structs.replace(p, stats=msgspec.structs.replace(p.stats, groups=None))
    keep = [True] + [False] * 6
    reader = PartReader(FileBlob(tmp_path), cache_bytes=0)
    want = reader.read_groups(old, SCHEMA, keep, p.stats.batch_rows)
    assert want.equals(reader.read_groups(p, SCHEMA, keep, p.stats.batch_rows))
    _flip(tmp_path / p.blob_key, offsets[5])  # outside the range: the whole file is checked
    with pytest.raises(ChecksumMismatch):
        reader.read_groups(old, SCHEMA, keep, p.stats.batch_rows)


def test_a_decode_never_reads_a_byte_it_was_not_given(tmp_path: Path) -> None:
    p = _part(tmp_path)
    assert p.blob_key is not None
    offsets, _ = _groups(p)
    data = (tmp_path / p.blob_key).read_bytes()
    stretches = parquet.Stretches(len(data), [(offsets[-1], data[offsets[-1]:]),
                                              (offsets[2], data[offsets[2]:offsets[3]])])
    keep = [False, False, True] + [False] * 4
    assert len(parquet.decode(p.blob_key, stretches, SCHEMA, keep=keep).table) == 300
    with pytest.raises(Corruption, match="not fetched"):
        parquet.decode(p.blob_key, stretches, SCHEMA, keep=[False, True] + [False] * 5)


def test_a_record_of_row_groups_that_disagrees_with_the_stats_is_corruption(
        tmp_path: Path) -> None:
    p = _part(tmp_path)
    assert not isinstance(p.stats, msgspec.UnsetType)
    assert p.stats.groups is not None
    g = p.stats.groups
    bad = msgspec.structs.replace(p, stats=msgspec.structs.replace(
        p.stats, groups=msgspec.structs.replace(g, offsets=g.offsets[:-1],
                                                crcs=g.crcs[:-1])))
    reader = PartReader(FileBlob(tmp_path), cache_bytes=0)
    with pytest.raises(Corruption, match="row groups"):
        reader.read_groups(bad, SCHEMA, [True] * 7, p.stats.batch_rows)


# -- a distributed compaction's tasks ---------------------------------------------------------


def _collection(tmp_path: Path) -> None:
    opts = persist.Options(background_compaction=False, batch_rows=1 << 11, stats_bytes=4096,
                           inline_threshold=1024)
    with persist.open(tmp_path, options=opts) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(3):
            rng = np.random.default_rng(t)
            n = 20_000
            w.append(pa.table({"key": pa.array(rng.integers(-(1 << 40), 1 << 40, n)),
                               "value": pa.array(rng.integers(0, 3, n)),
                               "time": pa.array(np.full(n, t), pa.uint64()),
                               "diff": pa.array(np.ones(n, np.int64))}), upper=t + 1).result()
        w.allow_compaction(2).result()


def _sums(t: pa.Table) -> Counter[tuple[int, int]]:
    return +Counter({(k, v): d for k, v, d in zip(
        t.column("key").to_pylist(), t.column("value").to_pylist(),
        t.column("diff").to_pylist(), strict=True)})


def _staged(root: Path, staged: list[distributed.StagedPart]) -> Counter[tuple[int, int]]:
    reader = PartReader(FileBlob(root), cache_bytes=0)
    return _sums(pa.concat_tables(reader.read(s.part, SCHEMA) for s in staged))


def test_a_task_reads_only_its_key_range_of_each_part(tmp_path: Path) -> None:
    _collection(tmp_path)
    url = f"file://{tmp_path}"
    plan = distributed.plan_compaction(url, "c", n=2)
    assert plan is not None
    assert len(plan.tasks) == 2
    first, second = plan.tasks
    cut = first.upper
    assert cut is not None
    p = plan.tasks[0].parts[0]
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    offsets, _ = _groups(p)
    (kb,) = (b for b in p.stats.batches if b.path == "key")
    # a row group wholly in the second task's range, and one wholly in the first's
    late = next(i for i, lo in enumerate(kb.lo) if isinstance(lo, int) and lo > cut)
    early = next(i for i, hi in enumerate(kb.hi) if isinstance(hi, int) and hi < cut)
    path = tmp_path / p.blob_key
    good = path.read_bytes()
    want = [_staged(tmp_path, distributed.run_compaction_task(t)) for t in plan.tasks]
    _flip(path, (offsets[late] + offsets[late + 1]) // 2)
    got = distributed.run_compaction_task(first)
    assert _staged(tmp_path, got) == want[0]
    with pytest.raises(ChecksumMismatch, match=p.id):
        distributed.run_compaction_task(second)
    path.write_bytes(good)
    _flip(path, (offsets[early] + offsets[early + 1]) // 2)
    with pytest.raises(ChecksumMismatch, match=p.id):
        distributed.run_compaction_task(first)
    got = distributed.run_compaction_task(second)
    assert _staged(tmp_path, got) == want[1]
    path.write_bytes(good)
    plan.stager.release()
    assert verify.verify(resolve(str(tmp_path)).blob.read_only()).problems == []


@pytest.mark.parametrize("damage", ["crc", "offset"])
def test_verify_reports_a_row_group_record_that_is_not_the_file(tmp_path: Path,
                                                               damage: str) -> None:
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=PINNED)
    assert isinstance(ix, Engine)
    ix.fence()
    ix.register("c", pa.int64(), pa.int64())
    ix.write({"c": pa.table({"key": pa.array(np.arange(1000)),
                             "value": pa.array(np.arange(1000)),
                             "time": pa.array(np.zeros(1000, dtype=np.uint64)),
                             "diff": pa.array(np.ones(1000, dtype=np.int64))})})
    assert verify.verify(ix.blob).problems == []
    (p,) = ix.state.collections["c"].parts
    assert p.blob_key is not None
    assert isinstance(p.stats, stats.PartStats)
    g = p.stats.groups
    assert g is not None
    # the same file again, as a part whose row group record is wrong (a writer's bug)
    key = p.blob_key.rsplit("/", 1)[0] + "/" + "f" * 32
    (tmp_path / key).write_bytes((tmp_path / p.blob_key).read_bytes())
    bad = (stats.Groups(g.offsets, (g.crcs[0] ^ 1, *g.crcs[1:])) if damage == "crc" else
           stats.Groups((g.offsets[0], g.offsets[1] + 1, *g.offsets[2:]), g.crcs))
    txn = Txn(ix.state)
    txn.stage(AddPart(name="c", part=msgspec.structs.replace(
        p, id="f" * 32, blob_key=key, stats=msgspec.structs.replace(p.stats, groups=bad))))
    ix.commit(txn)
    report = verify.verify(ix.blob)
    assert [q for q in report.problems if "recorded row groups" in q] == [
        f"c: {key}'s recorded row groups (bytes 4-{g.offsets[-1]} in {len(g.crcs)}) are not "
        f"its row groups"], report.problems
