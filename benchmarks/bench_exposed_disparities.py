"""Throughput of the "Stable Diffusion Exposed" image-space disparity heads (paper 004, section 4).

Each head runs inside the triplet generator on whole units (neutral, feminine, masculine images)
while they are on the generator's device (``operators.support.disparity``). This benchmark loads
every head through its production operator and times ``triplet_similarities`` on random units:

  ssim           SsimDisparity: SSIM and Diff. Pix. (no model)
  resnet         BackboneDisparity(space=resnet): ResNet-50 logits (microsoft/resnet-50 architecture)
  dino           BackboneDisparity(space=dino): DINO ViT-S/16 class token (facebook/dino-vits16)
  split-product  SplitProductDisparity: DINO ViT-B/8 patch tokens (facebook/dino-vitb8)
  clip           ClipImageEmbedder.triplet_similarities: CLIP ViT-B/32 with QuickGELU (OpenAI's)

Models: FULL-SIZE architecture-identical models with random weights, built in a temporary
directory and saved the way the production loaders read them (transformers ``save_pretrained``
with the checkpoints' image-processor configs; open_clip ``local-dir:`` with
open_clip_config.json + safetensors, as ``pipelines/standins/clip.py`` writes). The weights are
random, so the similarities are meaningless; the cost is that of the real models. ``--smoke``
uses the tiny stand-ins of ``pipelines.standins`` instead (seconds, for CI-like checks).

Two ways of computing the same features, side by side:

  batched   all ``--units`` units in one ``triplet_similarities`` call, the network seeing up to
            ``--batch-size`` images per forward pass (configs/exposed.yaml: 32), as the generator
            hands a micro-batch of units to its heads;
  per unit  the baseline: the head called on one unit at a time with its network batch size set to 1,
            so every forward pass sees a single image (three passes per unit); SSIM has no network,
            so its baseline is only the one-unit-per-call loop.

Both are timed after one warm-up call of their own; the script checks they give the same
similarities. Each head runs in its own subprocess (as does each model build), so peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is that head's: the per-unit row's peak covers
loading and the per-unit runs, the batched row's (measured after it, the peak cannot be reset)
loading and both. On CUDA the allocator's peak of each mode is reported too.

Units: ``--images structured`` (default) makes each unit's neutral image a random smooth field
with fine noise and the feminine / masculine images the same image with one random rectangle
redrawn, roughly what the same seed gives under three prompts: SSIM's Diff. Pix. cost (hole
filling) depends on the image content; the networks' costs do not. ``--images noise`` draws
every pixel uniformly.

    python benchmarks/bench_exposed_disparities.py --units 4                 # CPU, full size
    python benchmarks/bench_exposed_disparities.py --device cuda --units 16
    python benchmarks/bench_exposed_disparities.py --smoke --heads ssim dino
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_child_process_arguments, save_open_clip  # noqa: E402

HEADS = ("ssim", "resnet", "dino", "split-product", "clip")
HEAD_MODEL = {"ssim": None, "resnet": "resnet-50", "dino": "dino-vits16", "split-product": "dino-vitb8",
              "clip": "clip-b32"}
RESULT = "RESULT "

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]

# microsoft/resnet-50 config.json (transformers ResNetConfig's defaults are ResNet-50's, but
# num_labels defaults to 2: the checkpoint has the 1000 ImageNet classes)
RESNET50 = {"num_channels": 3, "embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048], "depths": [3, 4, 6, 3],
            "layer_type": "bottleneck", "hidden_act": "relu", "downsample_in_first_stage": False,
            "num_labels": 1000}
# facebook/dino-vits16 and facebook/dino-vitb8 config.json (ViTModel, saved without pooler)
DINO_VIT = {
    "dino-vits16": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
                    "patch_size": 16, "image_size": 224},
    "dino-vitb8": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                   "patch_size": 8, "image_size": 224},
}
DINO_COMMON = {"num_channels": 3, "qkv_bias": True, "layer_norm_eps": 1e-6, "hidden_act": "gelu",
               "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
# open_clip's ViT-B-32 model config with QuickGELU, as OpenAI trained it (= its ViT-B-32-quickgelu.json)
CLIP_B32 = {"embed_dim": 512, "quick_gelu": True,
            "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 32},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12}}
# what the published models have, for the check printed with the parameter counts
PUBLISHED_PARAMS = {"resnet-50": "25.6 M", "dino-vits16": "21.7 M", "dino-vitb8": "85.8 M", "clip-b32": "151.3 M"}


def n_params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


# --- builders (each in its own subprocess) ------------------------------------------------------------------


def build_resnet50(directory: Path) -> dict:
    import torch  # deferred: torch
    from transformers import (  # deferred: transformers
        ConvNextImageProcessor,
        ResNetConfig,
        ResNetForImageClassification,
    )
    from transformers.image_utils import PILImageResampling  # deferred: transformers

    defaults = ResNetConfig()
    checked = {k: getattr(defaults, k) for k in ("layer_type", "depths", "hidden_sizes", "embedding_size")}
    checked = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in checked.items()}
    assert checked == {k: RESNET50[k] for k in checked}, f"ResNetConfig() is not ResNet-50: {checked}"
    config = ResNetConfig(**RESNET50)
    torch.manual_seed(0)
    model = ResNetForImageClassification(config).eval()
    model.save_pretrained(directory)
    # microsoft/resnet-50 preprocessor_config.json: ConvNeXt's processor, shortest edge 224 with crop_pct
    # 0.875 (resize to 256, center crop 224), bicubic, ImageNet mean and std
    ConvNextImageProcessor(size={"shortest_edge": 224}, crop_pct=0.875, resample=PILImageResampling.BICUBIC,
                           do_resize=True, do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN,
                           image_std=IMAGENET_STD).save_pretrained(directory)
    (directory / "STANDIN.txt").write_text("ResNet-50 architecture (microsoft/resnet-50), random weights.\n")
    return {"params": n_params(model), "config": {k: getattr(config, k) for k in
                                                  ("layer_type", "depths", "hidden_sizes", "num_labels")},
            "ResNetConfig() defaults": checked}


def build_dino(directory: Path, key: str) -> dict:
    import torch  # deferred: torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel  # deferred: transformers
    from transformers.image_utils import PILImageResampling  # deferred: transformers

    config = ViTConfig(**DINO_VIT[key], **DINO_COMMON)
    torch.manual_seed(0)
    model = ViTModel(config, add_pooling_layer=False).eval()  # the DINO checkpoints have no pooler
    model.save_pretrained(directory)
    # facebook/dino-vit* preprocessor_config.json: resize to 224 x 224, bilinear (resample 2), ImageNet mean/std
    # (as pipelines/standins/vision.py's DINO stand-ins)
    ViTImageProcessor(size={"height": 224, "width": 224}, resample=PILImageResampling.BILINEAR, do_resize=True,
                      do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN,
                      image_std=IMAGENET_STD).save_pretrained(directory)
    (directory / "STANDIN.txt").write_text(f"DINO {key} architecture (facebook/{key}), random weights.\n")
    return {"params": n_params(model), "config": {k: getattr(config, k) for k in
                                                  ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                   "intermediate_size", "patch_size", "image_size")}}


def build_clip_b32(directory: Path) -> dict:
    import open_clip  # deferred: open_clip
    import torch  # deferred: torch

    cfg = json.loads(json.dumps(CLIP_B32))
    bundled = open_clip.get_model_config("ViT-B-32")
    if bundled is not None and {**bundled, "quick_gelu": True} != cfg:
        raise SystemExit(f"open_clip's ViT-B-32 config differs from the one written here: {bundled}")
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**cfg)
    save_open_clip(model, cfg, directory, OPENAI_MEAN, OPENAI_STD,
                   "open_clip ViT-B-32 (QuickGELU) architecture, random weights; outputs are meaningless")
    return {"params": n_params(model), "visual_params": n_params(model.visual),
            "config": "open_clip ViT-B-32 + quick_gelu (= ViT-B-32-quickgelu)"}


def build_smoke(directory: Path, key: str) -> dict:
    from pipelines.standins.clip import build_tiny_open_clip
    from pipelines.standins.vision import build_tiny_dino, build_tiny_resnet

    if key == "resnet-50":
        build_tiny_resnet(directory)
    elif key == "dino-vits16":
        build_tiny_dino(directory, patch_size=16)
    elif key == "dino-vitb8":
        build_tiny_dino(directory, patch_size=8)
    else:
        build_tiny_open_clip(directory)
    return {"config": "tiny stand-in (pipelines.standins)"}


def build(args, key: str) -> dict:
    directory = Path(args.workdir) / key
    directory.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        return build_smoke(directory, key)
    if key == "resnet-50":
        return build_resnet50(directory)
    if key in DINO_VIT:
        return build_dino(directory, key)
    return build_clip_b32(directory)


# --- runs through the production operators ------------------------------------------------------------------


def make_units(units: int, size: int, kind: str, device: str):
    """(U, 3, 3, size, size) float32 images in [0, 1] on ``device`` (module docstring)."""
    import torch  # deferred: torch
    import torch.nn.functional as F  # deferred: torch

    g = torch.Generator("cpu").manual_seed(0)
    if kind == "noise":
        return torch.rand(units, 3, 3, size, size, generator=g).to(device)
    coarse = torch.rand(units, 3, max(size // 32, 2), max(size // 32, 2), generator=g)
    base = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    base = (base + 0.05 * torch.randn(units, 3, size, size, generator=g)).clamp(0, 1)
    out = base.unsqueeze(1).repeat(1, 3, 1, 1, 1)
    for u in range(units):
        for v in (1, 2):  # feminine, masculine: one rectangle redrawn
            h, w = (int(x) for x in torch.randint(size // 8, size // 2, (2,), generator=g))
            top, left = (int(x) for x in torch.randint(0, size - max(h, w), (2,), generator=g))
            patch = torch.rand(3, 1, 1, generator=g) * 0.5 + 0.5 * torch.rand(3, h, w, generator=g)
            out[u, v, :, top:top + h, left:left + w] = patch
    return out.contiguous().to(device)


def load_head(args, name: str):
    from operators.image_backbone_disparity import BackboneDisparity
    from operators.image_clip_embedding import ClipImageEmbedder
    from operators.image_split_product import SplitProductDisparity
    from operators.image_ssim_disparity import SsimDisparity
    from schemas.exposed import Space

    model = None if HEAD_MODEL[name] is None else str(Path(args.workdir) / HEAD_MODEL[name])
    if name == "ssim":
        return SsimDisparity(device=args.device), None
    if name == "resnet":
        head = BackboneDisparity(space=Space.RESNET, model=model, device=args.device, batch_size=args.batch_size)
        return head, head.bundle.model
    if name == "dino":
        head = BackboneDisparity(space=Space.DINO, model=model, device=args.device, batch_size=args.batch_size)
        return head, head.bundle.model
    if name == "split-product":
        head = SplitProductDisparity(model=model, device=args.device, batch_size=args.batch_size)
        return head, head.bundle.model
    head = ClipImageEmbedder(model=f"local-dir:{model}", pretrained=None, device=args.device,
                             batch_size=args.batch_size)
    return head, head.bundle.model


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch  # deferred: torch

        torch.cuda.synchronize()


def timed(args, fn) -> float:
    """Seconds per call of ``fn`` (mean of --repeats calls, after one warm-up call)."""
    fn()
    _sync(args.device)
    t = time.perf_counter()
    for _ in range(args.repeats):
        fn()
    _sync(args.device)
    return (time.perf_counter() - t) / args.repeats


def run(args, name: str) -> dict:
    import numpy as np
    import torch  # deferred: torch

    out: dict = {"head": name, "device": args.device, "torch_threads": torch.get_num_threads()}
    cuda = args.device.startswith("cuda")
    t = time.perf_counter()
    head, net = load_head(args, name)
    _sync(args.device)
    out["load_s"] = round(time.perf_counter() - t, 2)
    out["spaces"] = list(head.spaces)
    if net is not None:
        out["params"] = n_params(net)
        if name == "clip":
            out["visual_params"] = n_params(net.visual)
        rec = head.record
        out["record"] = {k: rec.get(k) for k in ("model_class", "activation", "resize", "resize_size", "crop_pct",
                                                 "interpolation", "crop_size", "image_size", "resize_mode",
                                                 "grid", "n_chunks", "standin") if rec.get(k) is not None}
    images = make_units(args.units, args.size, args.images, args.device)
    units = images.shape[0]

    # per unit, network batch 1 (first, so that the peak RSS read after it is its own)
    network_batch = getattr(head, "batch_size", None)
    if network_batch is not None:
        head.batch_size = 1
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    per_unit_results: list = []

    def per_unit():
        per_unit_results.clear()
        for u in range(units):
            per_unit_results.append(head.triplet_similarities(images[u:u + 1]))

    with torch.inference_mode():
        s = timed(args, per_unit)
    out["per_unit"] = {"seconds_per_call_of_all_units": s, "network_batch": 1 if network_batch else None,
                       "peak_rss": peak_rss_bytes(),
                       **({"peak_cuda": torch.cuda.max_memory_allocated()} if cuda else {})}

    # batched: all units in one call, the configured network batch
    if network_batch is not None:
        head.batch_size = network_batch
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    batched_result: dict = {}

    def batched():
        batched_result.clear()
        batched_result.update(head.triplet_similarities(images))

    with torch.inference_mode():
        s = timed(args, batched)
    out["batched"] = {"seconds_per_call_of_all_units": s, "network_batch": network_batch,
                      "images_per_forward": min(network_batch, 3 * units) if network_batch else None,
                      "peak_rss": peak_rss_bytes(),
                      **({"peak_cuda": torch.cuda.max_memory_allocated()} if cuda else {})}

    diff = 0.0
    for space, values in batched_result.items():
        stacked = np.concatenate([r[space] for r in per_unit_results])
        assert values.shape == (units, 3) and stacked.shape == (units, 3), (values.shape, stacked.shape)
        diff = max(diff, float(np.nanmax(np.abs(values - stacked))))
    out["max_abs_diff_batched_vs_per_unit"] = diff
    out["sample"] = {space: [round(float(x), 4) for x in v[0]] for space, v in batched_result.items()}
    return out


# --- child / driver ------------------------------------------------------------------------------------------


def child(args) -> None:
    import torch  # deferred: torch

    if args.threads:
        torch.set_num_threads(args.threads)
    try:  # no "Loading weights" / "Writing model shards" bars in the log
        from transformers.utils import logging as hf_logging  # deferred: transformers

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    kind, what = args.stage.split(":", 1)
    t = time.perf_counter()
    out = build(args, what) if kind == "build" else run(args, what)
    out.update(stage=args.stage, seconds=round(time.perf_counter() - t, 2), peak_rss_process=peak_rss_bytes())
    print(RESULT + json.dumps(out, default=str), flush=True)


def subprocess_stage(args, stage: str) -> dict | None:
    cmd = [sys.executable, __file__, "--stage", stage, "--workdir", args.workdir, "--device", args.device,
           "--units", str(args.units), "--size", str(args.size), "--batch-size", str(args.batch_size),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--images", args.images]
    if args.smoke:
        cmd.append("--smoke")
    print(f"== {stage}", flush=True)
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
        elif line.strip():
            print("  " + line, flush=True)
    if proc.returncode != 0 or result is None:
        print(f"  FAILED (exit {proc.returncode})", flush=True)
        return None
    return result


def _gb(b) -> str:
    return f"{b / 2**30:.2f} GB"


def _mparams(p) -> str:
    if not p:
        return "-"
    return f"{p / 1e6:.1f} M" if p >= 1e6 else f"{p / 1e3:.1f} k"


def table(args, runs: list[dict]) -> str:
    cuda = args.device.startswith("cuda")
    cols = (["head", "spaces", "params", "mode", "units/s", "images/s", "s/unit", "speed-up", "peak RSS"]
            + (["peak CUDA"] if cuda else []))
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in runs:
        params = _mparams(r.get("params"))
        if r.get("visual_params"):
            params += f" (visual {_mparams(r['visual_params'])})"
        ratio = r["per_unit"]["seconds_per_call_of_all_units"] / r["batched"]["seconds_per_call_of_all_units"]
        for mode in ("batched", "per_unit"):
            m = r[mode]
            s_unit = m["seconds_per_call_of_all_units"] / args.units
            if mode == "batched":
                label = (f"batched: {args.units} units/call, network batch {m['images_per_forward']}"
                         if m["network_batch"] else f"batched: {args.units} units/call")
            else:
                label = ("per unit: 1 unit/call, network batch 1 (3 passes/unit)" if m["network_batch"]
                         else "per unit: 1 unit/call")
            row = [r["head"], "+".join(r["spaces"]), params, label, f"{1 / s_unit:.3g}", f"{3 / s_unit:.3g}",
                   f"{s_unit:.3g}", f"{ratio:.2f}x" if mode == "batched" else "1 (baseline)", _gb(m["peak_rss"])] + ([_gb(m.get("peak_cuda", 0))] if cuda else [])
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where the images and heads are")
    ap.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS))
    ap.add_argument("--units", type=int, default=4, help="units (3 images each) per batched call")
    ap.add_argument("--size", type=int, default=512, help="image side in pixels (SD 1.x: 512)")
    ap.add_argument("--batch-size", type=int, default=32, help="network batch of the batched mode (configs/exposed.yaml)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per mode, after one warm-up call")
    ap.add_argument("--images", choices=("structured", "noise"), default="structured")
    ap.add_argument("--smoke", action="store_true", help="tiny stand-in models (pipelines.standins) instead of full size")
    add_child_process_arguments(ap)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.units < 1 or args.repeats < 1 or args.batch_size < 1:
        ap.error("--units, --repeats and --batch-size must be >= 1")
    if args.stage:
        return child(args)

    t0 = time.perf_counter()
    own = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="exposed-disparities-")
    builds, runs, failed = [], [], []
    try:
        for name in args.heads:
            key = HEAD_MODEL[name]
            if key is not None:
                b = subprocess_stage(args, f"build:{key}")
                if b is None:
                    failed.append(f"build:{key}")
                    continue
                builds.append(b)
                print(f"  {key}: {_mparams(b.get('params'))} parameters"
                      + (f" (visual tower {_mparams(b['visual_params'])})" if b.get("visual_params") else "")
                      + ("" if args.smoke else f", published {PUBLISHED_PARAMS[key]}")
                      + f"; {b.get('config')}; built in {b['seconds']} s", flush=True)
            r = subprocess_stage(args, f"run:{name}")
            if r is None:
                failed.append(f"run:{name}")
            else:
                runs.append(r)
                print(f"  loaded in {r['load_s']} s; {r.get('record', {})}", flush=True)
                print(f"  batched vs per-unit max |diff| {r['max_abs_diff_batched_vs_per_unit']:.3g}; "
                      f"unit 0: {r['sample']}", flush=True)
            if key is not None:
                shutil.rmtree(Path(args.workdir) / key, ignore_errors=True)
    finally:
        if own:
            shutil.rmtree(args.workdir, ignore_errors=True)
    threads = runs[0]["torch_threads"] if runs else "?"
    print(f"\n== {'tiny stand-ins (--smoke)' if args.smoke else 'full-size random-weight models'}, device "
          f"{args.device}, {args.units} units of 3 x {args.size}x{args.size} ({args.images}), torch threads {threads}, "
          f"mean of {args.repeats} timed call(s) after a warm-up\n")
    print(table(args, runs))
    print("\nper unit = the baseline: triplet_similarities on one unit at a time, networks run one image per forward "
          "pass; speed-up = per-unit time / batched time;\npeak RSS of the per-unit row: load + per-unit runs; "
          "of the batched row: the process peak (both).")
    print(f"wall {time.perf_counter() - t0:.1f} s")
    if failed:
        print(f"FAILED: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
