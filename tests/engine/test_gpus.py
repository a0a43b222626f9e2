"""GPUs of the model actors come from the study's configuration, not from what is up at connect time.

On the shipped cluster.yaml the head has no GPU and gpu_worker starts at 0 nodes: a request sized
from ``ray.cluster_resources()`` asks for 0 GPUs, SD/CLIP/BLIP-2 land on CPU workers in fp32 and
the autoscaler never starts a GPU node. These tests hold the request to the configuration, and
the refusal of real models on a CPU.
"""

from helpers import FORKED_WORKERS, REPO_ROOT
from forked_workers import python_command
import json
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from operators.support.models import GPU_HINT, ModelLoadError, pick_device
from pipelines import amplification, dalleval, exposed, gep
from pipelines.engine.run import gpus

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
    from pipelines.engine.stream import runtime

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
    from pipelines.engine.run import gpus
    from pipelines.engine.stream import runtime
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

    model = sys.argv[1]   # built by the test: this driver needs neither torch nor diffusers
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
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    model = build_tiny_stable_diffusion(tmp_path / "sd", seed=0)
    cmd, env = python_command([sys.executable, "-c", FORKED_WORKERS + _ADVERTISED_GPU, str(model)],
                              tmp_dir=str(tmp_path))   # forked from the tests' template
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=580)
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

    from pipelines.engine.cli.options import RunOptions
    from pipelines.engine.run import gpus

    p = argparse.ArgumentParser()
    gpus.add_generation_options(p)

    def speed(argv):   # what the generator stage gets, through the run's options
        return dict(RunOptions.from_args(p.parse_args(argv)).speed)

    assert speed([]) == {"channels_last": False, "vae_slicing": False,
                                                         "compile_unet": False}
    got = speed(["--gen-channels-last", "--gen-vae-slicing", "auto", "--gen-compile", "max-autotune"])
    assert got == {"channels_last": True, "vae_slicing": "auto", "compile_unet": "max-autotune"}
    assert speed(["--gen-compile", "default", "--gen-vae-slicing", "on"]) == \
        {"channels_last": False, "vae_slicing": True, "compile_unet": True}
    # the options are ImageGenerator's keyword arguments
    import inspect

    from operators.image_generation import ImageGenerator

    assert set(got) <= set(inspect.signature(ImageGenerator).parameters)


# --- generators too large for the ordinary GPU node ------------------------

def _spec(model, dtype="auto", **kw):
    """The spec the study drivers build for ``model``: its family and card dtype from families.py."""
    from operators.support.families import defaults
    from pipelines.engine.generation import GeneratorSpec

    d = defaults(model)
    return GeneratorSpec(model=model, dtype=dtype, family=d["family"], cuda_dtype=d["cuda_dtype"], **kw)


@pytest.mark.parametrize("model,dtype,large", [
    ("black-forest-labs/FLUX.1-dev", "auto", True),                       # 16.9B in bf16: ~39 GiB
    ("black-forest-labs/FLUX.1-schnell", "auto", True),
    ("black-forest-labs/FLUX.1-schnell", "bfloat16", True),
    ("stabilityai/stable-diffusion-3.5-large", "auto", True),             # 13.7B in bf16: ~32 GiB
    ("stabilityai/stable-diffusion-3.5-large-turbo", "auto", True),
    ("stabilityai/stable-diffusion-3.5-medium", "auto", False),           # 7.9B in bf16: ~18 GiB
    ("stabilityai/stable-diffusion-3-medium-diffusers", "auto", False),   # 7.7B in fp16: ~18 GiB
    ("stabilityai/stable-diffusion-xl-base-1.0", "auto", False),          # 3.5B in fp16: ~8 GiB
    ("stabilityai/stable-diffusion-xl-base-1.0", "float32", False),       # 3.5B x 4 x 1.25 = 17 GB
    ("stabilityai/stable-diffusion-3-medium-diffusers", "float32", True),  # 7.7B x 4 x 1.25 = 38 GB
    ("stabilityai/stable-diffusion-3.5-medium", "float32", True),
    ("runwayml/stable-diffusion-v1-5", "auto", False),                    # size unknown here: not routed
    ("CompVis/stable-diffusion-v1-4", "float32", False),
    ("black-forest-labs/FLUX.1-Krea-dev", "auto", True),                  # another FLUX.1: by its family
    ("someone/some-model", "float32", False),                             # unknown: trusted to fit
])
def test_needs_large_gpu(model, dtype, large):
    spec = _spec(model, dtype)
    assert gpus.needs_large_gpu(spec) is large
    assert gpus.actor_resources(spec) == ({gpus.LARGE_GPU_RESOURCE: 1.0} if large else {})


