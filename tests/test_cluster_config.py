"""cluster.yaml is a valid Ray cluster launcher config and keeps the properties the project needs of it.

Validation goes through Ray's own code and schema (ray/autoscaler/ray-schema.json) the way
`ray up` does: ``prepare_config`` (merges the provider's defaults.yaml) then
``validate_config``. No network, no cloud, no cluster.
"""

from helpers import REPO_ROOT
import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import ray
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = REPO_ROOT
CLUSTER_YAML = ROOT / "cluster.yaml"
SCHEMA_PATH = Path(ray.autoscaler.__file__).parent / "ray-schema.json"

# Instance types the file uses or suggests -> (vCPUs, GPUs), so that declared resources
# follow a change of InstanceType. Types not listed here are not checked.
KNOWN_INSTANCES = {
    "m6i.2xlarge": (8, 0), "m6i.4xlarge": (16, 0), "m6i.8xlarge": (32, 0), "m6i.16xlarge": (64, 0),
    "c6i.8xlarge": (32, 0), "m5.large": (2, 0),
    "g5.xlarge": (4, 1), "g5.2xlarge": (8, 1), "g5.4xlarge": (16, 1), "g5.12xlarge": (48, 4),
    "g6.2xlarge": (8, 1), "g6e.2xlarge": (8, 1), "p4d.24xlarge": (96, 8), "p4de.24xlarge": (96, 8),
    "p5.48xlarge": (192, 8), "p5.4xlarge": (16, 1), "g6e.12xlarge": (48, 4),
}
# GPU instance types -> (memory of one GPU in GB, host memory in GiB), AWS's published figures.
GPU_INSTANCES = {
    "g5.xlarge": (24, 16), "g5.2xlarge": (24, 32), "g5.4xlarge": (24, 64), "g5.12xlarge": (24, 192),
    "g6.2xlarge": (24, 32), "g6e.2xlarge": (48, 64), "p4d.24xlarge": (40, 1152), "p4de.24xlarge": (80, 1152),
    "p5.48xlarge": (80, 2048), "p5.4xlarge": (80, 256), "g6e.12xlarge": (48, 384),
}


@pytest.fixture(scope="module")
def text():
    return CLUSTER_YAML.read_text()


@pytest.fixture
def config(text):
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA_PATH.read_text())


def ray_validate(config):
    """What `ray up` runs before touching the cloud."""
    validate_config(prepare_config(copy.deepcopy(config)))


def node_types(config):
    return config["available_node_types"]


def worker_types(config):
    return {k: v for k, v in node_types(config).items() if k != config["head_node_type"]}


# --- validation against Ray's schema ---------------------------------------------------------

def test_valid_for_ray(config):
    ray_validate(config)


def test_valid_against_the_schema_shipped_with_ray(config, schema):
    jsonschema.validators.validator_for(schema).check_schema(schema)
    jsonschema.validate(config, schema)


@pytest.mark.parametrize("breakage, error", [
    ("unknown top-level key", r"'max_wrokers' was unexpected"),
    ("max_workers of the wrong type", r"'many' is not of type 'integer'"),
    ("node type without resources", r"'resources' is a required property"),
    ("fractional GPU", r"0.5 is not of type 'integer'"),
    ("unknown node type field", r"'max_worker' was unexpected"),
    ("head type not among node types", r"head_node_type` must be one of"),
    ("min_workers above the global max", r"smaller than the sum of `min_workers`"),
])
def test_validation_is_live(config, breakage, error):
    broken = copy.deepcopy(config)
    gpu = next(k for k, v in worker_types(broken).items() if v["resources"].get("GPU"))
    if breakage == "unknown top-level key":
        broken["max_wrokers"] = 3
    elif breakage == "max_workers of the wrong type":
        broken["max_workers"] = "many"
    elif breakage == "node type without resources":
        del broken["available_node_types"][gpu]["resources"]
    elif breakage == "fractional GPU":
        broken["available_node_types"][gpu]["resources"]["GPU"] = 0.5
    elif breakage == "unknown node type field":
        broken["available_node_types"][gpu]["max_worker"] = 2
    elif breakage == "head type not among node types":
        broken["head_node_type"] = "no-such-type"
    elif breakage == "min_workers above the global max":
        broken["available_node_types"][gpu]["min_workers"] = broken["max_workers"] + 1
    with pytest.raises((jsonschema.ValidationError, ValueError), match=error):
        ray_validate(broken)


