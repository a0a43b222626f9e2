"""Tiny random-weight pipelines of today's text-to-image families, built from the real classes.

RANDOM STAND-INS, OUTPUTS MEANINGLESS. Like ``standins.diffusion`` for SD 1.x, each builder writes a
directory with ``save_pretrained`` that ``AutoPipelineForText2Image.from_pretrained`` loads through
the production loader (``operators.support.diffusion.load_text2image``), with the real component
classes and file layout of the family and tiny sizes:

- ``sdxl``: ``StableDiffusionXLPipeline`` (two CLIP text encoders, the second with projection, a UNet
  with ``text_time`` added conditions: the pooled embedding and the size/crop ids);
- ``sd3``: ``StableDiffusion3Pipeline`` (MMDiT ``SD3Transformer2DModel``, two CLIP encoders with
  projection and a T5 encoder, flow-matching Euler scheduler, 16-channel VAE);
- ``flux``: ``FluxPipeline`` (``FluxTransformer2DModel`` with double- and single-stream blocks, a CLIP
  encoder for the pooled embedding, a T5 encoder for the sequence; ``guidance_embeds`` for a
  dev-like model);
- ``pixart``: ``PixArtSigmaPipeline`` (``PixArtTransformer2DModel``, T5 only, DPM-Solver++);
- ``chroma``, ``lumina2``, ``sana``, ``sana-sprint``, ``z-image``, ``flux2-klein``, ``flux2``, ``qwen-image``,
  ``hunyuan-image``, ``kolors``, ``cogview4``, ``hidream``: the 2025-2026 families of their names (each
  builder says what it holds; Gemma 2 and GLM-4 (and Llama) encoders with tokenizers over the tiny T5
  vocabulary; Qwen3 and Qwen2.5-VL encoders with a byte-level Qwen tokenizer and Qwen's chat template;
  Mistral 3 with its vision tower behind a Pixtral processor and a Mistral chat template; ChatGLM3
  with a SentencePiece model trained here on a few sentences).

The CLIP tokenizer is the real one (``standins.diffusion.clip_tokenizer_to_save``); the T5 tokenizer
is a tiny SentencePiece-style (Unigram) tokenizer over the bytes and a few hundred words, built with
the ``tokenizers`` library, because T5's vocabulary does not ship with any package here. Images are
64x64 (latents 8x8; PixArt 256x256). SDXL and PixArt decode with the fitted face decoder of the SD
stand-ins (``standins.face_decoder``); SD 3 and FLUX paint noise. The same seed writes the same
weights.

A process builds each (family, seed, options) once: ``build_tiny_pipeline`` keeps the files of its
first build in memory and writes them to every later directory that asks for the same stand-in
(byte for byte what a new build writes: the builders are seeded). A driver that runs several
stand-in runs (the test suite, a notebook) builds each generator once instead of once per run.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

from pipelines.standins.diffusion import CLIP_VOCAB_SIZE, build_tiny_stable_diffusion, clip_tokenizer_to_save
from pipelines.standins.face_decoder import build_tiny_vae, load_face_decoder

FAMILIES = ("sdxl", "sd3", "flux", "pixart", "chroma", "lumina2", "sana", "sana-sprint", "z-image", "flux2-klein",
            "flux2", "qwen-image", "hunyuan-image", "kolors", "cogview4", "hidream")
# the stand-ins' image size: 64 px, PixArt and HiDream 256 px, SANA 512 px, SANA-Sprint 1024 px (their
# resolution binning knows no smaller size; HiDream rescales every size to its default's area)
STANDIN_SIZE = {"pixart": 256, "sana": 512, "sana-sprint": 1024, "hidream": 256}
TINY = 32
T5_VOCAB = 400


def build_tiny_t5_tokenizer():
    """A T5 tokenizer (``T5TokenizerFast`` / transformers 5's ``T5Tokenizer``) over a tiny Unigram
    vocabulary: "<pad>" 0, "</s>" 1, "<unk>" 2, the printable ASCII characters and common words."""
    # deferred: tokenizers, transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import T5TokenizerFast

    words = ("a photo of the an person man woman who works as doctor nurse ceo pilot chef teacher lawyer "
             "farmer engineer scientist cat dog on in with and is at to").split()
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + w, -2.0) for w in words] + [("\u2581", -3.0)]
    pieces += [(c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation]
    model = models.Unigram(pieces, unk_id=2, byte_fallback=False)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Replace(r"\s+", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                           extra_ids=0, model_max_length=512)


def _t5_encoder(seed: int):
    # deferred: torch, transformers
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    return T5EncoderModel(T5Config(vocab_size=T5_VOCAB, d_model=TINY, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1))


def _clip_encoder(seed: int, projection: bool, hidden: int = TINY, positions: int = 77):
    # deferred: torch, transformers
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=CLIP_VOCAB_SIZE, hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=positions, projection_dim=hidden,
                         bos_token_id=CLIP_VOCAB_SIZE - 2, eos_token_id=CLIP_VOCAB_SIZE - 1,
                         pad_token_id=CLIP_VOCAB_SIZE - 1, hidden_act="gelu")
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def _vae(seed: int, latent_channels: int = 4, flow: bool = False, stages: int = 4, mid_attention: bool = True):
    """The stand-in VAE. SD's 4-channel VAE (SDXL, PixArt) gets the fitted face decoder of
    ``standins.face_decoder`` (its images are faces, so the face steps of the studies find some);
    the flow models' VAEs (SD 3: 16 channels, FLUX: no quant convs) stay random. ``mid_attention``
    False: no self-attention in the middle block (HiDream's latents are always 128 x 128, whose
    16,384-position attention was three quarters of its stand-in's generation time)."""
    # deferred: torch, diffusers
    import torch
    from diffusers import AutoencoderKL

    if latent_channels == 4 and not flow:
        vae = build_tiny_vae(seed)
        load_face_decoder(vae)
        return vae
    torch.manual_seed(seed)
    extra = {"shift_factor": 0.0609, "scaling_factor": 1.5035, "use_quant_conv": False,
             "use_post_quant_conv": False} if flow else {}
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * stages,
                         up_block_types=("UpDecoderBlock2D",) * stages, block_out_channels=(8, 8, 16, 16)[-stages:],
                         layers_per_block=1, latent_channels=latent_channels, norm_num_groups=8, sample_size=64,
                         mid_block_add_attention=mid_attention, **extra)


def build_tiny_sdxl(directory, seed: int = 0) -> str:
    # deferred: torch, diffusers
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=2 * TINY, attention_head_dim=(2, 4), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=TINY + 6 * 8,
            transformer_layers_per_block=(1, 1), norm_num_groups=32)
        pipe = StableDiffusionXLPipeline(
            vae=_vae(seed + 1), text_encoder=_clip_encoder(seed + 2, False), text_encoder_2=_clip_encoder(seed + 3, True),
            tokenizer=clip_tokenizer_to_save(), tokenizer_2=clip_tokenizer_to_save(), unet=unet,
            scheduler=EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                             timestep_spacing="leading", steps_offset=1))
    return _save(pipe, directory, "sdxl", seed)


