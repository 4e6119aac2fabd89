"""The console script against s3:// locations on each S3 test server: the same code path as file
locations, reached through ``persist.location.resolve`` with ``-o`` options."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import cli
from tests.cli.test_cli import run

pytest.importorskip("boto3")

pytestmark = [pytest.mark.s3, pytest.mark.dynamodb]


def _flags(options: dict[str, Any]) -> list[str]:
    return [arg for k, v in options.items() for arg in ("-o", f"{k}={v}")]


def test_cli_on_s3(aws_options: dict[str, Any], bucket: str, tmp_path: Any) -> None:
    table = f"persist-cli-{bucket[-8:]}"
    dynamodb = aws_options.get("dynamodb_endpoint_url", aws_options["endpoint_url"])
    run("dynamodb", "create-table", table, "--endpoint-url", dynamodb,
        "--region", aws_options["region_name"],
        *_flags({k: v for k, v in aws_options.items() if k.startswith("aws_")}))
    options = {**aws_options, "lock_table": table}
    url = f"s3://{bucket}/loc"
    with persist.open(url, reentrance_id="s3-writer", storage_options=options) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((i, i), 0, 1) for i in range(500)], 1).result()
        w.append([((1, 1), 1, -1)], 2).result()
    flags = _flags(options)
    info = json.loads(run("inspect", url, "--json", *flags).stdout)
    assert info["collections"][0]["upper"] == 2
    assert info["lock"]["holder"] == "s3-writer"
    report = json.loads(run("verify", url, "--json", "--no-progress", *flags).stdout)
    assert report["problems"] == []
    out = tmp_path / "c.parquet"
    run("snapshot", url, "c", "--out", str(out), *flags)
    import pyarrow.parquet as pq

    assert len(pq.read_table(out)) == 499
    assert "held by" not in run("lock", url, *flags).stdout  # released on close
    run("inspect", f"s3://{bucket}/nothing-here", *flags, expect=cli.EXIT_USAGE)
