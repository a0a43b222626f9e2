"""Compact declaration of pyarrow fields: one field per column name, all of one type.

The column names themselves are defined in the study modules next to this one; this only builds
``pa.field`` objects for them.
"""

from __future__ import annotations

import pyarrow as pa


def typed(data_type: pa.DataType, *names: str, nullable: bool = True) -> list[pa.Field]:
    """``pa.field(name, data_type, nullable)`` for each of ``names``, in order."""
    return [pa.field(name, data_type, nullable=nullable) for name in names]