def build_tiny_sd3(directory, seed: int = 0) -> str:
    # deferred: torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=16, num_layers=2,
                                            attention_head_dim=8, num_attention_heads=4, joint_attention_dim=TINY,
                                            caption_projection_dim=TINY, pooled_projection_dim=2 * TINY,
                                            out_channels=16, pos_embed_max_size=16)
        pipe = StableDiffusion3Pipeline(
            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=_vae(seed + 1, latent_channels=16, flow=True),
            text_encoder=_clip_encoder(seed + 2, True), tokenizer=clip_tokenizer_to_save(),
            text_encoder_2=_clip_encoder(seed + 3, True), tokenizer_2=clip_tokenizer_to_save(),
            text_encoder_3=_t5_encoder(seed + 4), tokenizer_3=build_tiny_t5_tokenizer())
    return _save(pipe, directory, "sd3", seed)


def build_tiny_flux(directory, seed: int = 0, guidance_embeds: bool = False) -> str:
    # deferred: torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TINY,
                                             pooled_projection_dim=TINY, guidance_embeds=guidance_embeds,
                                             axes_dims_rope=(4, 6, 6))
        pipe = FluxPipeline(
            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
            vae=_vae(seed + 1, latent_channels=4, flow=True),
            text_encoder=_clip_encoder(seed + 2, False), tokenizer=clip_tokenizer_to_save(),
            text_encoder_2=_t5_encoder(seed + 3), tokenizer_2=build_tiny_t5_tokenizer())
    return _save(pipe, directory, "flux", seed)


