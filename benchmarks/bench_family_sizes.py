"""Today's model families at full size, on the meta device: parameters, memory and shapes.

No weights are allocated (``torch.device("meta")``), so the full-size networks of SDXL, SD 3 /
3.5 and FLUX.1, and of the 2025-2026 families (FLUX.2 dev and klein, Qwen-Image, HiDream-I1, SANA,
Lumina-Image 2.0, Kolors, Chroma, CogView4, HunyuanImage 2.1, Z-Image), are built on any machine in
seconds. For each model it prints the parameter count of each component, the memory its weights take
in the dtype its family runs in on a GPU (``operators.support.families``: bfloat16 for FLUX and
SD 3.5 and the 2025-2026 families but Kolors, float16 otherwise), that times the loader's headroom
(``operators.support.diffusion.MEMORY_HEADROOM``, what ``check_fits`` asks of a card), the smallest
common card that holds it, the same for its largest single component (what diffusers'
``enable_model_cpu_offload`` keeps on the GPU at a time), and the shape the denoiser returns for one
1024 px image (a forward pass on meta tensors: shapes only, no arithmetic), and what the VAE decodes
it to: the image every study's heads receive (the heads at that size: ``bench_fullsize_smoke.py
--size 1024``). HiDream-I1, Lumina-Image 2.0 and HunyuanImage 2.1 get no forward pass: their
denoisers index tokens by data-dependent masks (expert routing, caption lengths), which meta tensors
cannot do (``forward`` is None for them).

Configurations: FLUX.1's transformer is the diffusers class's defaults (its checkpoint's config);
the SD 3 / 3.5 transformers, SDXL's UNet, T5-XXL's encoder and the CLIP text towers are written out
below from their published config.json files. The parameter counts it prints match the published
sizes (FLUX.1 12B, SD 3.5 large 8.1B, SD 3 medium 2B, SDXL's UNet 2.6B, T5-XXL's encoder 4.8B).
For the 2025-2026 families each builder says which values are the installed diffusers class's
defaults (checked offline with ``inspect.signature``) and which are the published config.json
values as recalled (the hub cannot be reached from here, so those are not confirmed offline; where
a public copy of the config exists, e.g. in diffusers' conversion scripts, the comment names it).
Their counts match the published sizes: FLUX.2-dev's transformer 32.2B and Mistral Small 3.1 24.0B,
FLUX.2 klein 9B's transformer 9.1B, Qwen-Image's 20.4B, HiDream-I1's 17.1B, SANA 1.6B, Lumina 2
2.6B, Chroma 8.9B, CogView4's 6.4B (published as "6B"), HunyuanImage 2.1's 17.4B ("17B"), Z-Image
6.2B ("6B").

  python benchmarks/bench_family_sizes.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CARDS_GB = ((24, "24 GB (A10G, L4)"), (48, "48 GB (L40S, A6000)"), (80, "80 GB (A100, H100)"))


def t5_xxl():
    from transformers import T5Config, T5EncoderModel  # deferred: transformers

    return T5EncoderModel(T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                                   feed_forward_proj="gated-gelu"))


def clip_text(big: bool, projection: bool, positions: int = 77):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # deferred: transformers

    cfg = (CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                          projection_dim=1280, hidden_act="gelu", max_position_embeddings=positions) if big else
           CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                          projection_dim=768, hidden_act="quick_gelu", max_position_embeddings=positions))
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def vae(latent_channels: int):
    from diffusers import AutoencoderKL  # deferred: diffusers

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(128, 256, 512, 512), layers_per_block=2)


def sdxl_unet(**published):
    from diffusers import UNet2DConditionModel  # deferred: diffusers

    return UNet2DConditionModel(**{
        "sample_size": 128, "block_out_channels": (320, 640, 1280), "layers_per_block": 2,
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        "transformer_layers_per_block": (1, 2, 10), "attention_head_dim": (5, 10, 20), "cross_attention_dim": 2048,
        "use_linear_projection": True, "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816, **published})


# ---- the 2025-2026 families' text encoders: transformers classes with their published configs written
# out (recalled; the hub cannot be reached from here). Values a transformers config does not need for
# the parameter count (rope, token ids, dropout) are left at the class's defaults.

def mistral_small_31():
    """FLUX.2-dev's text encoder: Mistral Small 3.1 24B (Mistral3ForConditionalGeneration, Pixtral vision
    tower and projector included, lm_head untied). Recalled published config; the same values are in a
    public copy of FLUX.2-dev's text_encoder/config.json (kohya-ss/sd-scripts' FLUX.2 loader). The top-level
    tie_word_embeddings=False is needed: transformers 5 would otherwise tie lm_head to the embedding (23.3B)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration  # deferred: transformers

    return Mistral3ForConditionalGeneration(Mistral3Config(
        text_config={"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768,
                     "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "vocab_size": 131072, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                     "tie_word_embeddings": False},
        vision_config={"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096,
                       "num_hidden_layers": 24, "num_attention_heads": 16, "head_dim": 64, "image_size": 1540,
                       "patch_size": 14, "num_channels": 3},
        image_token_index=10, multimodal_projector_bias=False, projector_hidden_act="gelu", spatial_merge_size=2,
        vision_feature_layer=-1, tie_word_embeddings=False))


def qwen3(size: str):
    """Qwen3 4B (Z-Image, FLUX.2 klein 4B; embeddings tied) or 8B (FLUX.2 klein 9B; untied lm_head) as Qwen3ForCausalLM, the
    class Flux2KleinPipeline names. Recalled published configs (Qwen/Qwen3-4B, Qwen/Qwen3-8B config.json)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM  # deferred: transformers

    hidden, intermediate, tied = {"4B": (2560, 9728, True), "8B": (4096, 12288, False)}[size]
    return Qwen3ForCausalLM(Qwen3Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=36,
                                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                        tie_word_embeddings=tied))


def qwen25_vl_7b():
    """Qwen-Image's and HunyuanImage 2.1's text encoder: Qwen2.5-VL-7B-Instruct with its vision tower
    (Qwen2_5_VLForConditionalGeneration, lm_head untied). Recalled published config; the same values are in a
    public copy (kohya-ss/sd-scripts' HunyuanImage text-encoder loader)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # deferred: transformers

    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config={"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                     "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                     "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
        vision_config={"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                       "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "in_channels": 3,
                       "hidden_act": "silu"},
        vocab_size=152064, tie_word_embeddings=False))


def llama31_8b():
    """HiDream-I1's text_encoder_4: Llama-3.1-8B-Instruct (LlamaForCausalLM, lm_head untied). Recalled
    published config."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: transformers

    return LlamaForCausalLM(LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False))


def gemma2_2b():
    """SANA's and Lumina-Image 2.0's text encoder: Gemma 2 2B (Gemma2Model; the causal-LM head would be tied to
    the embedding, so the count is the same either way). Recalled published config (google/gemma-2-2b-it)."""
    from transformers import Gemma2Config, Gemma2Model  # deferred: transformers

    return Gemma2Model(Gemma2Config(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                    num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000))


def glm4_9b():
    """CogView4's text encoder: GLM-4-9B as GlmModel (no lm_head), the class CogView4Pipeline names. Recalled
    published config (THUDM/glm-4-9b-hf); the same values, architectures GlmModel, are in a public copy of
    CogView4-6B's text_encoder/config.json."""
    from transformers import GlmConfig, GlmModel  # deferred: transformers

    return GlmModel(GlmConfig(hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
                              num_key_value_heads=2, head_dim=128, vocab_size=151552, attention_bias=True,
                              partial_rotary_factor=0.5, rms_norm_eps=1.5625e-07, max_position_embeddings=8192,
                              tie_word_embeddings=False))


def chatglm3_6b():
    """Kolors' text encoder: ChatGLM3-6B (diffusers' own ChatGLMModel, output layer included). The class's
    defaults give the layer sizes (28 layers, 4096 hidden, 13696 FFN, 65024 vocabulary) but not ChatGLM3's
    grouped-query attention: add_qkv_bias, multi_query_attention and multi_query_group_num=2 are the published
    config as recalled (THUDM/chatglm3-6b; a public copy has the same). original_rope is not a ChatGLMConfig
    argument but the model reads it. Its layers are built through torch's skip_init, which puts them on
    the ``device`` it is given (else the CPU, uninitialised): the default device (meta, or the GPU the
    benchmark builds on) is passed."""
    import torch  # deferred: torch
    from diffusers.pipelines.kolors.text_encoder import ChatGLMConfig, ChatGLMModel  # deferred: diffusers

    return ChatGLMModel(device=torch.get_default_device(), config=ChatGLMConfig(num_layers=28, padded_vocab_size=65024, hidden_size=4096, ffn_hidden_size=13696,
                                      kv_channels=128, num_attention_heads=32, seq_length=32768, add_qkv_bias=True,
                                      multi_query_attention=True, multi_query_group_num=2, add_bias_linear=False,
                                      rmsnorm=True, post_layer_norm=True, original_rope=True))


def byt5_glyph():
    """HunyuanImage 2.1's text_encoder_2: the Glyph-SDXL-v2 ByT5 encoder (T5EncoderModel), google/byt5-small's
    encoder (recalled: d_model 1472, d_ff 3584, 12 layers, 6 heads, gated-gelu) with its embedding grown from
    ByT5's 384 tokens to 1510 by the glyph color and font tokens (138 colors + 988 fonts, counted from the lists
    in kohya-ss/sd-scripts' public HunyuanImage loader; 1510 also as recalled of the published config)."""
    from transformers import T5Config, T5EncoderModel  # deferred: transformers

    return T5EncoderModel(T5Config(vocab_size=1510, d_model=1472, d_kv=64, d_ff=3584, num_layers=12,
                                   num_decoder_layers=4, num_heads=6, feed_forward_proj="gated-gelu",
                                   tie_word_embeddings=False))


# ---- the 2025-2026 families' denoisers and VAEs

def flux2_transformer(klein: str | None = None):
    """FLUX.2-dev: Flux2Transformer2DModel's defaults are its published config (8 double and 48 single blocks,
    48 heads x 128, joint_attention_dim 15360 = 3 x Mistral's 5120 (Flux2Pipeline stacks layers 10, 20, 30),
    guidance embedding on), confirmed offline against the class and diffusers' convert_flux2_to_diffusers.py.
    FLUX.2 klein 9B: published config as recalled, not confirmable offline (its repository is gated): 8 double and
    24 single blocks, 32 heads x 128, joint_attention_dim 12288 = 3 x Qwen3-8B's 4096 (Flux2KleinPipeline stacks
    layers 9, 18, 27: confirmed offline), no guidance embedding (the klein pipeline passes guidance=None:
    confirmed offline); the same values are in several public FLUX.2 klein loaders (DiffSynth-Studio, mflux).
    FLUX.2 klein 4B: 5 double and 20 single blocks, 24 heads x 128, joint_attention_dim 7680 = 3 x Qwen3-4B's
    2560, no guidance embedding, the class's other defaults: the transformer config.json of a public copy of the
    diffusers-format klein-base-4B repository (the official one is gated)."""
    from diffusers import Flux2Transformer2DModel  # deferred: diffusers

    if klein == "9B":
        return Flux2Transformer2DModel(num_layers=8, num_single_layers=24, num_attention_heads=32,
                                       joint_attention_dim=12288, guidance_embeds=False)
    if klein == "4B":
        return Flux2Transformer2DModel(num_layers=5, num_single_layers=20, num_attention_heads=24,
                                       joint_attention_dim=7680, guidance_embeds=False)
    return Flux2Transformer2DModel()


def hidream_transformer():
    """HiDream-I1-Full: published config as recalled (the same values are in a public copy of diffusers'
    HiDream conversion script). Differs from the class's defaults in patch_size 2 (default None), in/out
    channels 16 (default 64), caption_channels [4096 (T5), 4096 (Llama)] (default None), llama_layers (default
    None; 32 layers then layer 31 again, one per block: only the forward reads it) and axes_dims_rope (no
    parameters). Defaults that are the published values: 16 double and 32 single blocks, 20 heads x 128,
    text_emb_dim 2048 (CLIP-L 768 + CLIP-G 1280 pooled), 4 routed experts, 2 active, max_resolution 128 x 128."""
    from diffusers import HiDreamImageTransformer2DModel  # deferred: diffusers

    return HiDreamImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=16,
                                          caption_channels=[4096, 4096], llama_layers=list(range(32)) + [31] * 16,
                                          axes_dims_rope=(64, 32, 32))


