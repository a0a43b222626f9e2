"""Speed options of the generation stage (channels-last, VAE slicing, torch.compile of the UNet, the
attention processor that runs), on the tiny random-weight SD 1.x pipeline loaded through the
production path: the options are recorded, and they give the same images as the default generator."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from operators.support import diffusion
from operators.image_generation import ImageGenerator
from operators.support.diffusion import VAE_SLICING_AUTO_MIN_BATCH
from operators.support.codec import batch_images
from pipelines.standins.diffusion import build_tiny_stable_diffusion
from schemas.images import GENERATION_STATUS, SEED, GenerationStatus
from schemas.subsets import PROMPT, PROMPT_ID

STEPS = 2
PROMPTS = ["a photo of a doctor", "a photo of a chef", "a photo of a lawyer"]
SEEDS = [7, 99, 3]


def rows(prompts, seeds) -> pa.Table:
    return pa.table({
        PROMPT_ID: pa.array(range(1, len(prompts) + 1), pa.int32()),
        PROMPT: pa.array(prompts, pa.string()),
        SEED: pa.array(seeds, pa.int64()),
    })


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    return build_tiny_stable_diffusion(tmp_path_factory.mktemp("sd_tiny_options"), seed=0)


@pytest.fixture(scope="module")
def plain(sd_dir):
    return ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=3)


@pytest.fixture(scope="module")
def plain_images(plain):
    """(3, 3, 64, 64) float images of one 3-image call of the default generator."""
    with torch.inference_mode():
        images, _ = plain._generate(PROMPTS, SEEDS)
    return images


def decode_calls(gen, monkeypatch) -> list[int]:
    """The number of latents each VAE decoder pass gets (1 per pass when sliced)."""
    calls: list[int] = []
    vae = gen.pipe.vae
    inner = vae._decode

    def spy(z, *a, **kw):
        calls.append(int(z.shape[0]))
        return inner(z, *a, **kw)

    monkeypatch.setattr(vae, "_decode", spy)
    return calls


# -- defaults: nothing changes, and what runs is recorded ------------------------------------------------


def test_defaults_are_off_and_recorded(plain):
    r = plain.record
    assert r["channels_last"] is False and r["compile_unet"] is False and r["vae_slicing"] is False
    assert r["vae_slicing_auto_min_batch"] is None
    assert plain.channels_last is False and plain.compile_mode is None and plain.vae_slicing is False
    # diffusers' SDPA processor is what the UNet and the VAE run
    assert r["attention_processors"] == {"unet": ["AttnProcessor2_0"], "vae": ["AttnProcessor2_0"]}
    assert diffusion.attention_processors(plain.pipe) == r["attention_processors"]
    assert not plain.pipe.vae.use_slicing
    conv = plain.pipe.unet.conv_in.weight
    assert conv.is_contiguous() and not conv.is_contiguous(memory_format=torch.channels_last)


def test_default_generator_leaves_the_vae_unsliced(plain, plain_images, monkeypatch):
    calls = decode_calls(plain, monkeypatch)
    with torch.inference_mode():
        images, _ = plain._generate(PROMPTS, SEEDS)
    assert calls == [3]  # one decode of the whole call
    assert torch.equal(images, plain_images)


@pytest.mark.parametrize("kwargs, message", [
    ({"vae_slicing": "yes"}, "vae_slicing"),
    ({"vae_slicing": 1}, "vae_slicing"),
    ({"compile_unet": "fast"}, "compile_unet"),
])
def test_invalid_option_values_are_rejected(sd_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageGenerator(sd_dir, steps=STEPS, device="cpu", **kwargs)


# -- channels-last -----------------------------------------------------------------------------------------


def test_channels_last_gives_the_same_images_and_is_recorded(sd_dir, plain, plain_images):
    gen = ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=3, channels_last=True)
    assert gen.record["channels_last"] == ["unet", "vae"]
    assert gen.record["compile_unet"] is False and gen.record["vae_slicing"] is False
    for conv in (gen.pipe.unet.conv_in, gen.pipe.vae.decoder.conv_in):
        w = conv.weight
        assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    with torch.inference_mode():
        images, _ = gen._generate(PROMPTS, SEEDS)
    assert images.shape == plain_images.shape
    # NHWC convolutions sum in another order: floating-point rounding only
    assert (images - plain_images).abs().max().item() < 1e-4
    a = batch_images(gen(rows(PROMPTS, SEEDS)))
    b = batch_images(plain(rows(PROMPTS, SEEDS)))
    for x, y in zip(a, b):
        assert np.abs(x.astype(int) - y).max() <= 1


# -- VAE slicing ---------------------------------------------------------------------------------------------


def test_vae_slicing_decodes_one_image_at_a_time_with_the_same_images(sd_dir, plain_images, monkeypatch):
    gen = ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=3, vae_slicing=True)
    assert gen.record["vae_slicing"] is True and gen.record["vae_slicing_auto_min_batch"] is None
    calls = decode_calls(gen, monkeypatch)
    with torch.inference_mode():
        images, _ = gen._generate(PROMPTS, SEEDS)
    assert calls == [1, 1, 1]
    # the UNet ran on the same batch; only the decoder saw one latent at a time
    assert (images - plain_images).abs().max().item() < 2e-5   # observed ~2e-6
    out = gen(rows(PROMPTS, SEEDS))
    assert out.column(GENERATION_STATUS).to_pylist() == [GenerationStatus.OK] * 3


def test_vae_slicing_auto_slices_only_large_calls(sd_dir, monkeypatch):
    n = VAE_SLICING_AUTO_MIN_BATCH
    gen = ImageGenerator(sd_dir, steps=1, device="cpu", micro_batch=n, vae_slicing="auto")
    assert gen.record["vae_slicing"] == "auto" and gen.record["vae_slicing_auto_min_batch"] == n
    calls = decode_calls(gen, monkeypatch)
    prompts = [f"a photo of a person number {i}" for i in range(n)]
    out = gen(rows(prompts[:n - 1], list(range(n - 1))))   # one call of n - 1 images: not sliced
    assert calls == [n - 1] and not gen.pipe.vae.use_slicing
    calls.clear()
    sliced = gen(rows(prompts, list(range(n))))             # one call of n images: sliced
    assert calls == [1] * n and gen.pipe.vae.use_slicing
    calls.clear()
    gen.regenerate(prompts[0], 0)                           # a single image: nothing to slice
    assert calls == [1] and not gen.pipe.vae.use_slicing
    first = batch_images(out)[:2]
    again = batch_images(sliced)[:2]
    for x, y in zip(first, again):  # the same seeds in a larger call: rounding at most
        assert np.abs(x.astype(int) - y).max() <= 3


# -- torch.compile ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, mode, passed", [(True, "default", None),
                                                  ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs",
                                                   "max-autotune-no-cudagraphs")])
def test_compile_unet_is_wired_and_recorded(sd_dir, monkeypatch, option, mode, passed):
    """Without compiling (slow on a CPU): the UNet, and only it, is compiled in place with the mode."""
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append((self, kw)))
    gen = ImageGenerator(sd_dir, steps=STEPS, device="cpu", compile_unet=option, channels_last=True)
    assert len(compiled) == 1
    module, kwargs = compiled[0]
    assert module is gen.pipe.unet and kwargs == {"mode": passed}
    assert gen.compile_mode == mode and gen.record["compile_unet"] == mode
    assert gen.record["channels_last"] == ["unet", "vae"]
    # recorded before compiling: still the SDPA processor
    assert gen.record["attention_processors"]["unet"] == ["AttnProcessor2_0"]


@pytest.mark.slow
def test_compiled_unet_gives_the_same_images(sd_dir, plain_images):
    """Really compiles (inductor, a C++ compiler on the CPU): tens of seconds on 2 cores. The CPU
    kernels are built scalar (no SIMD code: about 40% less compiling, the same graph, passes and
    results); a GPU compiles Triton kernels, so the CPU's vector code is nothing a run uses."""
    import torch._inductor.config as inductor

    gen = ImageGenerator(sd_dir, steps=STEPS, device="cpu", micro_batch=3, compile_unet=True)
    with torch.inference_mode(), inductor.patch({"cpp.vec_isa_ok": False}):
        images, _ = gen._generate(PROMPTS, SEEDS)
    assert type(gen.pipe.unet).__name__ == "UNet2DConditionModel"   # compiled in place
    assert (images - plain_images).abs().max().item() < 1e-3
