"""Cost of the "Stable Diffusion Exposed" per-image object analysis (paper 004, sections 5-6), next to
the cost of generating the image.

``operators.image_prompt_dependency.PromptDependency`` runs inside the triplet generator: the UNet's
cross-attention is recorded while a unit's three images are denoised (``CrossAttentionCapture``), then
``analyse`` makes, per image, the noun set, the DAAM heat maps and word masks of the prompt's nouns, the
objects (GroundingDINO boxes for "prompt nouns + the 249 tags of configs/exposed_tags.txt", split into
several queries of <= 256 tokens as production splits them, class-agnostic NMS, one SAM mask per box)
and the dependency groups. This benchmark times, for ``--units`` triplets (3 images each) at
``--size`` pixels:

  generation (the baseline)  the SD 1.5 UNet (860 M; 320/640/1280/1280, cross-attention 768) evaluated
                             on the unit's latents with classifier-free guidance (batch 2 x 3), random
                             text states (2 x 3, 77, 768); ``--steps`` evaluations are timed and the
                             figure is extrapolated to a ``--gen-steps`` (50) step image. UNet only:
                             the text encoder and the VAE decoder (once per image) are left out.
  attention recording        the same evaluations inside ``CrossAttentionCapture`` (interleaved with
                             the plain ones): the time of the recorder's ``record`` calls (timed
                             inside the loop) and the with-minus-without difference of the UNet
                             calls, both extrapolated to ``--gen-steps`` steps.
  analyse()                  one ``PromptDependency.analyse`` call on the unit's images with the
                             recorded sums, split by timers around the production functions it
                             calls: ``CrossAttentionCapture.heat_maps`` (every layer upsampled to the
                             image, bicubic) and ``attention_masks_torch`` (word masks, ~5 nouns
                             per prompt); ``GroundedSegmenter._detect`` (GroundingDINO, all queries,
                             NMS); ``GroundedSegmenter._segment`` (SAM image embedding + one mask
                             per box); the rest (spaCy nouns, coverage, previews, RLE of every mask,
                             groups).

Models: FULL-SIZE architectures with random weights (the costs are those of the real models, the
outputs meaningless): the SD 1.5 UNet built in memory (diffusers ``UNet2DConditionModel`` with
``unet/config.json`` of runwayml/stable-diffusion-v1-5); GroundingDINO-T
(``IDEA-Research/grounding-dino-tiny``: transformers' ``GroundingDinoConfig`` defaults, i.e. Swin-T,
BERT-base text encoder, 900 queries, 6 + 6 layers; checked below) and SAM ViT-H
(``facebook/sam-vit-huge``: 1280 wide, 32 layers, 16 heads, global attention at 7/15/23/31;
``--sam vit-b`` for ViT-B, much cheaper on a CPU), saved with ``save_pretrained`` with their
checkpoints' image processors (GroundingDINO shortest edge 800 / longest 1333, padded; SAM longest
edge 1024, padded to 1024) and loaded through the production loaders inside ``PromptDependency``
(which raise on any config/weights mismatch). GroundingDINO's tokenizer is a lower-casing BERT
WordPiece over the words used here (bert-base-uncased's vocabulary is a download), with the
special tokens and "." at bert-base-uncased's ids, as ``pipelines/standins/grounding.py`` builds it;
every tag word is one token, as nearly all are in bert-base-uncased. The text encoder is BERT-base
sized (30522 x 768 embeddings, 12 layers).

Objects: with random weights GroundingDINO's token probabilities saturate (most of each query's 900
boxes score 1.0 and pass the 0.25 / 0.2 thresholds: several hundred boxes per image after NMS),
where the real models find on the order of ten objects in a generated image. SAM's mask decoder
runs on every box at once (the image embedding repeated per box), which at hundreds of boxes costs
tens of GB and minutes; so the benchmark keeps the first ``--objects`` (10) boxes of each image's
detection result (by decreasing score, as NMS leaves them) before segmentation (``--objects 0``: no
cap). The detection itself (all forward passes, the thresholds, NMS over all boxes) is timed in
full; the table reports the boxes found and the boxes segmented.

``--smoke`` uses the tiny stand-ins of ``pipelines.standins`` (64 px images) to check the script in
seconds. Warm-up (unless ``--no-warmup``): one UNet evaluation and one ``analyse`` call on one image
before timing (page-in of the memory-mapped weights, kernel selection).

    python benchmarks/bench_exposed_objects.py --smoke
    python benchmarks/bench_exposed_objects.py --steps 1                     # CPU, full size, SAM ViT-H
    python benchmarks/bench_exposed_objects.py --sam vit-b --steps 1
    python benchmarks/bench_exposed_objects.py --device cuda --units 2 --steps 4   # UNet fp16 (dtype auto)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# one triplet (neutral, feminine, masculine), five nouns each
TRIPLET = ("A person holding a cup of coffee at a table in a kitchen",
           "A woman holding a cup of coffee at a table in a kitchen",
           "A man holding a cup of coffee at a table in a kitchen")

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

from benchmarks.bench_fullsize_smoke import SD1_UNET as SD15_UNET  # noqa: E402 -- SD 1.x unet/config.json
# IDEA-Research/grounding-dino-tiny config.json: what GroundingDinoConfig() must give (checked)
GROUNDING_DINO_T = {"num_queries": 900, "d_model": 256, "encoder_layers": 6, "decoder_layers": 6,
                    "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "encoder_attention_heads": 8,
                    "decoder_attention_heads": 8, "encoder_n_points": 4, "decoder_n_points": 4,
                    "num_feature_levels": 4, "max_text_len": 256, "two_stage": True}
SWIN_T = {"embed_dim": 96, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24], "window_size": 7, "patch_size": 4,
          "out_indices": [2, 3, 4]}
BERT_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512}
# facebook/sam-vit-huge and facebook/sam-vit-base config.json vision_config (prompt encoder and mask
# decoder: SamConfig's defaults, the same in both)
SAM_VISION = {
    "vit-h": {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "mlp_dim": 5120,
              "global_attn_indexes": [7, 15, 23, 31]},
    "vit-b": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "mlp_dim": 3072,
              "global_attn_indexes": [2, 5, 8, 11]},
}
SAM_CHECKPOINT = {"vit-h": "facebook/sam-vit-huge", "vit-b": "facebook/sam-vit-base"}
SAM_COMMON = {"output_channels": 256, "image_size": 1024, "patch_size": 16, "window_size": 14, "num_pos_feats": 128,
              "qkv_bias": True, "use_abs_pos": True, "use_rel_pos": True, "layer_norm_eps": 1e-6}
PUBLISHED_PARAMS = {"unet": "859.5 M", "grounding-dino": "172 M", "vit-h": "641 M", "vit-b": "93.7 M"}


def n_params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def _mparams(p: int) -> str:
    return f"{p / 1e6:.1f} M"


def peak_rss_gb() -> float:
    """VmHWM of this process (Linux), GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch  # deferred: torch

        torch.cuda.synchronize()


