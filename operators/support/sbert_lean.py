"""SBERT on a CPU without sentence-transformers' start-up.

A Ray actor that loads all-MiniLM-L6-v2 through sentence-transformers spends about 6 CPU-seconds
before it encodes anything: the library's imports (transformers' model-loading code, which brings
in torch.distributed and dynamo, scikit-learn, timm...) and then the model. On a 2-core machine that
is two cores' worth of several seconds per actor, a fifth of the 4 M-row caption stream.

This module runs the same model with torch alone: the BERT encoder's weights from the saved
``model.safetensors``, the tokenizer from its ``tokenizer.json`` (the Rust ``tokenizers`` library
that transformers' fast tokenizer wraps), mean pooling over the attention mask and L2
normalisation, the modules sentence-transformers' ``modules.json`` lists. The arithmetic is
transformers' ``BertModel`` in eval mode, op for op (embeddings sum and LayerNorm; per layer
query/key/value projections, ``scaled_dot_product_attention`` with the padding mask, output
projection, residual LayerNorm, erf GELU feed-forward, residual LayerNorm), so the vectors equal
the library's to float rounding (tested against ``SentenceTransformer.encode`` on the paper's
model). Only that layout is accepted (``lean_layout``); anything else, a hub id that is not a
local directory, or a GPU, goes through sentence-transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from operators.support.sbert_batches import token_batches

# what this module computes: BertModel (absolute positions, erf GELU) + mean pooling [+ Normalize]
_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize")


def lean_layout(path: str | Path) -> str | None:
    """None when the saved model at ``path`` is what ``LeanSbert`` computes, else why not."""
    path = Path(path)
    if not path.is_dir():
        return "not a local directory"
    try:
        modules = json.loads((path / "modules.json").read_text())
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable modules.json/config.json ({exc})"
    kinds = [m.get("type") for m in modules]
    if kinds[:2] != list(_MODULES[:2]) or any(k != _MODULES[2] for k in kinds[2:]) or modules[0].get("path", "") != "":
        return f"modules {kinds}"
    if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu" \
            or config.get("position_embedding_type", "absolute") != "absolute" or config.get("is_decoder"):
        return "not an encoder-only BERT with erf GELU and absolute positions"
    try:
        pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError) as exc:
        return f"no readable pooling config ({exc})"
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True]
    if modes != ["pooling_mode_mean_tokens"] or pooling.get("include_prompt", True) is not True:
        return f"pooling {pooling}"
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file() and json.loads(st_config.read_text()).get("do_lower_case"):
        return "do_lower_case in sentence_bert_config.json"
    for name in ("model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            return f"no {name}"
    dtypes = safetensors_dtypes(path / "model.safetensors")   # integer buffers (position ids) aside
    floats = {d for d in dtypes if not d.startswith(("I", "U", "BOOL"))}
    if floats != {"F32"}:
        return f"weights stored as {sorted(floats) or 'unreadable'}, not float32"
    return None


def safetensors_dtypes(file: Path) -> set[str]:
    """The dtypes of a .safetensors file's tensors, read from its JSON header (no torch)."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size)) if 0 < size < 1 << 27 else {}
    except (OSError, ValueError):
        return set()
    return {v["dtype"] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict) and "dtype" in v}


class LeanTokenizer:
    """``tokenizer(texts, truncation=True, max_length=n)["input_ids"]``, like transformers' fast
    tokenizer for the calls this project makes (special tokens added, no padding)."""

    def __init__(self, path: Path, max_length: int):
        from tokenizers import Tokenizer  # deferred: tokenizers

        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tok.no_padding()
        self._max = None
        self._truncate(max_length)

    def _truncate(self, max_length: int | None):
        if max_length != self._max:
            if max_length is None:
                self._tok.no_truncation()
            else:
                self._tok.enable_truncation(max_length=int(max_length), strategy="longest_first")
            self._max = max_length

    def encode(self, texts: list[str], max_length: int | None):
        self._truncate(max_length)
        return self._tok.encode_batch(texts)

    def __call__(self, texts: list[str], truncation: bool = True, max_length: int | None = None) -> dict:
        encs = self.encode(list(texts), max_length if truncation else None)
        return {"input_ids": [e.ids for e in encs]}


def padded(ids: list[list[int]], type_ids: list[list[int]]):
    """(input ids, token type ids, attention mask) as (rows, longest) int64 tensors, padded with 0
    on the right, as transformers' tokenizer pads for BERT."""
    import torch  # deferred: torch

    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    out = []
    for rows in (ids, type_ids):
        a = np.zeros(mask.shape, np.int64)
        a[mask] = np.fromiter((t for r in rows for t in r), np.int64, int(lengths.sum()))
        out.append(torch.from_numpy(a))
    return out[0], out[1], torch.from_numpy(mask.astype(np.int64))


