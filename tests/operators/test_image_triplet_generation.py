"""Triplet generation (papers 003/004, sections 3-4) on tiny random SD 1.x pipelines loaded through the
production path: one seed per unit shared by its three prompts, three rows per unit, the prompt and
denoising spaces captured without changing the images, heads on the device, failures per unit."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.support.diffusion import load_text2image
from operators.image_triplet_generation import TripletGenerator, generate_units
from operators.support.codec import batch_images
from pipelines.standins.diffusion import build_tiny_stable_diffusion
from schemas.exposed import (
    FEMININE,
    IMAGE_ID,
    MASCULINE,
    NEUTRAL,
    PAIRS,
    UNIT_ID,
    UNIT_STATUS,
    VARIANT,
    Space,
    Variant,
    disparity_column,
)
from schemas.images import GENERATION_STATUS, SEED, GenerationStatus
from schemas.subsets import PROMPT

STEPS = 2


@pytest.fixture(scope="module")
def sd_dirs(tmp_path_factory):
    """Three tiny generators: 0 and 1 differ everywhere; 2 is 1's UNet/VAE with 0's text encoder."""
    root = tmp_path_factory.mktemp("sd")
    a = build_tiny_stable_diffusion(root / "a", seed=0)
    b = build_tiny_stable_diffusion(root / "b", seed=5)
    c = build_tiny_stable_diffusion(root / "c", seed=5)
    shutil.rmtree(Path(c) / "text_encoder")
    shutil.copytree(Path(a) / "text_encoder", Path(c) / "text_encoder")
    return a, b, c


def units(triplets, seeds) -> pa.Table:
    return pa.table({UNIT_ID: [f"u{i}" for i in range(len(triplets))],
                     NEUTRAL: [t[0] for t in triplets], FEMININE: [t[1] for t in triplets],
                     MASCULINE: [t[2] for t in triplets], SEED: pa.array(seeds, pa.int64())})


TRIPLETS = [("A person rides a bike.", "A woman rides a bike.", "A man rides a bike."),
            ("People walk on a beach.", "Women walk on a beach.", "Men walk on a beach.")]


def test_three_rows_per_unit_with_shared_seed_and_pair_values(sd_dirs):
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu", micro_batch=2)
    out = gen(units(TRIPLETS, [11, 22]))
    assert out.num_rows == 6
    assert out.column(VARIANT).to_pylist() == list(Variant.ALL) * 2
    assert out.column(PROMPT).to_pylist() == [p for t in TRIPLETS for p in t]
    assert out.column(SEED).to_pylist() == [11, 11, 11, 22, 22, 22]
    assert out.column(IMAGE_ID).to_pylist()[:3] == ["u0-neutral", "u0-feminine", "u0-masculine"]
    assert set(out.column(GENERATION_STATUS).to_pylist()) == {GenerationStatus.OK}
    assert set(out.column(UNIT_STATUS).to_pylist()) == {GenerationStatus.OK}
    for space in (Space.PROMPT, Space.DENOISING):
        values = out.column(disparity_column(space)).to_pylist()
        assert values[0] == values[1] == values[2] and len(values[0]) == len(PAIRS)
        assert all(-1.0 <= v <= 1.0 + 1e-9 for v in values[0])
    # spaces no head measures stay null
    assert out.column(disparity_column(Space.SSIM)).null_count == 6
    imgs = batch_images(out)
    assert all(a is not None and a.shape == (64, 64, 3) for a in imgs)


def test_same_seed_same_noise_identical_prompts_give_identical_results(sd_dirs):
    """Three identical prompts with one seed: the same z_T and text, so similarity 1 in the prompt and
    denoising spaces (the seed really is shared)."""
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu")
    same = ("A person reads.",) * 3
    out = gen(units([same], [5]))
    for space in (Space.PROMPT, Space.DENOISING):
        assert np.allclose(out.column(disparity_column(space)).to_pylist()[0], 1.0, atol=1e-6)
    a, b, c = batch_images(out)
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1 and np.abs(a.astype(int) - c.astype(int)).max() <= 1


def test_a_negative_prompt_reaches_every_image_of_a_unit(sd_dirs):
    """The generator spec's negative prompt (call_kwargs) is given per prompt of the 3U-prompt call;
    the prompt space stays the conditional half, so it does not move."""
    plain = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu")(units(TRIPLETS[:1], [7]))
    neg = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu",
                           call_kwargs={"negative_prompt": "a red square"})(units(TRIPLETS[:1], [7]))
    assert set(neg.column(GENERATION_STATUS).to_pylist()) == {GenerationStatus.OK}
    assert all(not np.array_equal(x, y) for x, y in zip(batch_images(plain), batch_images(neg)))
    prompt = disparity_column(Space.PROMPT)
    assert np.allclose(plain.column(prompt).to_pylist()[0], neg.column(prompt).to_pylist()[0], atol=1e-6)


def test_capture_changes_nothing_and_embeddings_are_the_conditional_sequence(sd_dirs):
    pipe, _ = load_text2image(sd_dirs[0], device="cpu", dtype="float32")
    images, embeds, latents, flags, pooled = generate_units(pipe, [TRIPLETS[0]], [7], STEPS, 7.5)
    gens = [torch.Generator("cpu").manual_seed(7) for _ in range(3)]
    plain = pipe(prompt=list(TRIPLETS[0]), num_inference_steps=STEPS, guidance_scale=7.5, generator=gens,
                 output_type="pt").images
    assert torch.equal(images.reshape(3, *images.shape[2:]), plain)
    cond, _ = pipe.encode_prompt(list(TRIPLETS[0]), "cpu", 1, True)
    assert torch.allclose(embeds.reshape(3, *embeds.shape[2:]), cond, atol=1e-6)
    assert embeds.shape[2:] == (77, pipe.text_encoder.config.hidden_size)   # the full sequence, not pooled
    assert latents.shape[:2] == (1, 3) and latents.shape[2] == pipe.unet.config.out_channels


def test_generators_sharing_a_text_encoder_agree_in_the_prompt_space(sd_dirs):
    """SD v2.0 and v2.1 share OpenCLIP-H: their prompt-space columns agree (Table 3), while their
    denoising spaces differ. Stand-ins b and c share nothing but c has a's text encoder."""
    batch = units(TRIPLETS, [3, 4])
    a, b, c = (TripletGenerator(d, steps=STEPS, device="cpu")(batch) for d in sd_dirs)
    prompt = disparity_column(Space.PROMPT)
    assert np.allclose(a.column(prompt).to_pylist(), c.column(prompt).to_pylist(), atol=1e-9)
    assert not np.allclose(a.column(prompt).to_pylist(), b.column(prompt).to_pylist(), atol=1e-4)
    den = disparity_column(Space.DENOISING)
    assert not np.allclose(a.column(den).to_pylist(), c.column(den).to_pylist(), atol=1e-6)


