"""Word heat maps of Chroma, FLUX.2 (dev, klein), Qwen-Image, HunyuanImage 2.1, CogView4, Lumina 2 and Z-Image read
at the attention kernel
(operators/support/kernel_attention.py), on tiny random pipelines of the real classes loaded through
the production loader: recording does not change the image, only the conditional evaluations
count, the recorded probabilities are a hand computation of each block's softmax (its mask and
scale included) on the query and key it attends with, the text positions are the pipeline's own
tokens, and a planted word lights its region."""

from __future__ import annotations

import sys

import pytest
import torch

from operators.support.attention_capture import capture_for
from operators.support.diffusion import load_text2image
from operators.support.kernel_attention import KernelAttentionCapture, text_spans
from pipelines.standins.families import STANDIN_SIZE, build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ("chroma", "flux2", "flux2-klein", "qwen-image", "hunyuan-image", "cogview4", "lumina2", "z-image", "sana",
            "sana-sprint", "pixart", "hidream")
PROMPTS = ["a doctor with a cat", "a nurse at work"]
# max_sequence_length: the stand-ins read one token per byte, so FLUX.2-dev's system message and the
# part of Qwen-Image's template its pipeline keeps come first
# (Lumina 2's system prompt too); HunyuanImage: 1,000 positions, fixed
SEQ = {"flux2": 256, "qwen-image": 256, "lumina2": 256, "z-image": 128, "hunyuan-image": None, "sana": None,
       "sana-sprint": None}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel")
    return {f: load_text2image(build_tiny_pipeline(f, root / f, seed=0), device="cpu", dtype="float32")[0]
            for f in FAMILIES}


def call_kwargs(family, n):
    """Each family's CFG switched on where it has one (Chroma, klein, Qwen-Image's true CFG)."""
    if family == "qwen-image":
        return {"true_cfg_scale": 4.0, "negative_prompt": [" "] * n}
    if family == "hunyuan-image":
        return {}                                          # its guider holds the guidance
    return {"guidance_scale": 4.0}


def generate(pipe, family, steps=2, prompts=PROMPTS):
    if family == "sana-sprint":
        steps = 2                      # its consistency sampler runs 2 steps only
    gens = [torch.Generator("cpu").manual_seed(3 + i) for i in range(len(prompts))]
    seq, size = SEQ.get(family, 64), STANDIN_SIZE.get(family, 64)     # SANA's resolution bins: 512, 1024 px
    return pipe(prompt=list(prompts), num_inference_steps=steps, generator=gens, output_type="pt", height=size,
                width=size, **({} if seq is None else {"max_sequence_length": seq}),
                **call_kwargs(family, len(prompts))).images


def kernel_module(pipe):
    from operators.support.kernel_attention import FAMILIES as READ

    family = READ[type(pipe.transformer).__name__]
    attn = getattr(pipe.transformer, family.blocks[0])[0].get_submodule(family.attn)
    return sys.modules[type(attn.processor).__module__]


class SpyF:
    """A processor module's ``F`` whose scaled_dot_product_attention goes through ``spy`` with
    (B, S, heads, d) tensors, as dispatch_attention_fn receives them."""

    def __init__(self, functional, spy):
        self.functional, self.spy = functional, spy

    def __getattr__(self, name):
        return getattr(self.functional, name)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, *args, **kwargs):
        def through(q, k, v, mask=None, *a, **kw):
            return self.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2), mask, *a, **kw).transpose(1, 2)
        return self.spy(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask, *args,
                        _through=through, **kwargs).transpose(1, 2)


def patch_kernel(pipe, make):
    """Put ``make(original)`` in place of the kernel the family's processors call now ((B, S,
    heads, d) tensors either way); returns the function that puts it back."""
    where = kernel_module(pipe)
    name = "dispatch_attention_fn" if hasattr(where, "dispatch_attention_fn") else "F"
    before = getattr(where, name)
    if name == "F":
        fn = make(None)
        setattr(where, name, SpyF(before, lambda *a, _through, **kw: fn(*a, _through=_through, **kw)))
    else:
        fn = make(before)
        setattr(where, name, lambda *a, **kw: fn(*a, **kw))
    return lambda: setattr(where, name, before)


