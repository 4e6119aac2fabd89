"""The Spark source and sink on an s3:// location (each S3 test server), options passed as
``storage_options.*`` strings through Spark to every process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from tests.spark.support import Collected, canon, sums, updates_at
from tests.support.engine import updates_between
from tests.support.patience import PATIENCE

pytestmark = [pytest.mark.spark, pytest.mark.s3]


@pytest.fixture
def s3_options(s3_connection: dict[str, str]) -> dict[str, str]:
    return dict(s3_connection)


def test_batch_stream_and_sink_on_s3(spark: Any, tmp_path: Path, bucket: str,
                                     s3_options: dict[str, str]) -> None:
    url = f"s3://{bucket}/loc"
    with persist.open(url, storage_options=dict(s3_options)) as client:
        w, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(3):
            w.append(updates_at(t, 40), upper=t + 1).result()
        want = r.snapshot(2).to_arrow()
        history = pa.concat_tables(updates_between(client, "events", 0, 3))

    def opts(builder: Any) -> Any:
        for k, v in s3_options.items():
            builder = builder.option(f"storage_options.{k}", v)
        return builder

    df = opts(spark.read.format("persist").option("collection", "events")).load(url)
    assert canon(df.toArrow()) == canon(want)
    sink = Collected()
    q = (opts(spark.readStream.format("persist").option("collection", "events")).load(url)
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(PATIENCE)
    assert q.exception() is None
    assert canon(sink.all()) == canon(history)
    raw = opts(spark.read.format("persist").option("collection", "events")
               .option("mode", "raw")).load(url)
    opts(raw.write.format("persist").mode("append").option("collection", "copy")
         .option("upper", 5)).save(url)
    with persist.open(url, read_only=True, storage_options=dict(s3_options)) as client:
        _, copy = client.create_or_load("copy", key_type=pa.string(), value_type=pa.int64())
        assert copy.upper == 5
        assert sums(copy.snapshot(4).to_arrow()) == sums(want)
