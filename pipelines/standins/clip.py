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

import numpy as np

from pipelines.standins.face_decoder import TINT, face_templates

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


# the stand-in a run builds (--standin-models) is calibrated so that a demo reaches the counted-
# image path: the two gender prompts point along the line between two photos, and the logit
# scale puts those photos at p = CALIBRATED_P (see ``calibrate``)
CALIBRATION_PROMPTS = ("A photo of a man", "A photo of a woman")
CALIBRATED_P = 0.97


def build_tiny_open_clip(directory, seed: int = 0, calibrate: bool = False) -> str:
    """Build a tiny random CLIP in ``directory`` (created if needed) and return its model spec,
    ``"local-dir:<absolute path>"``. The same seed writes the same weights; with ``calibrate``,
    the weights ``calibrate`` sets too."""
    # deferred: open_clip, safetensors, torch
    import open_clip
    import safetensors.torch
    import torch
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):  # seed open_clip's init without touching the caller's RNG
        torch.manual_seed(seed)
        model = open_clip.model.CLIP(**json.loads(json.dumps(TINY_MODEL_CFG)))
    note = f"random weights (seed {seed}); outputs are meaningless"
    if calibrate:
        note += "; " + calibrate_gender_prompts(model, OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)
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
        "standin": note,
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return f"local-dir:{out}"


def calibrate_gender_prompts(model, mean, std) -> str:
    """Make a random CLIP read the bundled sample's two face photos, and the faces the stand-in
    generators draw from them, as two genders, so that an offline demo exercises every branch a real
    run reaches (counted images on both sides, ambiguous ones, amplification, correlations), not
    only "ambiguous".

    With random weights the two prompts' cosine similarities differ by about 0.01 on any image, so
    at open_clip's initial logit scale (14.3) no image reaches p >= 0.9 and every image of a demo
    is ambiguous. Here the calibration images are scikit-image's camera-man and astronaut photos,
    whole and as the 64 px face crops of ``standins.face_decoder.face_templates``; u is the unit
    vector with x.u equal for the "man" images and opposite for the "woman" ones (the minimum-norm
    solution of X u = y, y = +1 / -1, normalised). The text projection gets the smallest change
    (least squares, in the span of the two prompts' pooled text features) that makes the prompts'
    embeddings +u and -u, and the logit scale is set so that every calibration image gets
    p = CALIBRATED_P for its gender. Any other image is read from where its random embedding falls
    along u: still meaningless. Returns a note to record."""
    # deferred: open_clip, torch, skimage
    import open_clip
    import torch
    import torch.nn.functional as F
    from skimage import data

    side = TINY_MODEL_CFG["vision_cfg"]["image_size"]

    def prepared(x: torch.Tensor) -> torch.Tensor:   # (1, 3, h, w) in [0, 1]
        x = F.interpolate(x, size=(side, side), mode="bicubic", antialias=True, align_corners=False)
        return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)

    def photo(a: np.ndarray) -> torch.Tensor:
        a = np.stack([a] * 3, axis=-1) if a.ndim == 2 else a[..., :3]
        return prepared(torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None].float() / 255.0)

    woman_face, man_face = face_templates()
    # the faces as the stand-in generators draw them: as is, and darkened as their latents darken them
    shades = [1.0 - d for d in np.linspace(0.0, TINT, 3)]
    images = [photo(data.camera())] + [prepared((man_face[None] + 1) / 2 * k) for k in shades]
    images += [photo(data.astronaut())] + [prepared((woman_face[None] + 1) / 2 * k) for k in shades]
    y = torch.tensor([1.0] * (1 + len(shades)) + [-1.0] * (1 + len(shades)))
    with torch.no_grad():
        x = model.encode_image(torch.cat(images), normalize=True)               # (4, D)
        u = torch.linalg.pinv(x) @ y                                             # x @ u = y
        margin = 1.0 / float(u.norm())                                           # x.u / |u| = +-margin
        u = u / u.norm()
        text = model.encode_text(open_clip.tokenize(list(CALIBRATION_PROMPTS)))   # (2, D), not normalised
        proj = model.text_projection                                              # (width, D)
        pooled = torch.linalg.solve(proj.T, text.T).T                             # text = pooled @ proj
        target = torch.stack([u, -u]) * text.norm(dim=-1, keepdim=True)
        proj += torch.linalg.pinv(pooled) @ (target - pooled @ proj)
        # logit(man) - logit(woman) = scale * (x.u - x.(-u)) = +-2 * scale * margin = log(p / (1 - p))
        scale = float(np.log(CALIBRATED_P / (1 - CALIBRATED_P))) / (2 * margin)
        model.logit_scale.fill_(float(np.log(scale)))
    return (f"gender prompts calibrated on scikit-image's camera-man (man) and astronaut (woman) photos, whole and "
            f"as the stand-in generators' face crops, at p = {CALIBRATED_P}, logit scale {scale:.1f}")
