"""A fork into another prefix of the same bucket, on moto's S3 server: the fork reads the source
prefix's blobs (``S3Blob.sibling``), the source's GC keeps what the fork pins, and distributed
reads of the fork plan and read them too."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist.distributed import describe, read_task
from persist.indexed.state import pins
from persist.location import resolve

pytestmark = pytest.mark.s3

# The commit deadline leaves room for a busy machine and a slow S3 round trip (0.2 s did not:
# a write's commit was refused as late under load); it also bounds an unread pin's life.
OPTIONS = persist.Options(inline_threshold=0, gc_grace_seconds=0.0,
                          commit_deadline_seconds=5.0, leak_grace_seconds=None,
                          background_compaction=False)


def test_fork_across_prefixes_of_one_bucket(aws_options: dict[str, Any], bucket: str) -> None:
    src_url, dst_url = f"s3://{bucket}/src", f"s3://{bucket}/dst"
    with persist.open(src_url, storage_options=aws_options, options=OPTIONS) as src:
        w, r = src.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        for t in range(4):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        want = r.snapshot(2).to_python()
        # NB: through a destination writer with these options: the pin records its commit
        # deadline, and the source releases it only after twice that
        with persist.open(dst_url, storage_options=aws_options, options=OPTIONS) as dst:
            persist.fork(src_url, "e", dst_url, into="e", as_of=2, client=dst,
                         storage_options=aws_options)
        src_blob = resolve(src_url, storage_options=aws_options).blob
        assert len(pins.listing(src_blob)) == 1
        # the source merges everything away and collects: what the fork reads stays
        w.allow_compaction(3).result()
        src.maintain()
        src.maintain()
        with persist.open(dst_url, storage_options=aws_options, read_only=True) as dst:
            _, fr = dst.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
            assert fr.snapshot(2).to_python() == want
        scan = describe(dst_url, "e", storage_options=aws_options).snapshot(2)
        rows = sum(t.num_rows for task in scan.tasks(consolidated=True) for t in read_task(task))
        assert rows == len(want)
        # and everything in the other direction: the destination goes, the pin goes
        for key in resolve(dst_url, storage_options=aws_options).blob.list_keys(""):
            resolve(dst_url, storage_options=aws_options).blob.delete(key)
        deadline = time.monotonic() + 60
        while pins.listing(src_blob) and time.monotonic() < deadline:
            src.maintain()
            time.sleep(0.1)
        assert not pins.listing(src_blob)
        assert not src.state.retired
