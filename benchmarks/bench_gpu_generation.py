"""GPU throughput of the two model stages of paper 002, with architecture-identical random weights.

  generation  Stable Diffusion 1.x (UNet 860M, VAE, CLIP ViT-L/14 text encoder; the SD 1.4/1.5
              architecture) at 512 px, 50 PNDM steps, guidance 7.5, fp16, batch sizes 1-16,
              through the production ImageGenerator (per-image seeds, output tensor on the device)
  clip        open_clip ViT-L/14 image tower + zero-shot decision, fp16, through
              ClipGenderClassifier.classify_tensor (tensor input, no file round trip)

Baseline: the paper's 3.5 s per image on one TITAN RTX (App. A.3). Random weights cost exactly
what trained weights cost; no download is needed.

  python benchmarks/bench_gpu_generation.py [--device cuda] [--batch-sizes 1 2 4 8 16] [--steps 50]
  python benchmarks/bench_gpu_generation.py --device cpu --batch-sizes 1 --steps 1 --size 256   # smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAPER_SECONDS_PER_IMAGE = 3.5  # SD 1.4/1.5, one TITAN RTX, 50 steps (paper 002, App. A.3)


def build_sd1_random(directory: str) -> str:
    """Save an SD 1.x pipeline with the real architecture and random weights (fp16 on disk)."""
    import torch  # deferred: torch
    from diffusers import (  # deferred: diffusers
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel  # deferred: transformers

    from pipelines.standins.diffusion import SD1_SCHEDULER, build_clip_tokenizer

    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=768, attention_head_dim=8,
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, sample_size=512,
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    )
    text = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                                        hidden_act="quick_gelu", projection_dim=768))
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text, tokenizer=build_clip_tokenizer(),
                                   scheduler=PNDMScheduler(**SD1_SCHEDULER), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.to(torch.float16)
    pipe.save_pretrained(directory)
    return directory


def bench_generation(args) -> None:
    import pyarrow as pa
    import torch  # deferred: torch

    from operators.image_generation import ImageGenerator

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = build_sd1_random(tmp)
        print(f"built SD 1.x-architecture random weights in {time.perf_counter() - t0:.0f} s")
        for bs in args.batch_sizes:
            gen = ImageGenerator(model=model, steps=args.steps, guidance_scale=7.5, height=args.size, width=args.size,
                                 device=args.device, safety_checker="off", micro_batch=bs)
            n = bs * args.repeats
            batch = pa.table({"prompt": ["A photo of the face of an engineer"] * n, "seed": pa.array(range(n), pa.int64())})
            gen(batch.slice(0, bs))  # warm-up
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            gen(batch)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = (time.perf_counter() - t) / n
            print(f"generation batch {bs:>2}: {1 / dt:6.2f} images/s, {dt:6.3f} s/image   vs paper (TITAN RTX) "
                  f"{PAPER_SECONDS_PER_IMAGE:.1f} s/image: {PAPER_SECONDS_PER_IMAGE / dt:5.1f}x   "
                  f"[{gen.record.get('dtype')}, {args.size}px, {args.steps} steps]")
            del gen


def bench_clip(args) -> None:
    import open_clip  # deferred: open_clip
    import torch  # deferred: torch

    from operators.image_clip_gender import ClipGenderClassifier

    with tempfile.TemporaryDirectory() as tmp:
        model = open_clip.create_model("ViT-L-14-quickgelu", pretrained=None)  # the OpenAI weights need QuickGELU
        ckpt = str(Path(tmp) / "vit-l-14-random.pt")
        torch.save(model.state_dict(), ckpt)
        del model
        clf = ClipGenderClassifier(model="ViT-L-14-quickgelu", pretrained=ckpt, device=args.device, batch_size=args.clip_batch,
                                   only_face_ok=False)
        images = torch.rand(args.clip_images, 3, 512, 512, device=args.device)
        clf.classify_tensor(images[: args.clip_batch])
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        clf.classify_tensor(images)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        print(f"clip ViT-L/14 from 512px tensors, micro-batch {args.clip_batch}: {args.clip_images / dt:8.1f} images/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2, help="timed batches per batch size")
    ap.add_argument("--clip-images", type=int, default=512)
    ap.add_argument("--clip-batch", type=int, default=64)
    ap.add_argument("--only", choices=["generation", "clip"])
    args = ap.parse_args()
    if args.only in (None, "generation"):
        bench_generation(args)
    if args.only in (None, "clip"):
        bench_clip(args)


if __name__ == "__main__":
    main()
