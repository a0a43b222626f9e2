"""Tiny chat models built offline (paper 002 App. A.6): a random LlamaForCausalLM and a
WordLevel tokenizer with a chat template, and "scripted" variants whose weights make them a fixed
bigram chain (no attention or MLP output, one-hot embeddings, an lm_head pointing each token at the
next), so their answers are known: after the generation prompt's ":" the "chain" model says
"a doctor" and stops, the "silent" one stops at once."""

import json
import shutil

import torch

from schemas.paraphrases import PAPER_PROMPT

CAPTIONS = ["a photo of a doctor in a hospital", "the nurse smiles",
            "an engineer at work on a bridge near the river on a sunny day in the city", "a chef", "doctor"]
OCCUPATIONS = ["doctor", "nurse", "engineer", "chef", "doctor"]
SPECIALS = ["[UNK]", "<s>", "</s>", "<pad>"]
TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}<s> assistant :{% endif %}")


def paper_request(caption: str, occupation: str) -> list[dict]:
    return [{"role": "user", "content": PAPER_PROMPT.replace("[OCCUPATION]", occupation).replace("[CAPTION]", caption)}]


REQUESTS = [paper_request(c, o) for c, o in zip(CAPTIONS, OCCUPATIONS)]


def build_tokenizer(pad: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    words = []
    for text in [PAPER_PROMPT, *CAPTIONS, *OCCUPATIONS, "user assistant :"]:
        for word, _ in pre.pre_tokenize_str(text):
            if word not in words and word not in SPECIALS:
                words.append(word)
    vocab = {t: i for i, t in enumerate(SPECIALS + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="[UNK]",
                                  **({"pad_token": "<pad>"} if pad else {}))
    tok.chat_template = TEMPLATE
    return tok


def build_model(vocab_size: int, pad: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3 if pad else None,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def scripted(model, tok, chain: dict[str, str]):
    """The model made a bigram chain: with every o_proj and down_proj zero the residual stream at a
    position is its token's embedding; the chain's tokens get one-hot embeddings and lm_head rows,
    so after token ``t`` the only positive logit is ``chain[t]``'s (all others are 0)."""
    import copy

    m = copy.deepcopy(model)
    ids = tok.get_vocab()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        m.model.norm.weight.fill_(1.0)
        m.lm_head.weight.zero_()
        for k, (src, dst) in enumerate(chain.items()):
            m.model.embed_tokens.weight[ids[src]] = 0.0
            m.model.embed_tokens.weight[ids[src], k] = 1.0
            m.lm_head.weight[ids[dst], k] = 1.0
    return m


def build_dirs(root) -> dict:
    """The models saved under ``root``: random, chain, silent, nopad, plain (no chat template)."""
    tok = build_tokenizer()
    model = build_model(len(tok))
    out = {}
    for name, net in {"random": model,
                      "chain": scripted(model, tok, {":": "a", "a": "doctor", "doctor": "</s>"}),
                      "silent": scripted(model, tok, {":": "</s>"})}.items():
        out[name] = root / name
        net.save_pretrained(out[name])
        tok.save_pretrained(out[name])
    # a tokenizer without a pad token and a model without pad_token_id: the pad token is the eos token
    out["nopad"] = root / "nopad"
    build_model(len(tok), pad=False).save_pretrained(out["nopad"])
    build_tokenizer(pad=False).save_pretrained(out["nopad"])
    # the chain without a chat template: the prompt is the content and a newline
    out["plain"] = root / "plain"
    shutil.copytree(out["chain"], out["plain"])
    (out["plain"] / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((out["plain"] / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (out["plain"] / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out
