"""Text-to-image generation stage, on a tiny random-weight SD 1.x pipeline loaded through the
production path (AutoPipelineForText2Image.from_pretrained on a saved directory), 2 steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.support.models import ModelLoadError
from operators.support.codec import batch_images
from operators.image_generation import ImageGenerator, regenerate
from operators.support.diffusion import load_text2image
from pipelines.standins.diffusion import (
    SD1_SCHEDULER,
    build_clip_tokenizer,
    build_tiny_stable_diffusion,
)
from schemas.images import (
    GENDER,
    GENDER_COLUMNS,
    GENERATION_COLUMNS,
    GENERATION_DETAIL,
    GENERATION_STATUS,
    IMAGE,
    IMAGE_ENCODING,
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    MODEL,
    NSFW,
    P_FEMALE,
    P_MALE,
    RGB8,
    SAFETY_CHECKER,
    SEED,
    GenerationStatus,
)
from schemas.subsets import PROMPT, PROMPT_ID

STEPS = 2
SIZE = 64  # the stand-in's default image size


def rows(prompts, seeds) -> pa.Table:
    return pa.table({
        PROMPT_ID: pa.array(range(1, len(prompts) + 1), pa.int32()),
        PROMPT: pa.array(prompts, pa.string()),
        SEED: pa.array(seeds, pa.int64()),
    })


class FakeClassifier:
    """Records what it is given; p_male = mean intensity of each image, so a row's result can be
    checked against that row's own pixels."""

    stage_name = "fake_classifier"
    output_fields = GENDER_COLUMNS

    def __init__(self):
        self.calls = []

    def classify_tensor(self, images):
        self.calls.append({"type": type(images), "shape": tuple(images.shape), "device": images.device,
                           "dtype": images.dtype, "min": float(images.min()), "max": float(images.max())})
        m = images.float().mean(dim=(1, 2, 3)).cpu().numpy().astype(np.float32)
        return {GENDER: np.where(m >= np.median(m), "female", "male").astype(str), P_MALE: m, P_FEMALE: 1 - m}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    return build_tiny_stable_diffusion(tmp_path_factory.mktemp("sd_tiny"), seed=0)


@pytest.fixture(scope="module")
def sd_checker_dir(tmp_path_factory):
    return build_tiny_stable_diffusion(tmp_path_factory.mktemp("sd_tiny_checker"), seed=0, with_safety_checker=True)


@pytest.fixture(scope="module")
def exact_gen(sd_dir):
    """micro_batch=1: bit-exact regardless of the Ray batch."""
    return ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=1)


@pytest.fixture(scope="module")
def batched_gen(sd_dir):
    return ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=3, heads=[FakeClassifier()])


# -- the stand-in ---------------------------------------------------------------------------------------


