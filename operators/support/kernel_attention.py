"""Word heat maps from the joint attention of the 2025-2026 transformer denoisers, read where each
block hands its final queries and keys to the attention kernel: DAAM's method (Tang et al. 2023) as
``joint_attention.py`` carries it to SD 3 and FLUX.1, for Chroma, FLUX.2 (dev and klein),
Qwen-Image, HunyuanImage 2.1, CogView4, Lumina-Image 2.0, Z-Image and HiDream-I1, and from the
cross-attention of SANA, SANA-Sprint and PixArt-α/Σ.

``joint_attention.py`` rebuilds a block's queries and keys from its projections, norms and rotary
embedding. The newer processors differ in each of these (a fused query/key/value/MLP projection in
FLUX.2's single-stream blocks, Qwen-Image's complex rotary pair applied to image and text apart, a
text mask built inside the processor), so here nothing is rebuilt: while a recorded attention
module runs, the kernel its processor calls, ``dispatch_attention_fn`` of the processor's own
module, is wrapped, and the recorder reads the query, key, mask and scale the block passes to it,
after every norm and rotation, exactly what the block's softmax sees. The kernel's output is the
original's: recording never changes the image (tested bit for bit). The processors, read in the
installed diffusers (0.42):

- Chroma (``ChromaTransformer2DModel``, ``transformer_chroma.py``): ``transformer_blocks.*.attn``
  and ``single_transformer_blocks.*.attn`` are ``FluxAttention`` with ``FluxAttnProcessor``
  (``transformer_flux.py``); the joint sequence is [text, image] in both (the single-stream blocks
  receive it concatenated). The pipeline passes a text mask that the transformer turns into a
  float (B, 1, S, S) outer product, which the kernel adds to the scores (an additive bias of 0 or
  1, not a boolean mask): the recorder adds it the same way. Classifier-free guidance is a second
  transformer call per step with the negative prompt and no ``cache_context``: with ``guidance``
  every second call is left out.
- FLUX.2 (``Flux2Transformer2DModel``, ``transformer_flux2.py``): ``transformer_blocks.*.attn``
  (``Flux2Attention``, ``Flux2AttnProcessor``) and ``single_transformer_blocks.*.attn``
  (``Flux2ParallelSelfAttention``, ``Flux2ParallelSelfAttnProcessor``: queries and keys from one
  fused projection); [text, image], no mask. FLUX.2-dev is guidance-distilled (one call); klein's
  CFG calls are wrapped in ``cache_context("cond")`` / ``("uncond")``, and "uncond" is left out.
- Qwen-Image (``QwenImageTransformer2DModel``, ``transformer_qwenimage.py``):
  ``transformer_blocks.*.attn`` (``Attention`` with ``QwenDoubleStreamAttnProcessor2_0``);
  [text, image] with a boolean (B, 1, 1, S) mask of the valid text positions, built inside the
  processor; true CFG's negative call is wrapped in ``cache_context("uncond")``, left out.

- HunyuanImage 2.1 (``HunyuanImageTransformer2DModel``, ``transformer_hunyuanimage.py``):
  ``transformer_blocks.*.attn`` and ``single_transformer_blocks.*.attn`` (``Attention`` with
  ``HunyuanImageAttnProcessor``); [image, text] with a boolean (B, 1, 1, S) mask; the text-only
  token refiner's attention is not recorded. The transformer puts the prompt's valid ByT5 glyph
  tokens (its quoted text, none without quotes) before the valid Qwen2.5-VL tokens; the pipeline
  reads the prompt in Qwen-Image's system template (without the assistant turn) and drops its first
  34 tokens. Its guider wraps the conditional and unconditional calls in
  ``cache_context("pred_cond")`` / ``("pred_uncond")``: "pred_uncond" is left out.

- CogView4 (``CogView4Transformer2DModel``, ``transformer_cogview4.py``): ``transformer_blocks.*.attn1``
  (``Attention`` with ``CogView4AttnProcessor``, which concatenates [text, image] and projects both
  with the same ``to_q``/``to_k``) calls ``F.scaled_dot_product_attention``: the processor module's
  ``F`` is replaced for the recording by one whose ``scaled_dot_product_attention`` is wrapped. The
  pipeline pads the GLM tokens on the left to a multiple of 16 (and the tokenizer pads the batch to
  its longest), so a prompt's positions are found in the ids the text encoder read in the recorded
  call (``rows``): its own tokens, read alone, at their last occurrence. CFG: ``cache_context``
  "cond" / "uncond".

- Lumina-Image 2.0 (``Lumina2Transformer2DModel``, ``transformer_lumina2.py``): ``layers.*.attn``
  (``Attention`` with ``Lumina2AttnProcessor2_0``, grouped keys repeated, its own scale) calls
  ``F.scaled_dot_product_attention`` (read as CogView4's); the text-only ``context_refiner`` and
  image-only ``noise_refiner`` are not recorded. Each sample's joint sequence is [its valid text,
  image, padding] (its text length is the call's ``encoder_attention_mask`` sum), with a boolean
  mask where the lengths differ. The pipeline reads the system prompt, " <Prompt Start> " and the
  prompt with Gemma's BOS. CFG is an untagged second call with the negative prompt's embeddings
  (and none once ``cfg_trunc_ratio`` ends it): recorded are the calls given the first call's text.

- Z-Image (``ZImageTransformer2DModel``, ``transformer_z_image.py``): ``layers.*.attention``
  (``Attention`` with ``ZSingleStreamAttnProcessor``, its rotary embedding passed as ``freqs_cis``)
  calls ``dispatch_attention_fn``; the refiners are not recorded. The transformer takes lists of
  per-sample latents and captions and lays each sequence out [image, caption], the image padded
  with learned tokens to a multiple of 32, where the caption's columns start. Its captions are the
  valid tokens of Qwen's chat template (thinking on). CFG is one doubled batch, the conditional
  half first: with ``guidance`` the first half of a doubled call is recorded.

- SANA, SANA-Sprint (``SanaTransformer2DModel``, ``sana_transformer.py``): cross-attention
  ``transformer_blocks.*.attn2`` (``Attention`` with ``SanaAttnProcessor2_0``, an additive mask of
  the text's padding) calls ``F.scaled_dot_product_attention``. The pipelines prepend their
  default instruction to the prompt as their ``_text_preprocessing`` gives it (lower-cased,
  stripped), and keep the encoder's first position and its last (text length - 1): the text is
  tokenized as the pipeline tokenizes it, then carried through that selection. SANA's CFG doubles the batch [unconditional, conditional]: a call with
  twice the encoder's rows keeps its second half. SANA-Sprint's guidance is embedded.

- PixArt-α/Σ (``PixArtTransformer2DModel``): cross-attention ``transformer_blocks.*.attn2``
  (``Attention`` with ``AttnProcessor2_0`` of ``attention_processor.py``, whose ``F`` is read, the
  other processors of that module passing through unrecorded) with an additive mask of T5's
  padding; T5 reads the prompt alone, as the pipeline's ``_text_preprocessing`` gives it at the
  call's default ``clean_caption``; CFG doubles the batch as SANA's.

- HiDream-I1 (``HiDreamImageTransformer2DModel``, ``transformer_hidream_image.py``):
  ``double_stream_blocks.*.block.attn1`` and ``single_stream_blocks.*.block.attn1``
  (``HiDreamAttention`` with ``HiDreamAttnProcessor``, queries and keys of [image, text]) call
  ``F.scaled_dot_product_attention`` without a mask. Each block's text is [T5 (``max_sequence_length``
  positions), the Llama stack's last state, the Llama layer of that block]; the T5 segment comes
  first and is the one recorded (T5 reads the prompt alone, as for SD 3; the Llama segments are
  the same prompt again, in another tokenizer, a different layer per block). CFG doubles the batch
  [unconditional, conditional]: with ``guidance`` its second half is recorded.

The image's query rows and the text's key columns of the joint sequence are found from the
transformer call: the image's length is its token grid, read off ``img_ids`` (Chroma, FLUX.2: rows
and columns in its columns 1 and 2), ``img_shapes`` (Qwen-Image) or the (B, C, H, W) latents over
the patch size (HunyuanImage); the text is the rest. Each recorded evaluation adds softmax(scale Q K^T + mask) over the
full key set, in float32, summed over the heads, the image rows and the recorded text columns kept,
into one running sum per block (``joint_scores.kernel_probabilities``), as ``joint_attention.py``
does; ``heat_maps`` lays the blocks out on the grid, upsamples, clamps and averages them alike.

A text position is mapped back to the prompt's characters through the family's own tokenizer and
template (``_template``, ``text_spans``): Chroma's T5 reads the prompt alone; FLUX.2-dev's Mistral
reads its system message and the prompt in its chat template (nothing dropped: the prompt's tokens
follow the system message's, after the row's left padding, ``lead``); klein's Qwen3 reads the
prompt in Qwen's chat template; Qwen-Image's Qwen2.5-VL reads it in its description template, of
which the pipeline drops the first 34 tokens; CogView4's positions are found in the rows its
encoder read (``rows``). The recorded segment starts at the prompt's first token (``text_offset``,
measured on the template once; 0 for the "rows" families and SANA's selection), so ``tokens``
counts prompt tokens.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

from operators.support.joint_attention import JointAttentionCapture, positions_of_words
from operators.support.joint_scores import kernel_probabilities

TEXT_FIRST = "text-first"
IMAGE_FIRST = "image-first"
# per sample [its valid text, image, padding] (Lumina 2: only the prompt's valid tokens enter, so the
# image starts at a different position in each sample)
TEXT_FIRST_PER_SAMPLE = "text-first, per sample"
CROSS = "cross"          # cross-attention: image queries, text keys (SANA)


@dataclass(frozen=True)
class Family:
    """How one family's denoiser and pipeline are read (module docstring)."""

    name: str
    transformer: str                     # the denoiser's class name
    blocks: tuple[str, ...]              # ModuleList attributes of the transformer whose blocks' ``attn`` are recorded
    skip_contexts: frozenset = frozenset({"uncond"})
    alternate_cfg: bool = False          # CFG as an untagged second call per step (Chroma)
    same_text_cfg: bool = False          # CFG as an untagged second call: recorded are the calls given the first's text
    grid_from: str = "img_ids"           # "img_ids", "img_shapes", or "latents" ((B, C, H, W) over the patch size)
    order: str = TEXT_FIRST              # the joint sequence's order
    attn: str = "attn"                   # the attention attribute of each block
    kernel: str = "dispatch"             # "dispatch" (dispatch_attention_fn) or "sdpa" (F.scaled_dot_product_attention)
    # "template": the text positions are the template's tokens (text_spans); "rows": found in the
    # rows the text encoder read in the recorded call (CogView4 pads on the left to a multiple of 16)
    text: str = "template"
    image_pad: int = 1                   # the image segment is padded to a multiple of this (Z-Image: 32)
    cond_first: bool = False             # CFG as one doubled batch, the conditional half first (Z-Image)
    # SANA, PixArt: the pipeline reads the prompt through its own _text_preprocessing (lower-cased
    # and stripped, or PixArt's caption cleaning); SANA keeps the text encoder's first position and
    # its last (text length - 1): its denoiser's text is that selection of the row
    preprocessed: bool = False
    select_last: bool = False
    cond_second: bool = False            # CFG as one doubled batch [unconditional, conditional] (HiDream)
    encoder: str = "text_encoder"        # the pipeline's text encoder whose ids the recorded text holds (HiDream: T5)
    pad_to_max_seq: bool = False         # a non-square image is padded to the transformer's max_seq (HiDream)
    padded_text: bool = False            # the encoder's padded row reaches the denoiser whole (FLUX.2): a left
                                         # padding shifts each prompt (``lead``)


