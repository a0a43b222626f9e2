"""Throughput of DALL-Eval's skill detector (paper 000, section 4.1): DETR-R101-DC5, the COCO
checkpoint ``facebook/detr-resnet-101-dc5``, as ``operators.image_object_detection.ObjectDetector``
runs it on the generator's images (``classify_tensor``: quantise to 8-bit levels, the checkpoint's
own ``DetrImageProcessor`` on the images' device, the model, ``post_process_object_detection`` at
the 0.3 recording floor, boxes normalised).

Baseline, side by side at the same image and batch sizes: DETR-R50 without DC5
(``facebook/detr-resnet-50``), the detector of the paper's first version (App. A.2: "We replace the
object detector (DETR-R50) for evaluation with a stronger object detector (DETR-R101-DC5)"). DC5
(dilation in the last ResNet stage: stride 16 instead of 32) gives the transformer 4x the tokens,
which with the deeper backbone is where the extra cost goes.

Models: FULL-SIZE architectures with random weights (the cost is the real models', the detections
meaningless), built offline from their configurations, as the hub checkpoints have them: DETR with
a timm ResNet backbone (``use_timm_backbone``; resnet101 with ``dilation`` / resnet50), 100
queries, d_model 256, 6 + 6 transformer layers (FFN 2048, 8 heads), the 91 COCO labels; timm
creates the backbones with random weights (no ImageNet download). They are saved with
``save_pretrained`` together with the checkpoints' ``DetrImageProcessor`` (shortest edge 800,
longest 1333, ImageNet mean / std, padding) and loaded through the production loader
(``load_object_detector``, which raises on any config / weights mismatch). A 512 x 512 generated
image is resized to 800 x 800 by the processor. Random weights give almost no detections above
0.3, the real model about ten per image; the post-processing is a negligible share either way.

Per model and batch size: one warm-up call (page-in of the weights, kernel selection; unless
``--no-warmup``), then ``--repeats`` timed ``classify_tensor`` calls on ``(B, 3, size, size)`` float
images; images/s over the timed calls, and the split between the image processor, the model and
the post-processing (timers around the production calls; on CUDA synchronised). dtype "auto" is
float32 everywhere, as production.

    python benchmarks/bench_detector.py --smoke                 # tiny stand-ins, 64 px, seconds
    python benchmarks/bench_detector.py                         # CPU, 512 px, batches 1 and 4
    python benchmarks/bench_detector.py --device cuda --repeats 10 --batches 1,4,16
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_child_process_arguments  # noqa: E402

# facebook/detr-resnet-101-dc5 / facebook/detr-resnet-50 config.json (DETR's architecture; transformers
# DetrConfig defaults, checked below) and their preprocessor_config.json sizes
DETR_COMMON = {"num_queries": 100, "d_model": 256, "encoder_layers": 6, "decoder_layers": 6, "encoder_ffn_dim": 2048,
               "decoder_ffn_dim": 2048, "encoder_attention_heads": 8, "decoder_attention_heads": 8}
MODELS = {
    "detr-r101-dc5": {"checkpoint": "facebook/detr-resnet-101-dc5", "backbone": "resnet101", "dilation": True,
                      "published_params": "60 M"},
    "detr-r50": {"checkpoint": "facebook/detr-resnet-50", "backbone": "resnet50", "dilation": False,
                 "published_params": "41 M"},
}
MAIN, BASELINE = "detr-r101-dc5", "detr-r50"
PROCESSOR_SIZE = (800, 1333)


def n_params(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def peak_rss_gb() -> float:
    """VmHWM of this process (Linux), GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch  # deferred: torch

        torch.cuda.synchronize()


# --- model builders ----------------------------------------------------------------------------------------


