"""The indexed engine on an s3:// location served by moto: resolve, lock, fence, write, seal,
snapshot; and fencing of a stale writer through the S3 commit primitive, in both modes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from persist.blob.s3 import S3Blob
from persist.errors import Fenced
from persist.location import resolve
from tests.support.engine import Engine
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.s3


def _options(aws_options: dict[str, Any], mode: str, table: str) -> dict[str, Any]:
    if mode == "native":
        return dict(aws_options)
    return {**aws_options, "conditional_put": "dynamodb", "dynamodb_table": table}


@pytest.mark.parametrize("mode", ["native", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def test_indexed_engine_on_s3(aws_options: dict[str, Any], bucket: str, dynamodb_table: str,
                              mode: str) -> None:
    location = resolve(f"s3://{bucket}/prefix", storage_options=_options(aws_options, mode,
                                                                          dynamodb_table))
    assert isinstance(location.blob, S3Blob)
    lease = location.lock().acquire("w")
    assert lease.generation == 1

    engine = Engine.open(location.blob, epoch=1, writer="w")
    engine.fence()
    engine.register("c", pa.string(), pa.int64())
    engine.write({"c": [(("a", 1), 0, 1)]})
    engine.seal("c", 1)
    assert engine.snapshot("c", 0).to_python() == [(("a", 1), 0, 1)]

    # A reader on another handle sees the same state.
    reader = Engine.open(resolve(f"s3://{bucket}/prefix",
                             storage_options=aws_options).blob.read_only())
    assert reader.snapshot("c", 0).to_python() == [(("a", 1), 0, 1)]
    assert all(k.startswith(("meta/", "data/", "LOCK")) for k in location.blob.list_keys(""))


@pytest.mark.parametrize("mode", ["native", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def test_paused_writer_is_fenced_by_the_commit_cas(aws_options: dict[str, Any], bucket: str,
                                                  dynamodb_table: str, mode: str) -> None:
    options = _options(aws_options, mode, dynamodb_table)
    old_loc = resolve(f"s3://{bucket}/f", storage_options=options, lease_seconds=0.1)
    old_lease = old_loc.lock().acquire("old")
    old = Engine.open(old_loc.blob, epoch=old_lease.generation, writer="old")
    old.fence()
    old.register("c", pa.string(), pa.int64())

    # "old" pauses past its lease; "new" takes the lock and fences the log.
    new_loc = resolve(f"s3://{bucket}/f", storage_options=options, lease_seconds=0.1)
    new_lease = new_loc.lock().acquire("new", timeout=PATIENCE)
    assert new_lease.generation == old_lease.generation + 1
    new = Engine.open(new_loc.blob, epoch=new_lease.generation, writer="new")
    new.fence()

    with pytest.raises(Fenced):
        old.write({"c": [(("a", 1), 0, 1)]})
    new.write({"c": [(("b", 2), 0, 1)]})
    new.seal("c", 1)
    assert new.snapshot("c", 0).to_python() == [(("b", 2), 0, 1)]