def test_ray_defaults_do_not_leak_in(config):
    """Ray fills every missing top-level key from aws/defaults.yaml: its setup_commands install
    a nightly Ray wheel and its head_setup_commands run a second, separate pip install."""
    prepared = prepare_config(copy.deepcopy(config))
    assert prepared["head_setup_commands"] == config["setup_commands"]
    assert prepared["worker_setup_commands"] == config["setup_commands"]
    assert not any("ray-wheels" in c or "dev0" in c for c in prepared["head_setup_commands"])
    assert prepared["docker"] == {} or "image" in prepared["docker"]


# --- what the cluster must provide ---------------------------------------------------------

def test_provider_and_auth(config):
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    assert isinstance(config["provider"]["cache_stopped_nodes"], bool)
    assert config["auth"] == {"ssh_user": "ubuntu"}
    assert config["cluster_name"] and config["idle_timeout_minutes"] > 0 and config["upscaling_speed"] > 0


def test_head_runs_no_tasks_and_has_no_gpu(config):
    head = node_types(config)[config["head_node_type"]]
    assert head["resources"].get("CPU") == 0
    assert not head["resources"].get("GPU")
    assert head.get("max_workers", 0) == 0


def test_gpu_worker_type_declared_and_bounded(config):
    gpus = {k: v for k, v in worker_types(config).items() if v["resources"].get("GPU", 0) >= 1}
    assert gpus, "no worker type declares GPU in its resources"
    for name, t in gpus.items():
        assert t["resources"].get("CPU", 0) >= 1, name
        assert 0 <= t.get("min_workers", 0) <= t["max_workers"] and t["max_workers"] >= 1, name


def test_cpu_only_worker_type_declared_and_bounded(config):
    cpus = {k: v for k, v in worker_types(config).items()
            if not v["resources"].get("GPU") and v["resources"].get("CPU", 0) >= 1}
    assert cpus, "no CPU-only worker type (download and caption stages)"
    for name, t in cpus.items():
        assert 0 <= t.get("min_workers", 0) <= t["max_workers"] and t["max_workers"] >= 1, name


def test_global_bounds_cover_the_node_types(config):
    workers = worker_types(config).values()
    assert config["max_workers"] >= max(t["max_workers"] for t in workers)
    assert config["max_workers"] >= sum(t.get("min_workers", 0) for t in workers)


def test_declared_resources_match_the_instance_types(config):
    for name, t in node_types(config).items():
        itype = t["node_config"]["InstanceType"]
        if itype not in KNOWN_INSTANCES or name == config["head_node_type"]:
            continue
        vcpus, gpus = KNOWN_INSTANCES[itype]
        assert t["resources"].get("CPU") == vcpus, (name, itype)
        assert t["resources"].get("GPU", 0) == gpus, (name, itype)


# --- the node type of the big text-to-image models ------------------------------

def _big_models(resource=None):
    """(model, bytes it needs on a GPU in its card's dtype) of every known model that
    pipelines/engine/run/gpus.py routes to a larger GPU node type than gpu_worker (``resource``:
    only those routed to the node type declaring it), models too large for every card left out."""
    from operators.support.families import defaults
    from pipelines.engine.run import gpus
    from pipelines.engine.generation import GeneratorSpec

    out = []
    for model in gpus.PIPELINE_PARAMETERS:
        d = defaults(model)
        spec = GeneratorSpec(model=model, family=d["family"], cuda_dtype=d["cuda_dtype"])
        need = gpus.memory_needed(spec)
        if gpus.needs_large_gpu(spec) and need <= gpus.NODE_TIERS[-1].memory \
                and resource in (None, gpus.gpu_resource(spec)):
            out.append((model, need))
    return out