def test_standin_is_a_real_sd1_checkpoint(sd_dir):
    index = json.loads((Path(sd_dir) / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    assert index["unet"] == ["diffusers", "UNet2DConditionModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKL"]
    assert index["text_encoder"] == ["transformers", "CLIPTextModel"]
    assert index["tokenizer"][1] == "CLIPTokenizer"
    assert index["safety_checker"] == [None, None]
    sched = json.loads((Path(sd_dir) / "scheduler" / "scheduler_config.json").read_text())
    assert sched["_class_name"] == "PNDMScheduler"
    for key, value in SD1_SCHEDULER.items():
        assert sched[key] == value, key


def test_standin_tokenizer_is_clips():
    import open_clip

    tok = build_clip_tokenizer()
    assert len(tok) == 49408
    for text in ["A photo of the face of an engineer", "a portrait of a nurse, smiling!", "CEO's office 2023"]:
        ids = tok(text).input_ids
        reference = open_clip.tokenize([text])[0].tolist()  # open_clip's own CLIP tokenizer
        assert ids == reference[:len(ids)], text
        assert ids[0] == 49406 and ids[-1] == 49407


def test_standin_deterministic_for_seed(sd_dir, tmp_path):
    from operators.support.models import weights_fingerprint

    same = build_tiny_stable_diffusion(tmp_path / "same", seed=0)
    other = build_tiny_stable_diffusion(tmp_path / "other", seed=1)
    assert weights_fingerprint(same) == weights_fingerprint(sd_dir)
    assert weights_fingerprint(other) != weights_fingerprint(sd_dir)


# -- loading ----------------------------------------------------------------------------------------------


def test_record_of_a_local_model(exact_gen, sd_dir):
    r = exact_gen.record
    assert r["model"] == sd_dir and r["source"] == "directory"
    assert r["pipeline_class"] == "StableDiffusionPipeline"
    assert r["scheduler_class"] == "PNDMScheduler"
    assert r["device"] == "cpu" and r["dtype"] == "float32"
    assert r["safety_checker_policy"] == "model-default" and r["safety_checker_present"] is False
    assert r["diffusers_version"] and len(r["weights_sha256"]) == 64
    assert (r["steps"], r["guidance_scale"], r["micro_batch"]) == (STEPS, 7.5, 1)
    assert r["default_size"] == [SIZE, SIZE]
    assert exact_gen.pipe.unet.dtype == torch.float32


def test_invalid_model_directory_raises_model_load_error(tmp_path):
    bad = tmp_path / "not_a_pipeline"
    bad.mkdir()
    (bad / "README").write_text("nothing here")
    with pytest.raises(ModelLoadError) as err:
        load_text2image(str(bad), device="cpu")
    msg = str(err.value)
    assert str(bad) in msg and "local directory" in msg and "HF_HOME" in msg


def test_uncached_hub_id_offline_raises_model_load_error():
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-sd-model"):
        load_text2image("no-such-org/no-such-sd-model", device="cpu")


def test_unknown_policy_rejected(sd_dir):
    with pytest.raises(ValueError, match="safety_checker"):
        load_text2image(sd_dir, device="cpu", safety_checker="strict")


# -- generation -----------------------------------------------------------------------------------------


def test_output_columns_and_pixels(exact_gen, sd_dir):
    batch = rows(["a photo of the face of an engineer", "a portrait of a nurse"], [11, 12])
    out = exact_gen(batch)
    assert out.num_rows == 2
    assert out.column(PROMPT_ID).to_pylist() == [1, 2]  # input columns kept
    for field in GENERATION_COLUMNS:
        assert out.schema.field(field.name).type == field.type, field.name
    assert GENDER not in out.column_names
    assert out.column(IMAGE_ENCODING).to_pylist() == [RGB8, RGB8]
    assert out.column(IMAGE_HEIGHT).to_pylist() == [SIZE, SIZE] and out.column(IMAGE_WIDTH).to_pylist() == [SIZE, SIZE]
    assert out.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.OK] * 2
    assert out.column(NSFW).to_pylist() == [None, None]  # the model ships no checker
    assert out.column(SAFETY_CHECKER).to_pylist() == ["model-default"] * 2
    assert out.column(MODEL).to_pylist() == [sd_dir] * 2
    for img in batch_images(out):
        assert img.shape == (SIZE, SIZE, 3) and img.dtype == np.uint8
        assert img.std() > 0  # not a blank image


def test_image_depends_only_on_prompt_and_seed(exact_gen):
    alone = batch_images(exact_gen(rows(["a photo of a doctor"], [7])))[0]
    batch = exact_gen(rows(["a photo of a lawyer", "a photo of a chef", "a photo of a doctor"], [3, 99, 7]))
    reordered = exact_gen(rows(["a photo of a doctor", "a photo of a chef", "a photo of a lawyer"], [7, 99, 3]))
    a, b = batch_images(batch), batch_images(reordered)
    assert np.array_equal(a[2], alone) and np.array_equal(b[0], alone)
    assert np.array_equal(a[0], b[2]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], a[2])


