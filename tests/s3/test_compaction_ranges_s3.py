"""A distributed compaction's tasks on S3 (each server of the suite): a task fetches only the
row groups of its key range (ranged GETs) and verifies each, so a flipped byte in a row group
only the other task's range reaches is never read by this one, and is a ``ChecksumMismatch``
for the other."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

import persist
from persist import distributed
from persist.errors import ChecksumMismatch
from persist.indexed.format import columnar
from persist.indexed.read.parts import PartReader
from persist.location import resolve

pytestmark = pytest.mark.s3

OPTIONS = persist.Options(background_compaction=False, batch_rows=1 << 11, stats_bytes=4096,
                          inline_threshold=1024, commit_deadline_seconds=5.0)
SCHEMA = columnar.part_schema(pa.int64(), pa.int64())


def _sums(t: pa.Table) -> Counter[tuple[int, int]]:
    return +Counter({(k, v): d for k, v, d in zip(
        t.column("key").to_pylist(), t.column("value").to_pylist(),
        t.column("diff").to_pylist(), strict=True)})


def test_tasks_read_only_their_ranges_on_s3(aws_options: dict[str, Any], bucket: str,
                                            s3_client: Any) -> None:
    url = f"s3://{bucket}/loc"
    with persist.open(url, storage_options=aws_options, options=OPTIONS) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(2):
            rng = np.random.default_rng(t)
            n = 12_000
            w.append(pa.table({"key": pa.array(rng.integers(-(1 << 40), 1 << 40, n)),
                               "value": pa.array(rng.integers(0, 3, n)),
                               "time": pa.array(np.full(n, t), pa.uint64()),
                               "diff": pa.array(np.ones(n, np.int64))}), upper=t + 1).result()
        w.allow_compaction(1).result()
    plan = distributed.plan_compaction(url, "c", n=2, storage_options=aws_options)
    assert plan is not None
    first, second = plan.tasks
    cut = first.upper
    assert cut is not None
    p = first.parts[0]
    assert p.blob_key is not None
    assert not isinstance(p.stats, msgspec.UnsetType)
    assert p.stats.groups is not None
    offsets = p.stats.groups.offsets
    (kb,) = (b for b in p.stats.batches if b.path == "key")
    late = next(i for i, lo in enumerate(kb.lo) if isinstance(lo, int) and lo > cut)
    blob = resolve(url, storage_options=aws_options).blob
    reader = PartReader(blob, cache_bytes=0)

    def sums(staged: list[distributed.StagedPart]) -> Counter[tuple[int, int]]:
        return _sums(pa.concat_tables(reader.read(s.part, SCHEMA) for s in staged))

    want = sums(distributed.run_compaction_task(first))
    full = f"loc/{p.blob_key}"
    good = s3_client.get_object(Bucket=bucket, Key=full)["Body"].read()
    bad = bytearray(good)
    bad[(offsets[late] + offsets[late + 1]) // 2] ^= 0x10
    s3_client.put_object(Bucket=bucket, Key=full, Body=bytes(bad))
    assert sums(distributed.run_compaction_task(first)) == want
    with pytest.raises(ChecksumMismatch, match=p.id):
        distributed.run_compaction_task(second)
    s3_client.put_object(Bucket=bucket, Key=full, Body=good)
    plan.stager.release()
