"""A tiny random-weight Stable Diffusion 1.x pipeline, built from the real component classes.

RANDOM STAND-IN: the weights are random, so its images are meaningless noise-like pictures. It
exists so that tests and the offline embedded run exercise the production loading and generation
code (``AutoPipelineForText2Image.from_pretrained`` on a directory written by
``StableDiffusionPipeline.save_pretrained``) without downloading anything.

Everything is the real thing except the sizes: the UNet, VAE, PNDM scheduler with the SD v1
settings, CLIP text encoder, and the real CLIP BPE tokenizer (vocabulary rebuilt from the merges
file that open_clip ships, exactly as CLIP derives it), optionally the safety checker and its
image processor.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from pipelines.standins.face_decoder import (LATENT_MEAN_STD, LATENT_PIXEL_STD, build_tiny_vae, face_templates,
                                             load_face_decoder, target_images)

# The SD v1 scheduler settings (scheduler_config.json of CompVis/stable-diffusion-v1-4).
SD1_SCHEDULER = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "skip_prk_steps": True,
    "steps_offset": 1,
    "set_alpha_to_one": False,
}

CLIP_VOCAB_SIZE = 49408  # 256 bytes + 256 "</w>" variants + 48894 merges + 2 special tokens
CLIP_BOS = "<|startoftext|>"
CLIP_EOS = "<|endoftext|>"
TINY_HIDDEN = 32


def _bytes_to_unicode() -> dict[int, str]:
    """CLIP/GPT-2's reversible map from bytes to printable unicode characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def clip_bpe_files(directory: str | os.PathLike) -> tuple[str, str]:
    """Write CLIP's vocab.json and merges.txt into ``directory``; return their paths.

    Derived from open_clip's ``bpe_simple_vocab_16e6.txt.gz`` the way CLIP builds its vocabulary:
    the 256 byte symbols, their ``</w>`` variants, the first 49152-256-2 merges, then the two
    special tokens -- 49408 entries, the same ids as openai/clip-vit-large-patch14's tokenizer.
    """
    import open_clip  # deferred: open_clip

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    with gzip.open(bpe, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]  # line 0 is the "#version" header
    base = list(_bytes_to_unicode().values())
    vocab = base + [s + "</w>" for s in base] + ["".join(m.split()) for m in merges] + [CLIP_BOS, CLIP_EOS]
    if len(vocab) != CLIP_VOCAB_SIZE or len(set(vocab)) != CLIP_VOCAB_SIZE:
        raise RuntimeError(f"unexpected CLIP vocabulary from {bpe}: {len(vocab)} entries")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = directory / "vocab.json", directory / "merges.txt"
    vocab_file.write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False), encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return str(vocab_file), str(merges_file)


def build_clip_tokenizer():
    """The real CLIP tokenizer (transformers ``CLIPTokenizer``), built without a download: a copy of
    the one this process built first (converting the 49k merges takes about 0.3 s; a copy 0.08),
    for a caller that changes it."""
    return copy.deepcopy(_clip_tokenizer())


def clip_tokenizer_to_save():
    """The one CLIP tokenizer this process built, for a stand-in pipeline that only saves it
    (``save_pretrained`` reads it): never changed, so no copy (a copy per tokenizer was about 14
    CPU-s of the test suite's stand-in builds). ``build_clip_tokenizer`` gives one to change."""
    return _clip_tokenizer()


@functools.cache
def _clip_tokenizer():
    from transformers import CLIPTokenizer  # deferred: transformers

    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, _ = clip_bpe_files(tmp)
        # from_pretrained on the two files: the loader converts them to a tokenizer with every
        # transformers version (v5's constructor takes the vocabulary itself, not file names)
        tok = CLIPTokenizer.from_pretrained(tmp, model_max_length=77)
        if len(tok) != CLIP_VOCAB_SIZE:  # the tokenizer did not read the files
            raise RuntimeError(f"CLIPTokenizer built from {vocab_file} has {len(tok)} tokens, expected {CLIP_VOCAB_SIZE}")
    return tok