def test_different_seed_or_prompt_gives_a_different_image(exact_gen):
    imgs = batch_images(exact_gen(rows(["a photo of a doctor"] * 2 + ["a photo of a pilot"], [7, 8, 7])))
    same_prompt_other_seed = np.abs(imgs[0].astype(int) - imgs[1]).mean()
    other_prompt_same_seed = np.abs(imgs[0].astype(int) - imgs[2]).mean()
    assert same_prompt_other_seed > 5
    assert other_prompt_same_seed > 0


def test_regenerate_reproduces_a_batch_image_exactly(exact_gen):
    out = exact_gen(rows(["a photo of a farmer", "a photo of a baker", "a photo of a judge"], [21, 22, 23]))
    imgs = batch_images(out)
    assert np.array_equal(exact_gen.regenerate("a photo of a baker", 22), imgs[1])
    again = regenerate(exact_gen.pipe, "a photo of a judge", 23, steps=STEPS, guidance_scale=7.5)
    assert np.array_equal(again, imgs[2])
    assert not np.array_equal(regenerate(exact_gen, "a photo of a judge", 24), imgs[2])


def test_micro_batches_share_noise_and_differ_only_by_rounding(batched_gen, exact_gen):
    """micro_batch > 1: same initial noise per seed; batched kernels may move pixels a level or two."""
    prompts = ["a photo of a doctor", "a photo of a chef", "a photo of a lawyer", "a photo of a pilot"]
    seeds = [7, 99, 3, 5]
    batched = batch_images(batched_gen(rows(prompts, seeds)))  # micro-batches of 3 + 1
    for img, p, s in zip(batched, prompts, seeds):
        alone = exact_gen.regenerate(p, s)
        diff = np.abs(img.astype(int) - alone)
        assert diff.max() <= 3 and diff.mean() < 0.1
    assert np.abs(batched[0].astype(int) - batched[1]).mean() > 5


def test_null_or_blank_prompt_is_marked_not_generated(exact_gen):
    out = exact_gen(rows(["a photo of a doctor", None, "   ", "a photo of a nurse"], [1, 2, 3, 4]))
    assert out.num_rows == 4
    assert out.column(GENERATION_STATUS).to_pylist() == [
        GenerationStatus.OK, GenerationStatus.INVALID_PROMPT, GenerationStatus.INVALID_PROMPT, GenerationStatus.OK]
    assert out.column(IMAGE).is_null().to_pylist() == [False, True, True, False]
    assert out.column(IMAGE_HEIGHT).to_pylist() == [SIZE, None, None, SIZE]
    assert out.column(NSFW).null_count == 4
    assert out.column(MODEL).null_count == 0 and out.column(SEED).to_pylist() == [1, 2, 3, 4]
    assert np.array_equal(batch_images(out)[3], exact_gen.regenerate("a photo of a nurse", 4))
    empty = exact_gen(rows([None], [1]))
    assert empty.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.INVALID_PROMPT]


def test_classifier_gets_the_device_tensor_and_fills_its_rows(batched_gen):
    fake = batched_gen.heads[0]
    fake.calls.clear()
    batch = rows(["a photo of a doctor", None, "a photo of a chef", "a photo of a lawyer", "a photo of a pilot"],
                 [7, 8, 99, 3, 5])
    out = batched_gen(batch)
    assert [c["shape"] for c in fake.calls] == [(3, 3, SIZE, SIZE), (1, 3, SIZE, SIZE)]
    for c in fake.calls:
        assert issubclass(c["type"], torch.Tensor)
        assert c["device"] == torch.device(batched_gen.device) and c["dtype"].is_floating_point
        assert 0.0 <= c["min"] and c["max"] <= 1.0
    for field in GENDER_COLUMNS:
        assert out.schema.field(field.name).type == field.type
    p_male = out.column(P_MALE).to_pylist()
    assert p_male[1] is None and out.column(GENDER).to_pylist()[1] is None  # no image, no gender
    for i, img in enumerate(batch_images(out)):
        if i == 1:
            continue
        assert p_male[i] == pytest.approx(img.mean() / 255, abs=1 / 255)  # this row's own image
        assert out.column(P_FEMALE)[i].as_py() == pytest.approx(1 - p_male[i], abs=1e-6)
    assert len({p_male[i] for i in (0, 2, 3, 4)}) == 4


