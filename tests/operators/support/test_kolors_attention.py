"""Kolors's word heat maps (operators/support/kolors_attention.py) on a tiny random pipeline of its
real classes (ChatGLM3 over a SentencePiece model, an SDXL-style UNet) loaded through the production
loader: recording does not change the image, each layer's record is a hand softmax of its own
queries and keys over the text's last positions, the prompt's words are found in the ids its
encoder read (left-padded), and a planted word lights its region."""

from __future__ import annotations

import pytest
import torch

from operators.support.attention_capture import capture_for
from operators.support.diffusion import load_text2image
from operators.support.kolors_attention import KolorsAttentionCapture
from pipelines.standins.families import build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["a doctor with a cat", "a nurse at work"]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return load_text2image(build_tiny_pipeline("kolors", tmp_path_factory.mktemp("kolors") / "k", seed=0),
                           device="cpu", dtype="float32")[0]


def generate(pipe, steps=2, prompts=PROMPTS):
    gens = [torch.Generator("cpu").manual_seed(3 + i) for i in range(len(prompts))]
    return pipe(prompt=list(prompts), num_inference_steps=steps, generator=gens, output_type="pt", height=64,
                width=64, guidance_scale=5.0).images


def test_recording_does_not_change_the_image_and_keeps_the_conditional_half(pipe):
    plain = generate(pipe)
    with capture_for(pipe, guidance=True, layers="all") as cap:
        recorded = generate(pipe)
    assert isinstance(cap, KolorsAttentionCapture) and torch.equal(plain, recorded)
    assert cap.sums and all(cap.steps[n] == 2 for n in cap.sums)     # one evaluation per step: the batch halved
    for name, s in cap.sums.items():
        assert s.shape[0] == len(PROMPTS) and s.shape[-1] == cap.tokens == 128
        heads = pipe.unet.get_submodule(name[:-len(".processor")]).heads
        assert torch.allclose(cap.token_sums[name], torch.full_like(cap.token_sums[name], 2.0 * heads), atol=1e-4)
    assert len(cap.rows) == len(PROMPTS) and all(len(r) == 256 for r in cap.rows)


def test_each_layer_records_a_hand_softmax_over_the_texts_last_positions(pipe):
    """One step: the inputs of every attn2, queries and keys by hand (to_q, to_k, heads), the
    conditional half, softmax over all 256 keys, the last 128 columns, heads summed."""
    seen = {}
    modules = {n: m for n, m in pipe.unet.named_modules() if n.endswith("attn2")}

    def keep(name):
        def hook(module, args, kwargs, output):
            seen.setdefault(name, (args[0] if args else kwargs["hidden_states"], kwargs["encoder_hidden_states"]))
        return hook

    hooks = [m.register_forward_hook(keep(n), with_kwargs=True) for n, m in modules.items()]
    try:
        with capture_for(pipe, guidance=True, layers="all") as cap:
            generate(pipe, steps=1)
    finally:
        for h in hooks:
            h.remove()
    assert set(seen) == {n[:-len(".processor")] for n in cap.sums}
    for name, (h, e) in seen.items():
        attn = modules[name]
        h, e = h[len(PROMPTS):], e[len(PROMPTS):]                         # [unconditional, conditional]
        q, k = attn.to_q(h), attn.to_k(e)
        d = q.shape[-1] // attn.heads
        ref = 0
        for head in range(attn.heads):
            scores = q[..., head * d:(head + 1) * d].double() @ k[..., head * d:(head + 1) * d].double().transpose(1, 2)
            ref = ref + (scores * d ** -0.5).softmax(dim=-1)
        assert torch.allclose(cap.sums[name + ".processor"].double(), ref[..., -128:], atol=1e-5), name


def test_words_are_found_in_the_rows_the_encoder_read(pipe):
    with capture_for(pipe, guidance=True) as cap:
        generate(pipe, steps=1, prompts=["a nurse with a cat", "cat"])
    for i, prompt in enumerate(["a nurse with a cat", "cat"]):
        row = cap.rows[i]
        first = len(row) - cap.tokens
        for word, positions in cap.word_positions(None, prompt).items():
            pieces = pipe.tokenizer.convert_ids_to_tokens([row[first + p] for p in positions])
            assert "".join(pieces).replace("\u2581", "") == word * prompt.split().count(word), (prompt, word, pieces)
    assert set(cap.word_positions(None, "a nurse with a cat")) == {"a", "nurse", "with", "cat"}


def test_a_planted_word_lights_its_region(pipe):
    """Every recorded layer's queries and keys made identity projections of planted inputs: the
    image's top-left quadrant and "cat"'s text positions share one direction, the rest is small."""
    prompt = "a doctor with a cat"
    with capture_for(pipe, guidance=True, layers="all") as cap:
        record = cap.record

        def planted(name, attn, hidden, text):
            cat = cap.word_positions(None, prompt)["cat"]
            g = torch.Generator().manual_seed(0)
            hidden = torch.randn(hidden.shape, generator=g) * 0.01
            text = torch.randn(text.shape, generator=g) * 0.01
            side = int(round(hidden.shape[1] ** 0.5))
            quadrant = [r * side + c for r in range(side // 2) for c in range(side // 2)]
            hidden[:, quadrant, :8] = 3.0
            text[:, [text.shape[1] - cap.tokens + p for p in cat], :8] = 3.0
            inner = attn.to_q.weight.shape[0]
            with torch.no_grad():
                saved = attn.to_q.weight.clone(), attn.to_k.weight.clone()
                attn.to_q.weight.copy_(torch.eye(inner, hidden.shape[-1]))
                attn.to_k.weight.copy_(torch.eye(inner, text.shape[-1]))
                try:
                    record(name, attn, hidden, text)
                finally:
                    attn.to_q.weight.copy_(saved[0])
                    attn.to_k.weight.copy_(saved[1])

        cap.record = planted
        generate(pipe, steps=1, prompts=[prompt])
    maps = cap.heat_maps((8, 8), (64, 64))[0]
    words = cap.word_heat_maps(None, prompt, maps, ["cat", "doctor"])
    cat, doctor = torch.as_tensor(words["cat"]), torch.as_tensor(words["doctor"])
    inside = cat[:32, :32].mean()
    outside = torch.cat([cat[32:].flatten(), cat[:32, 32:].flatten()]).mean()
    assert inside > 5 * outside
    assert doctor[:32, :32].mean() < 2 * doctor.mean()
