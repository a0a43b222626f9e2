"""Word heat maps of Kolors (``KolorsPipeline``): its SDXL-style UNet's cross-attention, DAAM's method as
``cross_attention.CrossAttentionCapture`` records it (the same layers, the conditional half of the
doubled CFG batch, the same combination), over the tokens of its ChatGLM3 encoder.

Two things differ from SD's CLIP text (``pipeline_kolors.py``, ``tokenizer.py`` in the installed
diffusers): the ChatGLM tokenizer pads on the left to 256 positions, after which come ``[gMASK]``,
``sop`` and the prompt's tokens, so the prompt ends the sequence instead of following a BOS; and it
is a slow SentencePiece tokenizer, with no character offsets. So the recorded columns are the
last ``tokens`` positions (128 by default: a project choice, the prompt's end; a prompt longer than
that loses its first words), and a prompt's positions are found in the ids the text encoder read
in the recorded call (its first call: the prompts'; the negative prompt's follows), where its own
ids, read alone, occur; its words' ids are matched within them as for SD
(``CrossAttentionCapture.word_positions``).
"""

from __future__ import annotations

from operators.support.cross_attention import CrossAttentionCapture, word_maps

KOLORS_TOKENS = 128


class KolorsAttentionCapture(CrossAttentionCapture):
    """``with KolorsAttentionCapture(pipe, guidance=...) as cap: pipe(...)``; then
    ``cap.heat_maps(latent_hw, image_hw)`` (images, tokens, H, W) maps of the text's last ``tokens``
    positions, and ``cap.word_positions(tokenizer, prompt, words)`` each word's among them."""

    def __init__(self, pipe, tokens: int | None = None, guidance: bool = True, layers: str = "daam"):
        super().__init__(pipe.unet, tokens=KOLORS_TOKENS if tokens is None else tokens, guidance=guidance,
                         layers=layers)
        self.pipe = pipe
        self.tokenizer = pipe.tokenizer
        self.rows = None
        self._hook = None

    @property
    def prompt_tokens(self) -> int:
        return self.tokens

    def __enter__(self):
        self.rows = None
        self._hook = self.pipe.text_encoder.register_forward_pre_hook(self._encoder_rows, with_kwargs=True)
        try:
            return super().__enter__()
        except BaseException:
            self._hook.remove()
            raise

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        return super().__exit__(*exc)

    def _encoder_rows(self, module, args, kwargs):
        if self.rows is None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                self.rows = [list(map(int, r)) for r in ids.tolist()]
        return None

    def kept_columns(self, probs):
        """The last ``tokens`` columns (the prompt ends the left-padded sequence)."""
        return probs[..., -self.tokens:]

    def word_positions(self, tokenizer, prompt: str, words=None) -> dict[str, list[int]]:
        """{word: positions among the recorded last ``tokens`` columns} of each of ``words`` (default:
        every word of the prompt), found through the row the encoder read for the prompt."""
        if self.rows is None:
            raise RuntimeError("no text encoder call was recorded: word positions come after the pipeline call")
        ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        n = len(ids)
        # the row the prompt ends (so a prompt that ends another prompt is found in its own row), else
        # the first row that holds it, at its last occurrence there
        found = []
        for k, row in enumerate(self.rows):
            last = next((i for i in range(len(row) - n, -1, -1) if row[i:i + n] == ids), None)
            if last is not None:
                found.append((row[len(row) - n:] != ids, k, last, row))
        if not found:
            return {}
        _, _, start, row = min(found, key=lambda f: f[:2])
        first = len(row) - self.tokens                    # the row position of the first recorded column
        words = CrossAttentionCapture.word_positions(self.tokenizer, prompt, words)
        out = {w: [start + p - first for p in ps if start + p >= first] for w, ps in words.items()}
        return {w: ps for w, ps in out.items() if ps}

    def word_heat_maps(self, tokenizer, prompt: str, maps, words=None):
        """{word: (H, W) float32}: the mean of the maps of its positions (``word_positions``)."""
        return word_maps(self.word_positions(tokenizer, prompt, words), maps)