FAMILIES = {f.transformer: f for f in (
    Family("chroma", "ChromaTransformer2DModel", ("transformer_blocks", "single_transformer_blocks"),
           frozenset(), alternate_cfg=True, padded_text=True),
    Family("flux2", "Flux2Transformer2DModel", ("transformer_blocks", "single_transformer_blocks"), padded_text=True),
    Family("qwen-image", "QwenImageTransformer2DModel", ("transformer_blocks",), grid_from="img_shapes"),
    Family("hunyuan-image", "HunyuanImageTransformer2DModel", ("transformer_blocks", "single_transformer_blocks"),
           frozenset({"pred_uncond", "uncond"}), grid_from="latents", order=IMAGE_FIRST),
    Family("cogview4", "CogView4Transformer2DModel", ("transformer_blocks",), grid_from="latents", attn="attn1",
           kernel="sdpa", text="rows"),
    Family("lumina2", "Lumina2Transformer2DModel", ("layers",), frozenset(), same_text_cfg=True, grid_from="latents",
           order=TEXT_FIRST_PER_SAMPLE, kernel="sdpa"),
    Family("z-image", "ZImageTransformer2DModel", ("layers",), frozenset(), grid_from="x", order=IMAGE_FIRST,
           attn="attention", image_pad=32, cond_first=True),
    Family("sana", "SanaTransformer2DModel", ("transformer_blocks",), frozenset(), grid_from="latents", order=CROSS,
           attn="attn2", kernel="sdpa", preprocessed=True, select_last=True),
    Family("pixart", "PixArtTransformer2DModel", ("transformer_blocks",), frozenset(), grid_from="latents",
           order=CROSS, attn="attn2", kernel="sdpa", preprocessed=True),
    Family("hidream", "HiDreamImageTransformer2DModel", ("double_stream_blocks", "single_stream_blocks"), frozenset(),
           grid_from="latents", order=IMAGE_FIRST, attn="block.attn1", kernel="sdpa", cond_second=True,
           encoder="text_encoder_3", pad_to_max_seq=True),
)}