def build_tiny_pixart(directory, seed: int = 0) -> str:
    # deferred: torch, diffusers
    import torch
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                               out_channels=8, num_layers=2, cross_attention_dim=TINY,
                                               sample_size=32, patch_size=2, caption_channels=TINY,
                                               norm_num_groups=32)
        pipe = PixArtSigmaPipeline(tokenizer=build_tiny_t5_tokenizer(), text_encoder=_t5_encoder(seed + 2),
                                   vae=_vae(seed + 1), transformer=transformer,
                                   scheduler=DPMSolverMultistepScheduler())
    return _save(pipe, directory, "pixart", seed)


def build_tiny_gemma_tokenizer():
    """A Gemma tokenizer (transformers 5's ``GemmaTokenizer``, tokenizers-backed) over the tiny
    Unigram vocabulary of ``build_tiny_t5_tokenizer``: Gemma's own vocabulary ships with no package
    here."""
    from tokenizers import Tokenizer  # deferred: tokenizers, transformers
    from transformers import GemmaTokenizer

    backend = Tokenizer.from_str(build_tiny_t5_tokenizer().backend_tokenizer.to_str())
    return GemmaTokenizer(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                          bos_token="</s>")


def _gemma2_encoder(seed: int):
    # deferred: torch, transformers
    import torch
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(seed)
    return Gemma2Model(Gemma2Config(vocab_size=T5_VOCAB, hidden_size=TINY, intermediate_size=37, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0,
                                    eos_token_id=1, bos_token_id=1))


def build_tiny_chroma(directory, seed: int = 0) -> str:
    """``ChromaPipeline``: FLUX's double- and single-stream blocks with the distilled modulation
    approximator instead of pooled CLIP conditioning, T5 only, a negative prompt."""
    # deferred: torch, diffusers
    import torch
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TINY,
                                               axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
                                               approximator_hidden_dim=32, approximator_layers=1)
        pipe = ChromaPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                              vae=_vae(seed + 1, latent_channels=16, flow=True), text_encoder=_t5_encoder(seed + 2),
                              tokenizer=build_tiny_t5_tokenizer(), image_encoder=None, feature_extractor=None)
    return _save(pipe, directory, "chroma", seed)


def build_tiny_lumina2(directory, seed: int = 0) -> str:
    """``Lumina2Pipeline``: the Lumina-Image 2.0 unified next-DiT with caption refiner layers, a
    Gemma 2 text encoder (its system prompt prepended by the pipeline), flow matching."""
    # deferred: torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = Lumina2Transformer2DModel(sample_size=8, patch_size=2, in_channels=16, hidden_size=32,
                                                num_layers=1, num_refiner_layers=1, num_attention_heads=2,
                                                num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 6, 6),
                                                axes_lens=(300, 64, 64), cap_feat_dim=TINY)
        pipe = Lumina2Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
                               vae=_vae(seed + 1, latent_channels=16, flow=True),
                               text_encoder=_gemma2_encoder(seed + 2), tokenizer=build_tiny_gemma_tokenizer())
    return _save(pipe, directory, "lumina2", seed)


def _dc_ae(seed: int):
    """SANA's deep-compression autoencoder, tiny: six stages (32x spatial compression, as the real
    one), linear attention in the last three; 4 channels in the two full-resolution stages (SANA's
    resolution bins make the stand-ins decode at 512 and 1024 px: half the decoder's time of 8)."""
    # deferred: torch, diffusers
    import torch
    from diffusers import AutoencoderDC

    torch.manual_seed(seed)
    blocks = ("ResBlock",) * 3 + ("EfficientViTBlock",) * 3
    scales = ((),) * 3 + ((5,),) * 3
    return AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=8, encoder_block_types=blocks,
                         decoder_block_types=blocks, encoder_block_out_channels=(4, 4, 8, 16, 16, 16),
                         decoder_block_out_channels=(4, 4, 8, 16, 16, 16), encoder_layers_per_block=(1,) * 6,
                         decoder_layers_per_block=(1,) * 6, encoder_qkv_multiscales=scales,
                         decoder_qkv_multiscales=scales, upsample_block_type="interpolate",
                         downsample_block_type="conv", decoder_norm_types="rms_norm", decoder_act_fns="silu",
                         scaling_factor=0.41407)


