"""Tiny random-weight open-vocabulary detectors and SAM, saved with ``save_pretrained`` the way the
hub checkpoints are (paper 004, section 5 "Detecting generated objects").

They are random stand-ins: every weight comes from transformers' own initialisation, so the boxes,
labels and masks they give are meaningless. They exist so that tests and the offline embedded run
exercise the production loading, preprocessing and post-processing code
(``operators.image_grounded_segmentation``) without downloading the real models:

- ``build_tiny_grounding_dino``: a ``GroundingDinoForObjectDetection`` (Swin backbone, BERT text
  encoder, 12 queries instead of 900) with a ``GroundingDinoProcessor``: the
  ``GroundingDinoImageProcessor`` of ``IDEA-Research/grounding-dino-tiny`` (bilinear, ImageNet mean
  and std, padding) with a smaller size (shortest edge 128, longest 192 instead of 800 / 1333) and a
  lower-casing BERT WordPiece tokenizer over a small vocabulary (the special tokens, "." and "?" at
  bert-base-uncased's ids, which GroundingDINO's phrase masks use, the test words and the words of
  ``configs/exposed_tags.txt``; anything else is [UNK]);
- ``build_tiny_sam``: a ``SamModel`` (ViT image encoder, prompt encoder, mask decoder) on 128-pixel
  inputs (16-pixel patches, 32 x 32 low-resolution masks) with a ``SamProcessor`` whose
  ``SamImageProcessor`` is ``facebook/sam-vit-huge``'s with those sizes (longest edge 128, padded to
  128 x 128);
- ``build_tiny_owlv2``: an ``Owlv2ForObjectDetection`` (64-pixel images, 16-pixel patches: 16 boxes)
  with an ``Owlv2Processor``: the ``Owlv2ImageProcessor`` (pad to square, resize to 64 x 64) and the
  real CLIP BPE tokenizer (``pipelines.standins.diffusion.build_clip_tokenizer``) with OWL's 16-token
  queries and "!" padding.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.standins.diffusion import CLIP_VOCAB_SIZE, build_clip_tokenizer
from pipelines.standins.tiny import IMAGENET_MEAN, IMAGENET_STD, output_dir, save_model, seeded, write_note

TINY_HIDDEN = 32
GROUNDING_DINO_SIZE = {"shortest_edge": 128, "longest_edge": 192}
GROUNDING_DINO_QUERIES = 12
SAM_SIZE = 128
SAM_PATCH = 16
OWLV2_SIZE = 64
OWLV2_PATCH = 16
OWL_QUERY_TOKENS = 16  # OWL-ViT / OWLv2 text queries are 16 tokens long

# bert-base-uncased's ids of the tokens GroundingDINO's text masks split phrases on
# (transformers' modeling_grounding_dino.SPECIAL_TOKENS: [CLS], [SEP], ".", "?"), kept in the stand-in
BERT_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, ".": 1012, "?": 1029}
# words the tests use, besides the default tag list
STANDIN_WORDS = (
    ".", ",", "-", "a", "an", "the", "of", "with", "and", "in", "on",
    "person", "people", "man", "woman", "men", "women", "child", "girl", "boy", "family",
    "cat", "dog", "bow", "tie", "suit", "dress", "cocktail", "veil", "hat", "tree", "grass", "park", "car",
    "table", "chair", "cake", "salad", "church", "crowd", "team", "baseball", "player", "football",
    "##s", "##es",
)
TAGS_FILE = Path(__file__).resolve().parents[2] / "configs" / "exposed_tags.txt"


def wordpiece_vocab() -> list[str]:
    """The stand-in BERT vocabulary (a token's line is its id): [PAD], [UNK], [CLS], [SEP], [MASK], "."
    and "?" at their bert-base-uncased ids (GroundingDINO's text masks look for those ids), [unused*]
    fillers in between, then the test words and the words of the default tag list (lower case,
    split as BERT's basic tokenizer splits them: on spaces and punctuation), each once."""
    words = list(STANDIN_WORDS)
    if TAGS_FILE.is_file():
        for line in TAGS_FILE.read_text(encoding="utf-8").splitlines():
            words.extend(re.findall(r"\w+|[^\w\s]", line.strip().lower()))
    size = max(BERT_IDS.values()) + 1
    vocab = [f"[unused{i}]" for i in range(size)]
    for token, i in BERT_IDS.items():
        vocab[i] = token
    seen = set(BERT_IDS)
    for w in words:
        if w not in seen:
            seen.add(w)
            vocab.append(w)
    return vocab


def build_tiny_grounding_dino(directory, seed: int = 0) -> str:
    """Build a tiny random GroundingDINO and its processor in ``directory`` (created if needed);
    return the absolute directory path. The same seed writes the same weights."""
    # deferred: transformers
    from transformers import (BertConfig, BertTokenizer, GroundingDinoConfig, GroundingDinoForObjectDetection,
                              GroundingDinoImageProcessor, GroundingDinoProcessor, SwinConfig)
    from transformers.image_utils import PILImageResampling

    out = output_dir(directory)
    vocab = wordpiece_vocab()
    vocab_file = out / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    backbone = SwinConfig(embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=4, image_size=64,
                          patch_size=4, out_indices=[2, 3, 4], out_features=["stage2", "stage3", "stage4"])
    text = BertConfig(vocab_size=len(vocab), hidden_size=TINY_HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=2 * TINY_HIDDEN, max_position_embeddings=256)
    # decoder_layers >= 2: the box heads of layers 1.. are tied to layer 0's
    config = GroundingDinoConfig(
        backbone_config=backbone, text_config=text, num_queries=GROUNDING_DINO_QUERIES, d_model=TINY_HIDDEN,
        encoder_layers=1, decoder_layers=2, encoder_ffn_dim=2 * TINY_HIDDEN, decoder_ffn_dim=2 * TINY_HIDDEN,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_n_points=2, decoder_n_points=2,
        num_feature_levels=4, max_text_len=256)
    with seeded(seed):
        model = GroundingDinoForObjectDetection(config)
    save_model(model, out)
    tokenizer = BertTokenizer(str(vocab_file), do_lower_case=True, model_max_length=512)
    image_processor = GroundingDinoImageProcessor(
        size=dict(GROUNDING_DINO_SIZE), resample=PILImageResampling.BILINEAR, do_resize=True, do_rescale=True,
        do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, do_pad=True)
    GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    write_note(out, "GroundingDINO", seed, "detections and masks")
    return str(out)


def build_tiny_sam(directory, seed: int = 0) -> str:
    """Build a tiny random SAM and its processor in ``directory`` (created if needed); return the
    absolute directory path. The same seed writes the same weights."""
    # deferred: transformers
    from transformers import (SamConfig, SamImageProcessor, SamMaskDecoderConfig, SamModel, SamProcessor,
                              SamPromptEncoderConfig, SamVisionConfig)

    out = output_dir(directory)
    vision = SamVisionConfig(hidden_size=TINY_HIDDEN, output_channels=TINY_HIDDEN, num_hidden_layers=2,
                             num_attention_heads=2, image_size=SAM_SIZE, patch_size=SAM_PATCH, window_size=4,
                             global_attn_indexes=[1], num_pos_feats=TINY_HIDDEN // 2, mlp_dim=2 * TINY_HIDDEN)
    prompt = SamPromptEncoderConfig(hidden_size=TINY_HIDDEN, image_size=SAM_SIZE, patch_size=SAM_PATCH,
                                    mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=TINY_HIDDEN, mlp_dim=2 * TINY_HIDDEN, num_attention_heads=2,
                                   iou_head_hidden_dim=TINY_HIDDEN)
    config = SamConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)
    with seeded(seed):
        model = SamModel(config)
    save_model(model, out)
    low_res = SAM_SIZE // SAM_PATCH * 4  # the mask decoder upscales the embedding grid 4x
    image_processor = SamImageProcessor(
        size={"longest_edge": SAM_SIZE}, pad_size={"height": SAM_SIZE, "width": SAM_SIZE},
        mask_size={"longest_edge": low_res}, mask_pad_size={"height": low_res, "width": low_res},
        image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
    SamProcessor(image_processor=image_processor).save_pretrained(out)
    write_note(out, "SAM", seed, "detections and masks")
    return str(out)


def build_tiny_owlv2(directory, seed: int = 0) -> str:
    """Build a tiny random OWLv2 detector and its processor in ``directory`` (created if needed);
    return the absolute directory path. The same seed writes the same weights."""
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor  # deferred: transformers

    out = output_dir(directory)
    text = {"vocab_size": CLIP_VOCAB_SIZE, "hidden_size": TINY_HIDDEN, "intermediate_size": 2 * TINY_HIDDEN,
            "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": OWL_QUERY_TOKENS}
    vision = {"hidden_size": TINY_HIDDEN, "intermediate_size": 2 * TINY_HIDDEN, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": OWLV2_SIZE, "patch_size": OWLV2_PATCH}
    config = Owlv2Config(text_config=text, vision_config=vision, projection_dim=TINY_HIDDEN)
    with seeded(seed):
        model = Owlv2ForObjectDetection(config)
    save_model(model, out)
    tokenizer = build_clip_tokenizer()
    tokenizer.model_max_length = OWL_QUERY_TOKENS
    tokenizer.pad_token = "!"
    image_processor = Owlv2ImageProcessor(size={"height": OWLV2_SIZE, "width": OWLV2_SIZE})
    Owlv2Processor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    write_note(out, "OWLv2", seed, "detections and masks")
    return str(out)
