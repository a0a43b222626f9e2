"""Small builders shared by the tests."""

import pyarrow as pa


def captions_table(captions, **extra) -> pa.Table:
    cols = {"caption": pa.array(captions, pa.string())}
    cols.update(extra)
    return pa.table(cols)