def test_big_models_are_known():
    big = dict(_big_models())
    assert {"black-forest-labs/flux.1-dev", "black-forest-labs/flux.1-schnell",
            "stabilityai/stable-diffusion-3.5-large"} <= set(big), big


def test_large_gpu_worker_type(config):
    from pipelines.engine.run import gpus

    large = {k: v for k, v in worker_types(config).items() if gpus.LARGE_GPU_RESOURCE in v["resources"]}
    assert set(large) == {"gpu_worker_large"}, large
    t = large["gpu_worker_large"]
    assert t["node_config"]["InstanceType"] == "g6e.2xlarge"
    assert t["resources"] == {"CPU": 8, "GPU": 1, gpus.LARGE_GPU_RESOURCE: 1}
    assert t.get("min_workers", 0) == 0 and 1 <= t["max_workers"] <= config["max_workers"]
    gpu_gb, host_gib = GPU_INSTANCES[t["node_config"]["InstanceType"]]
    assert gpu_gb * 10**9 >= gpus.LARGE_GPU_WORKER_MEMORY
    for model, need in _big_models(gpus.LARGE_GPU_RESOURCE):   # each fits the large card and its host memory
        assert need <= gpu_gb * 10**9, (model, need / 2**30)
        assert need <= host_gib * 2**30, (model, need / 2**30)


def test_the_80_gb_type_holds_the_largest_2025_2026_models(config):
    """Qwen-Image, HiDream-I1 and HunyuanImage 2.1 (and FLUX.2-dev with CPU offload) go to
    gpu_worker_xlarge, the one node type declaring xlarge_gpu, whose card and host memory hold
    each of them; FLUX.2-dev whole fits no card here."""
    from operators.support.families import defaults
    from pipelines.engine.generation import GeneratorSpec
    from pipelines.engine.run import gpus

    xl = {k: v for k, v in worker_types(config).items() if gpus.XLARGE_GPU_RESOURCE in v["resources"]}
    assert set(xl) == {"gpu_worker_xlarge"}, xl
    t = xl["gpu_worker_xlarge"]
    assert t["resources"] == {"CPU": 16, "GPU": 1, gpus.XLARGE_GPU_RESOURCE: 1}
    assert t.get("min_workers", 0) == 0 and 1 <= t["max_workers"] <= config["max_workers"]
    assert (t["resources"]["CPU"], t["resources"]["GPU"]) == KNOWN_INSTANCES[t["node_config"]["InstanceType"]]
    gpu_gb, host_gib = GPU_INSTANCES[t["node_config"]["InstanceType"]]
    # an "80GB" card is 80 GiB of HBM, of which CUDA reports 79.2 GiB (H100, A100 80GB)
    assert gpu_gb == 80 and gpus.XLARGE_GPU_WORKER_MEMORY <= 79.2 * 2**30
    routed = dict(_big_models(gpus.XLARGE_GPU_RESOURCE))
    assert {"qwen/qwen-image", "hidream-ai/hidream-i1-full",
            "hunyuanvideo-community/hunyuanimage-2.1-diffusers"} <= set(routed), routed
    for model, need in routed.items():
        assert gpus.LARGE_GPU_WORKER_MEMORY < need <= gpus.XLARGE_GPU_WORKER_MEMORY and need <= host_gib * 2**30, model
    d = defaults("black-forest-labs/FLUX.2-dev")
    flux2 = GeneratorSpec(model="black-forest-labs/FLUX.2-dev", family=d["family"], cuda_dtype=d["cuda_dtype"])
    assert gpus.memory_needed(flux2) > 79.2 * 2**30 > gpus.XLARGE_GPU_WORKER_MEMORY >= gpus.memory_needed(flux2, True)
    assert gpus.gpu_resource(flux2, offload=True) == gpus.XLARGE_GPU_RESOURCE


