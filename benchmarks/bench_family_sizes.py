"""Today's model families at full size, on the meta device: parameters, memory and shapes.

No weights are allocated (``torch.device("meta")``), so the full-size networks of SDXL, SD 3 /
3.5 and FLUX.1 are built on any machine in seconds. For each model it prints the parameter count of
each component, the memory its weights take in the dtype its family runs in on a GPU
(``operators.support.families``: bfloat16 for FLUX and SD 3.5, float16 otherwise), that times the
loader's headroom (``operators.support.diffusion.MEMORY_HEADROOM``, what ``check_fits`` asks of a
card), the smallest common card that holds it, and the shape the denoiser returns for one 1024 px
image (a forward pass on meta tensors: shapes only, no arithmetic), and what the VAE decodes it to: the
image every study's heads receive (the heads at that size: ``bench_fullsize_smoke.py --size 1024``).

Configurations: FLUX.1's transformer is the diffusers class's defaults (its checkpoint's config);
the SD 3 / 3.5 transformers, SDXL's UNet, T5-XXL's encoder and the CLIP text towers are written out
below from their published config.json files. The parameter counts it prints match the published
sizes (FLUX.1 12B, SD 3.5 large 8.1B, SD 3 medium 2B, SDXL's UNet 2.6B, T5-XXL's encoder 4.8B).

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


def clip_text(big: bool, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # deferred: transformers

    cfg = (CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                          projection_dim=1280, hidden_act="gelu") if big else
           CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                          projection_dim=768, hidden_act="quick_gelu"))
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def vae(latent_channels: int):
    from diffusers import AutoencoderKL  # deferred: diffusers

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(128, 256, 512, 512), layers_per_block=2)


def sdxl_unet():
    from diffusers import UNet2DConditionModel  # deferred: diffusers

    return UNet2DConditionModel(
        sample_size=128, block_out_channels=(320, 640, 1280), layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)


def models():
    import torch  # deferred: torch
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel  # deferred: diffusers

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
    }


def main() -> None:
    import torch  # deferred: torch

    from operators.support.diffusion import MEMORY_HEADROOM
    from operators.support.families import defaults

    print(f"{'model':<48} {'component':<26} {'params':>8}")
    for model, (family, parts, denoiser, forward) in models().items():
        t0 = time.time()
        total, built = 0, {}
        with torch.device("meta"):
            for name, make in parts.items():
                built[name] = make()
                n = sum(p.numel() for p in built[name].parameters())
                total += n
                print(f"{model:<48} {name:<26} {n / 1e9:>7.2f}B")
            out = forward(built[denoiser])
            # the latents the VAE decodes (FLUX's packed 2 x 2 patches unpacked) and the image every
            # study's heads receive
            latents = out.reshape(1, 64, 64, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, 128, 128) \
                if out.ndim == 3 else out
            image = built["vae"].decode(latents, return_dict=False)[0]
        dtype = defaults(model)["cuda_dtype"]
        size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
        need = total * size * MEMORY_HEADROOM / 2**30
        card = next((label for gb, label in CARDS_GB if gb >= need), "more than 80 GB: several GPUs or offload")
        print(f"{model:<48} {'total':<26} {total / 1e9:>7.2f}B  {dtype}: weights {total * size / 2**30:.1f} GiB, "
              f"x{MEMORY_HEADROOM} = {need:.1f} GiB -> {card}; {denoiser} output {tuple(out.shape)} for 1024 px, "
              f"VAE decode {tuple(latents.shape)} -> image {tuple(image.shape)} ({time.time() - t0:.1f} s on meta)")


if __name__ == "__main__":
    main()