def build_full_size(directory: Path, name: str) -> dict:
    """The full-size DETR ``name`` (MODELS) with random weights and its checkpoint's image processor,
    saved in ``directory``; returns its parameter count."""
    import torch  # deferred: torch
    from transformers import DetrConfig, DetrForObjectDetection  # deferred: transformers

    from pipelines.standins.detection import coco_id2label, detr_image_processor

    spec = MODELS[name]
    id2label = coco_id2label()
    config = DetrConfig(use_timm_backbone=True, backbone=spec["backbone"], dilation=spec["dilation"],
                        id2label=id2label, label2id={v: k for k, v in id2label.items()})
    got = {k: getattr(config, k) for k in DETR_COMMON}
    if got != DETR_COMMON:
        raise SystemExit(f"DetrConfig() is not DETR's architecture: { {k: (got[k], DETR_COMMON[k]) for k in got} }")
    bc = config.backbone_config
    if (bc.model_type, bc.backbone, bc.output_stride) != ("timm_backbone", spec["backbone"],
                                                          16 if spec["dilation"] else None):
        raise SystemExit(f"unexpected backbone config {bc}")
    directory.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DetrForObjectDetection(config).eval()
    model.save_pretrained(directory)
    detr_image_processor(*PROCESSOR_SIZE).save_pretrained(directory)
    (directory / "STANDIN.txt").write_text(f"{spec['checkpoint']} architecture, random weights.\n")
    params = n_params(model)
    del model
    gc.collect()
    return {"params": params}


# --- timing ------------------------------------------------------------------------------------------------


class Timers:
    """Seconds spent in the image processor and the post-processing of one ObjectDetector."""

    def __init__(self, det):
        self.pre = self.post = 0.0
        device = det.device
        pixels = det._pixels
        ip = det.bundle.image_processor
        post = ip.post_process_object_detection

        def timed_pixels(u8):
            sync(device)
            t = time.perf_counter()
            out = pixels(u8)
            sync(device)
            self.pre += time.perf_counter() - t
            return out

        def timed_post(*args, **kwargs):
            sync(device)
            t = time.perf_counter()
            out = post(*args, **kwargs)
            sync(device)
            self.post += time.perf_counter() - t
            return out

        det._pixels = timed_pixels
        ip.post_process_object_detection = timed_post

    def reset(self):
        self.pre = self.post = 0.0


def measure(det, images_by_batch: dict, repeats: int, warmup: bool) -> dict:
    """Per batch size: seconds per timed call, images/s, the processor / model / post split, and
    the detections per image of the last call."""
    timers = Timers(det)
    out = {}
    for b, images in images_by_batch.items():
        det.batch_size = b
        if warmup:
            det.classify_tensor(images)
        sync(det.device)
        timers.reset()
        t = time.perf_counter()
        for _ in range(repeats):
            cols = det.classify_tensor(images)
        sync(det.device)
        total = time.perf_counter() - t
        n = b * repeats
        out[b] = {"seconds": total, "images": n, "img_s": n / total, "s_img": total / n,
                  "pre": timers.pre / total, "post": timers.post / total,
                  "model": max(0.0, 1 - (timers.pre + timers.post) / total),
                  "detections": sum(len(x) for x in cols["det_labels"]) / b}
        print(f"  batch {b}: {n} images in {total:.2f} s -> {n / total:.3f} images/s", flush=True)
    return out


def images_for(batches, size: int, device: str) -> dict:
    import torch  # deferred: torch

    g = torch.Generator().manual_seed(0)
    biggest = torch.rand(max(batches), 3, size, size, generator=g)
    return {b: biggest[:b].to(device) for b in batches}


# --- report ------------------------------------------------------------------------------------------------


