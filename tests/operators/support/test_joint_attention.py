"""DAAM word heat maps from the joint attention of MMDiT denoisers (SD 3 / 3.5, FLUX.1), recorded
through diffusers' attention processors on tiny random pipelines: recording does not change the
image, the recorded probabilities are those of the model's own queries and keys, only the
conditional evaluations count, maps have the image's shape, T5 words map to their tokens,
``capture_for`` picks the recorder of each family and refuses the others in one line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from operators.support.cross_attention import CrossAttentionCapture
from operators.support.diffusion import load_text2image
from operators.support.attention_capture import capture_for
from operators.support.joint_attention import (CONCATENATED, IMAGE_FIRST, TEXT_FIRST, JointAttentionCapture,
                                               token_grid)
from pipelines.standins.families import build_tiny_flux, build_tiny_pixart, build_tiny_sd3, build_tiny_t5_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["a doctor with a cat", "a nurse at work"]
SEQ = 32                                   # max_sequence_length: the T5 segment's length


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    pipe, _ = load_text2image(build_tiny_sd3(tmp_path_factory.mktemp("sd3") / "sd3", seed=0), device="cpu",
                              dtype="float32")
    return pipe


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    pipe, _ = load_text2image(build_tiny_flux(tmp_path_factory.mktemp("flux") / "flux", seed=0), device="cpu",
                              dtype="float32")
    return pipe


def generate(pipe, steps=2, prompts=PROMPTS, **kwargs):
    gens = [torch.Generator("cpu").manual_seed(3 + i) for i in range(len(prompts))]
    kwargs.setdefault("guidance_scale", 7.0 if "StableDiffusion3" in type(pipe).__name__ else 3.5)
    kwargs.setdefault("height", 64)
    kwargs.setdefault("width", 64)
    return pipe(prompt=list(prompts), num_inference_steps=steps, generator=gens, output_type="pt",
                max_sequence_length=SEQ, **kwargs).images


def expected_maps(sums, grid, image_hw):
    """Each block's sum laid out row-major on ``grid``, upsampled bicubically, clamped, averaged."""
    ups = []
    for s in sums.values():
        b, _, t = s.shape
        ups.append(F.interpolate(s.transpose(1, 2).reshape(b, t, *grid), size=image_hw, mode="bicubic",
                                 align_corners=False).clamp(min=0))
    return torch.stack(ups).mean(0)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_recording_does_not_change_the_image_and_sums_like_a_softmax(family, request):
    pipe = request.getfixturevalue(family)
    plain = generate(pipe)
    originals = dict(pipe.transformer.attn_processors)
    cap = capture_for(pipe, guidance=True)
    with cap:
        for name, proc in pipe.transformer.attn_processors.items():   # the layers see the original's signature
            assert inspect.signature(proc.__call__) == inspect.signature(originals[name].__call__)
        recorded = generate(pipe)
    assert torch.equal(plain, recorded)
    assert pipe.transformer.attn_processors == originals               # the very same processor objects
    assert "cache_context" not in pipe.transformer.__dict__
    expected = {"sd3": {f"transformer_blocks.{i}.attn.processor": IMAGE_FIRST for i in range(2)},
                "flux": {"transformer_blocks.0.attn.processor": TEXT_FIRST,
                         "single_transformer_blocks.0.attn.processor": CONCATENATED}}[family]
    assert cap.layouts == expected                                     # every joint block, FLUX's single ones too
    calls = len(pipe.scheduler.timesteps)
    assert set(cap.steps) == set(expected) and set(cap.steps.values()) == {calls}
    heads = pipe.transformer.config.num_attention_heads
    for name, total in cap.token_sums.items():                         # softmax over ALL keys: 1 per head
        assert total.shape == (len(PROMPTS), 16)                       # conditional half, 4 x 4 token grid
        assert torch.allclose(total, torch.full_like(total, heads * calls), atol=1e-4)
    assert cap.grid == (4, 4) and cap.text_tokens == SEQ and cap.prompt_tokens == SEQ - 1
    sums = {k: v[..., :6].clone() for k, v in cap.sums.items()}
    assert all(s.min() >= 0 and s.max() <= heads * calls for s in sums.values())
    maps = cap.heat_maps((8, 8) if family == "sd3" else None, (64, 64), tokens=6)
    assert maps.shape == (len(PROMPTS), 6, 64, 64) and maps.dtype == torch.float32
    assert torch.isfinite(maps).all() and float(maps.min()) >= 0.0
    assert torch.allclose(maps, expected_maps(sums, (4, 4), (64, 64)), atol=1e-6)
    assert not cap.sums                                                # per-block sums released