def build_tiny_sana(directory, seed: int = 0, sprint: bool = False) -> str:
    """``SanaPipeline`` (or ``SanaSprintPipeline``): the linear-attention SANA transformer with
    cross-attention to a Gemma 2 encoder, the DC-AE, DPM-Solver++ on flow sigmas (Sprint: SCM with
    embedded guidance). The pipelines bin the size to their aspect-ratio tables, so the stand-in
    is 512 px (sample size 16; SANA-Sprint knows only the 1024 px table)."""
    # deferred: torch, diffusers
    import torch
    from diffusers import (DPMSolverMultistepScheduler, SanaPipeline, SanaSprintPipeline, SanaTransformer2DModel,
                           SCMScheduler)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                                             num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=8,
                                             cross_attention_dim=16, caption_channels=TINY,
                                             sample_size=32 if sprint else 16, patch_size=1, guidance_embeds=sprint,
                                             qk_norm="rms_norm_across_heads" if sprint else None)
        scheduler = SCMScheduler() if sprint else DPMSolverMultistepScheduler(
            flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
        pipe = (SanaSprintPipeline if sprint else SanaPipeline)(
            tokenizer=build_tiny_gemma_tokenizer(), text_encoder=_gemma2_encoder(seed + 2), vae=_dc_ae(seed + 1),
            transformer=transformer, scheduler=scheduler)
    return _save(pipe, directory, "sana-sprint" if sprint else "sana", seed)


# Qwen's chat format, as Z-Image and FLUX.2 klein apply it to the prompt (``enable_thinking`` False
# adds the empty think block the Qwen3 template adds)
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}")


def _byte_level(specials: list[str]):
    """A ``tokenizers`` byte-level BPE without merges (one token per byte) with ``specials``."""
    # deferred: tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok


def build_tiny_qwen_tokenizer():
    """A Qwen2 tokenizer (byte-level BPE without merges: one token per byte) with Qwen's special
    tokens and chat template: Qwen's vocabulary ships with no package here."""
    from transformers import Qwen2Tokenizer  # deferred: transformers

    tok = _byte_level(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    return Qwen2Tokenizer(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                          bos_token=None, chat_template=QWEN_CHAT_TEMPLATE)


def _qwen3(seed: int, vocab: int, layers: int, hidden: int, causal: bool):
    # deferred: torch, transformers
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden + 5, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2, max_position_embeddings=1024)
    return (Qwen3ForCausalLM if causal else Qwen3Model)(cfg)


def build_tiny_z_image(directory, seed: int = 0) -> str:
    """``ZImagePipeline``: the single-stream S3-DiT with refiner layers over a Qwen3 encoder's
    second-to-last hidden states of the chat-formatted prompt, flow matching, a negative prompt."""
    # deferred: torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    tokenizer = build_tiny_qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32,
                                               n_layers=1, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                               cap_feat_dim=TINY, axes_dims=[4, 6, 6], axes_lens=[1024, 64, 64])
        pipe = ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(),
                              vae=_vae(seed + 1, latent_channels=16, flow=True),
                              text_encoder=_qwen3(seed + 2, len(tokenizer), 2, TINY, causal=False), tokenizer=tokenizer,
                              transformer=transformer)
    return _save(pipe, directory, "z-image", seed)


def _flux2_networks(seed: int, guidance_embeds: bool):
    """FLUX.2's tiny transformer (seed) and VAE with 2 x 2 latent patches (seed + 1): dev's has the
    guidance embedding, klein's not."""
    # deferred: torch, diffusers
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=32, num_layers=1, num_single_layers=1,
                                          attention_head_dim=16, num_attention_heads=2, joint_attention_dim=48,
                                          timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
                                          guidance_embeds=guidance_embeds)
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLFlux2(block_out_channels=(8, 8, 16, 16), layers_per_block=1, latent_channels=8,
                             norm_num_groups=8, sample_size=64, patch_size=(2, 2))
    return transformer, vae


