"""The S3 suite runs against real servers, never the in-process mock.

Its fixtures (``s3_server``, ``aws_options``, ``s3_client``, ``bucket``, ``dynamodb_table``, ...)
are suite-wide, in ``tests/support/s3_fixtures.py``: every test here runs once per configured
server (``[moto]``, ``[ministack]``; docs/s3.md, "Testing").
"""

from __future__ import annotations

from tests.support.s3_fixtures import requires, unique

__all__ = ["requires", "unique"]
