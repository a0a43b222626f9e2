"""Full-size architectures with random weights, through the production operators (a smoke run, not a test).

Each default model of the three studies is built with its published configuration and random
weights, saved the way its library saves it, loaded back through the production loader and given
one small batch:

  clip-l14  open_clip ViT-L/14 with QuickGELU (OpenAI's architecture; papers 002 and 001), saved as
            a local-dir model (open_clip_config.json + safetensors, as pipelines/standins/clip.py
            writes), loaded by operators.support.clip.load_clip, ClipGenderClassifier.classify_tensor
  clip-b32  open_clip ViT-B/32 with QuickGELU (DALL-Eval's CLIP gender alternative), the same way,
            with the DALL-Eval prompts and the 0.5 (argmax) threshold
  sd        Stable Diffusion 1.4/1.5 (UNet 860M, VAE, CLIP ViT-L/14 text tower, PNDM with the SD v1
            settings, the real CLIP tokenizer, and with --safety-checker model-default the real-size
            StableDiffusionSafetyChecker as paper002.yaml keeps it), saved with save_pretrained, loaded
            by operators.support.diffusion.load_text2image inside ImageGenerator, with the ViT-L/14
            gender head on the generator's output as pipelines/studies/amplification/images.py runs it
  blip2     BLIP-2 Flan-T5-XL (Salesforce/blip2-flan-t5-xl): the ViT-g vision tower (39 layers, 1408
            wide), the Q-Former (32 queries) and a Flan-T5 with the XL widths but only --t5-layers
            encoder and decoder layers (24 each would be ~3.9B parameters, ~16 GB in float32, more
            than this benchmark's ~12 GB budget), saved with save_pretrained with a Blip2Processor,
            loaded by operators.support.blip2_models.load_blip2 inside Blip2Detector, asked the
            DALL-Eval gender question and the 15 attribute questions of configs/dalleval.yaml.
            The tokenizer is the stand-in's word-level one (T5's SentencePiece model is a download).

Every build and every run is its own subprocess, so each peak memory figure is that stage's alone
(Linux VmHWM, reset between phases through /proc/self/clear_refs; on CUDA also the allocator's
peak). Per model it prints parameter counts, the shapes and dtypes each network saw and returned
(forward hooks on the production objects), seconds per phase and peak memory. The weights are
random, so the outputs are meaningless; costs are those of the real models.

  python benchmarks/bench_fullsize_smoke.py --device cpu --size 256 --batch 2 --steps 1
  python benchmarks/bench_fullsize_smoke.py --device cuda          # fp16 SD / CLIP, bf16 BLIP-2 (dtype auto)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_child_process_arguments  # noqa: E402

MODELS = ("clip-l14", "clip-b32", "sd", "blip2")
RESULT = "RESULT "

# --- published configurations ------------------------------------------------------------------------

# CompVis/stable-diffusion-v1-4 and stable-diffusion-v1-5 (identical architectures): unet/config.json
SD1_UNET = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False,
    "flip_sin_to_cos": True, "freq_shift": 0, "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": 768, "attention_head_dim": 8,
}
# vae/config.json
SD1_VAE = {
    "sample_size": 512, "in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "act_fn": "silu", "norm_num_groups": 32, "scaling_factor": 0.18215,
    "block_out_channels": (128, 256, 512, 512),
    "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
}
# text_encoder/config.json: the text tower of openai/clip-vit-large-patch14 (its published token ids)
SD1_TEXT = {
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5, "projection_dim": 768, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
}
# safety_checker/config.json: CLIP ViT-L/14 vision tower, projection 768
SD1_SAFETY_VISION = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "image_size": 224, "patch_size": 14, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
}

# open_clip model configs of OpenAI's CLIPs (model_configs/ViT-L-14-quickgelu.json, ViT-B-32-quickgelu.json):
# OpenAI trained them with QuickGELU, x * sigmoid(1.702 x)
CLIP_CFGS = {
    "clip-l14": {"embed_dim": 768, "quick_gelu": True,
                 "vision_cfg": {"image_size": 224, "layers": 24, "width": 1024, "patch_size": 14},
                 "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 768, "heads": 12, "layers": 12}},
    "clip-b32": {"embed_dim": 512, "quick_gelu": True,
                 "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 32},
                 "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12}},
}
CLIP_NAMES = {"clip-l14": "ViT-L-14-quickgelu", "clip-b32": "ViT-B-32-quickgelu"}

# Salesforce/blip2-flan-t5-xl config.json
BLIP2_VISION = {"hidden_size": 1408, "intermediate_size": 6144, "num_hidden_layers": 39, "num_attention_heads": 16,
                "image_size": 224, "patch_size": 14, "hidden_act": "gelu", "layer_norm_eps": 1e-6, "qkv_bias": True}
BLIP2_QFORMER = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "cross_attention_frequency": 2, "encoder_hidden_size": 1408, "vocab_size": 30522,
                 "max_position_embeddings": 512, "hidden_act": "gelu", "layer_norm_eps": 1e-12}
BLIP2_QUERY_TOKENS = 32
FLAN_T5_XL = {"vocab_size": 32128, "d_model": 2048, "d_kv": 64, "d_ff": 5120, "num_layers": 24,
              "num_decoder_layers": 24, "num_heads": 32, "feed_forward_proj": "gated-gelu",
              "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6,
              "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "dropout_rate": 0.0}
OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]


# --- measuring ----------------------------------------------------------------------------------------------


def _proc_status(key: str) -> int | None:
    """VmRSS / VmHWM of this process in bytes (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the next peak is one phase's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    hwm = _proc_status("VmHWM")
    if hwm is not None:
        return hwm
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


class Phase:
    """Seconds, peak RSS (and peak CUDA memory) of one phase of a stage."""

    def __init__(self, name: str, device: str, out: dict):
        self.name, self.device, self.out = name, device, out

    def __enter__(self):
        import torch  # deferred: torch

        self.reset = _reset_peak()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch  # deferred: torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        rec = {"seconds": round(time.perf_counter() - self.t, 1), "peak_rss_gb": round(_peak_rss() / 2**30, 2),
               "rss_after_gb": round((_proc_status("VmRSS") or 0) / 2**30, 2), "peak_is_phase_only": self.reset}
        if self.device.startswith("cuda"):
            rec["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        self.out[self.name] = rec
        print(f"  [{self.name}] {rec}", flush=True)
        return False


def _describe(x):
    """Shapes and dtypes of the tensors in a (nested) value, None where there are none."""
    import torch  # deferred: torch

    if torch.is_tensor(x):
        return f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"
    if isinstance(x, dict):
        d = {k: _describe(v) for k, v in x.items()}
        d = {k: v for k, v in d.items() if v is not None}
        return d or None
    if isinstance(x, (list, tuple)):
        d = [v for v in (_describe(v) for v in x) if v is not None]
        return (d[0] if len(d) == 1 else d) or None
    return None


def watch(modules: dict, io: dict) -> list:
    """Forward hooks recording each module's first inputs/outputs (shape, dtype) and its call count
    (hooks are removed after the first run, so the counts are one call's)."""
    handles = []
    for name, module in modules.items():
        if module is None:
            continue

        def hook(mod, args, kwargs, output, name=name):
            rec = io.setdefault(name, {"calls": 0})
            rec["calls"] += 1
            if rec["calls"] == 1:
                rec["in"] = _describe({**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs})
                rec["out"] = _describe(output)

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return handles


def unwatch(handles: list) -> None:
    while handles:
        handles.pop().remove()


def n_params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def activations(module) -> list[str]:
    """Class names of the GELU-family activations a network is built with."""
    return sorted({type(m).__name__ for m in module.modules() if "gelu" in type(m).__name__.lower()})


def run_phases(args) -> list[str]:
    """The first call pages the memory-mapped weights in (and on CUDA picks kernels); later ones are warm."""
    return ["run"] + [f"run warm {i}" for i in range(1, args.repeats)]


def run_head(args, head, parts: dict, out: dict):
    """Push the benchmark images through a device head (``classify_tensor``) once per phase,
    recording the shapes and dtypes ``parts`` see; returns (io record, last result)."""
    import torch  # deferred: torch

    io: dict = {}
    hooks = watch(parts, io)
    images = images_for(args)
    io["input images"] = _describe(images)
    for phase in run_phases(args):
        with Phase(phase, args.device, out), torch.inference_mode():
            res = head.classify_tensor(images)
        unwatch(hooks)
    return io, res


def images_for(args):
    """The (B, 3, size, size) float images in [0, 1] a generator hands its heads, on the device."""
    import torch  # deferred: torch

    g = torch.Generator("cpu").manual_seed(0)
    return torch.rand(args.batch, 3, args.size, args.size, generator=g).to(args.device)


# --- builders (each runs in its own subprocess) ------------------------------------------------------------


def build_clip(args, key: str, out: dict) -> None:
    import open_clip  # deferred: open_clip
    import safetensors.torch  # deferred: safetensors

    cfg = json.loads(json.dumps(CLIP_CFGS[key]))
    bundled = open_clip.get_model_config(CLIP_NAMES[key])  # the same values, as open_clip ships them
    if bundled is not None and any(bundled.get(k) != v for k, v in cfg.items()):
        print(f"  note: open_clip's {CLIP_NAMES[key]} config differs from the one written here: {bundled}")
    directory = Path(args.workdir) / key
    directory.mkdir(parents=True, exist_ok=True)
    with Phase("build", "cpu", out):
        model = open_clip.model.CLIP(**cfg)
    out["params"] = n_params(model)
    with Phase("save", "cpu", out):
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(state, str(directory / "open_clip_model.safetensors"))
        (directory / "open_clip_config.json").write_text(json.dumps({
            "model_cfg": cfg,
            "preprocess_cfg": {"mean": OPENAI_MEAN, "std": OPENAI_STD, "interpolation": "bicubic",
                               "resize_mode": "shortest"},
            "standin": f"{CLIP_NAMES[key]} architecture, random weights; outputs are meaningless",
        }, indent=2))


def build_sd(args, out: dict) -> None:
    import torch  # deferred: torch
    # deferred: diffusers
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPTextConfig, CLIPTextModel  # deferred: transformers

    from pipelines.standins.diffusion import SD1_SCHEDULER, build_clip_tokenizer

    with Phase("build", "cpu", out):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**SD1_UNET)
        vae = AutoencoderKL(**SD1_VAE)
        text = CLIPTextModel(CLIPTextConfig(**SD1_TEXT))
        safety = feature_extractor = None
        if args.safety_checker == "model-default":  # what paper002.yaml keeps (SD 1.x ships one)
            # deferred: diffusers
            from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker

            safety = StableDiffusionSafetyChecker(CLIPConfig(
                text_config={k: SD1_TEXT[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                      "num_hidden_layers", "num_attention_heads",
                                                      "max_position_embeddings", "hidden_act")},
                vision_config=SD1_SAFETY_VISION, projection_dim=768))
            feature_extractor = CLIPImageProcessor()  # its defaults are SD's: 224 px, bicubic, OpenAI mean/std
        pipe = StableDiffusionPipeline(unet=unet, vae=vae, text_encoder=text, tokenizer=build_clip_tokenizer(),
                                       scheduler=PNDMScheduler(**SD1_SCHEDULER), safety_checker=safety,
                                       feature_extractor=feature_extractor, requires_safety_checker=safety is not None)
    out["params"] = {"unet": n_params(unet), "vae": n_params(vae), "text_encoder": n_params(text),
                     "safety_checker": n_params(safety) if safety is not None else 0}
    with Phase("save", "cpu", out):
        pipe.save_pretrained(str(Path(args.workdir) / "sd"))  # float32, as the hub's main branches