def sana_dcae():
    """SANA's VAE, DC-AE f32c32 (AutoencoderDC): the class's defaults are the f32c32-in/mix layout (ResBlocks
    in every stage, pixel (un)shuffle); SANA's (mit-han-lab/dc-ae-f32c32-sana-1.0) differs in EfficientViT blocks
    in the last three stages, conv downsampling and interpolating upsampling: recalled, and the same in diffusers'
    convert_dcae_to_diffusers.py. Channels (128 ... 1024), layers per block (2,2,2,3,3,3 / 3 x 6), 32 latent
    channels, RMS norm and SiLU in the decoder are the class's defaults."""
    from diffusers import AutoencoderDC  # deferred: diffusers

    return AutoencoderDC(encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
                         decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
                         downsample_block_type="Conv", upsample_block_type="interpolate", scaling_factor=0.41407)


def cogview4_vae():
    """CogView4's VAE (AutoencoderKL, 16 latent channels): (128, 512, 1024, 1024) channels, 3 layers per block,
    no quant convs and no mid-block attention, as recalled and as in diffusers' convert_cogview4_to_diffusers.py."""
    from diffusers import AutoencoderKL  # deferred: diffusers

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(128, 512, 1024, 1024),
                         layers_per_block=3, use_quant_conv=False, use_post_quant_conv=False,
                         mid_block_add_attention=False, scaling_factor=1.0, shift_factor=0.0)