def tiny_safety_checker(seed: int = 0):
    """A tiny random ``StableDiffusionSafetyChecker`` (its thresholds as initialised: 1, so it
    flags nothing) and its ``CLIPImageProcessor`` (32 px)."""
    # deferred: torch, diffusers, transformers
    import torch
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        checker = StableDiffusionSafetyChecker(
            CLIPConfig(
                text_config={"vocab_size": CLIP_VOCAB_SIZE, "hidden_size": TINY_HIDDEN, "intermediate_size": 37,
                             "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 77},
                vision_config={"hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 1,
                               "num_attention_heads": 4, "image_size": 32, "patch_size": 8},
                projection_dim=TINY_HIDDEN,
            )
        )
    return checker, CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def checker_levels(images):
    """Calibration images, (N, 3, H, W) floats in [0, 1], as the 8-bit levels the stand-in
    checker's image processor reads: (N, 3, H, W) uint8 on the CPU."""
    import torch  # deferred: torch

    return images.detach().float().cpu().mul(255).round().clamp(0, 255).to(torch.uint8)


def build_tiny_safety_checker(directory: str | os.PathLike, seed: int = 0, flagged_share: float = 0.2,
                              images=None) -> str:
    """Save a tiny random standalone safety checker (``config.json`` and
    ``preprocessor_config.json`` at the root, as ``CompVis/stable-diffusion-safety-checker``) into
    ``directory``; return it. RANDOM STAND-IN: what it flags means nothing. Calibrated so that it
    flags some images: its first concept embedding is the calibration embeddings' first principal
    direction, whose threshold is the
    ``1 - flagged_share`` quantile of the cosines of calibration images; the other concepts never
    fire. ``images``: the calibration images, (N, 3, H, W) floats in [0, 1] (or their
    ``checker_levels``), or a list of such batches, one per stand-in generator the check will see:
    the direction is then the main one *within* the generators, orthogonal to the differences
    between their mean embeddings, so that each generator gets flagged images, not one generator
    all of them. Default: the stand-in face decoder's targets at random latents and noise
    images."""
    import torch  # deferred: torch

    checker, processor = tiny_safety_checker(seed)
    g = torch.Generator().manual_seed(seed)
    if images is None:
        z = torch.randn(64, 4, 1, 1, generator=g) * LATENT_MEAN_STD + torch.randn(64, 4, 8, 8, generator=g) * (
            LATENT_PIXEL_STD / 10)
        woman, man = face_templates()
        images = [(target_images(z, woman, man) + 1) / 2, torch.rand(32, 3, 64, 64, generator=g)]
    groups = list(images) if isinstance(images, (list, tuple)) else [images]
    embeds = []
    for batch in groups:
        levels = (batch if batch.dtype == torch.uint8 else checker_levels(batch)).permute(0, 2, 3, 1)
        pixels = processor(list(levels.numpy()), return_tensors="pt").pixel_values
        with torch.no_grad():
            embeds.append(checker.visual_projection(checker.vision_model(pixels)[1]))
    with torch.no_grad():
        unit = [torch.nn.functional.normalize(e, dim=1) for e in embeds]
        means = torch.stack([u.mean(dim=0) for u in unit])
        within = torch.cat([u - u.mean(dim=0) for u in unit])
        if len(unit) > 1:   # leave out the directions that tell the generators apart
            basis = torch.linalg.svd(means - means.mean(dim=0), full_matrices=False).Vh[:len(unit) - 1]
            within = within - (within @ basis.T) @ basis
        # random embeddings share a large common part: a random direction would flag all or none
        direction = torch.linalg.svd(within, full_matrices=False).Vh[0]
        cos = torch.cat(unit) @ direction
        checker.concept_embeds[0] = direction
        checker.concept_embeds_weights.fill_(2.0)
        checker.concept_embeds_weights[0] = float(np.quantile(cos.numpy(), 1 - flagged_share))
        checker.special_care_embeds_weights.fill_(2.0)
    directory = str(directory)
    checker.save_pretrained(directory)
    processor.save_pretrained(directory)
    Path(directory, "STANDIN.txt").write_text(
        "tiny random StableDiffusionSafetyChecker (NOT a real NSFW check): flags about "
        f"{flagged_share:.0%} of its calibration images, meaninglessly\n")
    return directory


def build_tiny_stable_diffusion(directory: str | os.PathLike, seed: int = 0, with_safety_checker: bool = False,
                                faces: bool = False) -> str:
    """Build and save a tiny random-weight SD 1.x pipeline into ``directory``; return the directory.

    RANDOM STAND-IN, OUTPUTS MEANINGLESS. Same classes and file layout as a real SD 1.x checkpoint
    (``StableDiffusionPipeline.save_pretrained``): UNet (latents 8x8, channels 32/64), VAE with the
    real 8x down-scaling (so images are 64x64 px), PNDM scheduler with the SD v1 settings, CLIP text
    encoder (hidden size 32, the real 49408-token vocabulary and tokenizer) and, with
    ``with_safety_checker``, a tiny ``StableDiffusionSafetyChecker`` plus its ``CLIPImageProcessor``.
    The same ``seed`` gives the same weights. With ``faces``, the VAE decoder's weights are the
    fitted ones of ``pipelines.standins.face_decoder`` (every image is one of two faces, blended and
    darkened by the latent; still meaningless), so that the face steps of the studies find faces.
    """
    # deferred: torch, diffusers, transformers
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    directory = str(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=TINY_HIDDEN,
            attention_head_dim=8,
            norm_num_groups=32,
        )
        vae = build_tiny_vae(seed + 1)
        if faces:
            load_face_decoder(vae)
        torch.manual_seed(seed + 2)
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=CLIP_VOCAB_SIZE,
                hidden_size=TINY_HIDDEN,
                intermediate_size=37,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=77,
                projection_dim=TINY_HIDDEN,
                bos_token_id=CLIP_VOCAB_SIZE - 2,
                eos_token_id=CLIP_VOCAB_SIZE - 1,
                pad_token_id=CLIP_VOCAB_SIZE - 1,
            )
        )
        safety_checker = feature_extractor = None
        if with_safety_checker:
            safety_checker, feature_extractor = tiny_safety_checker(seed + 3)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer_to_save(),
        unet=unet,
        scheduler=PNDMScheduler(**SD1_SCHEDULER),
        safety_checker=safety_checker,
        feature_extractor=feature_extractor,
        requires_safety_checker=with_safety_checker,
    )
    pipe.save_pretrained(directory)
    return directory
