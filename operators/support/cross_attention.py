"""Word heat maps from Stable Diffusion's cross-attention, DAAM's method (Tang et al. 2023), as paper
004 uses it for the prompt-image dependency groups (section 6, App. A "DAAM").

The cross-attention layers of the UNet (``attn2`` of each transformer block) record the attention
probabilities A_t = softmax(Q K^T / sqrt(d)) between the latent positions and the prompt tokens
during generation, through diffusers' attention-processor interface. Which layers, and how their
maps are combined, is ``layers``:

- ``"daam"`` (the default), DAAM's defaults as castorini/daam implements them (``daam/trace.py``
  at commit 09564e0: ``UNetCrossAttentionLocator(locate_middle_block=False)`` in ``trace.__init__``,
  so the mid block is not hooked; ``UNetCrossAttentionHooker.__call__`` records a map only when its
  spatial factor ``sqrt(latent_hw // positions)`` is not 8; ``compute_global_heat_map`` upsamples
  every map bicubically to the 64 x 64 latent grid, clamps it at 0 and averages; ``heatmap.py``
  ``WordHeatMap.expand_as`` then upsamples bicubically to the image, min-max normalised). Here: the
  down- and up-block layers, those whose grid is 1/8 of the latent's left out (for SD 1.x at 512 px
  that is only the mid block's 8 x 8 maps: 15 layers at 64, 32 and 16 remain), each upsampled to
  the latent grid, clamped, averaged, then expanded to the image (bicubic, no clamp).
- ``"all"`` (the other reading): every ``attn2``, the mid block's included, each
  upsampled straight to the image size, clamped, averaged.

In both:

- only the conditional half of a classifier-free-guidance batch (the prompt's, not the empty
  prompt's);
- summed over the heads and over the denoising steps (every UNet evaluation: PNDM's warm-up
  steps included) *per layer*, in place: one running (images x
  positions x tokens) sum per layer, so no per-step map is kept once its step is done;
- at the end (``heat_maps``) each layer's map is laid out on its grid and combined as above. DAAM
  keeps each head's map and clamps it before averaging; here the heads are summed first (bicubic
  interpolation is linear, so the two differ only where a single head's map undershoots below 0).

A word's heat map is the mean of the maps of its sub-word tokens (every occurrence of the word in
the prompt); ``objects.attention_mask`` then min-max normalises and binarises it at θ.

Recording never changes the generated image: the wrapped processor computes the layer's output
exactly as without the capture (the recorder only reads the layer's inputs and recomputes the probabilities on
the side, in float32); tests compare the images bit for bit. The original processors are restored
when the context ends.
"""

from __future__ import annotations

import math
import re

import numpy as np

WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")


class _Recorder:
    """Wraps one cross-attention processor: output from the original, probabilities recorded."""

    def __init__(self, inner, name: str, capture: "CrossAttentionCapture"):
        self.inner, self.name, self.capture = inner, name, capture

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        if encoder_hidden_states is not None and self.capture.recording:
            self.capture.record(self.name, attn, hidden_states, encoder_hidden_states)
        return out