def hunyuan_image_vae():
    """HunyuanImage 2.1's VAE (AutoencoderKLHunyuanImage has no defaults): 64 latent channels at 32 x
    compression, as recalled and as in diffusers' convert_hunyuan_image_to_diffusers.py."""
    from diffusers import AutoencoderKLHunyuanImage  # deferred: diffusers

    return AutoencoderKLHunyuanImage(in_channels=3, out_channels=3, latent_channels=64,
                                     block_out_channels=(128, 256, 512, 512, 1024, 1024), layers_per_block=2,
                                     spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289)


# ---- the latents a denoiser's output becomes before the VAE (the pipelines' own unpacking)

def unpack_2x2(out, channels: int, side: int = 64):
    """FLUX.1's, Chroma's and Qwen-Image's packed 2 x 2 patches (1, side^2, 4 x channels) back to latents."""
    return out.reshape(1, side, side, channels, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, channels, 2 * side, 2 * side)


def flux2_latents(out):
    """Flux2 pipelines: the 128-channel tokens of a 64 x 64 grid unpacked, then unpatchified (2 x 2) to the
    VAE's 32 channels."""
    grid = out.reshape(1, 64, 64, 128).permute(0, 3, 1, 2)
    return grid.reshape(1, 32, 2, 2, 64, 64).permute(0, 1, 4, 2, 5, 3).reshape(1, 32, 128, 128)