class LeanSbert:
    """The saved SentenceTransformer at ``path`` on the CPU in fp32, with ``encode`` /
    ``tokenizer`` / ``max_seq_length`` / ``device`` as this project uses them."""

    def __init__(self, path: str | Path):
        import torch  # deferred: torch
        from safetensors.torch import load_file  # deferred: safetensors

        path = Path(path)
        why = lean_layout(path)
        if why:
            raise ValueError(f"{path} is not a BERT + mean pooling SentenceTransformer: {why}")
        cfg = json.loads((path / "config.json").read_text())
        kinds = [m["type"] for m in json.loads((path / "modules.json").read_text())]
        st_config = path / "sentence_bert_config.json"
        st = json.loads(st_config.read_text()) if st_config.is_file() else {}
        self.normalize = _MODULES[2] in kinds
        tok_config = path / "tokenizer_config.json"
        model_max = json.loads(tok_config.read_text()).get("model_max_length") if tok_config.is_file() else None
        # as sentence-transformers sets it: sentence_bert_config.json's, else the tokenizer's within the positions
        self.max_seq_length = int(st.get("max_seq_length") or min(model_max or cfg["max_position_embeddings"],
                                                                  cfg["max_position_embeddings"]))
        self.tokenizer = LeanTokenizer(path, self.max_seq_length)
        self.device = torch.device("cpu")
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        w = load_file(str(path / "model.safetensors"))
        # saved either as BertModel ("embeddings.*") or with its "bert." prefix
        prefix = "bert." if any(k.startswith("bert.") for k in w) else ""
        w = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}
        missing = [k for k in self._names() if k not in w]
        if missing:
            raise ValueError(f"{path / 'model.safetensors'} lacks {missing[:3]}{'...' if len(missing) > 3 else ''}")
        self.w = {k: w[k].contiguous() for k in self._names()}

    def _names(self) -> list[str]:
        names = [f"embeddings.{n}" for n in ("word_embeddings.weight", "position_embeddings.weight",
                                             "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")]
        for i in range(self.layers):
            for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                         "output.dense", "output.LayerNorm"):
                names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
        return names

    def _forward(self, ids, types, mask):
        """Unit (or raw, without Normalize) sentence vectors of one padded batch."""
        import torch  # deferred: torch
        import torch.nn.functional as F  # deferred: torch

        w, eps = self.w, self.eps
        n, length = ids.shape
        pos = torch.arange(length)
        x = F.embedding(ids, w["embeddings.word_embeddings.weight"]) \
            + F.embedding(types, w["embeddings.token_type_embeddings.weight"])
        x = x + F.embedding(pos, w["embeddings.position_embeddings.weight"])
        x = F.layer_norm(x, (x.shape[-1],), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        # the padding mask as transformers builds it for SDPA (none when no row is padded)
        attn = None if bool(mask.all()) else mask[:, None, None, :].bool().expand(n, 1, length, length)
        d = x.shape[-1] // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(h, name):
                return F.linear(h, w[p + name + ".weight"], w[p + name + ".bias"])

            q, k, v = (lin(x, f"attention.self.{m}").view(n, length, self.heads, d).transpose(1, 2)
                       for m in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, dropout_p=0.0, scale=d ** -0.5)
            a = a.transpose(1, 2).reshape(n, length, -1).contiguous()
            x = F.layer_norm(lin(a, "attention.output.dense") + x, (x.shape[-1],),
                             w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
            h = F.gelu(lin(x, "intermediate.dense"))
            x = F.layer_norm(lin(h, "output.dense") + x, (x.shape[-1],),
                             w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        m = mask.unsqueeze(-1).to(x.dtype)
        out = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
        return F.normalize(out, p=2, dim=1) if self.normalize else out

    def _encode_batches(self, texts: list[str], encs: list, batches, normalize_embeddings: bool) -> np.ndarray:
        """Unit (or raw) vectors of ``texts`` (``encs``: their tokenizer encodings), batch by batch
        of ``batches`` (row indices), each batch's rows ordered as sentence-transformers orders them:
        longest text in characters first. Returned in input order."""
        import torch  # deferred: torch
        import torch.nn.functional as F  # deferred: torch

        out = np.empty((len(texts), self.w["embeddings.word_embeddings.weight"].shape[1]), np.float32)
        with torch.inference_mode():
            for part in batches:
                idx = part[np.argsort([-len(texts[i]) for i in part], kind="stable")]
                ids, types, mask = padded([encs[i].ids for i in idx], [encs[i].type_ids for i in idx])
                vec = self._forward(ids, types, mask)
                if normalize_embeddings:
                    vec = F.normalize(vec, p=2, dim=1)
                out[idx] = vec.numpy()
        return out

    def encode_by_tokens(self, texts: list[str], token_budget: int, normalize_embeddings: bool = True) -> np.ndarray:
        """``texts`` in batches cut by tokens (``sbert_batches.token_batches``), tokenized once: the
        same batches, row order and arithmetic as ``encode`` called on each batch's texts (bit for
        bit), without tokenizing every text a second time to cut them."""
        texts = list(texts)
        encs = self.tokenizer.encode(texts, self.max_seq_length) if texts else []
        lengths = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
        return self._encode_batches(texts, encs, token_batches(lengths, token_budget), normalize_embeddings)

    def encode(self, texts: list[str], batch_size: int = 32, normalize_embeddings: bool = False,
               convert_to_numpy: bool = True, show_progress_bar: bool = False) -> np.ndarray:
        """``SentenceTransformer.encode`` for a list of texts: sorted by length in characters
        (longest first), batches of ``batch_size`` padded to their longest, returned in input order."""
        texts = list(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        encs = self.tokenizer.encode(texts, self.max_seq_length) if texts else []
        return self._encode_batches(texts, encs, [order[s:s + batch_size] for s in range(0, len(texts), batch_size)],
                                    normalize_embeddings)