def _spy_sd3(monkeypatch, attn):
    """The (query, key) the processor of ``attn`` hands to scaled_dot_product_attention: (B, H, S, d)."""
    seen, inside = [], []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        if inside:
            seen.append((q.detach().clone(), k.detach().clone()))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    attn.register_forward_pre_hook(lambda *a: inside.append(1))
    attn.register_forward_hook(lambda *a: inside.clear())
    return seen


def _reference(q, k, rows, cols):
    """softmax(q k^T / sqrt(d)) in float64 over all keys, summed over heads: rows x cols."""
    p = ((q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5).softmax(-1).sum(1)
    return p[:, rows, cols]


def test_sd3_probabilities_are_those_of_the_models_own_queries_and_keys(sd3, monkeypatch):
    """One evaluation; q and k as JointAttnProcessor2_0 passes them to SDPA: [image, text] keys, CFG's
    conditional half, the T5 columns after the 77 CLIP ones."""
    attn = sd3.transformer.transformer_blocks[1].attn                  # the last block: context_pre_only
    seen = _spy_sd3(monkeypatch, attn)
    try:
        with capture_for(sd3, guidance=True, tokens=10) as cap:
            generate(sd3, steps=1)
    finally:
        attn._forward_pre_hooks.clear()
        attn._forward_hooks.clear()
    assert len(seen) == 1 and cap.steps["transformer_blocks.1.attn.processor"] == 1
    q, k = seen[0]
    b = q.shape[0] // 2
    assert k.shape[2] == 16 + 77 + SEQ
    ref = _reference(q[b:], k[b:], slice(0, 16), slice(16 + 77, 16 + 77 + 10))
    got = cap.sums["transformer_blocks.1.attn.processor"]
    assert got.shape == (b, 16, 10)
    assert torch.allclose(got.double(), ref, atol=1e-5)
    assert not torch.allclose(got.double(), _reference(q[:b], k[:b], slice(0, 16), slice(93, 103)), atol=1e-3)


def test_sd35_qk_norms_and_dual_attention(monkeypatch):
    """An SD 3.5-like transformer (RMS q/k norms, the image-only second attention): the joint
    attention is recorded through the norms, attn2 is not recorded, the output is unchanged."""
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8,
                                  num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                                  pooled_projection_dim=64, out_channels=16, pos_embed_max_size=16,
                                  qk_norm="rms_norm", dual_attention_layers=(0,)).eval()
    for name, p in model.named_parameters():                           # norms away from their identity init
        if "norm_q" in name or "norm_k" in name or "norm_added" in name:
            p.data.uniform_(0.5, 2.0)
    inputs = dict(hidden_states=torch.randn(2, 16, 8, 8), encoder_hidden_states=torch.randn(2, 77 + 8, 32),
                  pooled_projections=torch.randn(2, 64), timestep=torch.tensor([500.0, 500.0]), return_dict=False)
    with torch.no_grad():
        plain = model(**inputs)[0]
    attn = model.transformer_blocks[0].attn
    seen = _spy_sd3(monkeypatch, attn)
    cap = JointAttentionCapture(model, guidance=False, text_offset=77)
    with cap, torch.no_grad():
        recorded = model(**inputs)[0]
    assert torch.equal(plain, recorded)
    assert "transformer_blocks.0.attn2.processor" in model.attn_processors
    assert set(cap.layouts) == {"transformer_blocks.0.attn.processor", "transformer_blocks.1.attn.processor"}
    q, k = seen[0]
    got = cap.sums["transformer_blocks.0.attn.processor"]
    assert got.shape == (2, 16, 8) and cap.grid == (4, 4)
    assert torch.allclose(got.double(), _reference(q, k, slice(0, 16), slice(16 + 77, 16 + 85)), atol=1e-5)