@pytest.mark.parametrize("model, tier, offloaded", [
    ("black-forest-labs/FLUX.2-dev", None, "xlarge_gpu"),            # 131 GiB: no card; offloaded 75 GiB
    ("Qwen/Qwen-Image", "xlarge_gpu", "xlarge_gpu"),                  # 67 GiB; its 20B MMDiT alone 48 GiB
    ("HiDream-ai/HiDream-I1-Dev", "xlarge_gpu", "large_gpu"),         # 72 GiB; offloaded 40 GiB
    ("hunyuanvideo-community/HunyuanImage-2.1-Diffusers", "xlarge_gpu", "large_gpu"),
    ("black-forest-labs/FLUX.2-klein-base-9B", "large_gpu", None),    # 40 GiB; offloaded 21 GiB
    ("black-forest-labs/FLUX.2-klein-4B", None, None),                # 18.6 GiB: an A10G holds it whole
    ("lodestones/Chroma1-HD", "large_gpu", None),
    ("THUDM/CogView4-6B", "large_gpu", None),
    ("Tongyi-MAI/Z-Image-Turbo", "large_gpu", None),                  # 24 GiB: just over an A10G's 22.4
    ("Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers", None, None),
    ("Alpha-VLLM/Lumina-Image-2.0", None, None),
    ("Kwai-Kolors/Kolors-diffusers", None, None),                     # fp16: 21 GiB
    ("Qwen/Qwen-Image-2512", "xlarge_gpu", "xlarge_gpu"),             # a later release: by its family
])
def test_the_2025_2026_families_go_to_the_card_that_holds_them(model, tier, offloaded):
    spec = _spec(model)
    assert gpus.memory_needed(spec) is not None           # every one's size is known here (none left unrouted)
    if tier is None and gpus.needs_large_gpu(spec):       # FLUX.2-dev: more than the largest card
        assert gpus.memory_needed(spec) > gpus.XLARGE_GPU_WORKER_MEMORY
    else:
        assert gpus.gpu_resource(spec) == tier and gpus.actor_resources(spec) == ({tier: 1.0} if tier else {})
    assert gpus.gpu_resource(spec, offload=True) == offloaded


def test_a_model_larger_than_every_card_is_refused_in_one_line_with_offload_as_the_remedy(monkeypatch, tmp_path):
    import yaml

    monkeypatch.setenv("HOME", str(tmp_path))
    _fake_autoscaler(monkeypatch, None)
    (tmp_path / "ray_bootstrap_config.yaml").write_text((ROOT / "cluster.yaml").read_text())
    real = lambda: gpus.plan({}, None, "auto", standin=False)  # noqa: E731
    flux2, qwen = _spec("black-forest-labs/FLUX.2-dev"), _spec("Qwen/Qwen-Image")
    with pytest.raises(ModelLoadError) as err:   # the cluster offers xlarge_gpu, but no card holds 131 GiB
        gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux2, qwen])
    msg = str(err.value)
    assert "\n" not in msg and "FLUX.2-dev (~131 GiB in bfloat16)" in msg and "Qwen-Image" not in msg
    assert "CPU offload" in msg and "gpu_worker_xlarge" in msg
    # offloaded, it waits for the 80 GB node type with Qwen-Image
    gp = gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux2, qwen], offload=True)
    assert "xlarge_gpu" in gp.note and "FLUX.2-dev" in gp.note and "Qwen-Image" in gp.note
    # a cluster without the 80 GB type: Qwen-Image refused, naming it; Chroma still waits for gpu_worker_large
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    del config["available_node_types"]["gpu_worker_xlarge"]
    (tmp_path / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(config))
    chroma = _spec("lodestones/Chroma1-HD")
    assert "gpu_worker_large" in gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False,
                                                    specs=[chroma]).note
    with pytest.raises(ModelLoadError, match="custom resource xlarge_gpu.*add cluster.yaml's gpu_worker_xlarge"):
        gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[chroma, qwen])
    # on a machine whose own GPU holds it (`ray start --resources='{"xlarge_gpu": 1}'`): accepted
    up = _ClusterWith(1)
    up.cluster_resources = lambda: {"GPU": 1.0, "xlarge_gpu": 1.0, "large_gpu": 1.0}
    assert "xlarge_gpu" in gpus.check_cluster(up, real(), standin=False, local=True, specs=[flux2]).note