class _Functional:
    """A processor module's ``F`` (torch.nn.functional) with ``scaled_dot_product_attention``
    replaced, everything else the module's own."""

    def __init__(self, functional, sdpa):
        self._functional, self.scaled_dot_product_attention = functional, sdpa

    def __getattr__(self, name):
        return getattr(self._functional, name)


# -- the prompt's characters at each text position ----------------------------------------------------


def _spans(tokenizer, text: str, start: int, end: int, drop: int = 0, special: bool = True):
    """(token ids, [(s, e) character span in the prompt, or (0, 0)], how many of the tokens come
    before the prompt) of ``text`` tokenized with offsets, the prompt at characters ``start:end``
    of it, the first ``drop`` tokens left out."""
    enc = tokenizer(text, add_special_tokens=special, truncation=False, return_offsets_mapping=True)
    ids, spans = list(enc.input_ids), []
    pieces = tokenizer.convert_ids_to_tokens(ids)
    # the template's tokens (and specials) before the first one that holds a prompt character
    first = next((i for i, (s, e) in enumerate(enc.offset_mapping) if e > start and e > s), len(ids))
    before = max(0, first - drop)
    for piece, (s, e) in zip(pieces, enc.offset_mapping):
        s, e = max(s, start) - start, min(e, end) - start
        spans.append((s, e) if e > s and str(piece).replace("\u2581", "").strip() else (0, 0))
    return ids[drop:], spans[drop:], before


