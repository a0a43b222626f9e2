"""What every stage shares: declared resources, schema conformance, and row accounting.

A stage is a plain class: ``__init__`` loads what it needs once per worker, ``__call__`` takes a
``pyarrow.Table`` batch and returns one. Nothing here imports Ray, so tests call stages directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.captions import (
    OUTCOME_KEPT,
    OUTCOME_ROWS_IN,
    OUTCOME_ROWS_OUT,
    TALLY_COUNT,
    TALLY_OUTCOME,
    TALLY_STAGE,
)


@dataclass(frozen=True)
class Resources:
    """What a pipeline needs to know to turn a stage into a ``map_batches`` call."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 4096
    # None: stateless stage, run as Ray tasks. An int: a pool of that many actors, each loading
    # the stage's model once.
    actors: int | None = None


class ModelLoadError(RuntimeError):
    """A configured model could not be loaded; the message names it and how to provide it."""


GPU_HINT = ("To get a GPU: run on a node with one (on a cluster, each model actor asks for --gpus-per-actor GPUs, "
            "default 1 from the study's execution settings, and the autoscaler starts cluster.yaml's gpu_worker "
            "nodes for them; `ray status` shows them); to run the models on the CPU on purpose, pass --device cpu.")


def pick_device(device: str = "auto") -> str:
    """``auto``: cuda when torch sees a GPU, else cpu. ``cuda`` (a real model on a GPU actor) must
    be there: a GPU node whose torch cannot see its GPU fails here rather than computing on the CPU."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda"):
        import os

        import torch

        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} asked for, but torch {torch.__version__} (CUDA build "
                f"{torch.version.cuda or 'none'}) sees no GPU here (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}). {GPU_HINT}")
    return device


def with_column(table: pa.Table, name: str, values) -> pa.Table:
    """``table`` with column ``name`` set to ``values`` (replaced in place, or appended)."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, values) if i >= 0 else table.append_column(name, values)


def status_array(codes: np.ndarray, outcomes: tuple[str, ...]) -> pa.DictionaryArray:
    """A status column from integer (or boolean) codes indexing ``outcomes``; dictionary-encoded,
    so building it costs nothing per row."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, np.int8)), pa.array(list(outcomes), pa.string()))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order; absent columns are nulls."""
    n = table.num_rows
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                col = col.cast(field.type)
            columns.append(col)
        else:
            columns.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def tally_rows(stage: str, counts: Mapping[str, int], schema: pa.Schema) -> pa.Table:
    """One row per (stage, outcome) with its count and nulls elsewhere, conformed to ``schema``.

    Outcomes with a zero count are still emitted, so every outcome appears in the summary.
    """
    outcomes = list(counts)
    table = pa.table(
        {
            TALLY_STAGE: pa.array([stage] * len(outcomes), pa.string()),
            TALLY_OUTCOME: pa.array(outcomes, pa.string()),
            TALLY_COUNT: pa.array([int(counts[o]) for o in outcomes], pa.int64()),
        }
    )
    return conform(table, schema)