# --- model builders ----------------------------------------------------------------------------------------


def tokenizer_words() -> list[str]:
    """The stand-in WordPiece vocabulary (pipelines.standins.grounding: special tokens at
    bert-base-uncased's ids, the test words, the default tags) plus the words of TRIPLET."""
    from pipelines.standins.grounding import wordpiece_vocab

    vocab = wordpiece_vocab()
    seen = set(vocab)
    for prompt in TRIPLET:
        for w in re.findall(r"\w+|[^\w\s]", prompt.lower()):
            if w not in seen:
                seen.add(w)
                vocab.append(w)
    return vocab


def build_grounding_dino(directory: Path) -> dict:
    import torch  # deferred: torch
    from transformers import (  # deferred: transformers
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
    )
    from transformers.image_utils import PILImageResampling  # deferred: transformers

    config = GroundingDinoConfig()
    got = {k: getattr(config, k) for k in GROUNDING_DINO_T}
    got.update({k: list(v) if isinstance(v, (list, tuple)) else v
                for k, v in ((k, getattr(config.backbone_config, k)) for k in SWIN_T)})
    got.update({k: getattr(config.text_config, k) for k in BERT_BASE})
    want = {**GROUNDING_DINO_T, **SWIN_T, **BERT_BASE}
    if got != want:
        raise SystemExit(f"GroundingDinoConfig() is not grounding-dino-tiny's: "
                         f"{ {k: (got[k], want[k]) for k in want if got[k] != want[k]} }")
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = GroundingDinoForObjectDetection(config).eval()
    model.save_pretrained(directory)
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(tokenizer_words()) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab_file), do_lower_case=True, model_max_length=512)
    # IDEA-Research/grounding-dino-tiny preprocessor_config.json
    image_processor = GroundingDinoImageProcessor(
        size={"shortest_edge": 800, "longest_edge": 1333}, resample=PILImageResampling.BILINEAR, do_resize=True,
        do_rescale=True, do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, do_pad=True)
    GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(directory)
    (directory / "STANDIN.txt").write_text("GroundingDINO-T architecture (IDEA-Research/grounding-dino-tiny), "
                                           "random weights.\n")
    return {"params": n_params(model), "text_encoder": n_params(model.model.text_backbone),
            "tokenizer_vocab": len(tokenizer)}


