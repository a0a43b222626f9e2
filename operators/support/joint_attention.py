"""Word heat maps from the joint attention of transformer (MMDiT) denoisers, DAAM's method (Tang et
al. 2023) carried over from the UNet's cross-attention (``cross_attention.py``) to Stable Diffusion
3 / 3.5 and FLUX.1, for the prompt-image dependency groups (paper 004, section 6, App. A "DAAM").

An MMDiT block has no cross-attention layer: the image tokens and the text tokens form one sequence
and one attention runs over it, every query against every key. What the image's positions attend
to among the prompt's tokens is the block of that attention matrix with the image queries as rows
and the text keys as columns, and that is what is recorded, read off diffusers' processors (the
installed diffusers, 0.42):

- SD 3 / 3.5 (``SD3Transformer2DModel``; ``JointTransformerBlock.attn``, processor
  ``JointAttnProcessor2_0`` in ``models/attention_processor.py``): queries ``norm_q(to_q(x))``,
  keys ``[norm_k(to_k(x)), norm_added_k(add_k_proj(c))]`` (image, then text; the norms where the
  model has them, SD 3.5's RMS norms), ``F.scaled_dot_product_attention`` with its default scale
  1/sqrt(head_dim). SD 3.5's second, image-only attention (``attn2``, ``use_dual_attention``) has
  no text key and is not recorded. The text sequence (``pipeline_stable_diffusion_3.py``,
  ``encode_prompt``) is the 77 CLIP positions (CLIP-L and CLIP-G concatenated along the features,
  zero-padded to T5's width) followed by the T5 positions (``max_sequence_length``). The T5
  segment is recorded (``text_offset`` = the pipeline's ``tokenizer_max_length``, 77): T5 reads
  the prompt with ``tokenizer_3``, case and all, without the CLIP encoders' 77-token limit, and the
  CLIP positions hold two encoders' states of the same tokens side by side, which one word map
  cannot attribute.
- FLUX.1 (``FluxTransformer2DModel``, ``transformer_flux.py``): the double-stream blocks
  (``FluxTransformerBlock.attn``, ``FluxAttnProcessor``) build queries and keys as
  ``[norm_added_q/k(add_q/k_proj(c)), norm_q/k(to_q/k(x))]`` (text, then image) and apply the
  rotary embedding to the whole sequence; the single-stream blocks (``FluxSingleTransformerBlock``)
  receive the already concatenated [text, image] sequence with ``encoder_hidden_states=None`` and
  project it with ``to_q``/``to_k`` alone (then the norms and the rotary embedding). Their text
  sequence is T5's alone (``pipeline_flux.py``: CLIP gives only the pooled vector), so the
  segment is the whole text sequence (``text_offset`` 0, tokenizer ``tokenizer_2``).

In both, every recorded evaluation adds, in float32 and on the side, softmax(Q K^T / sqrt(d)) over
the FULL joint key set (text and image keys, as the block normalises it, so a text column's share
is what that token gets out of everything the image query reads), summed over the heads, the
rows of the image queries and the columns of the text segment's tokens kept, into one running
(images x image positions x tokens) sum per block: no per-step map is kept once its step is done.
The sum over *all* keys of each row is kept too (``token_sums``: heads x evaluations at every
position, a check of what was recorded).

Which evaluations are recorded:

- classifier-free guidance: SD 3 runs the transformer once on the doubled batch [unconditional,
  conditional] when ``guidance_scale > 1`` (``do_classifier_free_guidance``); with ``guidance``
  only the conditional half is kept (as in ``cross_attention.py``). FLUX.1 is guidance-distilled:
  ``guidance_scale`` is an embedding input of the transformer and the batch is never doubled, so
  ``attention_capture.capture_for`` records the whole batch whatever the caller's guidance flag
  says. FluxPipeline's "true CFG" (``true_cfg_scale > 1`` with a negative prompt) evaluates the
  negative prompt in a second call, which the pipeline wraps in
  ``transformer.cache_context("uncond")``: that call is not recorded (the context's name is read
  through a wrapper of ``cache_context`` put on the transformer for the capture's duration);
- SD 3's skip-layer guidance evaluates the conditional batch once more with ``skip_layers`` (some
  blocks left out, a perturbed prediction): not recorded;
- every other evaluation is: the steps are summed, as DAAM sums over time steps.

At the end (``heat_maps``) each block's sum is laid out on the token grid (the latent patchified:
SD 3's ``PatchEmbed`` with ``patch_size`` 2, FLUX's pipeline packing 2 x 2 latent patches; both
row-major; the grid is read off each transformer call: the latent's height and width over
``patch_size`` for SD 3, the ``img_ids`` rows and columns for FLUX), upsampled bicubically to the
image size, clamped at 0, and the blocks are averaged. Every joint block counts, FLUX's double- and
single-stream blocks alike, with equal weight: this project's choice. DAAM (castorini/daam) likewise
aggregates the UNet's cross-attention maps over layers and time steps (upsample, clamp, sum), and
its one layer selection, leaving out the UNet's coarsest (8 x 8) maps, is about resolution; an
MMDiT's blocks all work on the same grid, so there is nothing to leave out on that ground, and
picking blocks by their look would be a tuning nobody could check. ``layers`` of
``attention_capture.capture_for`` applies to the UNet only. The heads are summed before the clamp
(see ``cross_attention.py``).

A word's heat map is the mean of the maps of its tokens (every occurrence of the word in the
prompt). Words are found by character offsets (a fast tokenizer's ``return_offsets_mapping``): the
words of ``cross_attention.WORD`` in the lower-cased prompt, and the tokens whose characters fall
in them. T5's SentencePiece pieces depend on the context ("Doctor" at the start of a prompt, or
"(doctor)", is not the piece sequence of "doctor" alone) and T5 is case-sensitive, so matching the
ids of the word tokenized alone would miss occurrences. A piece that is only SentencePiece's word
marker "▁" carries no character of the word and belongs to none.

Recording never changes the generated image: each wrapped processor computes the layer's output
with the original processor, exactly as without the capture, and the recorder only reads the layer's inputs
(tests compare the images bit for bit). The original processors, and the transformer's
``cache_context``, are restored when the context ends.

Memory: the sums hold images x positions x tokens float32 values per block (FLUX.1 at 1024 px: 4096
positions; with 512 T5 tokens and 6 images, 50 MB per block, 57 blocks): pass ``tokens`` (the
prompt tokens anyone will read) to keep only the first ones. The probabilities are computed in
chunks of image queries of at most ``joint_scores.CHUNK_BYTES``.
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np

from operators.support.cross_attention import WORD, CrossAttentionCapture, word_maps
from operators.support.joint_scores import attention_probabilities, project_added_keys, project_queries_keys

# how the joint sequence of a recorded attention layer is laid out
IMAGE_FIRST = "image-first"     # SD 3: queries/keys [image, text], text from encoder_hidden_states
TEXT_FIRST = "text-first"       # FLUX double-stream: [text, image], text from encoder_hidden_states
CONCATENATED = "concatenated"   # FLUX single-stream: hidden_states is already [text, image]

def class_names(obj) -> set[str]:
    """The names of ``obj``'s class and of its bases."""
    return {c.__name__ for c in type(obj).__mro__}