def test_flux_probabilities_are_those_of_the_models_own_queries_and_keys(flux, monkeypatch):
    """Double- and single-stream blocks: q and k as FluxAttnProcessor hands them to the attention
    (after the norms and the rotary embedding), [text, image] order, the whole batch."""
    from diffusers.models.transformers import transformer_flux

    seen, where = {}, []
    original = transformer_flux.dispatch_attention_fn

    def spy(q, k, v, *args, **kwargs):                                 # (B, S, H, d)
        seen.setdefault(where[-1], []).append((q.transpose(1, 2).clone(), k.transpose(1, 2).clone()))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(transformer_flux, "dispatch_attention_fn", spy)
    blocks = {"transformer_blocks.0.attn.processor": flux.transformer.transformer_blocks[0].attn,
              "single_transformer_blocks.0.attn.processor": flux.transformer.single_transformer_blocks[0].attn}
    handles = [a.register_forward_pre_hook(lambda *x, n=n: where.append(n)) for n, a in blocks.items()]
    try:
        with capture_for(flux, guidance=True) as cap:                  # FLUX: guidance ignored, batch not doubled
            generate(flux, steps=1)
    finally:
        for h in handles:
            h.remove()
    for name in blocks:
        (q, k), = seen[name]
        assert q.shape[0] == len(PROMPTS) and k.shape[2] == SEQ + 16
        got = cap.sums[name]
        assert got.shape == (len(PROMPTS), 16, SEQ)
        assert torch.allclose(got.double(), _reference(q, k, slice(SEQ, SEQ + 16), slice(0, SEQ)), atol=1e-5)


def test_sd3_keeps_only_the_conditional_half(sd3):
    """The negative prompt changes the image but not the maps (one step: from the second on, the
    latents differ); skip-layer guidance's extra evaluations (conditional batch, some blocks
    skipped) are not recorded."""
    maps, images = [], []
    for negative in ("blurry", "a cat on a dog"):
        with capture_for(sd3, guidance=True, tokens=6) as cap:
            images.append(generate(sd3, steps=1, negative_prompt=[negative] * len(PROMPTS)))
        maps.append(cap.heat_maps((8, 8), (64, 64)))
    assert not torch.equal(images[0], images[1])
    assert torch.equal(maps[0], maps[1])
    with capture_for(sd3, guidance=True, tokens=6) as cap:
        generate(sd3, steps=3, prompts=PROMPTS[:1], skip_guidance_layers=[0], skip_layer_guidance_start=0.0,
                 skip_layer_guidance_stop=1.0)
    assert set(cap.steps.values()) == {len(sd3.scheduler.timesteps)}
    assert all(t.shape[0] == 1 for t in cap.token_sums.values())


def test_flux_true_cfg_negative_evaluation_is_not_recorded(flux):
    """True CFG evaluates the negative prompt in a second call at each step (cache_context
    "uncond"): the negative prompt changes the image (one step) but not the maps."""
    maps, images = [], []
    for negative in ("blurry", "a cat on a dog"):
        with capture_for(flux, guidance=True, tokens=6) as cap:
            images.append(generate(flux, steps=1, true_cfg_scale=2.0, negative_prompt=[negative] * len(PROMPTS)))
        assert set(cap.steps.values()) == {1}                          # one evaluation of the two
        maps.append(cap.heat_maps(None, (64, 64)))
    assert not torch.equal(images[0], images[1])
    assert torch.equal(maps[0], maps[1])
    assert "cache_context" not in flux.transformer.__dict__


def test_non_square_images_and_the_grid_checks(flux, sd3):
    with capture_for(flux, guidance=False, tokens=4) as cap:
        generate(flux, prompts=PROMPTS[:1], height=64, width=96)
    assert cap.grid == (4, 6)                                          # from img_ids: rows, columns
    sums = {k: v.clone() for k, v in cap.sums.items()}
    with pytest.raises(ValueError, match="packed"):
        cap.heat_maps((24, 64), (64, 96))                              # FLUX's packed latent shape is no grid
    maps = cap.heat_maps(None, (64, 96))
    assert maps.shape == (1, 4, 64, 96)
    assert torch.allclose(maps, expected_maps(sums, (4, 6), (64, 96)), atol=1e-6)
    with capture_for(sd3, guidance=True, tokens=4) as cap:
        generate(sd3, prompts=PROMPTS[:1], height=96, width=64)
    assert cap.grid == (6, 4)
    assert cap.heat_maps((12, 8), (96, 64)).shape == (1, 4, 96, 64)
    assert token_grid(24, (64, 96)) == (4, 6) and token_grid(24, (96, 64)) == (6, 4)
    with pytest.raises(ValueError, match="tile"):
        token_grid(24, (64, 64))
    with pytest.raises(RuntimeError, match="no joint attention"):
        JointAttentionCapture(sd3.transformer).heat_maps(None, (64, 64))


