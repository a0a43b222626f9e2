"""GPUs of the model actors come from the study's configuration, not from what is up at connect time.

On the shipped cluster.yaml the head has no GPU and gpu_worker starts at 0 nodes: a request sized
from ``ray.cluster_resources()`` asks for 0 GPUs, SD/CLIP/BLIP-2 land on CPU workers in fp32 and
the autoscaler never starts a GPU node. These tests hold the request to the configuration, and
the refusal of real models on a CPU.
"""

from helpers import REPO_ROOT
import json
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from operators.support.models import GPU_HINT, ModelLoadError, pick_device
from pipelines import amplification, dalleval, exposed, gep
from pipelines.engine import gpus

ROOT = REPO_ROOT


def readme_cluster_commands() -> dict[str, list[str]]:
    """The arguments after ``--`` of the first ``ray submit cluster.yaml pipelines/<study>.py`` of each
    study in the README (its cluster quick start) and the study pages ``docs/studies/*.md``."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs" / "studies").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages).replace("\\\n", " ")
    found = {}
    for m in re.finditer(r"ray submit cluster\.yaml pipelines/(\w+)\.py -- ([^`\n]+)", text):
        found.setdefault(m.group(1), shlex.split(m.group(2)))
    return found


def _execution(study: str) -> dict:
    import yaml

    name = {"amplification": "paper002.yaml", "gep": "gep.yaml", "dalleval": "dalleval.yaml",
            "exposed": "exposed.yaml"}[study]
    return dict(yaml.safe_load((ROOT / "configs" / name).read_text())["execution"])


PARSERS = {"amplification": amplification.build_parser, "gep": gep.build_parser, "dalleval": dalleval.build_parser,
           "exposed": exposed.build_parser}


def test_readme_cluster_commands_ask_every_model_actor_for_a_gpu():
    commands = readme_cluster_commands()
    assert set(commands) >= {"amplification", "gep", "dalleval", "exposed"}, commands
    for study, argv in commands.items():
        args = PARSERS[study]().parse_args(argv)
        gp = gpus.plan(_execution(study), args.gpus_per_actor, args.device, standin=False)
        # no Ray and no GPU here, exactly as on the cluster's head when the job starts
        assert gp.per_actor == 1.0 and gp.device == "cuda", (study, gp)
    amp = PARSERS["amplification"]().parse_args(commands["amplification"])
    assert amp.embed_gpus == 1.0 and amp.gen_actors >= 1  # SBERT actors ask for theirs explicitly


def test_stage_requests_reach_ray_data(ray_local):
    """The GPU count of a stage ends up in the Ray Data operator's remote arguments (what the
    autoscaler sees as a pending demand), for actor pools and tasks alike."""
    import pyarrow as pa

    from operators.base import Resources
    from pipelines.engine import runtime

    class Stage:
        def __init__(self, **_):
            pass

        def __call__(self, batch):
            return batch

    ds = ray_local.data.from_arrow(pa.table({"x": [1, 2]}))
    for res in (Resources(num_cpus=1, num_gpus=1, batch_size=2, actors=2), Resources(num_cpus=1, num_gpus=0.5)):
        op = runtime.map_stage(ds, Stage, {}, res)._logical_plan.dag
        assert op.ray_remote_args.get("num_gpus") == res.num_gpus


def test_zero_gpus_is_refused_for_real_models_unless_cpu_is_said():
    with pytest.raises(ModelLoadError, match="--device cpu"):
        gpus.plan({"gpus_per_model_actor": 1}, 0, "auto", standin=False)
    with pytest.raises(ModelLoadError, match="--device cpu"):
        gpus.plan({"gpus_per_model_actor": 0}, None, "auto", standin=False)
    cpu = gpus.plan({"gpus_per_model_actor": 1}, None, "cpu", standin=False)
    assert (cpu.per_actor, cpu.device) == (0.0, "cpu")
    with pytest.raises(ValueError, match="--device cpu"):
        gpus.plan({}, 1, "cpu", standin=False)
    assert gpus.plan({}, 0, "auto", standin=True).per_actor == 0.0  # stand-ins may run anywhere
    assert gpus.plan({}, None, "auto", standin=False).per_actor == gpus.DEFAULT_GPUS_PER_MODEL_ACTOR
    assert gpus.plan({}, 2, "cuda:0", standin=False).device == "cuda:0"


class _Cluster:
    def __init__(self, gpu: float):
        self.gpu = gpu

    def cluster_resources(self):
        return {"CPU": 4.0, "GPU": self.gpu} if self.gpu else {"CPU": 4.0}


def test_check_against_the_ray_instance(monkeypatch):
    real = lambda: gpus.plan({}, None, "auto", standin=False)  # noqa: E731
    # a local instance without GPUs can never get one: refused before any work
    with pytest.raises(ModelLoadError, match="local Ray instance has 0") as err:
        gpus.check_cluster(_Cluster(0), real(), standin=False, local=True)
    assert GPU_HINT in str(err.value)
    # a cluster with none up yet: wait for the autoscaler, unless it has no GPU node type at all
    monkeypatch.setattr(gpus, "autoscaler_max_gpus", lambda ray: None)
    gp = gpus.check_cluster(_Cluster(0), real(), standin=False, local=False)
    assert gp.per_actor == 1.0 and "autoscaler" in gp.note and "ray status" in gp.note
    monkeypatch.setattr(gpus, "autoscaler_max_gpus", lambda ray: 1.0)
    assert gpus.check_cluster(_Cluster(0), real(), standin=False, local=False).per_actor == 1.0
    monkeypatch.setattr(gpus, "autoscaler_max_gpus", lambda ray: 0.0)
    with pytest.raises(ModelLoadError, match="no node type with GPUs"):
        gpus.check_cluster(_Cluster(0), real(), standin=False, local=False)
    # GPUs up: asked for as configured
    assert gpus.check_cluster(_Cluster(4), real(), standin=False, local=True).per_actor == 1.0
    # stand-ins: the GPU when there is one, else the CPU
    standin = lambda: gpus.plan({}, None, "auto", standin=True)  # noqa: E731
    assert gpus.check_cluster(_Cluster(1), standin(), standin=True, local=True).per_actor == 1.0
    gp = gpus.check_cluster(_Cluster(0), standin(), standin=True, local=True)
    assert (gp.per_actor, gp.device) == (0.0, "auto")


def test_a_real_model_put_on_cuda_without_a_gpu_fails_with_the_hint():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelLoadError) as err:
        pick_device("cuda")
    assert "--device cpu" in str(err.value) and "gpu_worker" in str(err.value)
    assert pick_device("auto") == "cpu" and pick_device("cpu") == "cpu"


_ADVERTISED_GPU = textwrap.dedent("""
    import json, os, sys
    import pyarrow as pa
    import ray
    from operators.base import Resources
    from operators.image_generation import ImageGenerator
    from pipelines.engine import gpus, runtime
    from pipelines.standins.diffusion import build_tiny_stable_diffusion
    from schemas.images import SEED
    from schemas.subsets import PROMPT, PROMPT_ID

    ray.init(num_cpus=3, num_gpus=1, include_dashboard=False, log_to_driver=False)  # advertised, none present
    gp = gpus.check_cluster(ray, gpus.plan({}, None, "auto", standin=True), standin=True,
                            local=runtime.is_local_instance())

    class Probe(ImageGenerator):  # the production generator, reporting the GPU Ray gave its actor
        def __call__(self, batch):
            out = super().__call__(batch)
            ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
            return out.append_column("gpu_ids", pa.array([",".join(ids)] * out.num_rows))

    model = build_tiny_stable_diffusion(sys.argv[1], seed=0)
    rows = pa.table({PROMPT_ID: pa.array([1], pa.int32()), PROMPT: ["a photo of a nurse"], SEED: pa.array([7], pa.int64())})
    ds = runtime.map_stage(ray.data.from_arrow(rows), Probe, {"model": model, "steps": 1, "device": gp.device},
                           Resources(num_cpus=1, num_gpus=gp.per_actor, batch_size=1, actors=1))
    out = ds.select_columns(["gpu_ids"]).take_all()
    print("RESULT " + json.dumps({"per_actor": gp.per_actor, "local": runtime.is_local_instance(),
                                  "gpu_ids": [r["gpu_ids"] for r in out]}))