def test_memory_needed_is_parameters_times_dtype_times_headroom():
    from operators.support.diffusion import MEMORY_HEADROOM

    flux = _spec("black-forest-labs/FLUX.1-dev")
    assert gpus.spec_dtype(flux) == "bfloat16"
    assert gpus.memory_needed(flux) == int(16_870_600_467 * 2 * MEMORY_HEADROOM)
    assert 39 <= gpus.memory_needed(flux) / 2**30 < 40                     # docs/benchmarks.md: 39.3 GiB
    gib = lambda model: gpus.memory_needed(_spec(model)) / 2**30  # noqa: E731
    assert gib("stabilityai/stable-diffusion-3.5-large") == pytest.approx(31.9, abs=0.05)   # docs/benchmarks.md
    assert gib("stabilityai/stable-diffusion-xl-base-1.0") == pytest.approx(8.1, abs=0.05)
    assert gpus.memory_needed(_spec("runwayml/stable-diffusion-v1-5")) is None
    # the threshold is the ordinary node's card: a smaller one routes SDXL too
    assert gpus.GPU_WORKER_MEMORY == 24 * 10**9


def test_a_spec_without_family_is_detected_offline():
    from pipelines.engine.generation import GeneratorSpec

    assert gpus.needs_large_gpu(GeneratorSpec(model="black-forest-labs/FLUX.1-Krea-dev", cuda_dtype="bfloat16"))
    assert not gpus.needs_large_gpu(GeneratorSpec(model="someone/some-model", cuda_dtype="float32"))


def test_cpu_offload_needs_only_the_largest_component(monkeypatch, tmp_path):
    from types import SimpleNamespace

    sd35, flux = _spec("stabilityai/stable-diffusion-3.5-large"), _spec("black-forest-labs/FLUX.1-dev")
    assert gpus.needs_large_gpu(sd35) and not gpus.needs_large_gpu(sd35, offload=True)   # 8.06B x 2 x 1.25: 19 GiB
    assert gpus.needs_large_gpu(flux, offload=True)                                      # 11.9B x 2 x 1.25: 28 GiB
    assert gpus.memory_needed(flux, offload=True) == int(11_901_408_320 * 2 * 1.25)
    assert gpus.actor_resources(sd35, offload=True) == {}
    # a spec that carries its own cpu_offload
    own = SimpleNamespace(model=sd35.model, dtype="auto", cuda_dtype="bfloat16", family="sd3", cpu_offload=True)
    assert not gpus.needs_large_gpu(own) and gpus.needs_large_gpu(own, offload=False)
    # on a local instance: SD 3.5 large offloaded passes, FLUX does not, and the refusal says why
    monkeypatch.setenv("HOME", str(tmp_path))
    real = lambda: gpus.plan({}, None, "auto", standin=False)  # noqa: E731
    assert gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True, specs=[sd35],
                              offload=True).per_actor == 1.0
    with pytest.raises(ModelLoadError, match="largest component with CPU offload") as err:
        gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True, specs=[sd35, flux], offload=True)
    assert "stable-diffusion-3.5-large" not in str(err.value)
    # without offload, the refusal offers it for the model it would help (SD 3.5 large), not FLUX
    with pytest.raises(ModelLoadError, match="run stabilityai/stable-diffusion-3.5-large with CPU offload"):
        gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True, specs=[sd35, flux])