def build_blip2(args, out: dict) -> None:
    import torch  # deferred: torch
    from transformers import (  # deferred: transformers
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        BlipImageProcessor,
        T5Config,
    )

    from pipelines.standins.blip2 import IMAGE_TOKEN, build_tokenizer

    tokenizer = build_tokenizer()
    text = T5Config(**{**FLAN_T5_XL, "num_layers": args.t5_layers, "num_decoder_layers": args.t5_layers})
    config = Blip2Config(vision_config=BLIP2_VISION, qformer_config=BLIP2_QFORMER, text_config=text.to_dict(),
                         num_query_tokens=BLIP2_QUERY_TOKENS,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    with Phase("build", "cpu", out):
        torch.manual_seed(0)
        model = Blip2ForConditionalGeneration(config).eval()
    out["params"] = {"vision_model": n_params(model.vision_model), "qformer": n_params(model.qformer),
                     "language_projection": n_params(model.language_projection),
                     "query_tokens": model.query_tokens.numel(),
                     f"flan-t5 ({args.t5_layers}+{args.t5_layers} layers)": n_params(model.language_model)}
    with Phase("save", "cpu", out):
        directory = Path(args.workdir) / "blip2"
        model.save_pretrained(directory)
        del model
        processor = Blip2Processor(  # the published processor: 224 x 224 bicubic, OpenAI mean/std
            image_processor=BlipImageProcessor(size={"height": 224, "width": 224}, resample=3,
                                               image_mean=OPENAI_MEAN, image_std=OPENAI_STD),
            tokenizer=tokenizer, num_query_tokens=BLIP2_QUERY_TOKENS)
        processor.save_pretrained(directory)
        (directory / "STANDIN.txt").write_text("BLIP-2 Flan-T5-XL widths, random weights; answers are meaningless.\n")


# --- runs through the production operators ----------------------------------------------------------------


def run_clip(args, key: str, out: dict) -> None:

    from operators.image_clip_gender import ClipGenderClassifier

    kwargs = {"model": f"local-dir:{Path(args.workdir) / key}", "pretrained": None, "device": args.device,
              "only_face_ok": False}
    if key == "clip-b32":  # configs/dalleval.yaml clip: argmax over its two prompts
        kwargs |= {"prompts": ("a photo of a male", "a photo of a female"), "threshold": 0.5}
    with Phase("load", args.device, out):
        clf = ClipGenderClassifier(**kwargs)
    net = clf.bundle.model
    out["params"] = n_params(net)
    out["weights_dtype"] = str(next(net.parameters()).dtype).replace("torch.", "")
    out["activation"] = activations(net)
    out["image_size"] = clf.bundle.image_size
    io, res = run_head(args, clf, {"visual": net.visual}, out)
    io["result"] = {k: f"{getattr(v, 'shape', len(v))} {getattr(v, 'dtype', '')}" for k, v in res.items()}
    out["io"] = io
    out["sample"] = {k: [str(x) for x in v[:2]] for k, v in res.items()}


def run_sd(args, out: dict) -> None:
    import pyarrow as pa

    from operators.image_generation import ImageGenerator
    from schemas.images import GENDER, GENERATION_STATUS, IMAGE_HEIGHT, IMAGE_WIDTH, NSFW, P_MALE, SEED
    from schemas.subsets import PROMPT

    from operators.base import Stage
    from operators.image_clip_gender import ClipGenderClassifier

    head = Stage(ClipGenderClassifier, {"model": f"local-dir:{Path(args.workdir) / 'clip-l14'}", "pretrained": None,
                                        "prompts": ("A photo of a man", "A photo of a woman"), "threshold": 0.9})
    with Phase("load", args.device, out):
        gen = ImageGenerator(model=str(Path(args.workdir) / "sd"), steps=args.steps, guidance_scale=7.5,
                             height=args.size, width=args.size, device=args.device, dtype="auto",
                             safety_checker=args.safety_checker, heads=[head], micro_batch=args.batch)
    pipe = gen.pipe
    parts = {"text_encoder": pipe.text_encoder, "unet": pipe.unet, "vae.decoder": pipe.vae.decoder,
             "safety_checker": getattr(pipe, "safety_checker", None), "clip head visual": gen.heads[0].bundle.model.visual}
    whole = {"text_encoder": pipe.text_encoder, "unet": pipe.unet, "vae": pipe.vae,
             "safety_checker": getattr(pipe, "safety_checker", None), "clip head": gen.heads[0].bundle.model}
    out["params"] = {k: n_params(m) for k, m in whole.items() if m is not None}
    out["weights_dtype"] = {k: str(next(m.parameters()).dtype).replace("torch.", "") for k, m in whole.items() if m is not None}
    out["activation"] = {"text_encoder": pipe.text_encoder.config.hidden_act,
                         "clip head": activations(gen.heads[0].bundle.model)}
    out["record"] = {k: gen.record[k] for k in ("pipeline_class", "scheduler_class", "dtype", "device",
                                                 "safety_checker_present")}
    io: dict = {}
    hooks = watch(parts, io)
    batch = pa.table({PROMPT: ["A photo of the face of an engineer"] * args.batch,
                      SEED: pa.array(range(args.batch), pa.int64())})
    for phase in run_phases(args):
        with Phase(phase, args.device, out):
            res = gen(batch)
        unwatch(hooks)
    io["result table"] = {c: str(res.schema.field(c).type) for c in res.column_names}
    out["io"] = io
    out["sample"] = {c: res.column(c).to_pylist() for c in (GENERATION_STATUS, NSFW, IMAGE_HEIGHT, IMAGE_WIDTH, GENDER, P_MALE)
                     if c in res.column_names}


def run_blip2(args, out: dict) -> None:
    import yaml  # deferred: yaml

    from operators.image_blip2_vqa import Blip2Detector
    from schemas.dalleval import ATTRIBUTE_ANSWERS, DETECTED_GENDER, GENDER_ANSWER

    cfg = yaml.safe_load((ROOT / "configs" / "dalleval.yaml").read_text())
    b = cfg["blip2"]
    with Phase("load", args.device, out):
        det = Blip2Detector(model=str(Path(args.workdir) / "blip2"), gender_question=b["gender_question"],
                            attributes=cfg["attributes"], attribute_question=b["attribute_question"],
                            prompt_template=b["prompt_template"], max_new_tokens=b["max_new_tokens"],
                            batch_size=args.batch, device=args.device, dtype="auto")
    m = det.model
    parts = {"vision_model": m.vision_model, "qformer": m.qformer, "language_projection": m.language_projection,
             "t5 encoder": m.language_model.get_encoder(), "t5 decoder": m.language_model.get_decoder()}
    whole = {**{k: v for k, v in parts.items() if not k.startswith("t5 ")}, "query_tokens": m.query_tokens,
             f"flan-t5 ({m.config.text_config.num_layers}+{m.config.text_config.num_decoder_layers} layers)": m.language_model}
    out["params"] = {k: v.numel() if k == "query_tokens" else n_params(v) for k, v in whole.items()}
    out["weights_dtype"] = {k: str(v.dtype if k == "query_tokens" else next(v.parameters()).dtype).replace("torch.", "")
                            for k, v in whole.items()}
    out["questions_per_image"] = len(det.questions)
    io, res = run_head(args, det, parts, out)
    out["io"] = io
    out["sample"] = {k: res[k] for k in (GENDER_ANSWER, DETECTED_GENDER)}
    out["sample"]["first attribute answers"] = [a[:3] for a in res[ATTRIBUTE_ANSWERS]]


STAGES = {
    "build-clip-l14": lambda a, o: build_clip(a, "clip-l14", o),
    "run-clip-l14": lambda a, o: run_clip(a, "clip-l14", o),
    "build-clip-b32": lambda a, o: build_clip(a, "clip-b32", o),
    "run-clip-b32": lambda a, o: run_clip(a, "clip-b32", o),
    "build-sd": build_sd,
    "run-sd": run_sd,
    "build-blip2": build_blip2,
    "run-blip2": run_blip2,
}


def child(args) -> None:
    import torch  # deferred: torch

    if args.threads:
        torch.set_num_threads(args.threads)
    out: dict = {"stage": args.stage, "device": args.device, "torch_threads": torch.get_num_threads()}
    STAGES[args.stage](args, out)
    out["peak_rss_process_gb"] = round(_peak_rss() / 2**30, 2)  # since the last reset
    print(RESULT + json.dumps(out, default=str), flush=True)


# --- driver ------------------------------------------------------------------------------------------------


def plan(models) -> list[str]:
    stages = []
    for m in MODELS:
        if m in models:
            if m == "sd" and "clip-l14" not in models:
                stages.append("build-clip-l14")  # the generator's gender head
            stages += [f"build-{m}", f"run-{m}"]
    return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--size", type=int, default=256, help="generated image side in pixels")
    ap.add_argument("--batch", type=int, default=2, help="images per batch (generator micro-batch, heads)")
    ap.add_argument("--steps", type=int, default=1, help="denoising steps")
    ap.add_argument("--t5-layers", type=int, default=2, help="Flan-T5-XL encoder and decoder layers (24 in the real model)")
    ap.add_argument("--safety-checker", choices=("model-default", "off"), default="model-default",
                    help="build SD's real-size safety checker and keep it (paper002.yaml) or leave it out")
    ap.add_argument("--repeats", type=int, default=2, help="calls per model: the first, then warm ones")
    add_child_process_arguments(ap)
    ap.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "auto":
        import torch  # deferred: torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.stage:
        return child(args)

    own = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="fullsize-smoke-")
    results = []
    try:
        for stage in plan(args.models):
            print(f"== {stage}", flush=True)
            cmd = [sys.executable, __file__, "--stage", stage, "--workdir", workdir, "--device", args.device,
                   "--size", str(args.size), "--batch", str(args.batch), "--steps", str(args.steps),
                   "--t5-layers", str(args.t5_layers), "--safety-checker", args.safety_checker,
                   "--repeats", str(args.repeats), "--threads", str(args.threads)]
            t = time.perf_counter()
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            result = None
            for line in proc.stdout.splitlines():
                if line.startswith(RESULT):
                    result = json.loads(line[len(RESULT):])
                else:
                    print("  " + line, flush=True)
            if proc.returncode != 0 or result is None:
                print(f"  FAILED (exit {proc.returncode})", flush=True)
                result = {"stage": stage, "failed": proc.returncode}
            result["wall_s"] = round(time.perf_counter() - t, 1)
            for key, value in result.items():
                print(f"  {key}: {json.dumps(value, default=str)}", flush=True)
            results.append(result)
            if stage.startswith("run-"):  # free the disk once a model has run (sd's head reads clip-l14)
                name = stage[len("run-"):]
                drop = {name} | ({"clip-l14"} if name == "sd" else set())
                keep = {"clip-l14"} if name == "clip-l14" and "sd" in args.models else set()
                for d in drop - keep:
                    shutil.rmtree(Path(workdir) / d, ignore_errors=True)
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n== summary")
    for r in results:
        phases = {k: v for k, v in r.items() if isinstance(v, dict) and "seconds" in v}
        cells = ", ".join(f"{k} {v['seconds']} s / peak {v['peak_rss_gb']} GB"
                          + (f" (cuda {v['peak_cuda_gb']} GB)" if "peak_cuda_gb" in v else "") for k, v in phases.items())
        p = r.get("params")
        p = sum(p.values()) if isinstance(p, dict) else p
        size = f"{p / 1e6:8.1f} M params  " if p else " " * 19
        print(f"{r['stage']:<15} {size}{'FAILED ' if r.get('failed') is not None else ''}{cells}")
    sys.exit(1 if any(r.get("failed") is not None for r in results) else 0)


if __name__ == "__main__":
    main()