_SENTINEL = "\u2063PROMPT\u2063"


def _template(pipe) -> tuple[str, str, object, bool, int]:
    """(the text before the prompt, the text after it, the tokenizer that reads it, whether it adds
    its special tokens, how many leading tokens the pipeline drops) of the family's text template,
    rendered around a sentinel prompt."""
    kind = type(pipe).__name__
    if kind == "ChromaPipeline":
        return "", "", pipe.tokenizer, True, 0
    if kind == "Lumina2Pipeline":            # its system prompt before the prompt, BOS first
        return pipe.system_prompt + " <Prompt Start> ", "", pipe.tokenizer, True, 0
    if kind == "HiDreamImagePipeline":       # the T5 segment, first in its text: T5 reads the prompt alone
        return "", "", pipe.tokenizer_3, True, 0
    if kind in ("SanaPipeline", "SanaSprintPipeline"):      # its default instruction, then the prompt
        instruction = inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default
        return "\n".join(instruction or ()), "", pipe.tokenizer, True, 0
    if kind in ("PixArtSigmaPipeline", "PixArtAlphaPipeline"):
        return "", "", pipe.tokenizer, True, 0
    if kind in ("QwenImagePipeline", "HunyuanImagePipeline"):
        text, drop = pipe.prompt_template_encode.format(_SENTINEL), int(pipe.prompt_template_encode_start_idx)
        tokenizer, special = pipe.tokenizer, True
    elif kind == "Flux2Pipeline":
        from diffusers.pipelines.flux2.pipeline_flux2 import format_input  # deferred: diffusers

        text = pipe.tokenizer.apply_chat_template(format_input([_SENTINEL], system_message=pipe.system_message),
                                                  add_generation_prompt=False, tokenize=False)
        text = text[0] if isinstance(text, list) else text
        drop, tokenizer, special = 0, pipe.tokenizer.tokenizer, False
    elif kind in ("Flux2KleinPipeline", "ZImagePipeline"):     # klein without thinking, Z-Image with
        text = pipe.tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                                  add_generation_prompt=True,
                                                  enable_thinking=kind == "ZImagePipeline")
        drop, tokenizer, special = 0, pipe.tokenizer, True
    else:
        raise ValueError(f"{kind}: no text layout for its word heat maps")
    if text.count(_SENTINEL) != 1:
        raise ValueError(f"{kind}: its template does not hold the prompt once")
    before, after = text.split(_SENTINEL)
    return before, after, tokenizer, special, drop


def read_text(pipe, prompt: str) -> str:
    """The prompt as the family's pipeline hands it to its tokenizer: SANA's and PixArt's
    ``_text_preprocessing`` at their call's default ``clean_caption`` (lower-cased and stripped, or
    PixArt's caption cleaning), else the prompt itself."""
    family = FAMILIES.get(type(getattr(pipe, "transformer", None)).__name__)
    if family is None or not family.preprocessed:
        return prompt
    clean = inspect.signature(type(pipe).__call__).parameters["clean_caption"].default
    return pipe._text_preprocessing([prompt], clean_caption=bool(clean))[0]


def text_spans(pipe, prompt: str):
    """(the token ids the denoiser's text positions hold, the prompt's character span at each, the
    number of positions before the prompt's first token), as the family's pipeline builds its text
    sequence (module docstring); (0, 0) where a position holds none of the prompt's characters
    (template, special tokens)."""
    before, after, tokenizer, special, drop = _template(pipe)
    prompt = read_text(pipe, prompt)
    start, end = len(before), len(before) + len(prompt)
    ids, spans, ahead = _spans(tokenizer, before + prompt + after, start, end, drop, special)
    glyphs = _glyph_tokens(pipe, prompt)
    if glyphs:              # HunyuanImage: the valid ByT5 glyph tokens come first in the denoiser's text
        spans = [(0, 0)] * glyphs + spans
    return ids, spans, ahead