def build_tiny_flux2_klein(directory, seed: int = 0) -> str:
    """``Flux2KleinPipeline``: FLUX.2's transformer over three stacked hidden layers (9, 18, 27) of
    a Qwen3 causal LM (so 28 tiny layers), FLUX.2's VAE with 2x2 latent patches, CFG."""
    # deferred: torch, diffusers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    tokenizer = build_tiny_qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        transformer, vae = _flux2_networks(seed, guidance_embeds=False)
        pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                                  text_encoder=_qwen3(seed + 2, len(tokenizer), 28, 16, causal=True),
                                  tokenizer=tokenizer, transformer=transformer, is_distilled=False)
    return _save(pipe, directory, "flux2-klein", seed)


def build_tiny_cogview4(directory, seed: int = 0) -> str:
    """``CogView4Pipeline``: the CogView4 DiT over a GLM-4 encoder's second-to-last hidden states
    (a fast tokenizer over the tiny T5 vocabulary, as GLM's is not in any package here), flow
    matching with CogView4's linear dynamic shift, a negative prompt."""
    # deferred: torch, diffusers, tokenizers, transformers
    import torch
    from diffusers import CogView4Pipeline, CogView4Transformer2DModel, FlowMatchEulerDiscreteScheduler
    from tokenizers import Tokenizer
    from transformers import GlmConfig, GlmModel, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(build_tiny_t5_tokenizer().backend_tokenizer.to_str()),
        pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = CogView4Transformer2DModel(patch_size=2, in_channels=16, out_channels=16, num_layers=1,
                                                 attention_head_dim=16, num_attention_heads=2, text_embed_dim=TINY,
                                                 time_embed_dim=16, condition_dim=8, pos_embed_max_size=32,
                                                 sample_size=8, rope_axes_dim=(4, 4))
        torch.manual_seed(seed + 2)
        encoder = GlmModel(GlmConfig(vocab_size=T5_VOCAB, hidden_size=TINY, intermediate_size=37, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0))
        scheduler = FlowMatchEulerDiscreteScheduler(base_shift=0.25, max_shift=0.75, base_image_seq_len=256,
                                                    use_dynamic_shifting=True, time_shift_type="linear")
        pipe = CogView4Pipeline(tokenizer=tokenizer, text_encoder=encoder, transformer=transformer, scheduler=scheduler,
                                vae=_vae(seed + 1, latent_channels=16, flow=True))
    return _save(pipe, directory, "cogview4", seed)


def build_tiny_hidream(directory, seed: int = 0) -> str:
    """``HiDreamImagePipeline``: the sparse (mixture-of-experts) DiT with double- and single-stream
    blocks over four encoders: two long CLIP (248 positions, pooled), T5 and Llama 3.1 (chosen hidden layers, one per
    block; its tokenizer over the tiny T5 vocabulary here, eager attention as the pipeline asks for
    attention weights). The pipeline rescales every size to the area of its default (128 latent
    rows times the VAE's factor, squared): with a two-stage VAE (factor 2) the stand-in's images
    are 256 px, and 8 x 8 latent patches keep the transformer at 256 tokens."""
    # deferred: torch, diffusers, tokenizers, transformers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline, HiDreamImageTransformer2DModel
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    llama_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(build_tiny_t5_tokenizer().backend_tokenizer.to_str()),
        pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HiDreamImageTransformer2DModel(patch_size=8, in_channels=16, num_layers=1, num_single_layers=1,
                                                     attention_head_dim=8, num_attention_heads=2,
                                                     caption_channels=[TINY, TINY], text_emb_dim=2 * TINY,
                                                     num_routed_experts=2, num_activated_experts=1,
                                                     axes_dims_rope=(4, 2, 2), max_resolution=(32, 32),
                                                     llama_layers=[0, 1])
        torch.manual_seed(seed + 5)
        config = LlamaConfig(vocab_size=T5_VOCAB, hidden_size=TINY, intermediate_size=37, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0)
        config._attn_implementation = "eager"
        llama = LlamaForCausalLM(config)
        pipe = HiDreamImagePipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=_vae(seed + 1, latent_channels=16, flow=True, stages=2, mid_attention=False),
            text_encoder=_clip_encoder(seed + 2, True, positions=248), tokenizer=clip_tokenizer_to_save(),
            text_encoder_2=_clip_encoder(seed + 3, True, positions=248), tokenizer_2=clip_tokenizer_to_save(),
            text_encoder_3=_t5_encoder(seed + 4), tokenizer_3=build_tiny_t5_tokenizer(),
            text_encoder_4=llama, tokenizer_4=llama_tokenizer, transformer=transformer)
    return _save(pipe, directory, "hidream", seed)