def build_sam(directory: Path, kind: str) -> dict:
    import torch  # deferred: torch
    # deferred: transformers
    from transformers import SamConfig, SamImageProcessor, SamModel, SamProcessor, SamVisionConfig
    from transformers.image_utils import PILImageResampling  # deferred: transformers

    directory.mkdir(parents=True, exist_ok=True)
    config = SamConfig(vision_config=SamVisionConfig(**SAM_VISION[kind], **SAM_COMMON).to_dict())
    torch.manual_seed(0)
    model = SamModel(config).eval()
    model.save_pretrained(directory)
    # facebook/sam-vit-huge preprocessor_config.json
    image_processor = SamImageProcessor(
        size={"longest_edge": 1024}, pad_size={"height": 1024, "width": 1024}, mask_size={"longest_edge": 256},
        mask_pad_size={"height": 256, "width": 256}, resample=PILImageResampling.BILINEAR, do_rescale=True,
        do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, do_pad=True, do_convert_rgb=True)
    SamProcessor(image_processor=image_processor).save_pretrained(directory)
    (directory / "STANDIN.txt").write_text(f"SAM {kind} architecture ({SAM_CHECKPOINT[kind]}), random weights.\n")
    return {"params": n_params(model), "vision_encoder": n_params(model.vision_encoder)}


def build_unet(args):
    """(UNet on the device, CLIP tokenizer): SD 1.5's UNet, or with --smoke the tiny stand-in's."""
    import torch  # deferred: torch
    from diffusers import UNet2DConditionModel  # deferred: diffusers

    from pipelines.standins.diffusion import build_clip_tokenizer, build_tiny_stable_diffusion

    torch.manual_seed(0)
    if args.smoke:   # the stand-in's architecture (its weights are random too)
        path = Path(build_tiny_stable_diffusion(Path(args.workdir) / "sd")) / "unet"
        unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(path))
    else:
        unet = UNet2DConditionModel(**SD15_UNET)
    # nn.Module.to: diffusers' own to() warns about fp32-kept modules on any dtype cast (SD's UNet has none)
    unet = torch.nn.Module.to(unet, device=args.device, dtype=args.unet_dtype).eval()
    return unet, build_clip_tokenizer()


# --- timing helpers ------------------------------------------------------------------------------------------


