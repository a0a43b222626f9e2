"""Throughput of the DALL-Eval stages that run on CPUs or are batched differently from a naive port.

1. Measures (section 4.2.4): per-prompt counts, averages and MADs and per-prompt attribute presence
   from a per-image table of N images (``metric_dalleval.prompt_counts`` / ``attribute_presence``,
   pyarrow group-bys). Baseline: a Python loop over the image rows filling dictionaries.
2. BLIP-2 questions: the 16 questions of an image (gender + 15 attributes) answered with the vision
   encoder and Q-Former run once per image (``Blip2Detector.ask``). Baseline: one plain
   ``model.generate`` per (image, question), which re-encodes the image every time. Tiny random
   BLIP-2 on the CPU, so the ratio, not the absolute rate, is the point (with the real ViT-g the
   vision share of the work is larger).
3. Skin tone: face mesh + skin region + ITA per 512x512 image (scikit-image's astronaut).

    python benchmarks/bench_dalleval.py --images 1000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.studies.dalleval import metrics as M  # noqa: E402
from operators.base import conform  # noqa: E402
from schemas import dalleval as S  # noqa: E402

ATTRS = ["boots", "slippers", "jeans", "shorts", "slacks", "dress", "skirt", "suit", "shirt", "uniform", "jacket",
         "hat", "tie", "mask", "gloves"]


def _flat(a):
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def synthetic_images(n: int, prompts: int = 252, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    p = rng.integers(0, prompts, n)
    groups = np.array(["person", "man", "woman"])[p % 3]
    gender = np.array(["male", "female", "unknown"])[rng.integers(0, 3, n)]
    tone = rng.integers(1, 11, n).astype(np.int8)
    tone_mask = rng.random(n) < 0.1
    present = rng.integers(0, 3, (n, len(ATTRS)))
    flat = pa.array(np.where(present.ravel() == 2, None, present.ravel() == 1).tolist(), pa.bool_())
    offsets = pa.array(np.arange(0, n * len(ATTRS) + 1, len(ATTRS), dtype=np.int32))
    names = pa.ListArray.from_arrays(offsets, _flat(pa.array(np.tile(ATTRS, n))))
    table = pa.table({
        "image_id": pa.array(np.arange(n).astype(str)), "group": pa.array(groups),
        "profession": pa.array(np.char.add("profession-", (p // 3).astype(str))),
        "prompt": pa.array(np.char.add("prompt-", p.astype(str))), "model": pa.array(np.full(n, "sd")),
        "generation_status": pa.array(np.full(n, "ok")), "detected_gender": pa.array(gender),
        "skin_tone": pa.array(tone, mask=tone_mask), S.ATTRIBUTE_NAMES: names,
        S.ATTRIBUTE_PRESENT: pa.ListArray.from_arrays(offsets, _flat(flat)),
    })
    return conform(table, S.DALLEVAL_IMAGES)


def loop_baseline(images: pa.Table) -> tuple[dict, dict]:
    counts: dict = {}
    presence: dict = {}
    for r in images.to_pylist():
        if r["generation_status"] != "ok":
            continue
        c = counts.setdefault((r["model"], r["prompt"]), {"images": 0, "male": 0, "female": 0, "tones": [0] * 10})
        c["images"] += 1
        if r["detected_gender"] in ("male", "female"):
            c[r["detected_gender"]] += 1
        if r["skin_tone"] is not None:
            c["tones"][r["skin_tone"] - 1] += 1
        for a, v in zip(r[S.ATTRIBUTE_NAMES] or [], r[S.ATTRIBUTE_PRESENT] or []):
            s = presence.setdefault((r["model"], r["prompt"], a), [0, 0])
            if v is not None:
                s[0] += 1
                s[1] += int(v)
    for c in counts.values():
        m, f = c["male"], c["female"]
        c["avg_gender"] = (f - m) / (m + f) if m + f else float("nan")
        tot = sum(c["tones"])
        c["mad_tone"] = sum(abs(t / tot - 0.1) for t in c["tones"]) / 10 if tot else float("nan")
    return counts, presence


def bench_measures(n: int, baseline_n: int) -> None:
    images = synthetic_images(n)
    t0 = time.perf_counter()
    counts = M.prompt_counts(images)
    presence = M.attribute_presence(images)
    fast = time.perf_counter() - t0
    small = images.slice(0, baseline_n)
    t0 = time.perf_counter()
    base_counts, _ = loop_baseline(small)
    slow = time.perf_counter() - t0
    check = M.prompt_counts(small).to_pandas().set_index(["model", "prompt"])
    for key, c in list(base_counts.items())[:50]:
        row = check.loc[key]
        assert (row["male"], row["female"]) == (c["male"], c["female"]), key
    print(f"measures   pyarrow: {n:>10,} images in {fast:7.2f} s = {n / fast:>12,.0f} images/s "
          f"({counts.num_rows} prompts, {presence.num_rows} prompt-attribute rows)")
    print(f"           loop   : {baseline_n:>10,} images in {slow:7.2f} s = {baseline_n / slow:>12,.0f} images/s "
          f"-> {n / fast / (baseline_n / slow):.0f}x")


def bench_blip2(images: int) -> None:
    import torch  # deferred: torch
    from skimage import data  # deferred: skimage

    from operators.image_blip2_vqa import Blip2Detector
    from pipelines.standins.blip2 import build_tiny_blip2

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_blip2(Path(tmp) / "blip2", seed=0)
        det = Blip2Detector(path, attributes=[{"name": a, "text": a} for a in ATTRS], device="cpu", batch_size=16)
        photo = torch.from_numpy(data.astronaut()).permute(2, 0, 1).float().div(255)
        batch = photo.unsqueeze(0).repeat(images, 1, 1, 1)
        pixels = det.preprocess(batch)
        questions = det.questions
        det.ask(pixels[:1], questions)  # warm-up
        t0 = time.perf_counter()
        fast = det.ask(pixels, questions)
        t_fast = time.perf_counter() - t0
        proc = det.bundle.processor
        model = det.bundle.model
        t0 = time.perf_counter()
        slow = []
        with torch.inference_mode():
            for i in range(images):
                answers = []
                for q in questions:
                    inputs = proc(images=data.astronaut(), text=det.prompt_template.format(question=q), return_tensors="pt")
                    out = model.generate(**inputs, max_new_tokens=det.max_new_tokens, do_sample=False)
                    answers.append(proc.tokenizer.decode(out[0], skip_special_tokens=True).strip())
                slow.append(answers)
        t_slow = time.perf_counter() - t0
        agree = np.mean([a == b for fa, sa in zip(fast, slow) for a, b in zip(fa, sa)])
        n = images * len(questions)
        print(f"blip2      batched: {n:>10,} answers in {t_fast:7.2f} s = {n / t_fast:>12,.1f} answers/s")
        print(f"           per-question generate: {t_slow:7.2f} s = {n / t_slow:>12,.1f} answers/s "
              f"-> {t_slow / t_fast:.1f}x (answers agree: {agree:.0%}; one-level preprocessing differences may flip a "
              f"random model's token)")


def bench_skin(images: int) -> None:
    from skimage import data  # deferred: skimage

    from operators.image_skin_tone import SkinToneDetector

    photo = data.astronaut()
    with SkinToneDetector() as det:
        det.measure(photo)
        t0 = time.perf_counter()
        for _ in range(images):
            r = det.measure(photo)
        dt = time.perf_counter() - t0
    print(f"skin tone  {images:>10,} images (512x512) in {dt:7.2f} s = {images / dt:>12,.1f} images/s per CPU actor "
          f"(tone {r[S.SKIN_TONE]}, ITA {r[S.SKIN_ITA]:.1f})")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=1_000_000, help="images in the measures benchmark")
    p.add_argument("--baseline-images", type=int, default=50_000)
    p.add_argument("--blip2-images", type=int, default=8)
    p.add_argument("--skin-images", type=int, default=50)
    a = p.parse_args()
    bench_measures(a.images, a.baseline_images)
    bench_blip2(a.blip2_images)
    bench_skin(a.skin_images)


if __name__ == "__main__":
    main()