# -- safety checker ----------------------------------------------------------------------------------------


def test_safety_checker_model_default_and_off(sd_checker_dir):
    on = ImageGenerator(sd_checker_dir, steps=STEPS, device="cpu", micro_batch=2)
    assert on.record["safety_checker_present"] is True and on.record["safety_checker_policy"] == "model-default"
    out = on(rows(["a photo of a doctor", "a photo of a nurse", None], [1, 2, 3]))
    nsfw = out.column(NSFW).to_pylist()
    assert all(isinstance(v, bool) for v in nsfw[:2]) and nsfw[2] is None
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status[:2] == [GenerationStatus.NSFW_BLOCKED if v else GenerationStatus.OK for v in nsfw[:2]]

    off = ImageGenerator(sd_checker_dir, steps=STEPS, device="cpu", micro_batch=2, safety_checker="off")
    assert off.pipe.safety_checker is None
    assert off.record["safety_checker_present"] is False and off.record["safety_checker_policy"] == "off"
    out = off(rows(["a photo of a doctor", "a photo of a nurse"], [1, 2]))
    assert out.column(NSFW).to_pylist() == [None, None]
    assert out.column(SAFETY_CHECKER).to_pylist() == ["off", "off"]
    assert out.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.OK] * 2


def test_flagged_image_is_blocked_in_its_row(sd_checker_dir, monkeypatch):
    """The real checker, with its thresholds set so that it flags exactly the second call."""
    fake = FakeClassifier()
    gen = ImageGenerator(sd_checker_dir, steps=STEPS, device="cpu", micro_batch=1, heads=[fake])
    checker = gen.pipe.safety_checker
    real_forward = checker.forward
    calls = []

    def forward(clip_input, images):
        calls.append(1)
        checker.concept_embeds_weights.data.fill_(-2.0 if len(calls) == 2 else 2.0)  # cos - w > 0 <=> flagged
        checker.special_care_embeds_weights.data.fill_(2.0)
        return real_forward(clip_input=clip_input, images=images)

    monkeypatch.setattr(checker, "forward", forward)
    out = gen(rows(["a photo of a doctor", "a photo of a nurse", "a photo of a chef"], [1, 2, 3]))
    assert out.column(GENERATION_STATUS).to_pylist() == [
        GenerationStatus.OK, GenerationStatus.NSFW_BLOCKED, GenerationStatus.OK]
    assert out.column(NSFW).to_pylist() == [False, True, False]
    imgs = batch_images(out)
    assert imgs[1].max() == 0 and imgs[0].max() > 0  # the checker blanked that image
    assert len(fake.calls) == 2  # blocked images are not classified
    assert out.column(GENDER).to_pylist()[1] is None and out.column(P_MALE).to_pylist()[1] is None
    assert out.column(P_MALE).null_count == 1


# -- out of memory ---------------------------------------------------------------------------------------