@pytest.mark.parametrize("family", FAMILIES)
def test_recording_does_not_change_the_image_and_keeps_the_conditional_evaluations(pipes, family):
    pipe = pipes[family]
    plain = generate(pipe, family)
    with capture_for(pipe, guidance=True) as cap:
        recorded = generate(pipe, family)
    assert isinstance(cap, KernelAttentionCapture)
    assert torch.equal(plain, recorded)
    blocks = {f"{a}.{i}.{cap.family.attn}" for a in cap.family.blocks for i in range(len(getattr(pipe.transformer, a)))}
    assert set(cap.sums) == blocks and all(cap.steps[b] == 2 for b in blocks)    # one per step: CFG's left out
    config = pipe.transformer.config
    heads = config.n_heads if "n_heads" in config else config.num_attention_heads      # Z-Image names it n_heads
    for name, total in cap.token_sums.items():                   # each row a softmax: heads x evaluations
        assert torch.allclose(total, torch.full_like(total, 2.0 * heads), atol=1e-4), name
    size = STANDIN_SIZE.get(family, 64)
    grid = {"hunyuan-image": (8, 8), "hidream": (16, 16)}.get(family, (size // 16, size // 16) if "sana" not in family else
                                         (size // 32, size // 32))      # HunyuanImage 8x, patch 1; SANA 32x
    assert cap.grid == grid and all(s.shape == (2, grid[0] * grid[1], cap.text_tokens) for s in cap.sums.values())
    maps = cap.heat_maps(None, (64, 64), tokens=6)
    assert maps.shape == (2, 6, 64, 64) and (maps >= 0).all()
    where = kernel_module(pipe)                                       # the kernel is the module's own again
    assert where.dispatch_attention_fn.__name__ == "dispatch_attention_fn" if hasattr(where, "dispatch_attention_fn") \
        else where.F is torch.nn.functional
    assert "cache_context" not in pipe.transformer.__dict__


def hand_softmax(q, k, rows, col, n, scale, mask):
    """Head by head, row by row: softmax over every key of scale * q.k (+ the mask: additive, or
    -inf where False), the image rows and the text columns col..col+n, summed over the heads."""
    b, s, heads, d = q.shape
    out = torch.zeros(b, rows.stop - rows.start, n, dtype=torch.float64)
    for i in range(b):
        for h in range(heads):
            scores = (q[i, :, h].double() @ k[i, :, h].double().T) * (d ** -0.5 if scale is None else scale)
            if mask is not None:
                m = mask[i]
                m = m[h if m.shape[0] > 1 else 0] if m.ndim == 3 else m       # (heads, rows, keys): this head's
                m = m.reshape(-1, mask.shape[-1])
                m = m.expand(s, -1) if m.shape[0] == 1 else m
                scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.double()
            p = torch.exp(scores - scores.max(dim=1, keepdim=True).values)
            p = p / p.sum(dim=1, keepdim=True)
            out[i] += p[rows, col:col + n]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_recorded_probabilities_are_each_blocks_softmax_by_hand(pipes, family):
    """One step; the query, key, mask and scale every recorded block hands its kernel, spied on
    under the recorder: the sums are the hand computation (Chroma's float mask added, Qwen-Image's
    boolean mask applied), the text from the prompt's first token."""
    pipe = pipes[family]
    seen, holder = [], {}

    def make(original):
        def spy(query, key, value, attn_mask=None, *args, _through=None, **kwargs):
            cap = holder.get("cap")
            if cap is not None and cap.current is not None and cap.active:      # a recorded block's call
                seen.append((query.clone(), key.clone(), None if attn_mask is None else attn_mask.clone(),
                             args[3] if len(args) > 3 else kwargs.get("scale")))
            return (_through or original)(query, key, value, attn_mask, *args, **kwargs)
        return spy

    restore = patch_kernel(pipe, make)
    try:
        with capture_for(pipe, guidance=True, tokens=5) as cap:
            holder["cap"] = cap
            generate(pipe, family, steps=1)
    finally:
        restore()
    names = [n for n in cap.sums]
    masks = [m for _, _, m, _ in seen]
    if family == "chroma":
        assert all(m is not None and m.dtype != torch.bool for m in masks)      # the additive float mask
    if family == "qwen-image":
        assert any(m is not None and m.dtype == torch.bool for m in masks)
    if family == "hunyuan-image":
        assert any(m is not None and m.dtype == torch.bool for m in masks)
    image = cap.grid[0] * cap.grid[1]
    steps = len(seen) // len(names)                                  # one recorded call per block and step
    assert len(seen) == steps * len(names) and steps == (2 if family == "sana-sprint" else 1)
    for b, name in enumerate(names):
        ref = sum(expected(cap, pipe, family, *seen[b + t * len(names)], image) for t in range(steps))
        got = cap.sums[name].double()
        assert torch.allclose(got, ref, atol=1e-5), name


def expected(cap, pipe, family, q, k, mask, scale, image):
    """The hand computation of one recorded call, in the family's layout."""
    n = cap.sums[next(iter(cap.sums))].shape[-1]                     # 5; CogView4 all
    if cap.family.cond_second:                                       # HiDream: [unconditional, conditional]
        assert q.shape[0] == 2 * len(PROMPTS)
        q, k, mask = q[len(PROMPTS):], k[len(PROMPTS):], None if mask is None else mask[len(PROMPTS):]
    if cap.family.cond_first:                                        # Z-Image: [conditional, unconditional]
        assert q.shape[0] == 2 * len(PROMPTS)
        q, k, mask = q[:len(PROMPTS)], k[:len(PROMPTS)], None if mask is None else mask[:len(PROMPTS)]
    if cap.family.order == "cross":                                  # SANA: image queries, text keys
        if q.shape[0] == 2 * len(PROMPTS):                           # [unconditional, conditional]
            q, k, mask = q[len(PROMPTS):], k[len(PROMPTS):], None if mask is None else mask[len(PROMPTS):]
        assert q.shape[1] == image and k.shape[1] == cap.text_tokens
        return hand_softmax(q, k, slice(0, image), cap.text_offset, n, scale, mask)
    if cap.family.order == "text-first, per sample":                 # Lumina 2: each sample's own text length
        _, lengths = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=256)[:2]
        lengths = lengths.sum(dim=1).tolist()
        assert len(set(lengths)) == 2                                # two text lengths in the batch
        out = torch.zeros(len(PROMPTS), image, n, dtype=torch.float64)
        for i, length in enumerate(lengths):
            width = min(n, length - cap.text_offset)
            out[i:i + 1, :, :width] = hand_softmax(q[i:i + 1], k[i:i + 1], slice(length, length + image),
                                                   cap.text_offset, width, scale,
                                                   None if mask is None else mask[i:i + 1])
        return out
    text_len = k.shape[1] - image - (-image) % cap.family.image_pad if cap.family.order == "image-first" \
        else k.shape[1] - image
    padded = image + (-image) % cap.family.image_pad                  # Z-Image pads its image to 32
    rows, col = ((slice(text_len, text_len + image), cap.text_offset) if cap.family.order == "text-first"
                 else (slice(0, image), padded + cap.text_offset))
    return hand_softmax(q, k, rows, col, n, scale, mask)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_positions_are_the_pipelines_own_tokens(pipes, family):
    """The ids ``text_spans`` maps to the prompt are the ids the pipeline's text encoder read, from
    the position where the denoiser's text sequence starts; each word's positions hold its
    characters. CogView4's (left-padded) are found in the rows its encoder read: each word's
    positions there hold the word's tokens, for prompts of different lengths in one batch."""
    pipe = pipes[family]
    family_of = KernelAttentionCapture(pipe).family
    if family_of.text == "rows" or family_of.select_last:
        with capture_for(pipe, guidance=True) as cap:
            generate(pipe, family, steps=1)
        assert len(cap.rows) == len(PROMPTS) and len({len(r) for r in cap.rows}) == 1
        length = len(cap.rows[0])
        if cap.family.select_last:     # SANA: the row's first position and its last (text length - 1)
            kept = [0, *range(length - cap.prompt_tokens + 1, length)]
        else:                          # CogView4: every position, padded on the left to a multiple of 16
            kept = list(range(length))
            assert length % 16 == 0 and cap.prompt_tokens == length
        for i, prompt in enumerate(PROMPTS):
            pos = cap.word_positions(None, prompt)
            assert set(pos) == set(prompt.split())
            for word, positions in pos.items():
                text = "".join(cap.tokenizer.decode([cap.rows[i][kept[p]]]) for p in positions)
                assert text.replace("\u2581", "").replace(" ", "") == word * prompt.split().count(word), (word, text)
        if cap.family.preprocessed:
            return
        # a prompt that ends another one is found in its own row, not inside the longer one's
        with capture_for(pipe, guidance=True) as cap:
            generate(pipe, family, steps=1, prompts=["a nurse with a cat", "cat"])
        row = cap.rows[1]
        (p,) = cap.word_positions(None, "cat")["cat"]
        assert cap.tokenizer.decode([row[p]]).replace("\u2581", "").strip() == "cat"
        assert all(t == cap.tokenizer.pad_token_id for t in row[:p])
        return
    seen = []
    encoder = pipe.text_encoder_3 if family == "hidream" else pipe.text_encoder     # HiDream: its T5 segment
    hook = encoder.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw.get("input_ids", a[0] if a else None), kw.get("attention_mask"))),
        with_kwargs=True)
    try:
        generate(pipe, family, steps=1, prompts=PROMPTS[:1])
    finally:
        hook.remove()
    ids, mask = seen[0]
    row = ids[0][mask[0].bool()] if mask is not None else ids[0]
    mine, spans, before = text_spans(pipe, PROMPTS[0])
    drop = int(getattr(pipe, "prompt_template_encode_start_idx", 0))
    assert row.tolist()[drop:] == mine
    cap = KernelAttentionCapture(pipe, guidance=False)
    pos = cap.word_positions(None, PROMPTS[0])
    assert set(pos) == {"a", "doctor", "with", "cat"}
    for word, positions in pos.items():
        text = "".join(PROMPTS[0][s:e] for s, e in (spans[cap.text_offset + p] for p in positions))
        assert word in text.replace(" ", "") or text.strip() == word, (word, text)
    assert before == cap.text_offset and spans[cap.text_offset][0] == 0     # the segment starts at the prompt
    assert all(e == 0 for _, e in spans[:cap.text_offset])


