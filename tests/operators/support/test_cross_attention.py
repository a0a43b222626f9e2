"""DAAM word heat maps (paper 004, App. A) recorded through diffusers' attention processors on a tiny
random SD 1.x UNet: recording does not change the image, the recorded probabilities sum as a
softmax must, maps have the image's shape, words map to their tokens, processors are restored."""

import numpy as np
import pytest
import torch

from operators.support.diffusion import load_text2image
from operators.support.cross_attention import CrossAttentionCapture
from pipelines.standins.diffusion import build_tiny_stable_diffusion

STEPS = 3
PROMPTS = ["a person having a picnic at the park", "a woman having a picnic at the park"]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    p, _ = load_text2image(build_tiny_stable_diffusion(tmp_path_factory.mktemp("sd") / "sd", seed=0),
                           device="cpu", dtype="float32")
    return p


def generate(pipe):
    gens = [torch.Generator("cpu").manual_seed(3) for _ in PROMPTS]
    return pipe(prompt=PROMPTS, num_inference_steps=STEPS, guidance_scale=7.5, generator=gens, output_type="pt").images


def test_recording_does_not_change_the_image_and_sums_like_a_softmax(pipe):
    plain = generate(pipe)
    originals = dict(pipe.unet.attn_processors)
    with CrossAttentionCapture(pipe.unet, tokens=12, layers="all") as cap:
        recorded = generate(pipe)
    assert torch.equal(plain, recorded)
    assert {k: type(v) for k, v in pipe.unet.attn_processors.items()} == {k: type(v) for k, v in originals.items()}
    calls = len(pipe.scheduler.timesteps)                         # UNet evaluations (PNDM: one more than steps)
    assert calls >= STEPS and cap.steps and set(cap.steps.values()) == {calls}   # every layer, every evaluation
    assert all(k.endswith("attn2.processor") for k in cap.steps)
    for name, total in cap.token_sums.items():
        attn = pipe.unet.get_submodule(name.rsplit(".processor", 1)[0])
        assert total.shape[0] == len(PROMPTS)                     # the conditional half only
        assert torch.allclose(total, torch.full_like(total, attn.heads * calls), atol=1e-4)
    maps = cap.heat_maps((8, 8), (64, 64))
    assert maps.shape == (len(PROMPTS), 12, 64, 64) and float(maps.min()) >= 0.0
    assert not cap.sums                                           # per-layer sums released
    words = CrossAttentionCapture.word_heat_maps(pipe.tokenizer, PROMPTS[0], maps[0])
    assert list(words) == ["a", "person", "having", "picnic", "at", "the", "park"]
    assert all(m.shape == (64, 64) for m in words.values())
    ids = pipe.tokenizer(PROMPTS[0], add_special_tokens=False).input_ids
    k = ids.index(pipe.tokenizer("park", add_special_tokens=False).input_ids[0])
    assert np.allclose(words["park"], maps[0, k].numpy())
    a_positions = [i for i, t in enumerate(ids) if t == pipe.tokenizer("a", add_special_tokens=False).input_ids[0]]
    assert np.allclose(words["a"], maps[0, a_positions].mean(0).numpy(), atol=1e-6)


def test_daam_layers_leave_out_the_mid_block_and_average_on_the_latent_grid(pipe):
    """DAAM's defaults (castorini/daam): the mid block is not hooked, maps at 1/8 of the latent
    grid are skipped, each map is upsampled to the latent grid, clamped and averaged, and the
    average is expanded to the image. "all" records every attn2, the mid block's included."""
    import torch.nn.functional as F

    every = [n for n in pipe.unet.attn_processors if n.endswith("attn2.processor")]
    mid = [n for n in every if n.startswith("mid_block.")]
    assert mid and len(mid) < len(every)                      # the stand-in has both kinds
    with CrossAttentionCapture(pipe.unet, tokens=6) as daam:  # the default
        plain = generate(pipe)
    with CrossAttentionCapture(pipe.unet, tokens=6, layers="all") as full:
        assert torch.equal(generate(pipe), plain)             # neither changes the image
    assert set(daam.steps) == set(every) - set(mid) and set(full.steps) == set(every)
    sums = {k: v.clone() for k, v in daam.sums.items()}
    maps = daam.heat_maps((8, 8), (64, 64))
    # recomputed from the recorded sums: each layer to the 8 x 8 latent grid, clamped, averaged, then to 64 x 64
    grids = []
    for s in sums.values():
        side = int(round(s.shape[1] ** 0.5))
        grid = s.transpose(1, 2).reshape(s.shape[0], s.shape[2], side, side)
        grids.append(F.interpolate(grid, size=(8, 8), mode="bicubic", align_corners=False).clamp_(min=0))
    expected = F.interpolate(torch.stack(grids).mean(0), size=(64, 64), mode="bicubic", align_corners=False)
    assert torch.allclose(maps, expected, atol=1e-6)
    assert not torch.allclose(maps, full.heat_maps((8, 8), (64, 64)), atol=1e-3)   # the readings differ
    with pytest.raises(ValueError, match="layers"):
        CrossAttentionCapture(pipe.unet, layers="mid")


def test_without_guidance_the_whole_batch_is_recorded(pipe):
    with CrossAttentionCapture(pipe.unet, tokens=4, guidance=False) as cap:
        gens = [torch.Generator("cpu").manual_seed(1)]
        pipe(prompt=PROMPTS[:1], num_inference_steps=2, guidance_scale=1.0, generator=gens, output_type="pt")
    assert all(t.shape[0] == 1 for t in cap.token_sums.values())
    with pytest.raises(ValueError, match="positions"):
        cap.heat_maps((7, 7), (64, 64))


def test_nothing_recorded_is_an_error(pipe):
    with pytest.raises(RuntimeError, match="no cross-attention"):
        CrossAttentionCapture(pipe.unet).heat_maps((8, 8), (64, 64))