def table(results: dict, names: tuple, labels: dict) -> str:
    main, base = names
    lines = [f"| batch | {labels[main]} images/s | s/image | {labels[base]} images/s | s/image | "
             f"{main} / {base} time |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for b in results[main]:
        m, r = results[main][b], results[base].get(b)
        if r is None:
            lines.append(f"| {b} | {m['img_s']:.3f} | {m['s_img']:.3f} | - | - | - |")
            continue
        lines.append(f"| {b} | {m['img_s']:.3f} | {m['s_img']:.3f} | {r['img_s']:.3f} | {r['s_img']:.3f} | "
                     f"{m['s_img'] / r['s_img']:.2f}x |")
    lines.append("")
    lines.append("| model | batch | processor | model | post-processing | detections/image (random weights) |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        for b, m in results[name].items():
            lines.append(f"| {labels[name]} | {b} | {m['pre']:.1%} | {m['model']:.1%} | {m['post']:.1%} | "
                         f"{m['detections']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--size", type=int, default=512, help="image side in pixels (generated images: 512)")
    ap.add_argument("--batches", default="1,4", help="comma-separated batch sizes (default 1,4)")
    ap.add_argument("--repeats", type=int, default=2, help="timed classify_tensor calls per batch size")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up call per batch size")
    ap.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"), default="auto",
                    help="detector dtype (auto: float32, as production)")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false", help="DETR-R101-DC5 only")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny stand-ins (pipelines.standins.detection: transformers-ResNet and timm resnet10t DC5), "
                         "64 px, one call")
    add_child_process_arguments(ap)
    args = ap.parse_args()
    try:
        batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    except ValueError:
        ap.error("--batches must be comma-separated integers")
    if not batches or min(batches) < 1 or args.repeats < 1 or args.size < 8:
        ap.error("--batches and --repeats must be >= 1, --size >= 8")
    if args.smoke:
        args.size = 64 if args.size == 512 else args.size
        args.repeats = 1

    import torch  # deferred: torch

    from operators.image_object_detection import ObjectDetector
    from operators.support.models import pick_device

    if args.threads:
        torch.set_num_threads(args.threads)
    with contextlib.suppress(ImportError):   # no "Loading weights" bars in the log
        from transformers.utils import logging as hf_logging  # deferred: transformers

        hf_logging.disable_progress_bar()
    device = pick_device(args.device)
    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-detector-"))
    t0 = time.perf_counter()
    names = (MAIN, BASELINE) if args.baseline else (MAIN,)
    labels = {MAIN: "DETR-R101-DC5", BASELINE: "DETR-R50"}
    results, params = {}, {}
    try:
        images = images_for(batches, args.size, device)
        for name in names:
            path = workdir / name
            t = time.perf_counter()
            if args.smoke:
                from pipelines.standins.detection import build_tiny_detr

                build_tiny_detr(path, seed=0, **({} if name == MAIN else {"timm_backbone": "resnet10t", "dilation": False}))
                labels[name] += " (tiny stand-in)"
            else:
                params[name] = build_full_size(path, name)["params"]
            built = time.perf_counter() - t
            t = time.perf_counter()
            det = ObjectDetector(str(path), device=device, dtype=args.dtype, batch_size=max(batches))
            loaded = time.perf_counter() - t
            p = n_params(det.bundle.model)
            print(f"{labels[name]}: {p / 1e6:.1f} M parameters"
                  + ("" if args.smoke else f" (published {MODELS[name]['published_params']})")
                  + f", built in {built:.1f} s, loaded in {loaded:.1f} s, {det.record['detector']['dtype']} on "
                  f"{device}, processor {det.record['detector']['image_processor_class']} "
                  f"(on device: {det.record['detector']['preprocessing_on_device']})", flush=True)
            results[name] = measure(det, images, args.repeats, args.warmup)
            del det
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        if len(names) == 1:
            results[BASELINE] = {}
            names = (MAIN, BASELINE)
        print()
        print(f"{args.size} x {args.size} images, batches {batches}, {args.repeats} timed call(s) each, "
              f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} torch threads")
        print(table(results, names, labels))
        print(f"\npeak RSS {peak_rss_gb():.2f} GB; total {time.perf_counter() - t0:.1f} s")
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