class CrossAttentionCapture:
    """``with CrossAttentionCapture(pipe.unet, tokens=n) as cap: pipe(...)``; then
    ``cap.heat_maps(latent_hw, image_hw)`` gives (images, tokens, H, W) maps of tokens 1..n (the
    first token, BOS, is left out)."""

    LAYERS = ("daam", "all")

    def __init__(self, unet, tokens: int = 76, guidance: bool = True, layers: str = "daam"):
        if layers not in self.LAYERS:
            raise ValueError(f"layers must be one of {self.LAYERS}, got {layers!r}")
        self.layers = layers
        self.unet = unet
        self.tokens = int(tokens)
        self.guidance = bool(guidance)
        self.sums: dict = {}
        self.steps: dict = {}
        # per layer, the probabilities summed over *all* tokens: heads x steps at every position
        # (a softmax sums to 1), kept as a check of what was recorded
        self.token_sums: dict = {}
        self.recording = False
        self._originals = None

    def __enter__(self):
        self._originals = dict(self.unet.attn_processors)
        wrapped = {name: (_Recorder(proc, name, self) if self._hooked(name) else proc)
                   for name, proc in self._originals.items()}
        if not any(isinstance(p, _Recorder) for p in wrapped.values()):
            raise ValueError(f"{type(self.unet).__name__} has no cross-attention layer (attn2) to record")
        self.unet.set_attn_processor(wrapped)
        self.recording = True
        return self

    def _hooked(self, name: str) -> bool:
        """Whether the processor ``name`` is recorded: every attn2; with "daam" not the mid block's."""
        if not name.endswith("attn2.processor"):
            return False
        return self.layers == "all" or not name.startswith("mid_block.")

    def __exit__(self, *exc):
        self.recording = False
        self.unet.set_attn_processor(self._originals)
        return False

    def record(self, name: str, attn, hidden_states, encoder_hidden_states) -> None:
        import torch  # deferred: torch

        with torch.no_grad():
            h = hidden_states
            if h.ndim == 4:
                b, c, hh, ww = h.shape
                h = h.view(b, c, hh * ww).transpose(1, 2)
            e = encoder_hidden_states
            if self.guidance:
                half = h.shape[0] // 2
                h, e = h[half:], e[half:]
            if attn.group_norm is not None:
                h = attn.group_norm(h.transpose(1, 2)).transpose(1, 2)
            if attn.norm_cross:
                e = attn.norm_encoder_hidden_states(e)
            q, k = attn.to_q(h), attn.to_k(e)
            b, length, inner = q.shape
            d = inner // attn.heads
            q = q.view(b, length, attn.heads, d).transpose(1, 2)
            k = k.view(b, k.shape[1], attn.heads, d).transpose(1, 2)
            if attn.norm_q is not None:
                q = attn.norm_q(q)
            if attn.norm_k is not None:
                k = attn.norm_k(k)
            scores = (q.float() @ k.float().transpose(-1, -2)) * attn.scale
            probs = scores.softmax(dim=-1).sum(dim=1)          # heads summed: (b, positions, all tokens)
            kept = self.kept_columns(probs)
            if name in self.sums:
                self.sums[name].add_(kept)
            else:
                self.sums[name] = kept.clone()
            self.steps[name] = self.steps.get(name, 0) + 1
            self.token_sums[name] = self.token_sums.get(name, 0) + probs.sum(dim=-1)

    def kept_columns(self, probs):
        """The recorded token columns of (b, positions, all tokens) probabilities: 1..tokens (after BOS)."""
        return probs[..., 1:1 + self.tokens]

    def heat_maps(self, latent_hw: tuple[int, int], image_hw: tuple[int, int], tokens: int | None = None):
        """(images, tokens, H, W) float32 on the UNet's device: per layer summed over steps and heads,
        laid out on its grid, combined as ``layers`` says (module docstring) at ``image_hw``.
        ``tokens``: only the first that many tokens (after BOS; the prompt's own, not the padding),
        so that the full-size maps of tokens nobody reads are never made. The per-layer sums are
        released."""
        import torch.nn.functional as F  # deferred: torch

        if not self.sums:
            raise RuntimeError("no cross-attention was recorded: was the pipeline called inside the context?")
        lat_h, lat_w = latent_hw
        keep = self.tokens if tokens is None else max(1, min(int(tokens), self.tokens))
        daam = self.layers == "daam"
        size = (lat_h, lat_w) if daam else tuple(image_hw)   # DAAM: average on the latent grid first
        total, used = None, 0
        for name in list(self.sums):
            s = self.sums.pop(name)[..., :keep]                # (b, positions, tokens)
            b, positions, t = s.shape
            factor = max(1, round(math.sqrt(lat_h * lat_w / positions)))   # the layer's downsampling
            h, w = lat_h // factor, lat_w // factor
            if lat_h % factor or lat_w % factor or h * w != positions:
                raise ValueError(f"layer {name}: {positions} positions do not tile a {lat_h}x{lat_w} latent")
            if daam and factor == 8:
                continue                                       # DAAM skips the maps at 1/8 of the latent grid
            grid = s.transpose(1, 2).reshape(b, t, h, w)
            up = F.interpolate(grid, size=size, mode="bicubic", align_corners=False).clamp_(min=0)
            total = up if total is None else total.add_(up)
            used += 1
            del s, grid, up
        if total is None:
            raise RuntimeError("no cross-attention layer is left to average (every recorded map was at 1/8 of the "
                               "latent grid)")
        total = total / used
        if daam and tuple(image_hw) != (lat_h, lat_w):
            total = F.interpolate(total, size=tuple(image_hw), mode="bicubic", align_corners=False)
        return total

    def release(self) -> None:
        """Drop what was recorded and not yet turned into heat maps."""
        self.sums.clear()

    @staticmethod
    def word_positions(tokenizer, prompt: str, words=None) -> dict[str, list[int]]:
        """{word: token positions (0 = the first token after BOS)} of each of ``words`` (default: every
        word of ``prompt``, lower case, letters and digits) at every occurrence in the prompt."""
        ids = tokenizer(prompt, add_special_tokens=False, truncation=False).input_ids
        out = {}
        for word in dict.fromkeys(WORD.findall(prompt.lower()) if words is None else words):
            piece = tokenizer(word, add_special_tokens=False).input_ids
            if not piece:
                continue
            positions = [i + j for i in range(len(ids) - len(piece) + 1) if ids[i:i + len(piece)] == piece
                         for j in range(len(piece))]
            if positions:
                out[word] = positions
        return out

    @staticmethod
    def word_heat_maps(tokenizer, prompt: str, maps, words=None) -> dict[str, np.ndarray]:
        """{word: (H, W) float32}: for each word of ``prompt`` (or of ``words``), the mean of the maps
        of its tokens, over every occurrence. ``maps``: (tokens, H, W) of one image, token 0 = the
        first token after BOS."""
        return word_maps(CrossAttentionCapture.word_positions(tokenizer, prompt, words), maps)


def word_maps(positions: dict[str, list[int]], maps) -> dict[str, np.ndarray]:
    """{word: (H, W) float32}: the mean of the maps at each word's token ``positions`` (those
    beyond ``maps``' tokens left out; a word with none left gets no map). ``maps``: (tokens, H, W)."""
    arr = maps.detach().float().cpu().numpy() if hasattr(maps, "detach") else np.asarray(maps, np.float32)
    out = {}
    for word, found in positions.items():
        found = [p for p in found if p < arr.shape[0]]
        if found:
            out[word] = arr[found].mean(axis=0)
    return out
