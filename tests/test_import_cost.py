"""What importing the engine pulls in: nothing that only some paths need.

Spark starts several fresh Python workers for the first stream of a session (planning the
source, running the stream reader, reading a partition), and each imports ``operators`` and so
``persist`` (issue 16). pandas alone cost ~150 ms of each such import when a module-level Arrow
scalar made pyarrow load it; boto3/botocore are needed only for ``s3://`` locations, hypothesis
never outside tests. This checks behaviour (which modules are loaded), not time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Modules an import of the engine must not load, and why.
UNNEEDED = {
    "pandas": "pyarrow loads it on its first conversion of a Python object: build Arrow "
              "scalars and arrays on first use, not at import",
    "boto3": "only s3:// and DynamoDB locations need it: import it where they are opened",
    "botocore": "only s3:// and DynamoDB locations need it: import it where they are opened",
    "moto": "a test dependency",
    "hypothesis": "a test dependency",
}


def loaded_by(module: str) -> set[str]:
    """The top-level names of the modules that ``import <module>`` loads, in a fresh
    interpreter (this process has loaded test dependencies already)."""
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("module", ["persist", "operators"])
def test_import_loads_nothing_unneeded(module: str) -> None:
    if module == "operators":
        pytest.importorskip("pyspark.sql.datasource")
    loaded = loaded_by(module)
    assert {m: why for m, why in UNNEEDED.items() if m in loaded} == {}