def _qwen25_vl(seed: int, vocab: int, layers: int, eos: int, pad: int):
    """A tiny ``Qwen2_5_VLForConditionalGeneration`` (Qwen-Image's and HunyuanImage's encoder):
    a Qwen2 text stack with multimodal rotary sections and a one-block vision tower."""
    # deferred: torch, transformers
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    text = dict(vocab_size=vocab, hidden_size=TINY, intermediate_size=37, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, bos_token_id=None, eos_token_id=eos,
                pad_token_id=pad)
    vision = dict(depth=1, hidden_size=16, intermediate_size=20, num_heads=2, out_hidden_size=TINY,
                  fullatt_block_indexes=[0])
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                                                               bos_token_id=None, eos_token_id=eos, pad_token_id=pad))


def build_tiny_qwen_image(directory, seed: int = 0) -> str:
    """``QwenImagePipeline``: the MMDiT over the last hidden states of a Qwen2.5-VL encoder reading the
    prompt in Qwen-Image's chat template (the pipeline drops its first 34 tokens), Qwen-Image's
    causal-3D VAE (one frame), 2 x 2 packed latents, true classifier-free guidance."""
    # deferred: torch, diffusers
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, \
        QwenImageTransformer2DModel

    tokenizer = build_tiny_qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=1,
                                                  attention_head_dim=16, num_attention_heads=2,
                                                  joint_attention_dim=TINY, axes_dims_rope=(4, 6, 6))
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                     temperal_downsample=[False, True, True])
        pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
                                 text_encoder=_qwen25_vl(seed + 2, len(tokenizer), 2, tokenizer.eos_token_id,
                                                         tokenizer.pad_token_id), tokenizer=tokenizer)
    return _save(pipe, directory, "qwen-image", seed)


def build_tiny_hunyuan_image(directory, seed: int = 0) -> str:
    """``HunyuanImagePipeline``: HunyuanImage 2.1's double- and single-stream DiT with a token
    refiner over a Qwen2.5-VL encoder's third-to-last hidden states and ByT5's glyph embedding (the
    real byte-level ``ByT5Tokenizer``), the 32x VAE (8x here), and its guidance as a guider
    component (``AdaptiveProjectedMixGuidance`` at its defaults), not a call argument."""
    # deferred: torch, diffusers, transformers
    import torch
    from diffusers import AutoencoderKLHunyuanImage, FlowMatchEulerDiscreteScheduler, HunyuanImagePipeline, \
        HunyuanImageTransformer2DModel
    from diffusers.guiders import AdaptiveProjectedMixGuidance
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    tokenizer, byt5 = build_tiny_qwen_tokenizer(), ByT5Tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HunyuanImageTransformer2DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                                     attention_head_dim=16, num_layers=1, num_single_layers=1,
                                                     num_refiner_layers=1, text_embed_dim=TINY,
                                                     text_embed_2_dim=TINY, rope_axes_dim=(8, 8))
        torch.manual_seed(seed + 1)
        # its ResNet blocks' GroupNorm has 32 groups: 32 channels at least
        vae = AutoencoderKLHunyuanImage(in_channels=3, out_channels=3, latent_channels=8,
                                        block_out_channels=(32, 32, 32, 32), layers_per_block=1,
                                        spatial_compression_ratio=8, sample_size=64, scaling_factor=0.75)
        torch.manual_seed(seed + 3)
        glyph = T5EncoderModel(T5Config(vocab_size=len(byt5), d_model=TINY, d_kv=8, d_ff=37, num_layers=1,
                                        num_heads=4, relative_attention_num_buckets=8))
        pipe = HunyuanImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=4.0), vae=vae,
                                    text_encoder=_qwen25_vl(seed + 2, len(tokenizer), 3, tokenizer.eos_token_id,
                                                            tokenizer.pad_token_id),
                                    tokenizer=tokenizer, text_encoder_2=glyph, tokenizer_2=byt5,
                                    transformer=transformer, guider=AdaptiveProjectedMixGuidance())
    return _save(pipe, directory, "hunyuan-image", seed)


# a Mistral chat template with a system prompt (Mistral Small 3.1's layout: [SYSTEM_PROMPT] ...
# [/SYSTEM_PROMPT][INST] ... [/INST]); content is a string or a list of typed parts
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% set text = m['content'] if m['content'] is string else "
    "(m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('')) %}"
    "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'user' %}[INST]{{ text }}[/INST]{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}")