# Why a model has no forward pass on meta tensors (its forward is None)
NO_META_FORWARD = {
    "HiDream-ai/HiDream-I1-Full": "its MoE routes tokens to experts by data-dependent masks",
    "Alpha-VLLM/Lumina-Image-2.0": "it reads the caption lengths out of the attention mask",
    "hunyuanvideo-community/HunyuanImage-2.1-Diffusers": "it selects the valid text tokens by their masks",
}


def models():
    import torch  # deferred: torch
    from diffusers import (AutoencoderKLFlux2, AutoencoderKLQwenImage, ChromaTransformer2DModel,  # deferred: diffusers
                           CogView4Transformer2DModel, FluxTransformer2DModel, HunyuanImageTransformer2DModel,
                           Lumina2Transformer2DModel, QwenImageTransformer2DModel, SanaTransformer2DModel,
                           SD3Transformer2DModel, ZImageTransformer2DModel)

    def flux_forward(m):
        return m(hidden_states=torch.randn(1, 4096, 64), encoder_hidden_states=torch.randn(1, 512, 4096),
                 pooled_projections=torch.randn(1, 768), timestep=torch.tensor([1.0]), img_ids=torch.zeros(4096, 3),
                 txt_ids=torch.zeros(512, 3), guidance=torch.tensor([3.5]), return_dict=False)[0]

    def sd3_forward(m):
        return m(hidden_states=torch.randn(1, 16, 128, 128), encoder_hidden_states=torch.randn(1, 333, 4096),
                 pooled_projections=torch.randn(1, 2048), timestep=torch.tensor([1.0]), return_dict=False)[0]

    def sdxl_forward(m):
        return m(torch.randn(1, 4, 128, 128), torch.tensor([1.0]), encoder_hidden_states=torch.randn(1, 77, 2048),
                 added_cond_kwargs={"text_embeds": torch.randn(1, 1280), "time_ids": torch.randn(1, 6)},
                 return_dict=False)[0]

    # the 2025-2026 families, each at 1024 px with its pipeline's text length
    def flux2_forward(text_dim, guidance):
        def forward(m):   # 32 latent channels, 2 x 2-patchified: 4096 tokens of 128; 4-axis position ids
            return m(hidden_states=torch.randn(1, 4096, 128), encoder_hidden_states=torch.randn(1, 512, text_dim),
                     timestep=torch.tensor([1.0]), img_ids=torch.zeros(1, 4096, 4), txt_ids=torch.zeros(1, 512, 4),
                     guidance=None if guidance is None else torch.tensor([guidance]), return_dict=False)[0]
        return forward

    def qwen_image_forward(m):
        return m(hidden_states=torch.randn(1, 4096, 64), encoder_hidden_states=torch.randn(1, 512, 3584),
                 encoder_hidden_states_mask=torch.ones(1, 512), timestep=torch.tensor([1.0]),
                 img_shapes=[[(1, 64, 64)]], return_dict=False)[0]

    def sana_forward(m):   # DC-AE: 32 channels at 1/32
        return m(hidden_states=torch.randn(1, 32, 32, 32), encoder_hidden_states=torch.randn(1, 300, 2304),
                 timestep=torch.tensor([1.0]), return_dict=False)[0]

    def kolors_forward(m):   # ChatGLM3's 4096-wide states, projected to 2048 by the UNet's encoder_hid_proj
        return m(torch.randn(1, 4, 128, 128), torch.tensor([1.0]), encoder_hidden_states=torch.randn(1, 256, 4096),
                 added_cond_kwargs={"text_embeds": torch.randn(1, 4096), "time_ids": torch.randn(1, 6)},
                 return_dict=False)[0]

    def chroma_forward(m):
        return m(hidden_states=torch.randn(1, 4096, 64), encoder_hidden_states=torch.randn(1, 512, 4096),
                 timestep=torch.tensor([1.0]), img_ids=torch.zeros(4096, 3), txt_ids=torch.zeros(512, 3),
                 return_dict=False)[0]

    def cogview4_forward(m):
        size = torch.tensor([[1024.0, 1024.0]])
        return m(hidden_states=torch.randn(1, 16, 128, 128), encoder_hidden_states=torch.randn(1, 224, 4096),
                 timestep=torch.tensor([1.0]), original_size=size, target_size=size,
                 crop_coords=torch.tensor([[0.0, 0.0]]), return_dict=False)[0]

    def z_image_forward(m):   # a list of (channels, frames, h, w) latents in, a list out: stacked as the pipeline does
        out = m([torch.randn(16, 1, 128, 128)], torch.tensor([1.0]), [torch.randn(512, 2560)], return_dict=False)[0]
        return torch.stack(out).squeeze(2)

    return {
        "black-forest-labs/FLUX.1-dev": ("flux", {
            "transformer": lambda: FluxTransformer2DModel(guidance_embeds=True), "text_encoder (CLIP-L)":
            lambda: clip_text(False, False), "text_encoder_2 (T5-XXL)": t5_xxl, "vae": lambda: vae(16)},
            "transformer", flux_forward),
        "stabilityai/stable-diffusion-3.5-large": ("sd3", {
            "transformer": lambda: SD3Transformer2DModel(num_layers=38, num_attention_heads=38, attention_head_dim=64,
                                                         caption_projection_dim=2432, pos_embed_max_size=192,
                                                         qk_norm="rms_norm"),
            "text_encoder (CLIP-L)": lambda: clip_text(False, True), "text_encoder_2 (CLIP-G)": lambda: clip_text(True, True),
            "text_encoder_3 (T5-XXL)": t5_xxl, "vae": lambda: vae(16)}, "transformer", sd3_forward),
        "stabilityai/stable-diffusion-3-medium-diffusers": ("sd3", {
            "transformer": lambda: SD3Transformer2DModel(num_layers=24, num_attention_heads=24, attention_head_dim=64,
                                                         caption_projection_dim=1536, pos_embed_max_size=192),
            "text_encoder (CLIP-L)": lambda: clip_text(False, True),
            "text_encoder_2 (CLIP-G)": lambda: clip_text(True, True), "text_encoder_3 (T5-XXL)": t5_xxl,
            "vae": lambda: vae(16)}, "transformer", sd3_forward),
        "stabilityai/stable-diffusion-xl-base-1.0": ("sdxl", {
            "unet": sdxl_unet, "text_encoder (CLIP-L)": lambda: clip_text(False, False),
            "text_encoder_2 (CLIP-G)": lambda: clip_text(True, True), "vae": lambda: vae(4)}, "unet", sdxl_forward),
        # ---- 2025-2026. A fifth element turns the denoiser's output into the VAE's latents (default: FLUX.1's
        # unpacking of 3-D outputs, others as they are). VAE: AutoencoderKLFlux2's defaults are its published
        # config (FLUX.1's layout with 32 latent channels and a batch-norm of the patchified latents).
        "black-forest-labs/FLUX.2-dev": ("flux2", {
            "transformer": flux2_transformer, "text_encoder (Mistral 3.1)": mistral_small_31,
            "vae": AutoencoderKLFlux2}, "transformer", flux2_forward(15360, 4.0), flux2_latents),
        "black-forest-labs/FLUX.2-klein-base-9B": ("flux2-klein", {
            "transformer": lambda: flux2_transformer(klein="9B"), "text_encoder (Qwen3 8B)": lambda: qwen3("8B"),
            "vae": AutoencoderKLFlux2}, "transformer", flux2_forward(12288, None), flux2_latents),
        "black-forest-labs/FLUX.2-klein-base-4B": ("flux2-klein", {
            "transformer": lambda: flux2_transformer(klein="4B"), "text_encoder (Qwen3 4B)": lambda: qwen3("4B"),
            "vae": AutoencoderKLFlux2}, "transformer", flux2_forward(7680, None), flux2_latents),
        # Qwen-Image: QwenImageTransformer2DModel's defaults are its published config (60 layers, 24 heads x 128,
        # joint_attention_dim 3584 = Qwen2.5-VL's hidden size, 16 channels packed 2 x 2), and
        # AutoencoderKLQwenImage's are its VAE's (base_dim 96, z_dim 16): confirmed offline against the classes
        # (the classes' defaults are the published values as recalled). Its VAE is a video VAE: 5-D latents.
        "Qwen/Qwen-Image": ("qwen-image", {
            "transformer": QwenImageTransformer2DModel, "text_encoder (Qwen2.5-VL)": qwen25_vl_7b,
            "vae": AutoencoderKLQwenImage}, "transformer", qwen_image_forward,
            lambda out: unpack_2x2(out, 16).unsqueeze(2)),
        # HiDream-I1: CLIP-L and CLIP-G with projections, stretched to 248 positions (Long-CLIP: the pipeline
        # tokenizes its CLIP prompts to 218 tokens, more than CLIP's 77, confirmed offline; 248 recalled), T5-XXL's
        # encoder, Llama 3.1 8B, FLUX.1's VAE.
        "HiDream-ai/HiDream-I1-Full": ("hidream", {
            "transformer": hidream_transformer, "text_encoder (CLIP-L)": lambda: clip_text(False, True, 248),
            "text_encoder_2 (CLIP-G)": lambda: clip_text(True, True, 248), "text_encoder_3 (T5-XXL)": t5_xxl,
            "text_encoder_4 (Llama 3.1)": llama31_8b, "vae": lambda: vae(16)}, "transformer", None),
        # SANA 1600M 1024 px: SanaTransformer2DModel's defaults are its published config (20 layers, 70 heads x 32
        # = 2240, cross-attention 20 x 112, caption_channels 2304 = Gemma 2's hidden size, sample_size 32):
        # confirmed offline against the class (published values as recalled).
        "Efficient-Large-Model/Sana_1600M_1024px_diffusers": ("sana", {
            "transformer": SanaTransformer2DModel, "text_encoder (Gemma 2)": gemma2_2b, "vae": sana_dcae},
            "transformer", sana_forward),
        # Lumina-Image 2.0: Lumina2Transformer2DModel's defaults are its published config (hidden 2304, 26 layers,
        # 2 refiner layers, 24 heads, 8 kv heads) but for cap_feat_dim: 2304 (Gemma 2's hidden size; the default is
        # 1024), as recalled and as in a public copy of a Lumina 2 fine-tune's config. FLUX.1's VAE.
        "Alpha-VLLM/Lumina-Image-2.0": ("lumina2", {
            "transformer": lambda: Lumina2Transformer2DModel(cap_feat_dim=2304), "text_encoder (Gemma 2)": gemma2_2b,
            "vae": lambda: vae(16)}, "transformer", None),
        # Kolors: SDXL's UNet with ChatGLM3's 4096-wide states projected to the 2048-wide cross-attention by an
        # encoder_hid_proj (encoder_hid_dim 4096, text_proj) and a 5632-wide added embedding (4096 pooled + 6 x 256
        # time ids): published config as recalled and as in a public copy of Kolors' unet/config.json; the rest
        # is SDXL's. SDXL's VAE.
        "Kwai-Kolors/Kolors-diffusers": ("kolors", {
            "unet": lambda: sdxl_unet(projection_class_embeddings_input_dim=5632, encoder_hid_dim=4096,
                                      encoder_hid_dim_type="text_proj"),
            "text_encoder (ChatGLM3)": chatglm3_6b, "vae": lambda: vae(4)}, "unet", kolors_forward),
        # Chroma: ChromaTransformer2DModel's defaults are its published config (FLUX.1-schnell's 19 + 38 blocks
        # without the modulation layers, a 5-layer 5120-wide distilled guidance approximator): confirmed offline
        # against the class (published values as recalled). T5-XXL's encoder, FLUX.1's VAE.
        "lodestones/Chroma": ("chroma", {
            "transformer": ChromaTransformer2DModel, "text_encoder (T5-XXL)": t5_xxl, "vae": lambda: vae(16)},
            "transformer", chroma_forward),
        # CogView4-6B: the class's defaults are CogView3-Plus-sized (30 layers, 64 heads x 40); CogView4's published
        # config, as recalled and as in diffusers' convert_cogview4_to_diffusers.py: 28 layers, 32 heads x 128
        # (text_embed_dim 4096, time_embed_dim 512, condition_dim 256: the defaults).
        "THUDM/CogView4-6B": ("cogview4", {
            "transformer": lambda: CogView4Transformer2DModel(num_layers=28, attention_head_dim=128,
                                                              num_attention_heads=32),
            "text_encoder (GLM-4)": glm4_9b, "vae": cogview4_vae}, "transformer", cogview4_forward),
        # HunyuanImage 2.1: HunyuanImageTransformer2DModel's defaults are its published config (20 double and 40
        # single blocks, 28 heads x 128, text_embed_dim 3584) but for text_embed_2_dim: 1472 (the ByT5 glyph
        # encoder's width; default None), as recalled and as in diffusers' convert_hunyuan_image_to_diffusers.py.
        "hunyuanvideo-community/HunyuanImage-2.1-Diffusers": ("hunyuan-image", {
            "transformer": lambda: HunyuanImageTransformer2DModel(text_embed_2_dim=1472),
            "text_encoder (Qwen2.5-VL)": qwen25_vl_7b, "text_encoder_2 (ByT5)": byt5_glyph,
            "vae": hunyuan_image_vae}, "transformer", None),
        # Z-Image-Turbo: ZImageTransformer2DModel's defaults are its published config (dim 3840, 30 layers, 2
        # refiner layers, 30 heads, cap_feat_dim 2560 = Qwen3-4B's hidden size): confirmed offline against the
        # class (published values as recalled). FLUX.1's VAE.
        "Tongyi-MAI/Z-Image-Turbo": ("z-image", {
            "transformer": ZImageTransformer2DModel, "text_encoder (Qwen3 4B)": lambda: qwen3("4B"),
            "vae": lambda: vae(16)}, "transformer", z_image_forward),
    }