def test_only_the_large_type_declares_the_large_resource(config):
    """The ordinary GPU type never gets a big-model actor: it does not declare the resource, and
    its card holds what gpus.GPU_WORKER_MEMORY says (so the routing threshold is not too high)."""
    from pipelines.engine.run import gpus

    types = node_types(config)
    assert gpus.LARGE_GPU_RESOURCE not in types["gpu_worker"]["resources"]
    assert gpus.LARGE_GPU_RESOURCE not in types[config["head_node_type"]]["resources"]
    for name, t in worker_types(config).items():
        itype = t["node_config"]["InstanceType"]
        if t["resources"].get("GPU") and gpus.LARGE_GPU_RESOURCE not in t["resources"]:
            assert GPU_INSTANCES[itype][0] * 10**9 >= gpus.GPU_WORKER_MEMORY, (name, itype)
        if gpus.LARGE_GPU_RESOURCE in t["resources"]:
            assert t["resources"][gpus.LARGE_GPU_RESOURCE] == t["resources"]["GPU"], name


ALTERNATIVE = re.compile(r"^\s*#\s+([a-z0-9]+\.[a-z0-9]+)\s+(\d+) x ([\w-]+) (\d+)GB,\s+(\d+) vCPU\s+->\s+(\{[^}]*\})",
                         re.M)


def test_commented_alternatives_match_the_instances(text):
    """The alternatives suggested in comments (``<type>  N x CARD MEMGB, V vCPU -> {resources}``)
    declare what their instance has; a large-GPU alternative holds the big models."""
    from pipelines.engine.run import gpus

    found = ALTERNATIVE.findall(text)
    assert {m[0] for m in found} >= {"g6e.2xlarge", "p4de.24xlarge", "p5.48xlarge"}, found
    for itype, count, _card, mem, vcpus, resources in found:
        res = yaml.safe_load(resources)
        assert (res["CPU"], res.get("GPU", 0)) == KNOWN_INSTANCES[itype] == (int(vcpus), int(count)), itype
        assert int(mem) == GPU_INSTANCES[itype][0], itype
        if gpus.LARGE_GPU_RESOURCE in res:
            assert res[gpus.LARGE_GPU_RESOURCE] == res["GPU"], itype
            assert all(need <= int(mem) * 10**9 for _, need in _big_models(gpus.LARGE_GPU_RESOURCE)), itype
        if gpus.XLARGE_GPU_RESOURCE in res:
            assert res[gpus.XLARGE_GPU_RESOURCE] == res["GPU"] and int(mem) == 80, itype
            assert all(need <= gpus.XLARGE_GPU_WORKER_MEMORY for _, need in _big_models(gpus.XLARGE_GPU_RESOURCE))


def test_every_node_runs_the_same_image(config):
    """Ray needs one Python and one Ray version across nodes; one AMI for all types keeps it so."""
    images = {t["node_config"].get("ImageId") for t in node_types(config).values()}
    assert len(images) == 1 and None not in images
    image = images.pop()
    assert image.startswith(("ami-", "resolve:ssm:")), image


def _repo_mount(config):
    mounts = {remote: local for remote, local in config["file_mounts"].items()
              if (CLUSTER_YAML.parent / local).resolve() == ROOT}
    assert mounts, "file_mounts do not ship the repository"
    return next(iter(mounts))


def test_file_mounts_ship_the_repository(config):
    remote = _repo_mount(config)
    assert remote.startswith(("~/", "/"))
    assert (ROOT / "pyproject.toml").exists()


def test_setup_installs_this_project_with_cloud_extra_and_matching_ray(config):
    remote = _repo_mount(config)
    installs = [c for c in config["setup_commands"] if "pip install" in c and remote in c]
    assert installs, f"no setup command pip-installs the mounted repo {remote}"
    assert any(re.search(r"-e\s+['\"]?\.\[[^\]]*cloud", c) or f"-e '{remote}[cloud]'" in c for c in installs)
    # the cluster's Ray must be the Ray that runs `ray up` (this one)
    pins = set(re.findall(r"ray\[[^\]]*\]==([\w.]+)", " ".join(config["setup_commands"])))
    assert pins == {ray.__version__}, f"setup_commands pin Ray {pins}, the launcher has {ray.__version__}"


