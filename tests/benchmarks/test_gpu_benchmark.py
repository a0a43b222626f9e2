"""``benchmarks/gpu.py``: the one GPU benchmark command. Its smoke mode (tiny stand-ins on the CPU) runs
in a subprocess and must print, and write to --output, a markdown table with a row per requested
stage and a positive throughput in each; no timing is asserted. The pure helpers (the table of GPU
peaks, the argument defaults) are tested in-process."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from forked_workers import python_command

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
RATE = re.compile(r"^([0-9][0-9,]*(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?) (images|captions)/s")


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def table_rows(markdown: str) -> list[dict]:
    """The rows of the benchmark's markdown table, as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| stage |"))
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = []
    for ln in lines[head + 2:]:   # after the header and the alignment row
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(columns), ln
        rows.append(dict(zip(columns, cells)))
    return rows


def run_smoke(tmp_path: Path, stages: str, *extra: str) -> tuple[str, str]:
    out = tmp_path / "gpu.md"
    # forked from the tests' template (its libraries imported: about 16 CPU-s less than a fresh
    # interpreter), the script run as __main__ as a user runs it
    cmd, env = python_command([sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--only", stages,
                               "--output", str(out), *extra])
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert out.is_file()
    return proc.stdout, out.read_text()


def check_rows(markdown: str, stages: list[str]) -> list[dict]:
    rows = table_rows(markdown)
    assert {r["stage"] for r in rows} == set(stages)
    for r in rows:
        m = RATE.match(r["throughput"])
        assert m, r
        assert float(m.group(1).replace(",", "")) > 0, r
        assert float(r["latency (s/call)"]) > 0 and float(r["s/item"]) > 0, r
        assert r["peak GPU memory"] == "-"   # CPU: no CUDA allocator
    return rows


# -- the smoke run ----------------------------------------------------------------------------------------------


EVERY_STAGE = ["generation", "families", "clip", "sbert", "blip2", "detr", "grounding"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One `python benchmarks/gpu.py --smoke` over every stage, with the speed options at their
    defaults (on for --smoke): what it printed and what it wrote. One subprocess for the module's
    tests, as a user runs it: its imports and stand-in builds are paid once."""
    return run_smoke(tmp_path_factory.mktemp("smoke"), ",".join(EVERY_STAGE))


@pytest.mark.slow   # a subprocess that builds and runs the stand-ins: about 30 s, too long for the fast tier
def test_smoke_generation_and_clip(smoke):
    """Generation side by side with its speed options, and the CLIP head, on the tiny stand-ins."""
    stdout, written = smoke
    assert written.strip() in stdout
    rows = [r for r in check_rows(written, EVERY_STAGE) if r["stage"] in ("generation", "clip")]
    gen = [r for r in rows if r["stage"] == "generation"]
    what = {(r["batch"], r["what"]) for r in gen}
    assert what == {("1", "text-to-image, plain"), ("2", "text-to-image, plain"),
                    ("1", "text-to-image, channels-last"), ("2", "text-to-image, channels-last"),
                    ("2", "text-to-image, vae-slicing")}   # slicing one image changes nothing: no batch-1 row
    for r in gen:
        assert r["dtype"] == "float32" and "AttnProcessor2_0" in r["notes"]
        assert r["share of peak"].startswith("n/a (")   # no GPU peak on the CPU
    assert "- attention in the UNet: AttnProcessor2_0; scaled_dot_product_attention" in written
    assert "TFLOP per image" in written and "--smoke" in written
    assert [r["batch"] for r in rows if r["stage"] == "clip"] == ["2"]


@pytest.mark.slow
def test_smoke_every_stage(smoke):
    """Every stage of the command, as `python benchmarks/gpu.py --smoke` runs it."""
    _, written = smoke
    rows = check_rows(written, EVERY_STAGE)
    # today's families at their cards' defaults: each model, batch 1 and 2, every image ok
    families = [r for r in rows if r["stage"] == "families"]
    assert len(families) == 2 * len(gpu_module().FAMILY_MODELS) and not any(r["notes"] for r in families)
    assert {r["model / config"].split(" (")[0] for r in families} == set(gpu_module().FAMILY_MODELS)
    assert any("FLUX.1-dev" in r["model / config"] and "guidance 3.5" in r["model / config"] for r in families)
    assert {r["dtype"] for r in rows if r["stage"] == "sbert"} == {"float32", "float16"}
    assert "answers/s" in next(r for r in rows if r["stage"] == "blip2")["throughput"]
    assert len([r for r in rows if r["stage"] == "grounding"]) == 2   # GroundingDINO boxes, SAM masks
    # the speed options' rows are generation's alone: every other stage is measured once per batch
    assert {r["what"] for r in rows if r["stage"] == "generation"} == {
        "text-to-image, plain", "text-to-image, channels-last", "text-to-image, vae-slicing"}


def gpu_module():
    import importlib

    return importlib.import_module("benchmarks.gpu")


NEW_FAMILY_MODELS = [m for m in gpu_module().FAMILY_MODELS if "stabilityai" not in m and "FLUX.1" not in m]


@pytest.mark.slow   # each builds its family's stand-in and full-size networks on the meta device: ~20 s in all
@pytest.mark.parametrize("model", NEW_FAMILY_MODELS)
def test_each_new_family_s_full_size_pipeline_is_its_class_with_the_benchmark_s_networks(model):
    """What ``--only families`` times on a GPU: the family's pipeline class holding
    bench_family_sizes' full-size networks, built here on the meta device (shapes only)."""
    import torch

    from benchmarks.bench_family_sizes import models
    from operators.support.families import detect

    pipe = gpu_module().full_size_pipeline(model, "meta", torch.bfloat16)
    assert type(pipe).__name__ in detect(model)[0].pipelines
    family, parts = models()[model][:2]
    assert family == detect(model)[0].name
    total = 0
    for name in parts:
        module = getattr(pipe, name.split(" ")[0])
        assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in module.parameters()), name
        total += sum(p.numel() for p in module.parameters())
    from pipelines.engine.run import gpus

    if model.lower() in gpus.PIPELINE_PARAMETERS:   # the routing's count is this pipeline's
        assert total == gpus.PIPELINE_PARAMETERS[model.lower()]