def split_tallies(batch: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split a stream batch into (data rows, tally rows)."""
    if TALLY_STAGE not in batch.column_names:
        return batch, batch.slice(0, 0)
    is_tally = pc.is_valid(batch.column(TALLY_STAGE))
    return batch.filter(pc.invert(is_tally)), batch.filter(is_tally)


def filter_with_tally(
    batch: pa.Table,
    stage: str,
    outcome: pa.Array,
    schema: pa.Schema,
    outcomes: tuple[str, ...],
) -> pa.Table:
    """Keep rows whose ``outcome`` is "kept"; replace the others by tally rows counting each reason.

    ``outcomes`` lists every possible outcome so that zero counts are reported too. The counts of
    one call always add up to ``batch.num_rows``.
    """
    counts = dict.fromkeys((OUTCOME_KEPT,) + tuple(o for o in outcomes if o != OUTCOME_KEPT), 0)
    if len(outcome):
        vc = pc.value_counts(outcome)
        for value, count in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
            if value not in counts:
                raise ValueError(f"stage {stage!r} produced unknown outcome {value!r}")
            counts[value] = count
    kept = batch.filter(pc.equal(outcome, OUTCOME_KEPT))
    return pa.concat_tables([conform(kept, schema), tally_rows(stage, counts, schema)])


class StreamStage:
    """Run a stage on a stream that also carries tally rows, and count what it does.

    Tally rows skip the operator and are passed on unchanged. A filtering operator (one with a
    ``status_column``) keeps its "kept" rows and turns the others into tally rows per reason;
    any other named operator tallies the rows it received and passed on. The result is conformed
    to the stream schema, so every block of the stream has one schema.
    """

    def __init__(self, factory: Callable[..., Callable[[pa.Table], pa.Table]], kwargs: dict, schema: pa.Schema):
        self.op = factory(**kwargs)
        self.schema = schema

    def __call__(self, batch: pa.Table) -> pa.Table:
        data, tallies = split_tallies(batch)
        parts = []
        if data.num_rows:
            out = self.op(data)
            stage = getattr(self.op, "stage_name", None)
            status = getattr(self.op, "status_column", None)
            if status is not None:
                parts.append(filter_with_tally(out, stage, out.column(status), self.schema, self.op.outcomes))
            else:
                parts.append(conform(out, self.schema))
                if stage is not None:
                    parts.append(tally_rows(stage, {OUTCOME_ROWS_IN: data.num_rows, OUTCOME_ROWS_OUT: out.num_rows}, self.schema))
        parts.append(conform(tallies, self.schema))
        return pa.concat_tables(parts)


# --- what a model loader records about the weights it loaded ------------------------------------------

# A Hugging Face cache keeps each revision as .../models--org--name/snapshots/<commit>/<files>
# (the files link into blobs/); the commit is read from that path, never from a resolved link.
_SNAPSHOT = re.compile(r"(?:^|/)snapshots/([0-9a-f]{40})(?:/|$)")
# The weight file a transformers / diffusers / sentence-transformers loader reads from one model
# directory when no variant is asked for, in their order of preference (safetensors before
# pickles; transformers tries a single file before a sharded index, diffusers the index first).
# An index stands for the shards it names.
LOADED_WEIGHT_NAMES = (
    "model.safetensors", "model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model.safetensors",
    "pytorch_model.bin", "pytorch_model.bin.index.json",
    "diffusion_pytorch_model.bin.index.json", "diffusion_pytorch_model.bin",
)
_sha256_seen: dict[tuple, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (remembered per path, size and mtime: a worker that loads the same
    multi-GB weights twice hashes them once)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    if key not in _sha256_seen:
        h = hashlib.sha256()
        with open(real, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        _sha256_seen[key] = h.hexdigest()
    return _sha256_seen[key]


def hub_commit(path: str | os.PathLike | None) -> str | None:
    """The commit of a file or directory inside a Hugging Face cache snapshot, else None."""
    if not path:
        return None
    m = _SNAPSHOT.search(Path(os.path.abspath(path)).as_posix())
    return m.group(1) if m else None


def hub_snapshot(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """The cached snapshot directory holding ``filename`` of hub repo ``repo_id`` at ``revision``
    (a commit, branch or tag; None: main), without network access; None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # noqa: BLE001 -- not a valid repo id, no cache: nothing to record
        return None
    return Path(found).parent if isinstance(found, str) else None


def loaded_weight_files(directory: str | os.PathLike) -> list[Path]:
    """The weight files a transformers / diffusers model loads from ``directory`` (see
    LOADED_WEIGHT_NAMES); empty when it holds none."""
    d = Path(directory)
    for name in LOADED_WEIGHT_NAMES:
        p = d / name
        if not p.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(p.read_text()).get("weight_map", {}).values()))
            return [d / s for s in shards]
        return [p]
    return []


def weights_provenance(files, root: str | os.PathLike) -> dict:
    """What a loader records about the weights it read: the hub commit of ``root`` (None off the
    hub), the sha256 of each file by its path under ``root``, and one sha256 over those pairs."""
    root = Path(os.path.abspath(root))
    shas = {Path(os.path.abspath(f)).relative_to(root).as_posix(): file_sha256(f) for f in files}
    listing = "".join(f"{name}\0{sha}\n" for name, sha in sorted(shas.items()))
    return {"commit": hub_commit(root), "weight_files": shas,
            "weights_sha256": hashlib.sha256(listing.encode()).hexdigest() if shas else None}


def weights_fingerprint(path: str) -> str | None:
    """One sha256 over every weight file (.safetensors, .bin) under a local model directory (None
    for anything else)."""
    if not path or not os.path.isdir(path):
        return None
    files = [p for p in Path(path).rglob("*") if p.suffix in {".safetensors", ".bin"} and p.is_file()]
    return weights_provenance(files, path)["weights_sha256"]