def _glyph_tokens(pipe, prompt: str) -> int:
    """HunyuanImage 2.1: how many valid ByT5 tokens of the prompt's quoted text its transformer puts
    before the Qwen tokens (its pipeline's ``extract_glyph_text``; none without quotes); 0 elsewhere."""
    if type(pipe).__name__ != "HunyuanImagePipeline" or getattr(pipe, "text_encoder_2", None) is None:
        return 0
    from diffusers.pipelines.hunyuan_image.pipeline_hunyuanimage import extract_glyph_text  # deferred: diffusers

    glyph = extract_glyph_text(prompt)
    if glyph is None:
        return 0
    return int(pipe.tokenizer_2(glyph, padding="max_length", max_length=128, truncation=True,
                                add_special_tokens=True, return_tensors="pt").attention_mask.sum())


def prompt_offset(pipe) -> int:
    """The text position of the prompt's first token: the template's tokens before it (measured on
    a probe prompt; the same for every prompt, as the template before it is fixed and ends in a
    special token or a line break), 0 where the prompt is read alone (Chroma's T5) or its position
    is found in the encoder's rows (CogView4)."""
    family = FAMILIES[type(pipe.transformer).__name__]
    if family.text == "rows" or family.select_last:   # found in the rows; SANA's selection starts the segment
        return 0
    return text_spans(pipe, "a")[2]


# -- the recorder ---------------------------------------------------------------------------------------