def _header_only_pipeline(root, shape):
    """A pipeline directory whose one component's safetensors header declares a tensor of
    ``shape`` (no data: pipeline_parameters reads headers only)."""
    import struct

    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline",
                                                       "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": list(shape), "data_offsets": [0, 0]}}).encode()
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return str(root)


def test_a_local_directory_is_sized_from_its_safetensors_headers(tmp_path, monkeypatch):
    from pipelines.engine.generation import GeneratorSpec

    big = _header_only_pipeline(tmp_path / "big", (100_000, 100_000))   # 10B parameters: 25 GB in bf16
    small = _header_only_pipeline(tmp_path / "small", (10_000, 10_000))
    for family in ("flux", None):   # the directory's own count wins over its family's
        assert gpus.needs_large_gpu(GeneratorSpec(model=big, family=family, cuda_dtype="bfloat16"))
        assert not gpus.needs_large_gpu(GeneratorSpec(model=small, family=family, cuda_dtype="bfloat16"))
    assert gpus.memory_needed(GeneratorSpec(model=big, cuda_dtype="bfloat16")) == int(10**10 * 2 * 1.25)
    from operators.support import diffusion

    if not hasattr(diffusion, "component_parameters"):
        pytest.skip("no per-component counts in operators.support.diffusion: offload sizes the whole pipeline")
    # with CPU offload, only the largest component counts: two 6B components need 15 GB at a time
    two = tmp_path / "two"
    _header_only_pipeline(two, (60_000, 100_000))
    (two / "text_encoder").mkdir()
    (two / "text_encoder" / "model.safetensors").write_bytes(
        (two / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes())
    index = json.loads((two / "model_index.json").read_text())
    (two / "model_index.json").write_text(json.dumps({**index, "text_encoder": ["transformers", "T5EncoderModel"]}))
    spec = GeneratorSpec(model=str(two), cuda_dtype="bfloat16")
    assert gpus.needs_large_gpu(spec) and not gpus.needs_large_gpu(spec, offload=True)


def test_tiny_standins_are_never_large(tmp_path, monkeypatch):
    import shutil

    from pipelines.engine.generation import GeneratorSpec
    from pipelines.standins.families import build_tiny_sdxl

    tiny = build_tiny_sdxl(tmp_path / "sdxl")
    spec = GeneratorSpec(model=tiny, family="sdxl", dtype="float32")
    assert not gpus.needs_large_gpu(spec) and gpus.actor_resources(spec) == {}
    # without its STANDIN.txt it is sized like any directory; with a tiny threshold it would route
    bare = shutil.copytree(tiny, tmp_path / "bare")
    (bare / "STANDIN.txt").unlink()
    monkeypatch.setattr(gpus, "GPU_WORKER_MEMORY", 1)
    assert gpus.needs_large_gpu(GeneratorSpec(model=str(bare), family="sdxl", dtype="float32"))
    assert not gpus.needs_large_gpu(spec)                  # the stand-in still is not


def test_actors_asking_no_gpu_ask_no_large_gpu():
    flux = _spec("black-forest-labs/FLUX.1-schnell")
    assert gpus.actor_resources(flux, gpus.plan({}, None, "auto", standin=False)) == {gpus.LARGE_GPU_RESOURCE: 1.0}
    assert gpus.actor_resources(flux, gpus.plan({}, None, "cpu", standin=False)) == {}


class _FakeGroup:
    def __init__(self, name, resources):
        self.name, self.resources = name, resources


def _fake_autoscaler(monkeypatch, groups):
    """The cluster config the autoscaler publishes to the GCS (ray._private.state), faked."""
    from types import SimpleNamespace

    from ray._private import state

    cfg = None if groups is None else SimpleNamespace(node_group_configs=[_FakeGroup(n, r) for n, r in groups.items()])
    monkeypatch.setattr(state.state, "get_cluster_config", lambda: cfg)


class _ClusterWith(_Cluster):
    def __init__(self, gpu: float, large: float = 0):
        super().__init__(gpu)
        self.large = large

    def cluster_resources(self):
        out = super().cluster_resources()
        return {**out, gpus.LARGE_GPU_RESOURCE: self.large} if self.large else out


def test_check_cluster_refuses_big_models_without_the_large_resource(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))   # no ~/ray_bootstrap_config.yaml
    real = lambda: gpus.plan({}, None, "auto", standin=False)  # noqa: E731
    flux, sdxl = _spec("black-forest-labs/FLUX.1-dev"), _spec("stabilityai/stable-diffusion-xl-base-1.0")
    # a local instance with a GPU but no large_gpu: refused in one line naming model, memory, remedy
    with pytest.raises(ModelLoadError) as err:
        gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True, specs=[sdxl, flux])
    msg = str(err.value)
    assert "\n" not in msg and "FLUX.1-dev" in msg and "39 GiB" in msg and "stable-diffusion-xl" not in msg
    assert "gpu_worker_large" in msg and "local Ray instance" in msg
    # small models only, no specs, stand-ins, or a CPU run: nothing asked
    assert gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True, specs=[sdxl]).per_actor == 1.0
    assert gpus.check_cluster(_ClusterWith(1), real(), standin=False, local=True).per_actor == 1.0
    standin = gpus.plan({}, None, "auto", standin=True)
    assert gpus.check_cluster(_ClusterWith(1), standin, standin=True, local=True, specs=[flux]).per_actor == 1.0
    cpu = gpus.plan({}, None, "cpu", standin=False)
    assert gpus.check_cluster(_ClusterWith(0), cpu, standin=False, local=True, specs=[flux]).per_actor == 0.0
    # a large GPU up (a node, or `ray start --resources`): accepted, and said so
    gp = gpus.check_cluster(_ClusterWith(1, large=1), real(), standin=False, local=True, specs=[flux])
    assert gpus.LARGE_GPU_RESOURCE in gp.note and "FLUX.1-dev" in gp.note