class ConstantHead:
    """A disparity head that records the images it was given."""

    spaces = (Space.SSIM,)
    record = {"fake": True}

    def __init__(self):
        self.shapes = []

    def triplet_similarities(self, images):
        self.shapes.append(tuple(images.shape))
        u = images.shape[0]
        return {Space.SSIM: np.tile([0.25, 0.5, 0.75], (u, 1))}


def test_heads_get_whole_units_on_the_device(sd_dirs):
    head = ConstantHead()
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu", heads=[head], micro_batch=2)
    out = gen(units(TRIPLETS, [1, 2]))
    assert head.shapes == [(2, 3, 3, 64, 64)]
    assert out.column(disparity_column(Space.SSIM)).to_pylist() == [[0.25, 0.5, 0.75]] * 6
    assert gen.record["heads"]["ssim"] == {"fake": True}


def test_a_head_without_triplet_similarities_is_refused(sd_dirs):
    class NotAHead:
        pass

    with pytest.raises(TypeError, match="not a disparity head"):
        TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu", heads=[NotAHead()])


def test_invalid_prompts_and_missing_seeds(sd_dirs):
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu")
    out = gen(units([TRIPLETS[0], ("A person sits.", "  ", "A man sits.")], [1, 2]))
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status[:3] == [GenerationStatus.OK] * 3 and status[3:] == [GenerationStatus.INVALID_PROMPT] * 3
    assert out.column(UNIT_STATUS).to_pylist()[3:] == [GenerationStatus.INVALID_PROMPT] * 3
    assert out.column(disparity_column(Space.PROMPT)).to_pylist()[3:] == [None] * 3
    with pytest.raises(ValueError, match="null seed"):
        gen(units([TRIPLETS[0]], [None]))