@pytest.mark.parametrize("model", ["black-forest-labs/FLUX.2-klein-base-4B"])
def test_the_routing_s_sizes_of_a_model_benchmarked_without_a_gpu_row_are_the_benchmark_s(model):
    """A model bench_family_sizes counts but gpu.py does not time (FLUX.2 klein 4B): the routing's
    whole and largest-component counts are the benchmark's meta-device counts."""
    import torch

    from benchmarks.bench_family_sizes import models
    from pipelines.engine.run import gpus

    with torch.device("meta"):
        counts = [sum(p.numel() for p in make().parameters()) for make in models()[model][1].values()]
    assert gpus.PIPELINE_PARAMETERS[model.lower()] == sum(counts)
    assert gpus.LARGEST_COMPONENT[model.lower()] == max(counts)


# -- helpers ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 SXM5 80GB", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L4", 121.0), ("NVIDIA A10G", 125.0), ("Tesla T4", 65.0),
    ("NVIDIA L40S", None), ("NVIDIA H100 NVL", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_known_peaks_by_device_name(gpu, name, peak):
    found = gpu.known_peak(name)
    assert (found[1] if found else None) == peak


def test_peak_override_and_cpu(gpu):
    assert gpu.resolve_peak("cpu", None)[0] is None
    value, text = gpu.resolve_peak("cpu", 100.0)
    assert value == 100.0 and "--peak-tflops" in text


def test_arguments_defaults_full_and_smoke(gpu):
    full = gpu.parse_args(["--device", "cuda"])
    assert full.stages == list(gpu.STAGES)
    assert full.batch_sizes == [1, 2, 4, 8, 16] and full.steps == 50 and full.size == 512
    assert full.channels_last and full.vae_slicing and not full.compile
    smoke = gpu.parse_args(["--smoke", "--device", "cpu", "--only", "clip,generation", "--batch-sizes", "2,1"])
    assert smoke.stages == ["generation", "clip"]   # in the command's order
    assert smoke.batch_sizes == [1, 2] and smoke.steps == 2 and smoke.size == 64 and smoke.repeats == 1
    assert smoke.channels_last and smoke.vae_slicing
    assert [label for label, _ in gpu.generation_variants(smoke)] == ["plain", "channels-last", "vae-slicing"]
    off = gpu.parse_args(["--smoke", "--device", "cpu", "--no-channels-last", "--no-vae-slicing"])
    assert not off.channels_last and not off.vae_slicing
    assert [label for label, _ in gpu.generation_variants(off)] == ["plain"]   # the flags take their rows away
    cpu = gpu.parse_args(["--device", "cpu", "--batch-sizes", "1", "4", "--compile"])
    assert cpu.batch_sizes == [1, 4] and not cpu.channels_last and not cpu.vae_slicing and cpu.compile
    assert [label for label, _ in gpu.generation_variants(cpu)] == ["plain", "compile"]
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--only", "generation,unknown"])
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--batch-sizes", "0"])


def test_a_failed_stage_is_a_failed_row(gpu):
    rows = [gpu.Row("clip", "-", "-", "-", "-", "-", error="RuntimeError: boom | bang")]
    text = gpu.table(rows)
    assert table_rows(text)[0]["throughput"] == "FAILED" and "boom / bang" in text