def oom_pipe(monkeypatch, gen, fails, error=lambda: torch.cuda.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB")):
    """The real pipeline, but a call whose prompts ``fails`` raises ``error()`` (as CUDA would)
    before anything is generated; returns the batch sizes of every call, and counts the cache
    releases between tries."""
    from operators import image_generation

    cls = type(gen.pipe)
    real = cls.__call__
    calls, released = [], []

    def call(self, *args, **kwargs):
        calls.append(len(kwargs["prompt"]))
        if fails(kwargs["prompt"]):
            raise error()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", call)
    real_free = image_generation._free_device_memory
    monkeypatch.setattr(image_generation, "_free_device_memory", lambda d: (released.append(d), real_free(d)))
    return calls, released


def test_out_of_memory_halves_the_batch_down_to_one_image(batched_gen, monkeypatch):
    monkeypatch.setattr(batched_gen, "micro_batch", 4)
    calls, released = oom_pipe(monkeypatch, batched_gen, lambda prompts: len(prompts) > 1)
    prompts = ["a photo of a doctor", "a photo of a nurse", "a photo of a chef", "a photo of a pilot",
               "a photo of a judge"]
    out = batched_gen(rows(prompts, [1, 2, 3, 4, 5]))
    # 4 fails -> 2 fails -> 1, 1; the other 2 fails -> 1, 1; the fifth image alone
    assert calls == [4, 2, 1, 1, 2, 1, 1, 1] and len(released) == 3
    assert out.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.OK] * 5
    assert out.column(GENERATION_DETAIL).null_count == 5 and out.column(P_MALE).null_count == 0
    for i, img in enumerate(batch_images(out)):  # each generated alone: bit-exact
        assert np.array_equal(img, batched_gen.regenerate(prompts[i], i + 1))


def test_an_image_out_of_memory_alone_gets_generation_error_and_is_counted(batched_gen, monkeypatch):
    from pipelines.engine.stream.progress import ErrorBudget

    monkeypatch.setattr(batched_gen, "micro_batch", 4)
    calls, _ = oom_pipe(monkeypatch, batched_gen, lambda prompts: "a photo of an astronaut" in prompts)
    out = batched_gen(rows(["a photo of a doctor", "a photo of an astronaut", None, "a photo of a nurse"],
                           [1, 2, 3, 4]))
    assert calls == [3, 2, 1, 1, 1]  # the astronaut fails in every batch it is in, also alone
    assert out.num_rows == 4 and out.column(SEED).to_pylist() == [1, 2, 3, 4]
    assert out.column(GENERATION_STATUS).to_pylist() == [
        GenerationStatus.OK, GenerationStatus.ERROR, GenerationStatus.INVALID_PROMPT, GenerationStatus.OK]
    detail = out.column(GENERATION_DETAIL).to_pylist()
    assert detail[0] is None and detail[2] is None and detail[3] is None
    assert "OutOfMemoryError" in detail[1] and "Tried to allocate 2.00 GiB" in detail[1]
    assert out.column(IMAGE).is_null().to_pylist() == [False, True, True, False]
    assert out.column(NSFW).to_pylist()[1] is None and out.column(GENDER).to_pylist()[1] is None
    assert out.column(P_MALE).is_null().to_pylist() == [False, True, True, False]
    assert np.array_equal(batch_images(out)[3], batched_gen.regenerate("a photo of a nurse", 4))
    budget = ErrorBudget("generation", {GENERATION_STATUS: GenerationStatus.FAILURES}, 0.05, min_rows=1)
    budget.add(out)
    assert budget.failed == {GenerationStatus.ERROR: 1, GenerationStatus.INVALID_PROMPT: 1}
    with pytest.raises(Exception, match="generation_error=1"):
        budget.check()


def test_generic_out_of_memory_runtime_error_is_retried_other_errors_are_not(batched_gen, monkeypatch):
    monkeypatch.setattr(batched_gen, "micro_batch", 2)
    calls, _ = oom_pipe(monkeypatch, batched_gen, lambda prompts: len(prompts) > 1,
                        lambda: RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported"))
    out = batched_gen(rows(["a photo of a doctor", "a photo of a nurse"], [1, 2]))
    assert calls == [2, 1, 1] and out.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.OK] * 2
    monkeypatch.undo()
    monkeypatch.setattr(batched_gen, "micro_batch", 2)
    oom_pipe(monkeypatch, batched_gen, lambda prompts: True, lambda: RuntimeError("expected scalar type Half"))
    with pytest.raises(RuntimeError, match="expected scalar type Half"):
        batched_gen(rows(["a photo of a doctor"], [1]))
