"""The word-heat-map recorder of a text-to-image pipeline: UNet cross-attention
(``operators.support.cross_attention``) or MMDiT joint attention
(``operators.support.joint_attention``), with the tokenizer of the recorded tokens.
"""

from __future__ import annotations

from operators.support.cross_attention import CrossAttentionCapture
from operators.support.joint_attention import JointAttentionCapture, class_names
from operators.support.kernel_attention import FAMILIES as KERNEL_FAMILIES, KernelAttentionCapture
from operators.support.kolors_attention import KolorsAttentionCapture

_SD3 = "SD3Transformer2DModel"
_FLUX = "FluxTransformer2DModel"


def capture_for(pipe, guidance: bool, layers: str = "daam", tokens: int | None = None):
    """The word-heat-map recorder of ``pipe``, with ``tokenizer`` (the tokenizer of the recorded
    tokens, for ``word_positions``) and ``prompt_tokens`` (how many prompt tokens its maps can
    hold; for a transformer known once it recorded) set on it:

    - a UNet pipeline (SD 1.x/2.x, SDXL): ``CrossAttentionCapture(pipe.unet, guidance, layers)``,
      ``pipe.tokenizer``; Kolors: ``KolorsAttentionCapture`` (the same, over the last positions of
      its left-padded ChatGLM3 tokens);
    - SD 3 / 3.5: ``JointAttentionCapture`` of the T5 positions after the CLIP ones
      (``text_offset`` = ``pipe.tokenizer_max_length``), ``pipe.tokenizer_3``; ``guidance``: the
      pipeline runs CFG (``guidance_scale > 1``), the batch is doubled;
    - FLUX.1: ``JointAttentionCapture`` of the T5 positions, ``pipe.tokenizer_2``; ``guidance`` is
      ignored: FLUX's guidance is distilled (an embedding input), its batch never doubled;
    - Chroma, FLUX.2 (dev, klein), Qwen-Image, HiDream-I1, HunyuanImage 2.1, CogView4, Lumina 2,
      Z-Image, SANA, PixArt: ``KernelAttentionCapture`` (read at the attention kernel; the text
      positions through the family's tokenizer and template).

    ``layers`` is the UNet's (``CrossAttentionCapture.LAYERS``); ``tokens``: keep only the first that
    many tokens (None: the UNet's 76 after BOS, a transformer's whole T5 segment). Any other
    pipeline is refused with a ValueError."""
    unet = getattr(pipe, "unet", None)
    if type(pipe).__name__ == "KolorsPipeline":           # a UNet over ChatGLM3's left-padded tokens
        return KolorsAttentionCapture(pipe, tokens=tokens, guidance=guidance, layers=layers)
    if unet is not None:
        cap = CrossAttentionCapture(unet, guidance=guidance, layers=layers,
                                    **({} if tokens is None else {"tokens": tokens}))
        cap.tokenizer = pipe.tokenizer
        cap.prompt_tokens = max(1, int(getattr(pipe.tokenizer, "model_max_length", 77)) - 2)
        return cap
    transformer = getattr(pipe, "transformer", None)
    names = class_names(transformer) if transformer is not None else set()
    kind = type(pipe).__name__
    if _SD3 in names:
        if getattr(pipe, "text_encoder_3", None) is None or getattr(pipe, "tokenizer_3", None) is None:
            raise ValueError(f"{kind} was loaded without its T5 encoder (text_encoder_3): its word heat maps are "
                             f"read on the T5 tokens; load it with T5, or run without objects (--no-objects)")
        cap = JointAttentionCapture(transformer, tokens=tokens, guidance=guidance,
                                    text_offset=int(getattr(pipe, "tokenizer_max_length", 77)))
        cap.tokenizer = pipe.tokenizer_3
        return cap
    if _FLUX in names:
        cap = JointAttentionCapture(transformer, tokens=tokens, guidance=False, text_offset=0)
        cap.tokenizer = pipe.tokenizer_2
        return cap
    if type(transformer).__name__ in KERNEL_FAMILIES:
        return KernelAttentionCapture(pipe, tokens=tokens, guidance=guidance)
    denoiser = type(transformer).__name__ if transformer is not None else "no UNet or transformer"
    raise ValueError(f"{kind} ({denoiser}): no word heat maps for this family (recorded: UNet cross-attention, "
                     f"SD 3 / FLUX.1 joint attention, and at the attention kernel the transformers of "
                     f"{', '.join(f.name for f in KERNEL_FAMILIES.values())}); run without objects (--no-objects)")