""")


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_local_instance_advertising_a_gpu_schedules_the_generator_actor_on_it(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _ADVERTISED_GPU, str(tmp_path / "sd")], cwd=ROOT,
                          capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result == {"per_actor": 1.0, "local": True, "gpu_ids": ["0"]}


STUDIES = [
    ("amplification", ["run", "--occupations", "nurse", "--sample-size", "2", "--nn-k", "2"]),
    ("gep", ["run"]),
    ("dalleval", ["run"]),
]


@pytest.mark.ray
@pytest.mark.timeout(600)
@pytest.mark.parametrize("study,argv", STUDIES, ids=[s for s, _ in STUDIES])
def test_real_models_are_refused_before_any_work_without_gpus(tmp_path, study, argv, ray_local, capsys):
    """Zero GPUs advertised (a local instance, no autoscaler) and none configured: the default (real)
    models are refused before any model loads (the hub is unreachable here, so reaching the model
    loader would fail differently) and before anything is written.

    Each study runs in this process on the tests' shared local instance (local, without GPUs, as a
    user's first `--ray-address local` run starts): the same check without paying the start of
    Python, the imports and a Ray instance for each. The scripts' own entry points are run in
    subprocesses elsewhere (``run_script`` in tests/studies/*/test_summarize_cli.py; the
    amplification script on a Ray head of its own in tests/test_job_submit.py)."""
    out = tmp_path / "out"
    args = [*argv, "--output", str(out), "--ray-address", "local", "--num-cpus", "2", "--no-progress"]
    main = {"amplification": amplification, "gep": gep, "dalleval": dalleval}[study].main
    returncode = main(args)
    stdout, err = capsys.readouterr()
    assert returncode == 2, stdout[-2000:] + err[-3000:]
    assert "GPU" in err and "--device cpu" in err and "local Ray instance has 0" in err, err[-2000:]
    assert "Traceback" not in err
    assert not [p for p in out.rglob("*") if p.is_file()], "nothing may be written before the refusal"


def test_generation_speed_flags_map_to_generator_options():
    import argparse

    from pipelines.engine import gpus

    p = argparse.ArgumentParser()
    gpus.add_generation_options(p)
    assert gpus.generation_options(p.parse_args([])) == {"channels_last": False, "vae_slicing": False,
                                                         "compile_unet": False}
    got = gpus.generation_options(p.parse_args(["--gen-channels-last", "--gen-vae-slicing", "auto",
                                                "--gen-compile", "max-autotune"]))
    assert got == {"channels_last": True, "vae_slicing": "auto", "compile_unet": "max-autotune"}
    assert gpus.generation_options(p.parse_args(["--gen-compile", "default", "--gen-vae-slicing", "on"])) == \
        {"channels_last": False, "vae_slicing": True, "compile_unet": True}
    # the options are ImageGenerator's keyword arguments
    import inspect

    from operators.image_generation import ImageGenerator

    assert set(got) <= set(inspect.signature(ImageGenerator).parameters)