def test_out_of_memory_halves_down_to_one_unit_never_splitting_one(sd_dirs, monkeypatch):
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu", micro_batch=2)
    real = gen.pipe.__class__.__call__
    calls = []

    def limited(self, *args, **kw):
        n = len(kw["prompt"])
        calls.append(n)
        if n > 3 or "sits" in kw["prompt"][0]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, *args, **kw)

    monkeypatch.setattr(gen.pipe.__class__, "__call__", limited)
    out = gen(units([TRIPLETS[0], ("A person sits.", "A woman sits.", "A man sits."), TRIPLETS[1]], [1, 2, 3]))
    assert calls[0] == 6 and all(n % 3 == 0 for n in calls)
    status = out.column(GENERATION_STATUS).to_pylist()
    assert status == [GenerationStatus.OK] * 3 + [GenerationStatus.ERROR] * 3 + [GenerationStatus.OK] * 3
    assert "out of memory with one unit" in out.column("generation_detail").to_pylist()[3]


def test_a_pipeline_that_hides_latents_or_prompt_embeds_is_refused():
    from operators.image_triplet_generation import check_capture

    class Pipe:
        _callback_tensor_inputs = ["latents"]

    with pytest.raises(ValueError, match="prompt_embeds"):
        check_capture(Pipe(), "some/model")
    Pipe._callback_tensor_inputs = ["latents", "prompt_embeds", "negative_prompt_embeds"]
    check_capture(Pipe(), "some/model")


def test_an_image_with_nan_values_is_invalid_and_its_unit_gets_no_disparities(sd_dirs, monkeypatch):
    """A decode with NaN values (float16 overflow) is ``invalid_image`` with the reason,
    never stored, and its unit measures no disparities; a few NaN pixels in an otherwise bright
    image, so only the NaN check (not the all-black one) can find it."""
    gen = TripletGenerator(sd_dirs[0], steps=STEPS, device="cpu", micro_batch=2)
    real = gen.pipe.__class__.__call__

    def nan_decode(self, *args, **kw):
        out = real(self, *args, **kw)
        out.images[1, :, :4, :4] = float("nan")   # the call's second image: unit 0's feminine one
        return out

    monkeypatch.setattr(gen.pipe.__class__, "__call__", nan_decode)
    out = gen(units(TRIPLETS, [1, 2]))
    ok, bad = GenerationStatus.OK, GenerationStatus.INVALID_IMAGE
    assert out.column(GENERATION_STATUS).to_pylist() == [ok, bad, ok, ok, ok, ok]
    detail = out.column("generation_detail").to_pylist()
    assert "NaN or infinite" in detail[1] and detail[0] is None and detail[3:] == [None] * 3
    assert out.column(UNIT_STATUS).to_pylist() == [bad] * 3 + [ok] * 3
    for space in (Space.PROMPT, Space.DENOISING):
        values = out.column(disparity_column(space)).to_pylist()
        assert values[:3] == [None] * 3 and all(v is not None for v in values[3:])
    imgs = batch_images(out)
    assert imgs[1] is None and all(a is not None for i, a in enumerate(imgs) if i != 1)