def test_a_left_padded_prompt_is_read_where_it_sits(pipes):
    """FLUX.2-dev's Mistral tokenizer pads on the left, and its pipeline hands the padded sequence
    to the transformer: each prompt's columns start after its own padding (the capture's ``lead``),
    as a hand softmax at those columns shows for two prompts of different lengths."""
    pipe = pipes["flux2"]
    tokenizer = pipe.tokenizer.tokenizer
    seen, holder = [], {}

    def make(original):
        def spy(query, key, value, attn_mask=None, *args, _through=None, **kwargs):
            cap = holder.get("cap")
            if cap is not None and cap.current is not None and cap.active:
                seen.append((query.clone(), key.clone(), kwargs.get("scale")))
            return original(query, key, value, attn_mask, *args, **kwargs)
        return spy

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    restore = patch_kernel(pipe, make)
    try:
        with capture_for(pipe, guidance=True, tokens=5) as cap:
            holder["cap"] = cap
            generate(pipe, "flux2", steps=1)
    finally:
        restore()
        tokenizer.padding_side = side
    assert cap.lead is not None and len(set(cap.lead)) == 2                # two paddings
    name = next(iter(cap.sums))
    q, k, scale = seen[0]
    text_len = k.shape[1] - 16
    for i, lead in enumerate(cap.lead):
        ref = hand_softmax(q[i:i + 1], k[i:i + 1], slice(text_len, text_len + 16), cap.text_offset + lead, 5, scale,
                           None)
        assert torch.allclose(cap.sums[name][i:i + 1].double(), ref, atol=1e-5)
        row = cap.rows[i]
        assert row[lead + cap.text_offset] == tokenizer(PROMPTS[i], add_special_tokens=False).input_ids[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_planted_word_lights_its_region(pipes, family):
    """Queries of the image's top-left quadrant and the keys of "cat"'s tokens set to one shared
    direction (every other query and key small): the word map of "cat" is brightest in that
    quadrant, "doctor"'s is not."""
    pipe = pipes[family]
    prompt = "a doctor with a cat"
    cap = capture_for(pipe, guidance=True)

    def make(original):
        def plant(query, key, value, attn_mask=None, *args, _through=None, **kwargs):
            if cap.current is not None and cap.active:
                cat = [cap.text_offset + p for p in cap.word_positions(None, prompt)["cat"]]
                h, w = cap._call_grid
                image = h * w
                text_len = query.shape[1] - image
                quadrant = [r * w + c for r in range(h // 2) for c in range(w // 2)]      # the top-left quarter
                first = cap.family.order != "image-first"          # Lumina 2: text first in each sample
                g = torch.Generator().manual_seed(0)
                query = torch.randn(query.shape, generator=g) * 0.01
                key = torch.randn(key.shape, generator=g) * 0.01
                direction = torch.ones(query.shape[-1]) * 3.0
                query[:, [(text_len if first else 0) + r for r in quadrant]] = direction
                key[:, [(0 if first else image + (-image) % cap.family.image_pad) + p for p in cat]] = direction
            return (_through or original)(query, key, value, attn_mask, *args, **kwargs)   # the recorder's, planted
        return plant

    with cap:
        restore = patch_kernel(pipe, make)
        try:
            generate(pipe, family, steps=1, prompts=[prompt])
        finally:
            restore()
    maps = cap.heat_maps(None, (64, 64))[0]
    words = cap.word_heat_maps(None, prompt, maps, ["cat", "doctor"])
    cat_map, doctor_map = torch.as_tensor(words["cat"]), torch.as_tensor(words["doctor"])
    inside, outside = cat_map[:32, :32].mean(), torch.cat([cat_map[32:].flatten(), cat_map[:32, 32:].flatten()]).mean()
    assert inside > 5 * outside
    assert doctor_map[:32, :32].mean() < 2 * doctor_map.mean()


def test_a_recorder_failure_leaves_the_images_and_the_maps_say_why(pipes, monkeypatch):
    """A failure inside the recorder stops the recording, not the generation: the images are those
    made without the capture, and the maps raise one line naming the block and the error. A compiled
    transformer is refused before any work (its graph calls no kernel to read)."""
    pipe = pipes["chroma"]
    plain = generate(pipe, "chroma")
    cap = capture_for(pipe, guidance=True)

    def broken(*args, **kwargs):
        raise ValueError("something in the recorder")

    monkeypatch.setattr(cap, "record_kernel", broken)
    with cap:
        images = generate(pipe, "chroma")
    assert torch.equal(plain, images)
    with pytest.raises(RuntimeError, match="transformer_blocks.0.attn: ValueError: something in the recorder") as err:
        cap.heat_maps(None, (64, 64))
    assert "\n" not in str(err.value)
    monkeypatch.setattr(pipe.transformer, "_compiled_call_impl", object())
    with pytest.raises(ValueError, match="--gen-compile"):
        with capture_for(pipe, guidance=True):
            pass