def build_tiny_mistral_processor():
    """A ``PixtralProcessor`` (FLUX.2-dev's tokenizer component) over a byte-level tokenizer with
    Mistral's special tokens and chat template: Mistral's vocabulary ships with no package here."""
    # deferred: transformers
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    tok = _byte_level(["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                       "[IMG]", "[IMG_BREAK]", "[IMG_END]"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        pad_token="<pad>", chat_template=MISTRAL_CHAT_TEMPLATE)
    return PixtralProcessor(image_processor=PixtralImageProcessor(patch_size=16), tokenizer=tokenizer, patch_size=16,
                            chat_template=MISTRAL_CHAT_TEMPLATE)


def build_tiny_flux2(directory, seed: int = 0) -> str:
    """``Flux2Pipeline`` (FLUX.2-dev): FLUX.2's transformer with the guidance embedding over three
    stacked hidden layers (10, 20, 30) of a Mistral 3 vision-language model (so 31 tiny layers and a
    one-layer Pixtral vision tower), FLUX.2's VAE with 2 x 2 latent patches, no negative prompt."""
    # deferred: torch, diffusers, transformers
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    processor = build_tiny_mistral_processor()
    tok = processor.tokenizer
    with torch.random.fork_rng(devices=[]):
        transformer, vae = _flux2_networks(seed, guidance_embeds=True)
        torch.manual_seed(seed + 2)
        config = Mistral3Config(
            text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=16, intermediate_size=21,
                             num_hidden_layers=31, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                             max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
            vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                               num_attention_heads=2, head_dim=8, patch_size=16, image_size=64),
            image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1)
        pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
                             text_encoder=Mistral3ForConditionalGeneration(config), tokenizer=processor)
    return _save(pipe, directory, "flux2", seed)


def build_tiny_chatglm_tokenizer(directory):
    """Kolors's ``ChatGLMTokenizer`` over a tiny SentencePiece (Unigram) model trained here on a few
    sentences of the stand-ins' words (ChatGLM3's model ships with no package here)."""
    # deferred: sentencepiece, diffusers
    import io

    import sentencepiece
    from diffusers.pipelines.kolors import ChatGLMTokenizer

    words = ("a photo of the an person man woman who works as doctor nurse ceo pilot chef teacher lawyer "
             "farmer engineer scientist cat dog on in with and is at to").split()
    sentences = [" ".join(words[i:i + 6]) for i in range(len(words))] * 20
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=200, hard_vocab_limit=False,
        model_type="unigram", character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2,
        num_threads=1, seed_sentencepiece_size=1000, shuffle_input_sentence=False)
    path = Path(directory) / "chatglm-tokenizer.model"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.getvalue())
    return ChatGLMTokenizer(vocab_file=str(path))


def build_tiny_kolors(directory, seed: int = 0) -> str:
    """``KolorsPipeline``: an SDXL-style UNet whose cross-attention reads a ChatGLM3 encoder's
    second-to-last hidden states through a text projection (``encoder_hid_dim_type="text_proj"``)
    and whose added conditions are the encoder's last-layer state of the last token and the size ids;
    the SDXL-like VAE with the SD stand-ins' face decoder."""
    # deferred: torch, diffusers
    import tempfile

    import torch
    from diffusers import EulerDiscreteScheduler, KolorsPipeline, UNet2DConditionModel
    from diffusers.pipelines.kolors import ChatGLMModel
    from diffusers.pipelines.kolors.text_encoder import ChatGLMConfig

    # the tokenizer copies its model file when the pipeline is saved: keep it until then
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = build_tiny_chatglm_tokenizer(scratch)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            unet = UNet2DConditionModel(
                sample_size=8, block_out_channels=(32, 64), layers_per_block=1,
                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=TINY, encoder_hid_dim=TINY,
                encoder_hid_dim_type="text_proj", attention_head_dim=(2, 4), addition_embed_type="text_time",
                addition_time_embed_dim=8, projection_class_embeddings_input_dim=TINY + 6 * 8, use_linear_projection=True)
            config = ChatGLMConfig(num_layers=2, padded_vocab_size=len(tokenizer) + 4, hidden_size=TINY,
                                   ffn_hidden_size=37, kv_channels=16, num_attention_heads=2, seq_length=256,
                                   multi_query_attention=True, multi_query_group_num=1, add_qkv_bias=True,
                                   original_rope=True)
            encoder = ChatGLMModel(config, empty_init=False)
            # ChatGLM's _init_weights initialises nothing (its checkpoints always overwrite them), so
            # under transformers 5 the tensors hold whatever memory they got: set them here
            generator = torch.Generator().manual_seed(seed + 2)
            with torch.no_grad():
                for name, param in encoder.named_parameters():
                    if name.endswith("bias"):
                        param.zero_()
                    elif param.ndim == 1:
                        param.fill_(1.0)
                    else:
                        param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
            pipe = KolorsPipeline(vae=_vae(seed + 1), text_encoder=encoder, tokenizer=tokenizer, unet=unet,
                                  scheduler=EulerDiscreteScheduler())
        return _save(pipe, directory, "kolors", seed)


