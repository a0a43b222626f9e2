"""Small builders shared by the tests."""
from pathlib import Path

import pyarrow as pa


def captions_table(captions, **extra) -> pa.Table:
    cols = {"caption": pa.array(captions, pa.string())}
    cols.update(extra)
    return pa.table(cols)


REPO_ROOT = Path(__file__).resolve().parents[1]  # the repository (tests/ sits at its top level)
TESTS_DATA = REPO_ROOT / "tests" / "data"  # the papers' tables as CSV
