"""A tiny random-weight BLIP-2 with a Flan-T5-style language model, saved with ``save_pretrained``.

It is a random stand-in: every weight is drawn from transformers' own initialisation, so its
answers are arbitrary token strings and the genders and attributes parsed from them are
meaningless. It exists so that tests and the offline embedded run exercise the production
loading and question-answering code (``operators.image_blip2_vqa.load_blip2`` /
``Blip2Detector``) without downloading ``Salesforce/blip2-flan-t5-xl`` (about 16 GB).

What it shares with the real checkpoint: the classes (``Blip2ForConditionalGeneration`` with a
``T5ForConditionalGeneration`` language model, gated-GELU feed-forward and untied embeddings as in
Flan-T5; ``Blip2Processor`` = ``BlipImageProcessor`` + a fast tokenizer), T5's special tokens
(``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, ``</s>`` appended to every input) and the way image tokens
are wired: the tokenizer has an ``<image>`` token, ``config.image_token_index`` is its id and the
processor's ``num_query_tokens`` equals ``config.num_query_tokens``, so ``Blip2Processor`` puts
exactly as many ``<image>`` tokens in front of the text as the Q-Former yields query outputs.

The tokenizer is a word-level vocabulary over a small in-code corpus (built offline with the
``tokenizers`` library), not T5's SentencePiece model: words outside it become ``<unk>``.
"""

from __future__ import annotations

from pipelines.standins.tiny import output_dir, save_model, seeded, write_note

IMAGE_TOKEN = "<image>"
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"  # ids 0, 1, 2 as in T5

# Words the tokenizer knows: the detector's questions, the answers it parses, and the attributes
# of the DALL-Eval study, plus some filler so that random answers are varied.
CORPUS = """
question answer the person looks like a male or female ? is wearing : yes no yeah yep nope maybe
man woman boy girl gentleman lady men women people it he she they his her this that there not sure
suit jeans skirt dress tie glasses hat scarf uniform boots sneakers shorts jacket coat shirt t-shirt
apron helmet mask gloves lab vest sweater cap jewelry makeup earrings necklace bag backpack
an of in on with and to photo picture image unknown both neither nurse doctor teacher engineer
black white red blue green brown grey yellow pink long short hair beard smiling standing sitting
one two three . ,
"""

TINY_IMAGE_SIZE = 32
TINY_NUM_QUERY_TOKENS = 4
# Larger-than-default initial weights: with transformers' defaults a model this small gives the
# same answer whatever the image; with these its (meaningless) answers vary with image and question.
INIT_RANGE = 0.5
T5_INIT_FACTOR = 4.0


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` with T5's special tokens and ``<image>``, built offline."""
    # deferred: tokenizers, transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = []
    for w in CORPUS.split():
        if w not in words:
            words.append(w)
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # join words with spaces, tidy punctuation
    tok.post_processor = processors.TemplateProcessing(  # T5 appends </s> to every input
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, vocab[EOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        model_max_length=512, padding_side="right",
    )
    fast.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    return fast


def build_tiny_blip2(directory, seed: int = 0) -> str:
    """Build a tiny random BLIP-2 (T5 language model) and its processor in ``directory``
    (created if needed); return the absolute directory path. The same seed writes the same weights."""
    # deferred: torch, transformers
    import torch
    from transformers import (Blip2Config, Blip2ForConditionalGeneration, Blip2Processor, Blip2QFormerConfig,
                              Blip2VisionConfig, BlipImageProcessor, T5Config)

    out = output_dir(directory)
    tokenizer = build_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)

    vision = Blip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=TINY_IMAGE_SIZE, patch_size=8, initializer_range=INIT_RANGE,
    )
    qformer = Blip2QFormerConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        encoder_hidden_size=32, cross_attention_frequency=1, vocab_size=64, max_position_embeddings=64,
        initializer_range=INIT_RANGE,
    )
    text = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0,
        initializer_factor=T5_INIT_FACTOR,
    )
    config = Blip2Config(
        vision_config=vision.to_dict(), qformer_config=qformer.to_dict(), text_config=text.to_dict(),
        num_query_tokens=TINY_NUM_QUERY_TOKENS, image_token_index=image_token_id, initializer_range=INIT_RANGE,
    )
    with seeded(seed):
        model = Blip2ForConditionalGeneration(config)
        # query tokens start at zero in transformers' init; give them values so the Q-Former's
        # outputs differ between queries, as in a trained model
        with torch.no_grad():
            model.query_tokens.normal_(0.0, INIT_RANGE)
    model.generation_config.max_new_tokens = 10
    save_model(model, out)

    image_processor = BlipImageProcessor(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})
    processor = Blip2Processor(image_processor=image_processor, tokenizer=tokenizer,
                               num_query_tokens=TINY_NUM_QUERY_TOKENS)
    processor.save_pretrained(out)
    write_note(out, "BLIP-2", seed, "answers")
    return str(out)