class Timers:
    """Seconds spent in wrapped callables, by name (CUDA-synchronised around each call)."""

    def __init__(self, device: str):
        self.device, self.seconds, self.calls = device, {}, {}

    @contextlib.contextmanager
    def wrap(self, owner, attr: str, name: str):
        """Replace ``owner.attr`` (an instance's method or a module's function) by a timed call of it."""
        inner = getattr(owner, attr)

        def timed(*a, **kw):
            sync(self.device)
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                sync(self.device)
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
                self.calls[name] = self.calls.get(name, 0) + 1

        setattr(owner, attr, timed)
        try:
            yield
        finally:
            if isinstance(owner, types.ModuleType):
                setattr(owner, attr, inner)
            else:
                delattr(owner, attr)  # the instance attribute shadowed the class's method

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def make_images(n: int, size: int, device: str):
    """(n, 3, size, size) float32 in [0, 1]: smooth random fields with fine noise."""
    import torch  # deferred: torch
    import torch.nn.functional as F  # deferred: torch

    g = torch.Generator("cpu").manual_seed(0)
    coarse = torch.rand(n, 3, max(size // 32, 2), max(size // 32, 2), generator=g)
    base = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    return (base + 0.05 * torch.randn(n, 3, size, size, generator=g)).clamp(0, 1).to(device)


# --- the two parts ---------------------------------------------------------------------------------------------


def run_generation(args, out: dict):
    """UNet evaluations with and without the recorder; returns (capture with the recorded sums, tokenizer)."""
    import torch  # deferred: torch
    from diffusers import PNDMScheduler  # deferred: diffusers

    from operators.support.cross_attention import CrossAttentionCapture
    from pipelines.standins.diffusion import SD1_SCHEDULER

    reset_peak_rss()
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    unet, tokenizer = build_unet(args)
    out["unet_build_s"] = time.perf_counter() - t
    out["unet_params"] = n_params(unet)
    n = 3 * args.units
    latent = args.size // 8
    dim = unet.config.cross_attention_dim
    g = torch.Generator("cpu").manual_seed(0)
    latents = torch.randn(2 * n, unet.config.in_channels, latent, latent, generator=g).to(args.device, args.unet_dtype)
    text = torch.randn(2 * n, 77, dim, generator=g).to(args.device, args.unet_dtype)   # [unconditional, conditional]
    scheduler = PNDMScheduler(**SD1_SCHEDULER)
    scheduler.set_timesteps(args.gen_steps)
    timesteps = [scheduler.timesteps[i % len(scheduler.timesteps)] for i in range(args.steps)]
    capture = CrossAttentionCapture(unet, guidance=True)     # = PromptDependency.capture(pipe, guidance=True)
    timers = Timers(args.device)

    def evaluate(ts, batch=slice(None)):
        sync(args.device)
        t0 = time.perf_counter()
        unet(latents[batch], ts, encoder_hidden_states=text[batch]).sample
        sync(args.device)
        return time.perf_counter() - t0

    plain, recorded = [], []
    with torch.no_grad():                                      # as the diffusers pipeline runs its UNet
        if args.warmup:
            out["unet_warmup_s"] = evaluate(timesteps[0], slice(n - 1, n + 1))   # batch 2: one image with CFG
        with timers.wrap(capture, "record", "record"):
            for ts in timesteps:                               # interleaved, so drift hits both alike
                plain.append(evaluate(ts))
                with capture:
                    recorded.append(evaluate(ts))
    out.update(unet_step_s=sum(plain) / len(plain), unet_step_capture_s=sum(recorded) / len(recorded),
               record_s_per_step=timers.seconds["record"] / len(recorded),
               record_calls_per_step=timers.calls["record"] // len(recorded), layers=len(capture.steps),
               unet_step_all=plain, unet_step_capture_all=recorded, generation_peak_rss_gb=peak_rss_gb())
    if args.device.startswith("cuda"):
        out["generation_peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
    capture.unet = None         # the recorder is done with the UNet: free it before the detectors load
    unet = latents = text = None   # noqa: F841 -- dropped for the collector
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return capture, tokenizer


def run_analysis(args, capture, tokenizer, out: dict) -> None:
    import torch  # deferred: torch

    import operators.image_prompt_dependency as dependency_module
    from operators.support.grounding import image_vocabulary, read_tags
    from operators.image_prompt_dependency import PromptDependency
    from schemas.exposed import DETECTION_DETAIL, DETECTION_STATUS, OBJECT_LABELS, PROMPT_NOUNS, DetectionStatus

    reset_peak_rss()
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    dep = PromptDependency(str(Path(args.workdir) / "gdino"), str(Path(args.workdir) / "sam"), device=args.device,
                           dtype=args.detector_dtype, vocabulary=read_tags(), box_threshold=args.box_threshold,
                           text_threshold=args.text_threshold)
    out["analysis_load_s"] = time.perf_counter() - t
    seg = dep.segmenter
    out["detector_params"] = n_params(seg.detector.model)
    out["segmenter_params"] = n_params(seg.segmenter.model)
    out["record"] = {k: seg.detector.record.get(k) for k in ("model_class", "dtype", "preprocessing_on_device")}
    n = 3 * args.units
    prompts = list(TRIPLET) * args.units
    images = make_images(n, args.size, args.device)
    latent_hw = (args.size // 8, args.size // 8)
    nouns = [list(f) for f in dep.nouns(prompts)]
    queries = [seg.queries(image_vocabulary(v, seg.vocabulary)) for v in nouns]
    out["nouns"] = nouns[:3]
    out["vocabulary"] = [len(image_vocabulary(v, seg.vocabulary)) for v in nouns[:3]]
    out["queries"] = [len(q) for q in queries[:3]]
    out["query_tokens"] = [len(q.input_ids) for q in queries[0]]
    saved = {k: v.clone() for k, v in capture.sums.items()}   # analyse() releases the sums: each call gets a copy
    timers = Timers(args.device)
    found: list[int] = []
    detect = seg._detect

    def capped_detect(u8, vocabs):
        """The production detection, then each image's first --objects boxes (module docstring)."""
        res = detect(u8, vocabs)
        found[:] = [len(r[1]) for r in res]
        return [tuple(x[:args.objects] for x in r) for r in res] if args.objects else res

    seg._detect = capped_detect                                  # removed by the timer's wrap on exit

    def analyse(skip=None) -> tuple[dict, float]:
        capture.sums.clear()
        capture.sums.update({k: v.clone() for k, v in saved.items()})
        sync(args.device)
        t0 = time.perf_counter()
        res = dep.analyse(images, prompts, capture, tokenizer, latent_hw, skip)
        sync(args.device)
        return res, time.perf_counter() - t0

    with contextlib.ExitStack() as stack:
        stack.enter_context(timers.wrap(capture, "heat_maps", "heat maps"))
        stack.enter_context(timers.wrap(dependency_module, "attention_masks_torch", "word masks"))
        stack.enter_context(timers.wrap(seg, "_detect", "detection"))
        stack.enter_context(timers.wrap(seg, "_segment", "segmentation"))
        if args.warmup:
            _, out["analyse_warmup_s"] = analyse(skip=[i != 0 for i in range(n)])   # one image
        totals, parts = [], {}
        for _ in range(args.repeats):
            timers.reset()
            res, seconds = analyse()
            totals.append(seconds)
            for k, v in timers.seconds.items():
                parts[k] = parts.get(k, 0.0) + v / args.repeats
    status = res[DETECTION_STATUS]
    if any(s != DetectionStatus.OK for s in status):
        raise SystemExit(f"analyse() did not give ok on every image: {status}; {res[DETECTION_DETAIL]}")
    out["analyse_s"] = sum(totals) / len(totals)
    out["analyse_all"] = totals
    out["parts_s"] = parts
    out["objects"] = [len(x) for x in res[OBJECT_LABELS]]
    out["boxes_found"] = found
    out["sample_labels"] = res[OBJECT_LABELS][0][:8]
    out["prompt_nouns"] = res[PROMPT_NOUNS][:3]
    out["analysis_peak_rss_gb"] = peak_rss_gb()
    dep = None   # noqa: F841
    gc.collect()
    if args.device.startswith("cuda"):
        out["analysis_peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30


# --- report ------------------------------------------------------------------------------------------------------


def table(args, r: dict) -> str:
    n = 3 * args.units
    per_image_gen = r["unet_step_s"] * args.gen_steps / n
    record = r["record_s_per_step"] * args.gen_steps / n
    diff = (r["unet_step_capture_s"] - r["unet_step_s"]) * args.gen_steps / n
    p = r["parts_s"]
    rest = r["analyse_s"] - sum(p.values())
    q = r["queries"][0]
    objects = sum(r["objects"]) / len(r["objects"])
    boxes = sum(r["boxes_found"]) / len(r["boxes_found"])
    sam = "SAM " + ("(tiny)" if args.smoke else args.sam.replace("vit-", "ViT-").upper().replace("VIT", "ViT"))
    gd = "GroundingDINO" + ("" if args.smoke else "-T")
    rows = [
        (f"**generation** (baseline): {'tiny' if args.smoke else 'SD 1.5'} UNet, {args.gen_steps} steps with CFG, extrapolated from "
         f"{args.steps} measured step(s) of batch 2 x {n}", args.gen_steps * r["unet_step_s"], per_image_gen),
        (f"attention recording: `record()` in {r['record_calls_per_step']} attn2 layers per step, "
         f"{args.gen_steps} steps (extrapolated)", args.gen_steps * r["record_s_per_step"], record),
        (f"(attention recording: UNet with capture - without, {args.gen_steps} steps, extrapolated)",
         args.gen_steps * (r["unet_step_capture_s"] - r["unet_step_s"]), diff),
        (f"heat maps: `heat_maps` ({r['layers']} layers -> {args.size}x{args.size}, bicubic)",
         p.get("heat maps", 0.0), p.get("heat maps", 0.0) / n),
        (f"word masks: `attention_masks_torch` ({sum(map(len, r['nouns'])) / len(r['nouns']):.3g} nouns per image)",
         p.get("word masks", 0.0),
         p.get("word masks", 0.0) / n),
        (f"detection: {gd}, {q} queries per image ({'+'.join(map(str, r['query_tokens']))} tokens), NMS "
         f"({boxes:.0f} boxes per image)",
         p.get("detection", 0.0), p.get("detection", 0.0) / n),
        (f"segmentation: {sam}, image embedding + {objects:.0f} boxes per image"
         + (f" (the first {args.objects})" if args.objects else ""),
         p.get("segmentation", 0.0), p.get("segmentation", 0.0) / n),
        ("rest of `analyse`: nouns (spaCy), coverage, previews, RLE of all masks, groups", rest, rest / n),
        ("**analyse()** (all of the above but recording)", r["analyse_s"], r["analyse_s"] / n),
        ("**analysis total**: analyse() + attention recording", r["analyse_s"] + args.gen_steps * r["record_s_per_step"],
         r["analyse_s"] / n + record),
    ]
    lines = ["| stage | images | seconds | s/image | images/s | vs. generation |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, seconds, per_image in rows:
        rate = f"{1 / per_image:.3g}" if per_image > 0 else "-"
        ratio = "1 (baseline)" if name.startswith("**generation") else f"{per_image / per_image_gen:.3g}x"
        lines.append(f"| {name} | {n} | {seconds:.3g} | {per_image:.3g} | {rate} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--units", type=int, default=1, help="triplets (3 images each) generated and analysed together")
    ap.add_argument("--size", type=int, default=512, help="image side in pixels (SD 1.5: 512; latents size/8)")
    ap.add_argument("--steps", type=int, default=2, help="UNet evaluations timed, with and without the recorder")
    ap.add_argument("--gen-steps", type=int, default=50, help="denoising steps of the image the figures extrapolate to")
    ap.add_argument("--sam", choices=sorted(SAM_VISION), default="vit-h", help="SAM image encoder (paper: ViT-H)")
    ap.add_argument("--repeats", type=int, default=1, help="timed analyse() calls")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the warm-up UNet evaluation and analyse() call on one image")
    ap.add_argument("--objects", type=int, default=10,
                    help="boxes of each image handed to SAM (the first by score; 0: all; module docstring)")
    ap.add_argument("--box-threshold", type=float, default=0.25, help="GroundingDINO box threshold (the demo's)")
    ap.add_argument("--text-threshold", type=float, default=0.2, help="GroundingDINO text threshold (the demo's)")
    ap.add_argument("--unet-dtype", choices=("auto", "float32", "float16", "bfloat16"), default="auto",
                    help="auto: float16 on CUDA (as the generator's dtype auto), float32 on CPU")
    ap.add_argument("--detector-dtype", choices=("auto", "float32", "float16", "bfloat16"), default="auto",
                    help="PromptDependency dtype (auto: float32 everywhere, as production)")
    ap.add_argument("--smoke", action="store_true", help="tiny stand-in models (pipelines.standins), 64 px")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--workdir", help="where the detectors are saved (default: a temporary directory, removed after)")
    args = ap.parse_args()
    if args.objects < 0:
        ap.error("--objects must be >= 0")
    if min(args.units, args.steps, args.gen_steps, args.repeats) < 1:
        ap.error("--units, --steps, --gen-steps and --repeats must be >= 1")
    if args.smoke and args.size == 512:
        args.size = 64                   # the tiny UNet's 8 x 8 latents
    if args.size % 8:
        ap.error("--size must be a multiple of 8")

    import torch  # deferred: torch

    from operators.support.models import resolve_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    with contextlib.suppress(ImportError):   # no "Loading weights" bars in the log
        from transformers.utils import logging as hf_logging  # deferred: transformers

        hf_logging.disable_progress_bar()
    args.unet_dtype = resolve_dtype(args.unet_dtype, args.device, cuda_auto="float16")
    t0 = time.perf_counter()
    own = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="exposed-objects-")
    r: dict = {}
    try:
        t = time.perf_counter()
        if args.smoke:
            from pipelines.standins.grounding import build_tiny_grounding_dino, build_tiny_sam

            build_tiny_grounding_dino(Path(args.workdir) / "gdino")
            build_tiny_sam(Path(args.workdir) / "sam")
        else:
            b = build_grounding_dino(Path(args.workdir) / "gdino")
            print(f"GroundingDINO-T: {_mparams(b['params'])} parameters (published {PUBLISHED_PARAMS['grounding-dino']}), "
                  f"BERT-base text encoder {_mparams(b['text_encoder'])}, stand-in WordPiece vocabulary of "
                  f"{b['tokenizer_vocab']} tokens", flush=True)
            gc.collect()
            b = build_sam(Path(args.workdir) / "sam", args.sam)
            print(f"SAM {args.sam}: {_mparams(b['params'])} parameters (published {PUBLISHED_PARAMS[args.sam]}), "
                  f"image encoder {_mparams(b['vision_encoder'])}", flush=True)
            gc.collect()
        print(f"detectors built and saved in {time.perf_counter() - t:.1f} s", flush=True)
        capture, tokenizer = run_generation(args, r)
        print(f"UNet: {_mparams(r['unet_params'])} parameters"
              + ("" if args.smoke else f" (published {PUBLISHED_PARAMS['unet']})")
              + f", built in {r['unet_build_s']:.1f} s; per step (batch 2 x {3 * args.units}): "
              f"{[round(x, 3) for x in r['unet_step_all']]} s plain, "
              f"{[round(x, 3) for x in r['unet_step_capture_all']]} s with the recorder "
              f"({r['record_calls_per_step']} record() calls per step, {r['record_s_per_step']:.3g} s); "
              f"peak RSS {r['generation_peak_rss_gb']:.2f} GB"
              + (f", peak CUDA {r['generation_peak_cuda_gb']:.2f} GB" if "generation_peak_cuda_gb" in r else ""),
              flush=True)
        run_analysis(args, capture, tokenizer, r)
        print(f"detectors loaded in {r['analysis_load_s']:.1f} s: {_mparams(r['detector_params'])} + "
              f"{_mparams(r['segmenter_params'])} parameters, {r['record']}", flush=True)
        print(f"prompt nouns {r['prompt_nouns']}; vocabulary per image {r['vocabulary']}; GroundingDINO queries "
              f"per image {r['queries']} ({r['query_tokens']} tokens); boxes found per image {r['boxes_found']}, "
              f"objects (segmented) per image {r['objects']} "
              f"(e.g. {r['sample_labels']})", flush=True)
        print(f"analyse() per call: {[round(x, 2) for x in r['analyse_all']]} s"
              + (f" (warm-up on one image {r['analyse_warmup_s']:.2f} s)" if args.warmup else "")
              + f"; parts {({k: round(v, 3) for k, v in r['parts_s'].items()})}; peak RSS "
              f"{r['analysis_peak_rss_gb']:.2f} GB"
              + (f", peak CUDA {r['analysis_peak_cuda_gb']:.2f} GB" if "analysis_peak_cuda_gb" in r else ""),
              flush=True)
    finally:
        if own:
            shutil.rmtree(args.workdir, ignore_errors=True)
    models = ("tiny stand-ins (--smoke)" if args.smoke else
              f"full-size random-weight models (SD 1.5 UNet {str(args.unet_dtype).replace('torch.', '')}, "
              f"GroundingDINO-T + SAM {args.sam}, detectors {args.detector_dtype})")
    print(f"\n== {models}, device {args.device}, {args.units} unit(s) = {3 * args.units} images of "
          f"{args.size}x{args.size}, torch threads {torch.get_num_threads()}, {args.repeats} timed analyse() "
          f"call(s){' after a one-image warm-up' if args.warmup else ''}\n")
    print(table(args, r))
    print(f"\ngeneration and recording: measured per UNet evaluation (batch 2 x {3 * args.units}: classifier-free "
          f"guidance) and multiplied by {args.gen_steps} steps; the text encoder and the VAE decoder are not "
          f"included. vs. generation = s/image over the baseline's s/image.")
    print(f"wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