BUILDERS = {"sdxl": build_tiny_sdxl, "sd3": build_tiny_sd3, "flux": build_tiny_flux, "pixart": build_tiny_pixart,
            "chroma": build_tiny_chroma, "lumina2": build_tiny_lumina2, "sana": build_tiny_sana,
            "sana-sprint": lambda directory, seed=0: build_tiny_sana(directory, seed, sprint=True),
            "z-image": build_tiny_z_image, "flux2-klein": build_tiny_flux2_klein, "cogview4": build_tiny_cogview4,
            "hidream": build_tiny_hidream, "flux2": build_tiny_flux2, "qwen-image": build_tiny_qwen_image,
            "hunyuan-image": build_tiny_hunyuan_image, "kolors": build_tiny_kolors}
# each generator family (operators.support.families) and the tiny stand-in it runs as; a family
# not listed runs as the SD 1.x stand-in
STANDIN_OF_FAMILY = {"sdxl": "sdxl", "sd3": "sd3", "flux": "flux", "pixart-alpha": "pixart", "pixart-sigma": "pixart",
                     "chroma": "chroma", "lumina2": "lumina2", "sana": "sana", "sana-sprint": "sana-sprint",
                     "z-image": "z-image", "flux2-klein": "flux2-klein", "cogview4": "cogview4", "hidream": "hidream",
                     "flux2": "flux2", "qwen-image": "qwen-image", "hunyuan-image": "hunyuan-image", "kolors": "kolors"}


def standin_family(family: str | None) -> str:
    """The tiny stand-in family for a spec's family (SD 1.x for unknown ones)."""
    return STANDIN_OF_FAMILY.get(family or "", "sd")


def build_tiny_pipeline(family: str, directory, seed: int = 0, **options) -> str:
    """A tiny random pipeline of ``family`` (``FAMILIES``, or ``sd`` for SD 1.x) in ``directory``;
    ``options``: the builder's own (``faces`` for sd, ``guidance_embeds`` for flux). Built once per
    process and options: later calls write the first build's files (``_BUILT``)."""
    if family != "sd" and family not in BUILDERS:
        raise ValueError(f"no tiny stand-in for the family {family!r} (have: sd, {', '.join(FAMILIES)})")
    try:
        key = (family, int(seed), tuple(sorted(options.items())))
        hash(key)
    except TypeError:   # an option that is no dictionary key: built every time
        key = None
    files = _BUILT.get(key) if key is not None else None
    if files is not None:
        root = Path(directory)
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        return str(directory) if family == "sd" else os.fspath(root)
    if family == "sd":
        path = build_tiny_stable_diffusion(directory, seed=seed, **options)
    else:
        path = BUILDERS[family](directory, seed=seed, **options)
    if key is not None:
        # the files as built, held in memory (all seventeen stand-ins: about 120 MB): the caller may
        # change its directory afterwards (a shared text encoder) or delete it
        _BUILT[key] = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*"))
                       if p.is_file()}
    return path


_BUILT: dict[tuple, dict[str, bytes]] = {}   # (family, seed, options) -> the files of its first build


def _save(pipe, directory, family: str, seed: int) -> str:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(out))
    (out / "STANDIN.txt").write_text(f"Tiny {family} stand-in ({type(pipe).__name__}): random weights (seed {seed}), "
                                     f"64x64 images; its outputs are meaningless.\n")
    return os.fspath(out)