def main() -> None:
    import torch  # deferred: torch

    from operators.support.diffusion import MEMORY_HEADROOM
    from operators.support.families import defaults

    def weights(params: int, size: int) -> tuple[float, float, str]:
        """GiB of the weights, that times the headroom, and the smallest common card that holds it."""
        need = params * size * MEMORY_HEADROOM / 2**30
        card = next((label for gb, label in CARDS_GB if gb >= need), "more than 80 GB: several GPUs or offload")
        return params * size / 2**30, need, card

    print(f"{'model':<48} {'component':<26} {'params':>8}")
    for model, (family, parts, denoiser, forward, *unpack) in models().items():
        t0 = time.time()
        total, built, counts = 0, {}, {}
        with torch.device("meta"):
            for name, make in parts.items():
                built[name] = make()
                n = counts[name] = sum(p.numel() for p in built[name].parameters())
                total += n
                print(f"{model:<48} {name:<26} {n / 1e9:>7.2f}B")
            if forward is not None:
                out = forward(built[denoiser])
                # the latents the VAE decodes (FLUX's packed 2 x 2 patches unpacked) and the image every
                # study's heads receive
                latents = unpack[0](out) if unpack else (
                    out.reshape(1, 64, 64, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, 128, 128)
                    if out.ndim == 3 else out)
                image = built["vae"].decode(latents, return_dict=False)[0]
        dtype = defaults(model)["cuda_dtype"]
        size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        gib, need, card = weights(total, size)
        shapes = (f"{denoiser} output {tuple(out.shape)} for 1024 px, VAE decode {tuple(latents.shape)} -> image "
                  f"{tuple(image.shape)}" if forward is not None else
                  f"no {denoiser} forward on meta tensors ({NO_META_FORWARD.get(model, 'not run')})")
        print(f"{model:<48} {'total':<26} {total / 1e9:>7.2f}B  {dtype}: weights {gib:.1f} GiB, "
              f"x{MEMORY_HEADROOM} = {need:.1f} GiB -> {card}; {shapes} ({time.time() - t0:.1f} s on meta)")
        largest = max(counts, key=counts.get)
        gib, need, card = weights(counts[largest], size)
        print(f"{model:<48} {'largest (CPU offload)':<26} {counts[largest] / 1e9:>7.2f}B  {largest}: {dtype} "
              f"{gib:.1f} GiB, x{MEMORY_HEADROOM} = {need:.1f} GiB -> {card} (what enable_model_cpu_offload keeps "
              f"on the GPU at a time)")


if __name__ == "__main__":
    main()