def test_nodes_run_the_python_the_project_requires(config):
    """The AMI's python3 is 3.10; pyproject requires more, so every pip install and every Ray
    command must use an interpreter of the required version (a venv first on PATH)."""
    floor = re.search(r'requires-python\s*=\s*">=\s*3\.(\d+)', (ROOT / "pyproject.toml").read_text())
    assert floor, "pyproject.toml states no requires-python floor"
    wanted = f"python3.{floor.group(1)}"
    commands = config["setup_commands"]
    assert any(wanted in c and "install" in c for c in commands), f"no setup command installs {wanted}"
    assert any(f"{wanted} -m venv ~/venv" in c for c in commands)
    assert any("venv/bin" in c and ".bashrc" in c for c in commands), "the venv must come first on PATH"
    pip = [c for c in commands if "pip install" in c]
    assert pip and all("~/venv/bin/python -m pip" in c for c in pip), pip


def test_start_commands(config):
    head = " ".join(config["head_start_ray_commands"])
    workers = " ".join(config["worker_start_ray_commands"])
    assert config["head_start_ray_commands"][0].strip() == "ray stop"
    assert config["worker_start_ray_commands"][0].strip() == "ray stop"
    assert "ray start --head" in head and "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "--address=$RAY_HEAD_IP:6379" in workers and "--head" not in workers


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync not installed")
def test_rsync_ships_the_code_but_not_venv_runs_or_git(config, tmp_path):
    """Run rsync (dry) with exactly the arguments Ray's SSH command runner builds."""
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    args = SSHCommandRunner._create_rsync_filter_args(None, {
        "rsync_exclude": config.get("rsync_exclude"), "rsync_filter": config.get("rsync_filter")})
    local = config["file_mounts"][_repo_mount(config)]
    src = os.path.join(str(CLUSTER_YAML.parent / local), "")   # Ray appends "/" to directories
    out = subprocess.run(["rsync", "-an", "--out-format=%n", *args, src, str(tmp_path / "dest")],
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert "pyproject.toml" in out and "pipelines/" in out and "cluster.yaml" in out
    for excluded in (".venv/", "runs/", ".git/"):
        assert not any(p == excluded or p.startswith(excluded) for p in out), excluded
    assert not any("__pycache__" in p or ".egg-info" in p for p in out)


# --- no credentials ---------------------------------------------------------------------------

SECRET_KEY = re.compile(r"access_key|secret|password|passwd|token|private_key|credential", re.I)


def _secret_keys(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            here = f"{path}.{k}"
            if SECRET_KEY.search(str(k)) and v not in (None, "", {}, []):
                yield here
            yield from _secret_keys(v, here)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _secret_keys(v, f"{path}[{i}]")


def test_no_credentials_in_the_config(config, text):
    assert list(_secret_keys(config)) == []
    assert not re.search(r"(?<![A-Z0-9])(AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])", text)
    assert "PRIVATE KEY-----" not in text
    assert not re.search(r"(?i)aws_(secret_access_key|session_token|access_key_id)\s*[=:]", text)
    commands = " ".join(c for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                                      "worker_setup_commands", "head_start_ray_commands",
                                      "worker_start_ray_commands") for c in config.get(key) or [])
    assert not re.search(r"AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)|GOOGLE_APPLICATION_CREDENTIALS",
                         commands)


def test_secret_checks_are_live(config):
    leaky = copy.deepcopy(config)
    leaky["provider"]["aws_credentials"] = {"aws_secret_access_key": "x" * 40}
    leaky["auth"]["ssh_private_key"] = "~/.ssh/mine.pem"
    assert sorted(_secret_keys(leaky)) == [".auth.ssh_private_key", ".provider.aws_credentials",
                                           ".provider.aws_credentials.aws_secret_access_key"]
