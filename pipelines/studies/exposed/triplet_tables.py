"""The tables every source of triplets makes and the files they are written to: triplet ids,
the source name they start with, the counts of each filter outcome (``TRIPLET_COUNTS``), and
``write_triplets``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators.base import conform
from pipelines.engine.storage import io
from schemas.exposed import (
    COUNT,
    HUMAN_WORD,
    TRIPLET_COUNTS,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TRIPLETS,
    TripletOutcome,
)

TRIPLETS_FILE = "triplets.parquet"
COUNTS_CSV = "triplet_counts.csv"
COUNTS_JSON = "triplet_counts.json"

_SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*")


def check_source(source: str) -> str:
    if not isinstance(source, str) or _SOURCE_NAME.fullmatch(source) is None:
        raise ValueError(f"source {source!r}: expected a short name of letters, digits, '.', '_' and '-' (gcc, coco, ...)")
    return source


def triplet_ids(source: str, rows: pa.Array) -> pa.Array:
    """f"{source}-{row:07d}", vectorised."""
    padded = pc.utf8_lpad(rows.cast(pa.string()), 7, "0")
    return pc.binary_join_element_wise(pa.repeat(pa.scalar(source, pa.string()), len(rows)), padded, "-")


def count_rows(source: str, outcomes: Mapping[str, int], words: Mapping[str, int] | None = None) -> pa.Table:
    """``TRIPLET_COUNTS`` rows: one per outcome (human word null), then one per human word under
    the human_word outcome (most frequent first)."""
    rows = [(o, None, int(n)) for o, n in outcomes.items()]
    rows += [(TripletOutcome.HUMAN_WORD, w, int(n)) for w, n in sorted((words or {}).items(), key=lambda kv: (-kv[1], kv[0]))]
    return conform(pa.table({
        TRIPLET_SOURCE: pa.array([source] * len(rows), pa.string()),
        TRIPLET_STATUS: pa.array([r[0] for r in rows], pa.string()),
        HUMAN_WORD: pa.array([r[1] for r in rows], pa.string()),
        COUNT: pa.array([r[2] for r in rows], pa.int64()),
    }), TRIPLET_COUNTS)


def write_triplets(triplets: pa.Table, counts: pa.Table, output_dir: str | Path) -> dict[str, str]:
    """``triplets.parquet``, ``triplet_counts.csv`` and ``triplet_counts.json`` (a list of rows)
    in ``output_dir``, each written atomically (a temporary name, then a rename); their paths."""
    triplets, counts = conform(triplets, TRIPLETS), conform(counts, TRIPLET_COUNTS)
    fs, root = io.output_fs(str(output_dir))
    paths = {"triplets": f"{root}/{TRIPLETS_FILE}", "counts_csv": f"{root}/{COUNTS_CSV}",
             "counts_json": f"{root}/{COUNTS_JSON}"}
    io.write_table(triplets, fs, paths["triplets"])
    io.write_text(counts.to_pandas().to_csv(index=False), fs, paths["counts_csv"])
    io.write_text(json.dumps(counts.to_pylist(), indent=1) + "\n", fs, paths["counts_json"])
    return paths