def test_t5_word_positions_match_by_characters():
    """T5 has no BOS (token 0 = the first token) and its pieces depend on the context: "Doctor" at
    the start and "(doctor)" are not the pieces of "doctor" alone, all three are found."""
    tok = build_tiny_t5_tokenizer()
    prompt = "Doctor and a nurse (doctor), a doctor at an x-ray"
    ids = tok(prompt, add_special_tokens=False).input_ids
    pieces = tok.convert_ids_to_tokens(ids)
    positions = JointAttentionCapture.word_positions(tok, prompt, ["doctor", "a", "x-ray", "ray", "nurse", "pilot"])
    assert set(positions) == {"doctor", "a", "x-ray", "ray", "nurse"}        # pilot is not in the prompt
    assert ["".join(pieces[p] for p in positions["doctor"]).replace("\u2581", "").lower()] == ["doctor" * 3]
    assert positions["doctor"][0] == 1 and pieces[0] == "\u2581"            # the bare word marker is no letter
    assert pieces[positions["doctor"][-1]] == "\u2581doctor"
    assert [pieces[p] for p in positions["a"]] == ["\u2581a", "\u2581a"]      # both, not the a of "an"/"and"
    assert "".join(pieces[p] for p in positions["x-ray"]) == "x-ray"
    assert positions["ray"] == positions["x-ray"][-3:]
    assert [pieces[p] for p in positions["nurse"]] == ["\u2581nurse"]
    every = JointAttentionCapture.word_positions(tok, prompt)
    assert list(every) == ["doctor", "and", "a", "nurse", "at", "an", "x", "ray"]
    # the ids of the word alone miss the capitalised and the bracketed occurrences
    assert len(CrossAttentionCapture.word_positions(tok, prompt, ["doctor"])["doctor"]) == 1
    maps = torch.arange(len(ids) * 4, dtype=torch.float32).reshape(len(ids), 2, 2)
    words = JointAttentionCapture.word_heat_maps(tok, prompt, maps, ["a", "doctor"])
    assert np.allclose(words["a"], maps[positions["a"]].mean(0).numpy())
    assert np.allclose(words["doctor"], maps[positions["doctor"]].mean(0).numpy())


def test_capture_for_picks_the_recorder_and_tokenizer_of_each_family(sd3, flux, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    cap = capture_for(sd3, guidance=True)
    assert type(cap) is JointAttentionCapture and cap.tokenizer is sd3.tokenizer_3
    assert (cap.guidance, cap.text_offset, cap.transformer) == (True, 77, sd3.transformer)
    assert capture_for(sd3, guidance=False).guidance is False          # guidance_scale <= 1: no doubled batch
    cap = capture_for(flux, guidance=True)
    assert type(cap) is JointAttentionCapture and cap.tokenizer is flux.tokenizer_2
    assert (cap.guidance, cap.text_offset) == (False, 0)               # distilled guidance: never doubled
    unet, _ = load_text2image(build_tiny_stable_diffusion(tmp_path / "sd", seed=0), device="cpu", dtype="float32")
    cap = capture_for(unet, guidance=True, layers="all")
    assert type(cap) is CrossAttentionCapture and cap.tokenizer is unet.tokenizer
    assert (cap.unet, cap.guidance, cap.layers, cap.prompt_tokens) == (unet.unet, True, "all", 75)
    pixart, _ = load_text2image(build_tiny_pixart(tmp_path / "pixart", seed=0), device="cpu", dtype="float32")
    assert type(capture_for(pixart, guidance=True)).__name__ == "KernelAttentionCapture"   # its cross-attention
    from types import SimpleNamespace

    other = type("SomeNewPipeline", (SimpleNamespace,), {})(transformer=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="--no-objects") as err:
        capture_for(other, guidance=True)
    assert "\n" not in str(err.value) and "SomeNewPipeline (Linear)" in str(err.value)
    no_t5 = StableDiffusion3Pipeline(**{**sd3.components, "text_encoder_3": None, "tokenizer_3": None})
    with pytest.raises(ValueError, match="T5") as err:
        capture_for(no_t5, guidance=True)
    assert "\n" not in str(err.value)
