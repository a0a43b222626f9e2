"""A tiny random-weight open_clip CLIP, saved the way ``open_clip.create_model("local-dir:...")`` loads it.

It is a random stand-in: its weights are drawn from open_clip's own initialisation, so its
embeddings, probabilities and gender labels are meaningless. It exists so that tests and the
offline embedded run exercise the production loading and classification code
(``operators.support.clip.load_clip``) without downloading ViT-L/14.

The text tower keeps CLIP's context length (77) and vocabulary size (49408), so open_clip's
bundled BPE tokenizer (``SimpleTokenizer``) works with it unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

# open_clip's file names for a local-dir / hf-hub model (open_clip.constants HF_CONFIG_NAME,
# HF_SAFE_WEIGHTS_NAME).
CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"

TINY_MODEL_CFG = {
    "embed_dim": 32,
    "quick_gelu": True,  # as OpenAI's CLIP weights, which it stands in for, were trained with
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16, "mlp_ratio": 2.0},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def build_tiny_open_clip(directory, seed: int = 0) -> str:
    """Build a tiny random CLIP in ``directory`` (created if needed) and return its model spec,
    ``"local-dir:<absolute path>"``. The same seed writes the same weights."""
    import open_clip
    import safetensors.torch
    import torch
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):  # seed open_clip's init without touching the caller's RNG
        torch.manual_seed(seed)
        model = open_clip.model.CLIP(**json.loads(json.dumps(TINY_MODEL_CFG)))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(out / WEIGHTS_NAME))
    config = {
        "model_cfg": TINY_MODEL_CFG,
        "preprocess_cfg": {
            "mean": list(OPENAI_DATASET_MEAN),
            "std": list(OPENAI_DATASET_STD),
            "interpolation": "bicubic",
            "resize_mode": "shortest",
        },
        "standin": f"random weights (seed {seed}); outputs are meaningless",
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return f"local-dir:{out}"
