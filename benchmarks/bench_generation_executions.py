"""One Ray Data execution for every generator of a run against one execution per generator.

    python benchmarks/bench_generation_executions.py --generators 4 --images 16

Builds ``--generators`` tiny random Stable Diffusion stand-ins, a plan of ``--images`` requests
with a CLIP embedding head (as GEP's: the actor imports diffusers, open_clip and transformers),
and generates every generator's images through the engine (``generation.generate``) twice on a
fresh local Ray instance, each time into an empty run directory: once with every generator in
the run (one execution, ``routing.ByModel``), once generator by generator (the baseline: one
execution each, as the engine ran them before). Prints the wall time and images per second of
both, and checks that both give the same rows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from operators.base import Stage  # noqa: E402
from operators.image_clip_embedding import ClipImageEmbedder  # noqa: E402
from operators.image_generation import ImageGenerator  # noqa: E402
from pipelines.engine import generation  # noqa: E402
from pipelines.engine.cli.options import RunOptions  # noqa: E402
from pipelines.engine.generation import GenerationPlan, GeneratorSpec, SafetySettings  # noqa: E402
from pipelines.engine.run import rundir  # noqa: E402
from pipelines.engine.run.models import build_standin_clip  # noqa: E402
from schemas import gep as S  # noqa: E402
from schemas.images import MODEL, SEED  # noqa: E402
from schemas.subsets import PROMPT  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generators", type=int, default=4)
    ap.add_argument("--images", type=int, default=16, help="images per generator")
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray instance")
    a = ap.parse_args(argv)
    import ray  # deferred: ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        specs = generation.build_standin_generators(
            [GeneratorSpec(f"org/model-{i}", steps=2) for i in range(a.generators)], str(root / "standins"))
        clip = build_standin_clip(str(root / "standins"))
        head = Stage(ClipImageEmbedder, {"model": clip, "pretrained": None})
        n = a.images
        requests = pa.table({S.IMAGE_ID: [f"i{k}" for k in range(n)], "setting": ["neutral"] * n, "gender": ["none"] * n,
                             PROMPT: ["a photo of a person"] * n, "image_index": pa.array(range(n), pa.int32()),
                             SEED: list(range(n))})   # GEP's image table (its non-null columns)
        plan = GenerationPlan(requests, S.GEP_IMAGES, ImageGenerator, heads=[head], key=S.IMAGE_ID, save_images=False)
        ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)

        def run_with(name: str, groups: list[list]) -> tuple[float, pa.Table]:
            rd = rundir.RunDir(str(root / "runs"), name).open("fp", {"job": name})
            st = SimpleNamespace(execution={"max_error_rate": 1.0, "error_budget_min_rows": 1})
            start, parts = time.perf_counter(), []
            for group in groups:
                run = SimpleNamespace(options=RunOptions(gen_batch_size=4), safety=SafetySettings(policy="off"), gpu=None, rd=rd, ray=ray,
                                      st=st, generators=group, echo=lambda *x, **k: None, models=[], safety_counts={})   # no NSFW check: a hub model
                parts.append(generation.generate(run, plan).images)
            return time.perf_counter() - start, pa.concat_tables(parts)

        one_s, one = run_with("one", [specs])
        each_s, each = run_with("each", [[s] for s in specs])
        ray.shutdown()
    images = a.generators * a.images
    cols = [MODEL, S.IMAGE_ID, S.EMBEDDING]
    same = one.select(cols).sort_by([(MODEL, "ascending"), (S.IMAGE_ID, "ascending")]).equals(
        each.select(cols).sort_by([(MODEL, "ascending"), (S.IMAGE_ID, "ascending")]))
    print(f"{a.generators} generators x {a.images} images, stand-ins, CLIP head, {a.cpus} Ray CPUs")
    print(f"  one execution for all generators: {one_s:7.1f} s  {images / one_s:6.2f} images/s")
    print(f"  one execution per generator:      {each_s:7.1f} s  {images / each_s:6.2f} images/s  (baseline)")
    print(f"  speed-up {each_s / one_s:.2f}x; same rows: {same}")


if __name__ == "__main__":
    main()
