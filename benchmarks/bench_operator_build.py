"""What an actor pays to build its operator, with Python's cyclic collector paused and without.

    python benchmarks/bench_operator_build.py --repeats 3

Every Ray actor of a stage is a fresh process that imports its operator's libraries and loads its
model when it builds the operator. This builds, each in a fresh Python process as an actor would,
the CLIP gender classifier on a tiny random open_clip stand-in (open_clip, torch, transformers,
timm) and the image generator on a tiny random Stable Diffusion stand-in (diffusers, transformers),
once through ``operators.base.Stage.build`` (the collector paused: ``gc_paused``) and once by
calling the class (the baseline: the collector on), and prints the CPU seconds of each build
side by side, with the full collections the build made.
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
kind, how, path = sys.argv[1:4]
stage = Stage(ClipGenderClassifier, {{"model": path, "pretrained": None, "device": "cpu"}}) if kind == "clip" else \
    Stage(ImageGenerator, {{"model": path, "device": "cpu", "steps": 2}})
t = time.process_time()
op = stage.build() if how == "paused" else stage.op(**stage.kwargs)
print(json.dumps({{"cpu_s": time.process_time() - t, "full_collections": gc.get_stats()[2]["collections"]}}))
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
        print(f"{'operator':<10} {'collector on (s)':>17} {'paused (s)':>11} {'saved':>7}   full collections on / paused")
        for kind, path in paths.items():
            runs = {how: [build_once(kind, how, path) for _ in range(args.repeats)] for how in ("on", "paused")}
            cpu = {how: statistics.median(r["cpu_s"] for r in rs) for how, rs in runs.items()}
            cols = {how: runs[how][0]["full_collections"] for how in runs}
            print(f"{kind:<10} {cpu['on']:>17.2f} {cpu['paused']:>11.2f} {1 - cpu['paused'] / cpu['on']:>7.0%}"
                  f"   {cols['on']} / {cols['paused']}")


if __name__ == "__main__":
    main()
