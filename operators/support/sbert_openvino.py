"""SBERT on a CPU through OpenVINO, the same model and the same numbers.

The sentence-transformers model's torch modules (the BERT encoder, mean pooling over the attention
mask, L2 normalisation) are converted as one graph with ``openvino.convert_model`` straight from the
loaded PyTorch module (no ONNX file, no download, no ``onnx`` package, whose protobuf >= 6.31
conflicts with mediapipe 0.10.14's protobuf < 5) and compiled for the CPU in **f32**: OpenVINO
would otherwise run in bf16 on CPUs that have it (AVX512-BF16, AMX) and move cosines by ~1e-3.
Tokenisation is the model's own tokenizer; texts are sorted by length and cut into batches like
``SentenceTransformer.encode`` does. ``benchmarks/bench_caption_stream.py`` measures the cosine
difference to torch on real captions and whether the nearest-neighbour subsets stay the same.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

import numpy as np

from operators.support.models import package_version
from operators.support.sbert_batches import token_batches, token_lengths

BACKENDS = ("torch", "openvino", "auto")


def available() -> bool:
    try:
        import_openvino()
    except ImportError:
        return False
    return True


def import_openvino():
    """``openvino``, without its usage reports. OpenVINO reports its import and each model
    conversion to Intel through Google Analytics unless the user opted out: it writes a client ID
    under ``~/intel`` and forks a process per event, which waits up to its timeout where there is
    no network (a cluster's worker nodes). Imported first here, its conversion modules bind
    OpenVINO's own stub (as when openvino-telemetry is not installed); imported elsewhere first,
    each conversion here still runs with that stub (``no_conversion_telemetry``)."""
    if "openvino" not in sys.modules and "openvino_telemetry" not in sys.modules:
        sys.modules["openvino_telemetry"] = None   # an import of it fails: OpenVINO takes its stub
        try:
            return importlib.import_module("openvino")   # deferred: openvino
        finally:
            sys.modules.pop("openvino_telemetry", None)
    return importlib.import_module("openvino")


def version() -> str | None:
    return package_version("openvino")


def _check_pipeline(model) -> bool:
    """The model is Transformer -> Pooling(mean) [-> Normalize]: what this graph computes."""
    names = [type(m).__name__ for m in model]
    if names[:2] != ["Transformer", "Pooling"] or any(n not in ("Normalize",) for n in names[2:]):
        raise ValueError(f"the OpenVINO SBERT backend supports Transformer + mean Pooling (+ Normalize), not {names}")
    pooling = model[1].get_config_dict() if hasattr(model[1], "get_config_dict") else {}
    mode = pooling.get("pooling_mode") or ("mean" if pooling.get("pooling_mode_mean_tokens") else None)
    if mode != "mean":
        raise ValueError(f"the OpenVINO SBERT backend supports mean pooling, not {pooling}")
    return "Normalize" in names


# the modules of OpenVINO's model conversion that report its use (``tm``: openvino-telemetry, or
# OpenVINO's own stub where that package is not installed)
_REPORTING = ("openvino.tools.ovc.convert_impl", "openvino.tools.ovc.telemetry_utils", "openvino.tools.ovc.utils")


@contextlib.contextmanager
def no_conversion_telemetry():
    """A model conversion that reports nothing (``import_openvino``), wherever ``openvino`` was
    imported first: OpenVINO's conversion modules use its own stub meanwhile."""
    import_openvino()
    from openvino.tools.ovc import telemetry_stub  # deferred: openvino

    modules = [m for m in map(importlib.import_module, _REPORTING) if hasattr(m, "tm")]
    kept = [m.tm for m in modules]
    for m in modules:
        m.tm = telemetry_stub
    try:
        yield
    finally:
        for m, tm in zip(modules, kept):
            m.tm = tm


class OpenVinoSbert:
    """``encode(texts, batch_size)`` -> float32 (n, dim) unit vectors, like
    ``SentenceTransformer.encode(..., normalize_embeddings=True)`` on the CPU in fp32."""

    def __init__(self, st_model, threads: int | None = None, precision: str = "f32"):
        """``precision``: "f32" (exact: cosines to torch fp32 >= 0.9999997 on real captions) or "bf16"
        (an option, on CPUs with AVX512-BF16 / AMX: faster; a caption-prompt cosine moves by up to
        ~3e-3, 2.65e-3 measured; never the default)."""
        if precision not in ("f32", "bf16"):
            raise ValueError(f"OpenVINO SBERT precision must be f32 or bf16, got {precision!r}")
        import torch  # deferred: torch

        ov = import_openvino()
        _check_pipeline(st_model)
        self.tokenizer = st_model.tokenizer
        self.max_length = int(st_model.max_seq_length)
        bert = st_model[0].auto_model.eval()

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask, token_type_ids):
                tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids).last_hidden_state
                mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, p=2, dim=1)

        example = {k: torch.ones(2, 8, dtype=torch.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad(), no_conversion_telemetry():
            graph = ov.convert_model(Encoder().eval(), example_input=example,
                                     input=[("input_ids", [-1, -1], ov.Type.i64),
                                            ("attention_mask", [-1, -1], ov.Type.i64),
                                            ("token_type_ids", [-1, -1], ov.Type.i64)])
        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.compiled = ov.Core().compile_model(graph, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.precision = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))

    def encode(self, texts: list[str], batch_size: int = 64, token_budget: int | None = None) -> np.ndarray:
        """``token_budget``: batches cut by tokens (``sbert_batches.token_batches``), else
        ``batch_size`` texts sorted by characters, longest first, as sentence-transformers does."""
        if not texts:
            return np.zeros((0, self.compiled.output(0).get_partial_shape()[1].get_length()), np.float32)
        if token_budget:
            batches = token_batches(token_lengths(self.tokenizer, texts, self.max_length), token_budget)
        else:
            order = np.argsort([-len(t) for t in texts], kind="stable")
            batches = [order[i:i + batch_size] for i in range(0, len(texts), batch_size)]
        out = [None] * len(texts)
        for idx in batches:
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="np")
            feed = {k: np.asarray(enc[k], np.int64) for k in ("input_ids", "attention_mask")}
            feed["token_type_ids"] = np.asarray(enc["token_type_ids"], np.int64) if "token_type_ids" in enc \
                else np.zeros_like(feed["input_ids"])
            res = self.request.infer(feed)
            vectors = np.asarray(res[self.compiled.output(0)], np.float32)
            for row, i in enumerate(idx):
                out[i] = vectors[row]
        return np.stack(out)

    def record(self) -> dict:
        return {"backend": "openvino", "openvino": version(), "precision": self.precision, "device": "CPU"}