class _Recorder:
    """Wraps one joint-attention processor: output from the original, probabilities recorded."""

    def __init__(self, inner, name: str, layout: str, capture: "JointAttentionCapture"):
        self.inner, self.name, self.layout, self.capture = inner, name, layout, capture
        # Attention.forward / FluxAttention.forward pass on only the keyword arguments that the
        # processor's __call__ names (inspect.signature): show them the original's
        try:
            signature = inspect.signature(inner.__call__)
        except (TypeError, ValueError):
            signature = None
        if signature is not None:
            def call(*args, **kwargs):
                return type(self).__call__(self, *args, **kwargs)

            call.__signature__ = signature
            self.__dict__["__call__"] = call

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        if self.capture.recording and self.capture.active:
            rotary = args[0] if args else kwargs.get("image_rotary_emb")
            self.capture.record(self.name, self.layout, attn, hidden_states, encoder_hidden_states, attention_mask,
                                rotary)
        return out

    def __getattr__(self, attr):
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)       # the original's settings (_attention_backend, scale, ...)


class JointAttentionCapture:
    """``with JointAttentionCapture(pipe.transformer, guidance=...) as cap: pipe(...)``; then
    ``cap.heat_maps(latent_hw, image_hw)`` gives (images, tokens, H, W) maps of the text segment's
    tokens (token 0 = the text position ``text_offset``: T5's first token, it has no BOS).

    ``tokens``: keep only the segment's first that many tokens (None: all of them);
    ``guidance``: the batch is [unconditional, conditional] and only the second half is recorded;
    ``text_offset`` / ``text_length``: the segment of the text sequence recorded (None: to its end).
    ``tokenizer`` (set by ``attention_capture.capture_for``): the tokenizer of the segment, for ``word_positions``."""

    def __init__(self, transformer, tokens: int | None = None, guidance: bool = True, text_offset: int = 0,
                 text_length: int | None = None):
        if not hasattr(transformer, "attn_processors") or not hasattr(transformer, "set_attn_processor"):
            raise ValueError(f"{type(transformer).__name__} has no attention processors to record")
        if tokens is not None and int(tokens) < 1:
            raise ValueError(f"tokens must be >= 1 or None, got {tokens}")
        if int(text_offset) < 0 or (text_length is not None and int(text_length) < 1):
            raise ValueError(f"bad text segment: offset {text_offset}, length {text_length}")
        self.transformer = transformer
        self.tokens = None if tokens is None else int(tokens)
        self.guidance = bool(guidance)
        self.text_offset = int(text_offset)
        self.text_length = None if text_length is None else int(text_length)
        self.tokenizer = None
        self.layouts: dict[str, str] = {}
        self.sums: dict = {}
        self.steps: dict = {}
        # per block, the probabilities summed over *all* keys (text and image): heads x evaluations
        # at every image position (a softmax sums to 1), kept as a check of what was recorded
        self.token_sums: dict = {}
        self.text_tokens: int | None = None    # the segment's length in the recorded calls
        self.grid: tuple[int, int] | None = None   # the token grid (rows, columns) of the recorded calls
        self.recording = False
        self.active = False                    # the current transformer call is recorded
        self._text_len = None                  # the current call's text sequence length
        self._context = None                   # the current cache_context name ("cond", "uncond")
        self._originals = None
        self._hook = None
        self._saved_cache_context = None

    # -- the context -------------------------------------------------------------------------------

    def __enter__(self):
        if self.recording:
            raise RuntimeError("this JointAttentionCapture is already recording")
        self.layouts = self._layouts()
        if not self.layouts:
            raise ValueError(f"{type(self.transformer).__name__} has no joint text-image attention "
                             f"(SD 3 JointTransformerBlock, FLUX double/single blocks) to record")
        self._originals = dict(self.transformer.attn_processors)
        wrapped = {name: (_Recorder(proc, name, self.layouts[name], self) if name in self.layouts else proc)
                   for name, proc in self._originals.items()}
        self.transformer.set_attn_processor(wrapped)
        self._hook = self.transformer.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        self._wrap_cache_context()
        self.recording = True
        return self

    def __exit__(self, *exc):
        self.recording = self.active = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._unwrap_cache_context()
        self.transformer.set_attn_processor(self._originals)
        return False

    def _layouts(self) -> dict[str, str]:
        """{processor name: layout} of the attention layers that mix text and image tokens."""
        out = {}
        for name in self.transformer.attn_processors:
            path = name[:-len(".processor")] if name.endswith(".processor") else name
            block_path, _, attr = path.rpartition(".")
            if attr != "attn" or not block_path:
                continue                       # SD 3.5's attn2: image tokens only
            names = class_names(self.transformer.get_submodule(block_path))
            if "FluxSingleTransformerBlock" in names:
                out[name] = CONCATENATED
            elif "FluxTransformerBlock" in names:
                out[name] = TEXT_FIRST
            elif "JointTransformerBlock" in names:
                out[name] = IMAGE_FIRST
        return out

    def _wrap_cache_context(self) -> None:
        """Follow the pipeline's ``transformer.cache_context(name)`` (FluxPipeline: "cond" for the
        prompt's evaluation, "uncond" for true CFG's negative prompt) while recording."""
        original = getattr(self.transformer, "cache_context", None)
        if original is None:
            return
        self._saved_cache_context = (original, "cache_context" in self.transformer.__dict__)
        capture = self

        @contextlib.contextmanager
        def cache_context(name, *args, **kwargs):
            before = capture._context
            capture._context = name
            try:
                with original(name, *args, **kwargs):
                    yield
            finally:
                capture._context = before

        self.transformer.__dict__["cache_context"] = cache_context

    def _unwrap_cache_context(self) -> None:
        if self._saved_cache_context is None:
            return
        original, own = self._saved_cache_context
        if own:
            self.transformer.__dict__["cache_context"] = original
        else:
            self.transformer.__dict__.pop("cache_context", None)
        self._saved_cache_context = None
        self._context = None

    def _before_forward(self, module, args, kwargs):
        """Each transformer call: is it recorded, its text length and its token grid."""
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        self.active = self.recording and not kwargs.get("skip_layers") and self._context != "uncond"
        self._text_len = None if text is None else int(text.shape[1])
        if hidden is None:
            return None
        grid = None
        if hidden.ndim == 4:                    # SD 3: (B, C, H, W) latents, patchified by PatchEmbed
            patch = int(getattr(getattr(module, "config", None), "patch_size", 1) or 1)
            grid = (int(hidden.shape[-2]) // patch, int(hidden.shape[-1]) // patch)
        else:                                   # FLUX: (B, positions, C) packed latents and their img_ids
            ids = kwargs.get("img_ids")
            if ids is not None:
                ids = ids[0] if ids.ndim == 3 else ids
                rows, cols = int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1
                if rows * cols == int(hidden.shape[1]):
                    grid = (rows, cols)
        if grid is not None and self.active:
            if self.grid is not None and self.grid != grid and self.sums:
                raise ValueError(f"the token grid changed from {self.grid} to {grid} while recording: one "
                                 f"JointAttentionCapture records one image size")
            self.grid = grid
        return None

    # -- recording ---------------------------------------------------------------------------------

    def record(self, name: str, layout: str, attn, hidden_states, encoder_hidden_states, attention_mask,
               rotary) -> None:
        import torch  # deferred: torch

        if attention_mask is not None:
            raise ValueError(f"{name}: an attention mask was passed; joint-attention maps are computed "
                             f"without one (neither SD 3 nor FLUX passes one)")
        with torch.no_grad():
            h, e = hidden_states, encoder_hidden_states
            if self.guidance:
                if h.shape[0] % 2:
                    raise ValueError(f"{name}: guidance is set but the batch of {h.shape[0]} is not "
                                     f"[unconditional, conditional]")
                half = h.shape[0] // 2
                h = h[half:]
                e = None if e is None else e[half:]
            if layout == CONCATENATED:
                length = self._text_len
                if length is None or length >= h.shape[1]:
                    raise ValueError(f"{name}: the text length of the concatenated sequence is unknown")
                q, _ = project_queries_keys(attn, h[:, length:])
                _, k = project_queries_keys(attn, h)
            elif e is None:
                return                           # a block called without text (not a joint call)
            else:
                length = int(e.shape[1])
                q, k_image = project_queries_keys(attn, h)
                k_text = project_added_keys(attn, e)
                k = torch.cat([k_image, k_text] if layout == IMAGE_FIRST else [k_text, k_image], dim=2)
            if rotary is not None:
                from diffusers.models.embeddings import apply_rotary_emb  # deferred: diffusers

                cos, sin = rotary
                q = apply_rotary_emb(q, (cos[-q.shape[2]:], sin[-q.shape[2]:]))   # the image rows: last
                k = apply_rotary_emb(k, (cos, sin))
            positions = int(q.shape[2])
            start = (positions if layout == IMAGE_FIRST else 0) + self.text_offset
            segment = length - self.text_offset
            if self.text_length is not None:
                segment = min(segment, self.text_length)
            if segment < 1:
                raise ValueError(f"{name}: the text sequence of {length} positions has nothing at offset "
                                 f"{self.text_offset}")
            self.text_tokens = segment
            n = segment if self.tokens is None else min(self.tokens, segment)
            self._add(name, *attention_probabilities(q, k, start, n))

    def _add(self, name: str, kept, total) -> None:
        """One recorded evaluation of block ``name``: its kept columns and row sums added to the block's."""
        if name in self.sums:
            self.sums[name].add_(kept)
            self.token_sums[name].add_(total)
        else:
            self.sums[name], self.token_sums[name] = kept, total
        self.steps[name] = self.steps.get(name, 0) + 1

    @property
    def prompt_tokens(self) -> int | None:
        """The most prompt tokens the recorded segment can hold: its length less T5's EOS (no BOS);
        None before anything was recorded."""
        return None if self.text_tokens is None else max(1, self.text_tokens - 1)

    # -- maps --------------------------------------------------------------------------------------

    def heat_maps(self, latent_hw: tuple[int, int] | None, image_hw: tuple[int, int], tokens: int | None = None):
        """(images, tokens, H, W) float32 on the transformer's device: per block summed over the
        evaluations and heads, laid out on the token grid, upsampled bicubically to ``image_hw``,
        clamped at 0, averaged over the blocks. ``latent_hw``: the (unpacked) latent's height and
        width, checked against the grid (it must be a whole multiple of it), or None (FLUX: the
        pipeline's latents are packed, their shape is no grid). ``tokens``: only the first that
        many tokens of the segment. The per-block sums are released."""
        import torch.nn.functional as F  # deferred: torch

        if not self.sums:
            raise RuntimeError("no joint attention was recorded: was the pipeline called inside the context?")
        image_hw = (int(image_hw[0]), int(image_hw[1]))
        grids = {name: self._grid(s.shape[1], latent_hw, image_hw) for name, s in self.sums.items()}   # all checked
        total, used = None, 0
        for name in list(self.sums):
            s = self.sums.pop(name)
            keep = s.shape[-1] if tokens is None else max(1, min(int(tokens), s.shape[-1]))
            s = s[..., :keep]
            b, positions, t = s.shape
            h, w = grids[name]
            grid = s.transpose(1, 2).reshape(b, t, h, w)
            up = F.interpolate(grid, size=image_hw, mode="bicubic", align_corners=False).clamp_(min=0)
            total = up if total is None else total.add_(up)
            used += 1
            del s, grid, up
        return total.div_(used)

    def _grid(self, positions: int, latent_hw, image_hw) -> tuple[int, int]:
        grid = self.grid if self.grid is not None and self.grid[0] * self.grid[1] == positions \
            else token_grid(positions, image_hw)
        if latent_hw is not None:
            lat_h, lat_w = int(latent_hw[0]), int(latent_hw[1])
            if lat_h % grid[0] or lat_w % grid[1] or lat_h // grid[0] != lat_w // grid[1]:
                raise ValueError(f"{positions} image positions on a {grid[0]}x{grid[1]} grid do not tile a "
                                 f"{lat_h}x{lat_w} latent (FLUX's latents are packed: pass latent_hw=None)")
        return grid

    def release(self) -> None:
        """Drop what was recorded and not yet turned into heat maps."""
        self.sums.clear()
        self.token_sums.clear()

    # -- words -------------------------------------------------------------------------------------

    @staticmethod
    def word_positions(tokenizer, prompt: str, words=None) -> dict[str, list[int]]:
        """{word: token positions (0 = the first token, the tokenizer's specials left out)} of each of
        ``words`` (default: every word of ``prompt`` by ``cross_attention.WORD``, lower case) at
        every occurrence in the prompt, by character offsets (module docstring). A word of several
        ``WORD`` words ("x-ray") matches them in a row. A tokenizer without offsets (a slow one) is
        matched by token ids, as ``CrossAttentionCapture.word_positions`` does."""
        if not getattr(tokenizer, "is_fast", False):
            return CrossAttentionCapture.word_positions(tokenizer, prompt, words)
        enc = tokenizer(prompt, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        pieces = tokenizer.convert_ids_to_tokens(enc.input_ids)
        spans = [(s, e) if p.replace("\u2581", "").strip() else (0, 0)        # "▁" alone: no character
                 for p, (s, e) in zip(pieces, enc.offset_mapping)]
        return positions_of_words(prompt, spans, words)

    @staticmethod
    def word_heat_maps(tokenizer, prompt: str, maps, words=None) -> dict[str, np.ndarray]:
        """{word: (H, W) float32}: for each word of ``prompt`` (or of ``words``), the mean of the maps
        of its tokens, over every occurrence. ``maps``: (tokens, H, W) of one image, token 0 = the
        segment's first token."""
        return word_maps(JointAttentionCapture.word_positions(tokenizer, prompt, words), maps)


def positions_of_words(prompt: str, spans, words=None) -> dict[str, list[int]]:
    """{word: the positions whose character span ``spans[j]`` = (start, end) in ``prompt`` overlaps
    the word} for each of ``words`` (default: every word of ``prompt`` by ``cross_attention.WORD``,
    lower case) at every occurrence; a word of several ``WORD`` words ("x-ray") matches them in a
    row. A span (0, 0) holds no character."""
    # lower case, one character for one (spans index the prompt as given)
    text = "".join(c.lower() if len(c.lower()) == 1 else c for c in prompt)
    found = [(m.group(), m.start(), m.end()) for m in WORD.finditer(text)]
    out = {}
    for word in dict.fromkeys(m[0] for m in found) if words is None else dict.fromkeys(words):
        parts = WORD.findall(str(word).lower())
        if not parts:
            continue
        positions: list[int] = []
        for i in range(len(found) - len(parts) + 1):
            if [f[0] for f in found[i:i + len(parts)]] == parts:
                lo, hi = found[i][1], found[i + len(parts) - 1][2]
                positions += [j for j, (s, e) in enumerate(spans) if s < hi and e > lo and e > s]
        if positions:
            out[word] = sorted(dict.fromkeys(positions))
    return out


def token_grid(positions: int, image_hw: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of ``positions`` image tokens laid out with the image's aspect ratio."""
    height, width = int(image_hw[0]), int(image_hw[1])
    for rows in range(1, positions + 1):
        if positions % rows == 0 and rows * width == (positions // rows) * height:
            return rows, positions // rows
    raise ValueError(f"{positions} image positions do not tile a {height}x{width} image")
