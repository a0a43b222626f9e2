"""How much the word masks of the Exposed study's dependency groups change between DAAM's layer
choice (the default) and every cross-attention layer (the other reading), on a tiny random SD 1.x
stand-in.

    python scripts/compare_attention_layers.py [--seeds 8] [--steps 4] [--theta 0.35]

Generates each prompt of a few triplets once per seed with both recorders attached to the same
call's layers (the image is the same: recording never changes it), binarises each noun's heat map
at θ as the study does, and prints per noun the IoU of the two masks and the share of pixels that
differ. With random weights the numbers say how far the two readings can drift, not what a real
model does; run it with ``--model`` on a real SD 1.x checkpoint for that.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["A person walks a dog in the park.", "A woman walks a dog in the park.", "A man walks a dog in the park.",
           "People eat cake at a table.", "A botanist studies samples in a laboratory"]


def masks(pipe, prompt, seed, steps, layers, theta):
    import torch  # deferred: torch

    from operators.support.cross_attention import CrossAttentionCapture
    from operators.support.dependency import attention_masks_torch

    with CrossAttentionCapture(pipe.unet, layers=layers) as cap:
        out = pipe(prompt=[prompt], num_inference_steps=steps, guidance_scale=7.5,
                   generator=[torch.Generator("cpu").manual_seed(seed)], output_type="pt")
    h, w = out.images.shape[-2:]
    scale = pipe.vae_scale_factor
    maps = cap.heat_maps((h // scale, w // scale), (h, w))
    words = CrossAttentionCapture.word_heat_maps(pipe.tokenizer, prompt, maps[0])
    names = list(words)
    stacked = torch.stack([torch.as_tensor(words[n]) for n in names])
    return dict(zip(names, attention_masks_torch(stacked, theta).numpy()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a diffusers SD 1.x directory or cached hub id (default: a tiny random stand-in)")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--theta", type=float, default=0.35)
    args = ap.parse_args(argv)

    from operators.support.diffusion import load_text2image
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    model = args.model or build_tiny_stable_diffusion(Path(tempfile.mkdtemp()) / "sd", seed=0)
    pipe, _ = load_text2image(model, device="cpu", dtype="float32")
    ious, changed = [], []
    for prompt in PROMPTS:
        for seed in range(args.seeds):
            a = masks(pipe, prompt, seed, args.steps, "daam", args.theta)
            b = masks(pipe, prompt, seed, args.steps, "all", args.theta)
            for word in a:
                inter, union = np.logical_and(a[word], b[word]).sum(), np.logical_or(a[word], b[word]).sum()
                ious.append(1.0 if union == 0 else inter / union)
                changed.append(float(np.mean(a[word] != b[word])))
    ious, changed = np.asarray(ious), np.asarray(changed)
    print(f"word masks compared: {len(ious)} ({len(PROMPTS)} prompts x {args.seeds} seeds, every word)")
    print(f"IoU(daam, all): mean {ious.mean():.3f}, median {np.median(ious):.3f}, min {ious.min():.3f}; "
          f"identical masks: {np.mean(ious == 1.0):.1%}")
    print(f"pixels that differ: mean {changed.mean():.1%}, max {changed.max():.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