class KernelAttentionCapture(JointAttentionCapture):
    """``with KernelAttentionCapture(pipe, guidance=...) as cap: pipe(...)``; then
    ``cap.heat_maps(latent_hw, image_hw)`` gives (images, tokens, H, W) maps of the recorded text
    segment (token 0 = the prompt's first token) and ``cap.word_positions(tokenizer, prompt, words)``
    the segment positions of each word. ``tokens``: keep only the segment's first that many tokens;
    ``guidance``: the pipeline runs classifier-free guidance (Chroma: every second call is the
    negative prompt's)."""

    def __init__(self, pipe, tokens: int | None = None, guidance: bool = True):
        transformer = getattr(pipe, "transformer", None)
        family = FAMILIES.get(type(transformer).__name__)
        if family is None:
            raise ValueError(f"{type(pipe).__name__}: no kernel-level word heat maps for its denoiser "
                             f"{type(transformer).__name__}")
        if tokens is not None and int(tokens) < 1:
            raise ValueError(f"tokens must be >= 1 or None, got {tokens}")
        self.pipe, self.family, self.transformer = pipe, family, transformer
        # a "rows" family's prompt sits at the end of its text (left padding): every position is kept
        self.tokens = None if tokens is None or family.text == "rows" else int(tokens)
        self.guidance = bool(guidance)
        self.text_offset = prompt_offset(pipe)
        self.text_length = None
        self.tokenizer = getattr(pipe.tokenizer, "tokenizer", pipe.tokenizer)
        self.layouts: dict[str, str] = {}
        self.sums, self.steps, self.token_sums = {}, {}, {}
        self.text_tokens = None
        self.grid = None
        self.recording = self.active = False
        self.current = None                 # the name of the attention module running now
        self._text_len = None
        self._call_grid = None
        self._caps = None                   # TEXT_FIRST_PER_SAMPLE: each sample's valid text length
        self._batch = None                  # cond_first: the prompts' batch (half the first, doubled call)
        self._keep = None                   # cond_first: keep the call's first this many samples
        self._cond_text = None              # same_text_cfg: the text tensor of the first recorded call
        self._context = None
        self._calls = 0
        self._hooks = []
        self._kernels = {}                  # processor module -> its original kernel (dispatch_attention_fn or F)
        self._saved_cache_context = None
        self.rows = None                    # "rows" families: the input ids the text encoder read first
        self.lead = None                    # each prompt's left padding in the text encoder's first call
        self.error = None                   # why the recording stopped (safely)

    # -- the context ------------------------------------------------------------------------------

    def __enter__(self):
        if self.recording:
            raise RuntimeError("this KernelAttentionCapture is already recording")
        if getattr(self.transformer, "_compiled_call_impl", None) is not None:
            raise ValueError(f"{type(self.transformer).__name__} is compiled (--gen-compile): its word heat maps are "
                             f"read at the attention kernel, which a compiled graph does not call; run without "
                             f"--gen-compile")
        self.error = None
        try:
            return self._enter()
        except BaseException:
            self.__exit__()
            raise

    def _enter(self):
        modules = {}
        for attr in self.family.blocks:
            for i, block in enumerate(getattr(self.transformer, attr)):
                modules[f"{attr}.{i}.{self.family.attn}"] = block.get_submodule(self.family.attn)
        self.layouts = {name: self.family.order for name in modules}
        kernel = "dispatch_attention_fn" if self.family.kernel == "dispatch" else "F"
        for name, module in modules.items():
            where = sys.modules[type(module.processor).__module__]
            if getattr(where, kernel, None) is None:
                raise ValueError(f"{name}: its processor {type(module.processor).__name__} calls no {kernel} to read")
            if where not in self._kernels:
                self._kernels[where] = getattr(where, kernel)
                setattr(where, kernel, self._kernel(where.dispatch_attention_fn) if kernel != "F" else
                        _Functional(where.F, self._sdpa(where.F.scaled_dot_product_attention)))
            self._hooks.append(module.register_forward_pre_hook(lambda *_, n=name: self._enter_module(n)))
            self._hooks.append(module.register_forward_hook(lambda *_: self._enter_module(None)))
        self._hooks.append(self.transformer.register_forward_pre_hook(self._before_forward, with_kwargs=True))
        self.rows = self.lead = None
        encoder = getattr(self.pipe, self.family.encoder, None)   # whose ids the recorded text holds
        if encoder is not None:
            self._hooks.append(encoder.register_forward_pre_hook(self._encoder_rows, with_kwargs=True))
        self._wrap_cache_context()
        self._calls = 0
        self._cond_text = None
        self._batch = None
        self.recording = True
        return self

    def __exit__(self, *exc):
        self.recording = self.active = False
        self.current = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for where, original in self._kernels.items():
            setattr(where, "dispatch_attention_fn" if self.family.kernel == "dispatch" else "F", original)
        self._kernels = {}
        self._unwrap_cache_context()
        return False

    def _enter_module(self, name):
        self.current = name

    def _kernel(self, original):
        capture = self

        def dispatch_attention_fn(query, key, value, attn_mask=None, *args, **kwargs):
            if capture.recording and capture.active and capture.current is not None:
                scale = args[2] if len(args) > 2 else kwargs.get("scale")   # after dropout_p, is_causal
                capture.safely(capture.current, query, key, attn_mask, scale)
            return original(query, key, value, attn_mask, *args, **kwargs)

        return dispatch_attention_fn

    def _sdpa(self, original):
        capture = self

        def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):   # (B, heads, S, d)
            if capture.recording and capture.active and capture.current is not None:
                scale = args[2] if len(args) > 2 else kwargs.get("scale")   # after dropout_p, is_causal
                capture.safely(capture.current, query.transpose(1, 2), key.transpose(1, 2), attn_mask, scale)
            return original(query, key, value, attn_mask, *args, **kwargs)

        return scaled_dot_product_attention

    def _encoder_rows(self, module, args, kwargs):
        """The ids of the text encoder's first call while recording: the prompts' (the negative
        prompt's call follows); and each row's left padding (FLUX.2-dev's Mistral tokenizer pads on
        the left, and its pipeline hands the padded sequence to the transformer)."""
        if self.rows is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                self.rows = [list(map(int, r)) for r in ids.tolist()]
                mask = kwargs.get("attention_mask")
                if mask is not None and mask.ndim == 2 and self.family.padded_text:
                    lead = [next((i for i, m in enumerate(r) if m), len(r)) for r in mask.tolist()]
                    self.lead = lead if any(lead) else None
        return None

    def _before_forward(self, module, args, kwargs):
        """Each transformer call: is it recorded, its text length and its token grid."""
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        if getattr(text, "ndim", 0) != 3:
            text = None                                     # Z-Image: (x, t, cap_feats), its captions a list
        record = self.recording and self._context not in self.family.skip_contexts
        if self.family.alternate_cfg and self.guidance:
            record = record and self._calls % 2 == 0       # the negative prompt's call follows each step's first
        if self.family.same_text_cfg and self.guidance and text is not None:
            if self._cond_text is None:
                self._cond_text = text.data_ptr()          # the prompt's embeddings, passed again at every step
            record = record and text.data_ptr() == self._cond_text
        mask = kwargs.get("encoder_attention_mask")
        self._caps = None if mask is None else [int(c) for c in mask.sum(dim=1).tolist()]
        self._calls += 1
        self.active = record
        self._text_len = None if text is None else int(text.shape[1])
        grid = None
        self._keep = None
        if self.family.grid_from == "x":              # Z-Image: lists of (C, 1, H, W) latents, the patch a kwarg
            latents = kwargs.get("x", args[0] if args else None)
            patch = int(kwargs.get("patch_size", 2))
            if latents:
                grid = (int(latents[0].shape[-2]) // patch, int(latents[0].shape[-1]) // patch)
                if self.family.cond_first and self.guidance and record:
                    if self._batch is None:       # the first call is doubled when CFG is on
                        self._batch = len(latents) // 2 if len(latents) % 2 == 0 else len(latents)
                    self._keep = self._batch if len(latents) == 2 * self._batch else None
            hidden = None
        elif self.family.grid_from == "latents":
            if hidden is not None and hidden.ndim == 4:
                patch = getattr(module.config, "patch_size", 1)
                ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)[-2:]
                grid = (int(hidden.shape[-2]) // ph, int(hidden.shape[-1]) // pw)
        elif self.family.grid_from == "img_shapes":
            shapes = kwargs.get("img_shapes")
            if shapes:
                nested = isinstance(shapes[0], (list, tuple)) and isinstance(shapes[0][0], (list, tuple))
                first = shapes[0][0] if nested else shapes[0]
                grid = (int(first[-2]), int(first[-1]))
        else:
            ids = kwargs.get("img_ids")
            if ids is not None:
                ids = ids[0] if ids.ndim == 3 else ids
                grid = (int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1)
        if grid is not None and hidden is not None and hidden.ndim == 3 and grid[0] * grid[1] != int(hidden.shape[1]):
            grid = None                                     # reference images appended (FLUX.2 editing): not a T2I grid
        self._call_grid = grid
        if grid is not None and record:
            if self.grid is not None and self.grid != grid and self.sums:
                raise ValueError(f"the token grid changed from {self.grid} to {grid} while recording: one capture "
                                 f"records one image size")
            self.grid = grid
        return None

    # -- recording ----------------------------------------------------------------------------------

    def safely(self, name: str, query, key, mask, scale) -> None:
        """``record_kernel``, but a failure stops the recording instead of the generation: the
        images are made as without the capture, and the maps report the error (``heat_maps``)."""
        try:
            self.record_kernel(name, query, key, mask, scale)
        except Exception as exc:   # noqa: BLE001 -- any recorder failure: the images go on, the maps say why
            self.error = f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())}"
            self.recording = self.active = False

    def heat_maps(self, latent_hw, image_hw, tokens: int | None = None):
        if self.error:
            raise RuntimeError(f"word heat maps not recorded: {self.error}")
        return super().heat_maps(latent_hw, image_hw, tokens)

    def record_kernel(self, name: str, query, key, mask, scale) -> None:
        """One evaluation of ``name``'s attention: ``query``/``key`` (B, S, heads, d) as the kernel
        receives them. The image's positions are the call's token grid (else the sequence less the
        call's text), the text the rest, in the family's order."""
        import torch  # deferred: torch

        if self._keep is not None:                      # the conditional half of a doubled batch (first)
            query, key = query[:self._keep], key[:self._keep]
            mask = None if mask is None else mask[:self._keep]
        if self.family.cond_second and self.guidance:   # [unconditional, conditional]: the second half
            if query.shape[0] % 2:
                raise ValueError(f"{name}: guidance is set but the batch of {query.shape[0]} is not "
                                 f"[unconditional, conditional]")
            half = query.shape[0] // 2
            query, key = query[half:], key[half:]
            mask = None if mask is None else mask[half:]
        if self.family.order == CROSS:
            self._cross(name, query, key, mask, scale)
            return
        positions = int(query.shape[1])
        padded = None
        if self._call_grid is not None:
            image = self._call_grid[0] * self._call_grid[1]
            padded = image + (-image) % self.family.image_pad      # Z-Image pads its image segment to 32
            if self.family.pad_to_max_seq and self._call_grid[0] != self._call_grid[1]:
                padded = int(self.transformer.max_seq)              # HiDream pads a non-square image to max_seq
            length = positions - padded
        else:
            length = self._text_len
            image = None if length is None else positions - length
        if length is None or length < 1 or image < 1:
            raise ValueError(f"{name}: the text and image parts of the joint sequence are unknown")
        segment = length - self.text_offset
        if segment < 1:
            raise ValueError(f"{name}: the text sequence of {length} positions has nothing at offset "
                             f"{self.text_offset}")
        if self.family.order == TEXT_FIRST_PER_SAMPLE:
            segment = max(self._caps) - self.text_offset
        self.text_tokens = segment
        n = segment if self.tokens is None else min(self.tokens, segment)
        q, k = query.transpose(1, 2), key.transpose(1, 2)
        with torch.no_grad():
            if self.family.order == TEXT_FIRST_PER_SAMPLE:     # each sample's image after its own text
                kept, total = self._by_sample(q, k, [(cap, cap + image, self.text_offset, cap)
                                                     for cap in self._caps], n, scale, mask)
            elif self.lead is not None and self.family.order == TEXT_FIRST and len(self.lead) == q.shape[0]:
                # each sample's prompt after its own left padding
                kept, total = self._by_sample(q, k, [(length, positions, self.text_offset + lead, length)
                                                     for lead in self.lead], n, scale, mask)
            else:
                rows, col = ((length, positions), self.text_offset) if self.family.order == TEXT_FIRST else \
                    ((0, image), (padded or image) + self.text_offset)
                kept, total = kernel_probabilities(q, k, rows, col, n, scale, mask)
        self._add(name, kept, total)

    def _cross(self, name: str, query, key, mask, scale) -> None:
        """A cross-attention call: the image's queries against the text's keys; a batch twice the
        prompts' (the encoder's rows) is CFG's [unconditional, conditional], its second half kept."""
        import torch  # deferred: torch

        prompts = len(self.rows) if self.rows else None
        if self.guidance and prompts and query.shape[0] == 2 * prompts:
            query, key = query[prompts:], key[prompts:]
            mask = None if mask is None or mask.shape[0] == 1 else mask[prompts:]
        image, length = int(query.shape[1]), int(key.shape[1])
        segment = length - self.text_offset
        self.text_tokens = segment
        n = segment if self.tokens is None else min(self.tokens, segment)
        with torch.no_grad():
            self._add(name, *kernel_probabilities(query.transpose(1, 2), key.transpose(1, 2), (0, image),
                                                  self.text_offset, n, scale, mask))

    def _by_sample(self, q, k, layout, n: int, scale, mask):
        """Sample by sample, where ``layout[i]`` = (first image row, end of the image rows, first
        text column, end of the text) of sample ``i``: its ``n`` columns from the first text column,
        those past the end of its text left 0 (they are other positions' keys)."""
        import torch  # deferred: torch

        rows = layout[0][1] - layout[0][0]
        kept = torch.zeros(q.shape[0], rows, n, dtype=torch.float32, device=q.device)
        total = torch.zeros(q.shape[0], rows, dtype=torch.float32, device=q.device)
        for i, (first, last, col, end) in enumerate(layout):
            width = max(0, min(n, end - col))
            got, sums = kernel_probabilities(q[i:i + 1], k[i:i + 1], (first, last), col, width, scale,
                                             None if mask is None else mask[i:i + 1])
            kept[i, :, :width] = got[0]
            total[i] = sums[0]
        return kept, total

    @property
    def prompt_tokens(self) -> int | None:
        return self.text_tokens

    # -- words --------------------------------------------------------------------------------------

    def word_positions(self, tokenizer, prompt: str, words=None) -> dict[str, list[int]]:
        """{word: segment positions} of each of ``words`` (default: every word of the prompt) at
        every occurrence, by the characters each text position holds (``text_spans``); positions
        count from the prompt's first token (``text_offset``). ``tokenizer`` is not used: the
        family's own template decides."""
        if self.family.text == "rows":
            spans = self._row_spans(prompt)
        else:
            _, spans, _ = text_spans(self.pipe, prompt)
            if self.family.select_last:       # SANA: the row padded on the right, then the first and last positions
                kept = self.text_tokens + self.text_offset if self.text_tokens else self._text_len
                length = len(self.rows[0]) if self.rows else len(spans)
                spans = (spans + [(0, 0)] * length)[:length]
                if kept:
                    spans = [spans[i] for i in [0, *range(length - kept + 1, length)]]
            spans = spans[self.text_offset:]
        return positions_of_words(read_text(self.pipe, prompt), spans, words)

    def _row_spans(self, prompt: str) -> list[tuple[int, int]]:
        """The prompt's character span at each text position, for a "rows" family: its tokens (read
        alone) found in the row the encoder read for it: the row whose other tokens are all padding
        and special tokens (so a prompt that ends another prompt is not found inside that one's
        row), else the last occurrence in the first row that holds them."""
        if self.rows is None:
            raise RuntimeError("no text encoder call was recorded: word positions come after the pipeline call")
        text = read_text(self.pipe, prompt)
        ids, spans, _ = _spans(self.tokenizer, text, 0, len(text), special=False)
        found = self._find(ids, spans)
        if found is None and len(ids) > 1:    # the first token read in context (after the template) may differ
            found = self._find(ids[1:], spans[1:])
        return found or []

    def _find(self, ids, spans):
        """``spans`` laid out on the row where ``ids`` occur (see ``_row_spans``), or None."""
        n = len(ids)
        filler = set(getattr(self.tokenizer, "all_special_ids", ())) | {self.tokenizer.pad_token_id}
        found = []
        for row in self.rows:
            for i in range(len(row) - n, -1, -1):
                if row[i:i + n] == ids:
                    whole = all(t in filler for t in row[:i] + row[i + n:])
                    found.append((not whole, len(found), i, len(row)))
                    break
        if not found:
            return None
        _, _, start, length = min(found)
        return [(0, 0)] * start + spans + [(0, 0)] * (length - start - n)

    def word_heat_maps(self, tokenizer, prompt: str, maps, words=None):
        from operators.support.cross_attention import word_maps

        return word_maps(self.word_positions(tokenizer, prompt, words), maps)