def test_check_cluster_reads_the_autoscalers_node_types(monkeypatch, tmp_path):
    import yaml

    monkeypatch.setenv("HOME", str(tmp_path))
    real = lambda: gpus.plan({}, None, "auto", standin=False)  # noqa: E731
    flux = _spec("stabilityai/stable-diffusion-3.5-large")
    ordinary = {"head": {"CPU": 0}, "cpu_worker": {"CPU": 32}, "gpu_worker": {"CPU": 8, "GPU": 1}}
    # published to the GCS without the large type: refused (nothing up yet)
    _fake_autoscaler(monkeypatch, ordinary)
    with pytest.raises(ModelLoadError, match="autoscaler has no node type with the custom resource large_gpu"):
        gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux])
    # with it: the actors wait for the autoscaler to start it
    _fake_autoscaler(monkeypatch, {**ordinary, "gpu_worker_large": {"CPU": 8, "GPU": 1, "large_gpu": 1}})
    gp = gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux])
    assert "gpu_worker_large" in gp.note and "autoscaler" in gp.note
    # a large type with fewer GPUs than an actor asks for cannot hold it (the 4-GPU type has no large_gpu)
    _fake_autoscaler(monkeypatch, {**ordinary, "gpu_x4": {"CPU": 48, "GPU": 4},
                                   "gpu_worker_large": {"CPU": 8, "GPU": 1, "large_gpu": 1}})
    assert gpus.check_cluster(_ClusterWith(0), gpus.plan({}, 2, "auto", standin=False), standin=False,
                              local=False).per_actor == 2.0
    with pytest.raises(ModelLoadError, match="large_gpu and 2 GPU"):
        gpus.check_cluster(_ClusterWith(0), gpus.plan({}, 2, "auto", standin=False), standin=False, local=False,
                           specs=[flux])
    # nothing published: ~/ray_bootstrap_config.yaml, here this repository's cluster.yaml
    _fake_autoscaler(monkeypatch, None)
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    (tmp_path / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(config))
    assert gpus.autoscaler_node_types(None)["gpu_worker_large"] == {"CPU": 8.0, "GPU": 1.0, "large_gpu": 1.0}
    assert gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux]).per_actor == 1.0
    del config["available_node_types"]["gpu_worker_large"]
    (tmp_path / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ModelLoadError, match="stable-diffusion-3.5-large"):
        gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux])
    assert gpus.autoscaler_max_gpus(None) == 1.0   # the GPU check reads the same config
    # no config at all: trusted, as for GPUs
    (tmp_path / "ray_bootstrap_config.yaml").unlink()
    assert gpus.autoscaler_node_types(None) is None
    assert gpus.check_cluster(_ClusterWith(0), real(), standin=False, local=False, specs=[flux]).per_actor == 1.0


