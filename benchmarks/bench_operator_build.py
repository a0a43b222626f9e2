"""What an actor pays to build its operator and start on its batches, with Python's cyclic
collector on, paused while it builds, and paused then settled.

    python benchmarks/bench_operator_build.py --repeats 3

Every Ray actor of a stage is a fresh process that imports its operator's libraries and loads its
model when it builds the operator. This builds, each in a fresh Python process as an actor would,
the CLIP gender classifier on a tiny random open_clip stand-in (open_clip, torch, transformers,
timm) and the image generator on a tiny random Stable Diffusion stand-in (diffusers, transformers)
three ways: by calling the class (the baseline: the collector on), through
``operators.base.Stage.build`` (the collector paused: ``gc_paused``), and as the actor class Ray
Data builds (``runtime.built_with_gc_paused``: paused, then ``settle_heap``: one collection and
the survivors frozen). Then it allocates what running batches allocates (2 million short-lived
containers), which is when the collector, back on, walks what the build left in its youngest
generation. It prints the CPU seconds of the build and of the batches, side by side, with the full
collections of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import fresh_process_json  # noqa: E402

_CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, {repo!r})
import operators
from operators.base import Stage
from operators.image_clip_gender import ClipGenderClassifier
from operators.image_generation import ImageGenerator
from pipelines.engine.stream.runtime import built_with_gc_paused
kind, how, path = sys.argv[1:4]
stage = Stage(ClipGenderClassifier, {{"model": path, "pretrained": None, "device": "cpu"}}) if kind == "clip" else \
    Stage(ImageGenerator, {{"model": path, "device": "cpu", "steps": 2}})
t = time.process_time()
if how == "on":
    op = stage.op(**stage.kwargs)
elif how == "paused":
    op = stage.build()
else:
    op = built_with_gc_paused(stage.op)(**stage.kwargs)
built, full = time.process_time() - t, gc.get_stats()[2]["collections"]
t = time.process_time()
for _ in range(2000):            # what batches allocate: short-lived containers, 1,000 at a time
    junk = [[i] for i in range(1000)]
del junk
print(json.dumps({{"build_s": built, "batches_s": time.process_time() - t, "full_build": full,
                  "full_batches": gc.get_stats()[2]["collections"] - full}}))
"""


def build_once(kind: str, how: str, path: str) -> dict:
    return fresh_process_json(_CHILD.format(repo=str(REPO)), kind, how, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per operator and way (default 3)")
    args = p.parse_args(argv)
    from pipelines.standins.clip import build_tiny_open_clip
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    with tempfile.TemporaryDirectory() as tmp:
        paths = {"clip": build_tiny_open_clip(str(Path(tmp) / "clip")),
                 "generator": build_tiny_stable_diffusion(str(Path(tmp) / "sd"))}
        ways = ("on", "paused", "settled")
        print(f"{'operator':<10} {'way':<8} {'build (s)':>10} {'batches (s)':>12} {'total (s)':>10} {'saved':>7}"
              f"   full collections (build + batches)")
        for kind, path in paths.items():
            runs = {how: [build_once(kind, how, path) for _ in range(args.repeats)] for how in ways}
            med = {how: {k: statistics.median(r[k] for r in rs) for k in ("build_s", "batches_s")}
                   for how, rs in runs.items()}
            base = med["on"]["build_s"] + med["on"]["batches_s"]
            for how in ways:
                total = med[how]["build_s"] + med[how]["batches_s"]
                r = runs[how][0]
                print(f"{kind:<10} {how:<8} {med[how]['build_s']:>10.2f} {med[how]['batches_s']:>12.2f} {total:>10.2f}"
                      f" {1 - total / base:>7.0%}   {r['full_build']} + {r['full_batches']}")


if __name__ == "__main__":
    main()
