"""One safety policy for every model: the Stable Diffusion safety checker as a
head (operators.image_nsfw_check) on every generator's images, the run-level exclusion, and the
policy's settings. Tiny random pipelines built offline, loaded through the production loaders."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from operators.image_generation import ImageGenerator
from operators.image_nsfw_check import NsfwCheck, checker_folders, load_safety_checker
from operators.support.models import ModelLoadError
from pipelines.engine.generation import SafetySettings, generation_settings, safety_counts
from pipelines.standins.diffusion import build_tiny_safety_checker, build_tiny_stable_diffusion
from pipelines.standins.families import build_tiny_sdxl
from schemas.images import (
    GENDER,
    GENDER_COLUMNS,
    GENERATION_STATUS,
    NSFW,
    P_FEMALE,
    P_MALE,
    SAFETY_CHECKER,
    SEED,
    GenerationStatus,
)
from schemas.subsets import PROMPT, PROMPT_ID

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 2
PROMPTS = ["a photo of a doctor", "a photo of a nurse", "a photo of a chef", "a photo of a pilot",
           "a photo of a baker", "a photo of a judge", "a photo of a clerk", "a photo of a farmer"]
SEEDS = list(range(11, 19))


def rows(prompts=PROMPTS, seeds=SEEDS) -> pa.Table:
    return pa.table({PROMPT_ID: pa.array(range(len(prompts)), pa.int32()), PROMPT: pa.array(prompts, pa.string()),
                     SEED: pa.array(seeds, pa.int64())})


class CountingHead:
    """A head that records how many images it was given."""

    stage_name = "counting"
    output_fields = GENDER_COLUMNS

    def __init__(self):
        self.seen = 0

    def classify_tensor(self, images):
        n = int(images.shape[0])
        self.seen += n
        return {GENDER: ["male"] * n, P_MALE: np.ones(n, np.float32), P_FEMALE: np.zeros(n, np.float32)}


@pytest.fixture(scope="module")
def sd_faces(tmp_path_factory):
    return build_tiny_stable_diffusion(tmp_path_factory.mktemp("sd_checker"), seed=0, with_safety_checker=True,
                                       faces=True)


@pytest.fixture(scope="module")
def checker_dir(tmp_path_factory, sd_faces):
    """Calibrated on this generator's images (other seeds): about half of such images flagged, so
    the 8 images below get both outcomes."""
    images, _ = ImageGenerator(sd_faces, steps=STEPS, device="cpu", micro_batch=8, safety_checker="off")._generate(
        PROMPTS, list(range(100, 108)))
    return build_tiny_safety_checker(tmp_path_factory.mktemp("nsfw") / "checker", seed=0, flagged_share=0.5,
                                     images=images)


@pytest.fixture(scope="module")
def sd_with_checker(sd_faces, checker_dir):
    """A tiny SD 1.x pipeline that ships a checker: the calibrated one in its safety_checker folder."""
    d = sd_faces
    for folder in ("safety_checker", "feature_extractor"):
        shutil.rmtree(Path(d) / folder)
        Path(d, folder).mkdir()
    for f in Path(checker_dir).iterdir():
        if f.name == "preprocessor_config.json":
            shutil.copy(f, Path(d) / "feature_extractor" / f.name)
        elif f.name != "STANDIN.txt":
            shutil.copy(f, Path(d) / "safety_checker" / f.name)
    return d


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory):
    return build_tiny_sdxl(tmp_path_factory.mktemp("sdxl"), seed=1)


def test_both_layouts_load_and_a_bad_directory_is_one_line(checker_dir, sd_with_checker, tmp_path):
    assert checker_folders(checker_dir) == (Path(checker_dir), Path(checker_dir))
    assert checker_folders(sd_with_checker) == (Path(sd_with_checker) / "safety_checker",
                                                Path(sd_with_checker) / "feature_extractor")
    _, _, rec = load_safety_checker(sd_with_checker, device="cpu")
    assert rec["class"] == "StableDiffusionSafetyChecker" and rec["weights_sha256"]
    assert list(rec["weight_files"]) == ["safety_checker/model.safetensors"]
    with pytest.raises(ModelLoadError, match="cannot load the NSFW check .*safety_checker/config.json"):
        load_safety_checker(str(tmp_path), device="cpu")


def test_the_head_flags_exactly_what_the_pipeline_s_own_checker_blanks(sd_with_checker):
    """The same images, checked by the SD pipeline's own checker (model-default) and by the head on
    the unblanked images (the model's checker off): the same flags, and both outcomes occur."""
    own = ImageGenerator(sd_with_checker, steps=STEPS, device="cpu", micro_batch=4)
    blanked = own(rows())
    own_flags = blanked.column(NSFW).to_pylist()
    assert 0 < sum(own_flags) < len(own_flags), own_flags
    head = NsfwCheck(sd_with_checker, device="cpu")
    plain = ImageGenerator(sd_with_checker, steps=STEPS, device="cpu", micro_batch=4, safety_checker="off",
                           nsfw_check=head)
    assert plain.pipe.safety_checker is None and plain.record["safety_checker_present"] is False
    checked = plain(rows())
    assert checked.column(NSFW).to_pylist() == own_flags
    # kept in (exclude off): every image is ok and keeps its pixels
    assert set(checked.column(GENERATION_STATUS).to_pylist()) == {GenerationStatus.OK}


def test_exclusion_leaves_flagged_images_out_of_every_head(sd_with_checker, checker_dir):
    counting = CountingHead()
    gen = ImageGenerator(sd_with_checker, steps=STEPS, device="cpu", micro_batch=4, safety_checker="off",
                         nsfw_check=NsfwCheck(checker_dir, device="cpu"), exclude_nsfw=True, heads=[counting])
    out = gen(rows())
    flags = out.column(NSFW).to_pylist()
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status == [GenerationStatus.NSFW_EXCLUDED if f else GenerationStatus.OK for f in flags]
    assert counting.seen == flags.count(False) and 0 < counting.seen < len(flags)
    genders = out.column(GENDER).to_pylist()
    assert [g is None for g in genders] == flags
    assert [v is None for v in out.column("image").to_pylist()] == flags   # never stored: its seed regenerates it
    assert gen.record["exclude_nsfw"] is True and gen.record["nsfw_check"]["model"] == checker_dir
    counts = safety_counts(out)
    assert counts == {"images": 8, "checked": 8, "flagged": sum(flags), "excluded": sum(flags), "blocked": 0}
    with pytest.raises(ValueError, match="exclude_nsfw needs an nsfw_check"):
        ImageGenerator(sd_with_checker, steps=STEPS, device="cpu", exclude_nsfw=True)


def test_a_model_with_and_one_without_its_own_checker_are_checked_alike(sd_with_checker, sdxl_dir, checker_dir):
    """check-all: the model's own checker is not loaded, the head checks every image of both."""
    spec = generation_settings({"models": [sd_with_checker, sdxl_dir], "steps": STEPS,
                                "nsfw_check": {"model": checker_dir, "exclude": True}})
    assert [g.safety_checker for g in spec.generators] == ["check-all", "check-all"]
    head = NsfwCheck(checker_dir, device="cpu")
    outs = []
    for g in spec.generators:
        kw = {**g.operator_kwargs(), "nsfw_check": head, "exclude_nsfw": True, "device": "cpu", "micro_batch": 4}
        gen = ImageGenerator(**kw)
        assert gen.pipe.safety_checker is None if hasattr(gen.pipe, "safety_checker") else True
        assert gen.record["safety_checker_present"] is False
        outs.append(gen(rows(PROMPTS[:4], SEEDS[:4])))
    for out in outs:
        assert out.column(NSFW).null_count == 0                 # every image of both models checked
        flags = out.column(NSFW).to_pylist()
        assert out.column(GENERATION_STATUS).to_pylist() == [
            GenerationStatus.NSFW_EXCLUDED if f else GenerationStatus.OK for f in flags]
        assert set(out.column(SAFETY_CHECKER).to_pylist()) == {"off"}   # what the operator loaded


def test_the_policy_is_one_setting_for_the_run():
    import argparse

    st = generation_settings({"models": ["org/a", "org/b"]})
    assert st.safety == SafetySettings() and st.safety.checks and not st.safety.exclude
    assert st.job()["safety"] == {"policy": "check-all", "model": "CompVis/stable-diffusion-v1-4",
                                  "revision": None, "exclude": False}
    args = argparse.Namespace(safety_checker="model-default", nsfw_check=None, exclude_nsfw=None)
    st = generation_settings({"models": ["org/a"], "nsfw_check": {"exclude": True}}, args)
    assert st.safety.policy == "model-default" and st.job()["safety"] == {"policy": "model-default"}
    assert st.generators[0].operator_kwargs()["safety_checker"] == "model-default"
    assert st.safety.operator_kwargs() == {}
    args = argparse.Namespace(nsfw_check="/models/checker", exclude_nsfw=True)
    st = generation_settings({"models": ["org/a"], "nsfw_check": {"model": "x/y", "revision": "abc"}}, args)
    assert (st.safety.model, st.safety.revision, st.safety.exclude) == ("/models/checker", None, True)
    kw = st.safety.operator_kwargs()
    assert kw["exclude_nsfw"] is True and kw["nsfw_check"].kwargs == {"model": "/models/checker", "revision": None}
    with pytest.raises(ValueError, match="one setting for the whole run"):
        generation_settings({"models": [{"model": "org/a", "safety_checker": "off"}, "org/b"]})
    with pytest.raises(ValueError, match="one setting for the whole run"):
        generation_settings({"models": ["org/a"]}, argparse.Namespace(generator=["org/a:safety_checker=off"]))
    with pytest.raises(ValueError, match="unknown keys"):
        generation_settings({"models": ["org/a"], "nsfw_check": {"threshold": 0.5}})
    with pytest.raises(ValueError, match="safety_checker must be one of"):
        generation_settings({"models": ["org/a"], "safety_checker": "strict"})


def test_a_triplet_unit_with_a_flagged_image_is_counted_not_measured(sd_with_checker, checker_dir):
    """Exposed: the check runs on the unit's three images; with exclusion a flagged image is
    nsfw_excluded, never stored, and its unit has no disparities in any space (as a blanked one);
    without, every unit is measured and the flags recorded."""
    from operators.image_triplet_generation import TripletGenerator
    from schemas.exposed import FEMININE, MASCULINE, NEUTRAL, UNIT_ID, UNIT_STATUS, Space, disparity_column

    triplets = [(f"A person {w}.", f"A woman {w}.", f"A man {w}.") for w in
                ("rides a bike", "walks on a beach", "reads a book", "cooks dinner")]
    batch = pa.table({UNIT_ID: [f"u{i}" for i in range(4)], NEUTRAL: [t[0] for t in triplets],
                      FEMININE: [t[1] for t in triplets], MASCULINE: [t[2] for t in triplets],
                      SEED: pa.array([3, 4, 5, 6], pa.int64())})
    head = NsfwCheck(checker_dir, device="cpu")
    out = TripletGenerator(sd_with_checker, steps=STEPS, device="cpu", safety_checker="off", nsfw_check=head,
                           exclude_nsfw=True)(batch)
    flags = out.column(NSFW).to_pylist()
    assert None not in flags and 0 < sum(flags) < len(flags), flags
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status == [GenerationStatus.NSFW_EXCLUDED if f else GenerationStatus.OK for f in flags]
    assert [v is None for v in out.column("image").to_pylist()] == flags
    for u in range(4):
        unit_flagged = any(flags[3 * u:3 * u + 3])
        assert out.column(UNIT_STATUS)[3 * u].as_py() == (GenerationStatus.NSFW_EXCLUDED if unit_flagged else "ok")
        for space in Space.GENERATOR:
            assert (out.column(disparity_column(space))[3 * u].as_py() is None) == unit_flagged
    kept = TripletGenerator(sd_with_checker, steps=STEPS, device="cpu", safety_checker="off", nsfw_check=head)(batch)
    assert kept.column(NSFW).to_pylist() == flags                    # the same check, recorded
    assert set(kept.column(GENERATION_STATUS).to_pylist()) == {"ok"}
    assert kept.column(disparity_column(Space.PROMPT_POOLED)).null_count == 0