class _RecordingDataset:
    """Stands in for a Ray dataset: records the keyword arguments of each ``map_batches``."""

    def __init__(self, calls=None):
        self.calls = [] if calls is None else calls

    def map_batches(self, fn, **kwargs):
        self.calls.append(kwargs)
        return _RecordingDataset(self.calls)


class _PassThrough:
    """A stage that returns its batch (its resources come from the Stage)."""

    stage_name = "op"

    def __init__(self, **_):
        pass

    def __call__(self, batch):
        return batch


def test_custom_resources_reach_map_batches_only_when_set():
    import pyarrow as pa

    from operators.base import Resources, Stage
    from pipelines.engine.stream import stages

    schema = pa.schema([pa.field("x", pa.int64())])
    for res in (Resources(num_gpus=1, actors=2), Resources(), Resources(resources={})):
        for sch in (None, schema):
            ds = _RecordingDataset()
            stages.run(ds, [Stage(_PassThrough, {}, res)], sch)
            assert "resources" not in ds.calls[0], (res, sch)
    for res in (Resources(num_gpus=1, actors=2, resources={"large_gpu": 1}), Resources(resources={"large_gpu": 1})):
        for sch in (None, schema):
            ds = _RecordingDataset()
            stages.run(ds, [Stage(_PassThrough, {}, res)], sch)
            assert ds.calls[0]["resources"] == {"large_gpu": 1}, (res, sch)
            assert ds.calls[0].get("num_gpus") == (res.num_gpus or None)


def test_resources_override_like_num_gpus():
    from operators.base import Resources, Stage
    from pipelines.engine.stream import stages

    class Gen:
        stage_name = "generate"
        resources = Resources(num_gpus=1, actors=1)

    gen = Stage(Gen, {})
    changes = stages.overrides({"stages": {"generate": {"resources": {"large_gpu": 1}}}})
    (out,) = stages.configure([gen], changes)
    assert out.declared() == Resources(num_gpus=1, actors=1, resources={"large_gpu": 1.0})
    # the run's value (values=, as generator_pipeline passes num_gpus) wins over the file's
    changes = stages.overrides({"stages": {"generate": {"resources": {"large_gpu": 1}}}},
                               values={"generate": {"num_gpus": 1.0, "resources": {"big": 2}}})
    assert stages.configure([gen], changes)[0].declared().resources == {"big": 2.0}
    assert stages.configure([gen], stages.overrides({}))[0].declared().resources is None
    for bad in ("large_gpu", {"large_gpu": -1}, {"large_gpu": "one"}):
        with pytest.raises(ValueError, match="generate.resources"):
            stages.overrides({"stages": {"generate": {"resources": bad}}})


def test_stage_custom_resources_reach_ray_data(ray_local):
    """Ray Data accepts them: they end up in the operator's remote arguments, next to the GPUs."""
    import pyarrow as pa

    from operators.base import Resources, Stage
    from pipelines.engine.stream import stages

    ds = ray_local.data.from_arrow(pa.table({"x": [1, 2]}))
    big = stages.run(ds, [Stage(_PassThrough, {}, Resources(num_gpus=1, batch_size=2, actors=1, resources={"large_gpu": 1}))])
    assert big._logical_plan.dag.ray_remote_args["resources"] == {"large_gpu": 1}
    assert big._logical_plan.dag.ray_remote_args["num_gpus"] == 1
    small = stages.run(ds, [Stage(_PassThrough, {}, Resources(num_gpus=1, batch_size=2, actors=1))])
    assert "resources" not in small._logical_plan.dag.ray_remote_args
