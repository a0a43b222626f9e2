"""BLIP-2 visual question answering: perceived gender and worn attributes (paper 000, section 4.2.3, App. C.2).

DALL-Eval detects the perceived gender of the person in a generated image by asking BLIP-2
(``Salesforce/blip2-flan-t5-xl``) "the person looks like a male or a female?", and the presence
of attributes by asking "Is the person wearing [A]?" ("a suit", "jeans", ...). This stage asks
those questions of every image and writes the raw answers and what is parsed from them
(``schemas.dalleval.DETECTION_FIELDS`` without the CLIP probabilities).

Rules chosen where the paper is silent:

* Prompt: BLIP-2's VQA format ``"Question: {question} Answer:"``; decoding is greedy (no
  sampling, one beam), at most ``max_new_tokens`` (10) answer tokens, special tokens dropped and
  surrounding whitespace stripped.
* Gender (``parse_gender``): the answer names a male word (male, man, boy, gentleman) or a female
  word (female, woman, girl, lady) as a whole word, case-insensitively ("female" never counts as
  "male"). Exactly one side named -> that gender; both sides or neither (or no answer) -> unknown.
* Attributes (``parse_yes_no``): the answer's first word yes / yeah / yep -> present, no / nope
  -> absent, anything else -> null (not answered); punctuation, case and whitespace are ignored.
* Rows without a usable image (null or undecodable payload, or a GENERATION_STATUS other than
  ok, e.g. an image blanked by the safety checker) get null outputs; no row is ever dropped.
  GENDER_DETECTOR is "blip2" on every answered row when a gender question is asked.

Efficiency: the vision encoder, Q-Former and language projection run once per image; their
``num_query_tokens`` outputs are then reused for every question (1 gender + 15 attributes in
the paper's setting). Each (image, question) pair is one row of a batched
``language_model.generate(inputs_embeds=..., attention_mask=...)`` call whose inputs are built
exactly as ``Blip2ForConditionalGeneration.generate`` builds them: ``num_query_tokens`` image
tokens (``config.image_token_index``) in front of the tokenised prompt, as ``Blip2Processor``
does (transformers >= 4.47), and the image-token embeddings replaced by the projected query
outputs. The questions are tokenised once, at construction. The answers equal those of plain
``model.generate(**processor(images=..., text=...))`` (tested on a tiny random model).

Preprocessing: images already on a device (the generator's (B, 3, H, W) float output, handed
over with ``classify_tensor``) are transformed there with torch ops equivalent to the loaded
``BlipImageProcessor`` (resize to its (height, width) with antialiased bicubic interpolation,
rescale, normalise with its mean and std); payload batches (encoded bytes or raw RGB8) are
decoded with ``operators.support.codec.batch_images`` and go through the same path.

dtype "auto" is bfloat16 on CUDA (Flan-T5 overflows in float16; LAVIS, the paper's
implementation, ran the Flan-T5 half in bfloat16) and float32 on the CPU; ``dtype="float16"``
selects half precision (transformers then keeps T5's ``wo`` projections and the Q-Former in
float32).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.codec import decode_rows, generated_image_rows, rgb_levels
from operators.support.blip2_models import DEFAULT_MODEL, load_blip2
from schemas.dalleval import (
    ATTRIBUTE_ANSWERS,
    ATTRIBUTE_NAMES,
    ATTRIBUTE_PRESENT,
    DETECTED_GENDER,
    DETECTION_FIELDS,
    GENDER_ANSWER,
    GENDER_DETECTOR,
    DetectedGender,
    GenderDetector,
)
from schemas.images import P_FEMALE, P_MALE

STAGE_BLIP2_VQA = "blip2_vqa"
DEFAULT_GENDER_QUESTION = "the person looks like a male or a female?"  # paper 000, section 4.2.3, verbatim
DEFAULT_ATTRIBUTE_QUESTION = "Is the person wearing {attribute}?"
DEFAULT_PROMPT_TEMPLATE = "Question: {question} Answer:"  # BLIP-2's VQA prompt format
DEFAULT_MALE_WORDS = ("male", "man", "boy", "gentleman")
DEFAULT_FEMALE_WORDS = ("female", "woman", "girl", "lady")
YES_WORDS = ("yes", "yeah", "yep")
NO_WORDS = ("no", "nope")

OUTPUT_FIELDS = tuple(f for f in DETECTION_FIELDS if f.name not in (P_MALE, P_FEMALE))


# --- parsing the answers -----------------------------------------------------------------------------


def _word_pattern(words: Sequence[str]) -> re.Pattern:
    """Whole-word, case-insensitive match of any of ``words`` (phrases allowed)."""
    alternatives = "|".join(re.escape(w.strip().lower()) for w in sorted(words, key=len, reverse=True) if w.strip())
    if not alternatives:
        return re.compile(r"(?!x)x")  # matches nothing
    return re.compile(rf"(?<![a-z0-9])(?:{alternatives})(?![a-z0-9])")


def parse_gender(answer: str | None, male_words: Sequence[str] = DEFAULT_MALE_WORDS,
                 female_words: Sequence[str] = DEFAULT_FEMALE_WORDS) -> str:
    """``DetectedGender`` named by a BLIP-2 answer: MALE when it contains a male word and no
    female word (whole words, case-insensitive), FEMALE the other way round, UNKNOWN when it
    names both, neither, or there is no answer."""
    if not answer:
        return DetectedGender.UNKNOWN
    text = str(answer).lower()
    male = _word_pattern(male_words).search(text) is not None
    female = _word_pattern(female_words).search(text) is not None
    if male and not female:
        return DetectedGender.MALE
    if female and not male:
        return DetectedGender.FEMALE
    return DetectedGender.UNKNOWN


_FIRST_WORD = re.compile(r"[a-z]+")


def parse_yes_no(answer: str | None) -> bool | None:
    """True when the answer's first word is yes / yeah / yep, False for no / nope, else None
    (case, punctuation and whitespace ignored)."""
    if not answer:
        return None
    m = _FIRST_WORD.search(str(answer).lower())
    if m is None:
        return None
    word = m.group(0)
    if word in YES_WORDS:
        return True
    if word in NO_WORDS:
        return False
    return None


def normalize_attributes(attributes) -> list[tuple[str, str]]:
    """``[(name, text), ...]`` from a mapping name -> text, or a sequence of ``{"name", "text"}``
    dicts, ``(name, text)`` pairs or plain strings (name = text). Names must be unique."""
    if attributes is None:
        return []
    items = list(attributes.items()) if isinstance(attributes, Mapping) else list(attributes)
    out = []
    for item in items:
        if isinstance(item, str):
            name, text = item, item
        elif isinstance(item, Mapping):
            name, text = item.get("name"), item.get("text", item.get("name"))
        else:
            name, text = item
        if not isinstance(name, str) or not name.strip() or not isinstance(text, str) or not text.strip():
            raise ValueError(f"attribute {item!r}: name and text must be non-empty strings")
        out.append((name, text))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"attribute names must be unique, got {names}")
    return out


# --- the operator ------------------------------------------------------------------------------------


class Blip2Detector:
    """Adds DETECTED_GENDER, GENDER_ANSWER, GENDER_DETECTOR, ATTRIBUTE_NAMES, ATTRIBUTE_ANSWERS,
    ATTRIBUTE_PRESENT: BLIP-2's answers to the gender and attribute questions about each image."""

    stage_name = STAGE_BLIP2_VQA
    resources = Resources(num_cpus=1, num_gpus=1, batch_size=16, actors=1)
    output_fields = OUTPUT_FIELDS   # what classify_tensor returns, for the generator

    def __init__(self, model: str = DEFAULT_MODEL, revision: str | None = None,
                 gender_question: str | None = DEFAULT_GENDER_QUESTION, attributes=(),
                 attribute_question: str = DEFAULT_ATTRIBUTE_QUESTION,
                 prompt_template: str = DEFAULT_PROMPT_TEMPLATE, max_new_tokens: int = 10,
                 batch_size: int = 16, device: str = "auto", dtype: str = "auto",
                 male_words: Sequence[str] | None = None, female_words: Sequence[str] | None = None):
        import torch  # deferred: torch

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain {{question}}, got {prompt_template!r}")
        self.attributes = normalize_attributes(attributes)
        if self.attributes and "{attribute}" not in attribute_question:
            raise ValueError(f"attribute_question must contain {{attribute}}, got {attribute_question!r}")
        self.gender_question = gender_question or None
        self.attribute_question = attribute_question
        self.prompt_template = prompt_template
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.male_words = tuple(male_words) if male_words is not None else DEFAULT_MALE_WORDS
        self.female_words = tuple(female_words) if female_words is not None else DEFAULT_FEMALE_WORDS

        self.bundle = load_blip2(model, revision, device, dtype)
        self.model = self.bundle.model
        self.processor = self.bundle.processor
        self.tokenizer = self.processor.tokenizer
        self.device = self.bundle.device
        rec = self.bundle.record
        self.image_size = tuple(rec["image_size"])
        self.interpolation = rec["interpolation"]
        self.do_resize = rec["do_resize"]
        # x in 0-255 levels -> the processor's (x * rescale_factor - mean) / std
        scale = rec["rescale_factor"] if rec["do_rescale"] else 1.0
        mean = rec["image_mean"] if rec["do_normalize"] else [0.0, 0.0, 0.0]
        std = rec["image_std"] if rec["do_normalize"] else [1.0, 1.0, 1.0]
        self._scale = scale
        self._mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self._decoder_only = bool(self.model.config.use_decoder_only_language_model)

        # the prompts, in answer order: [gender question] + attribute questions
        self.questions = ([self.gender_question] if self.gender_question else []) + [
            self.attribute_question.format(attribute=text) for _, text in self.attributes
        ]
        self.prompts = [self.prompt_template.format(question=q) for q in self.questions]
        self._prompt_cache: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self.record = {
            **rec,
            "gender_question": self.gender_question,
            "attribute_question": self.attribute_question if self.attributes else None,
            "attributes": [{"name": n, "text": t} for n, t in self.attributes],
            "prompt_template": self.prompt_template,
            "prompts": list(self.prompts),
            "max_new_tokens": self.max_new_tokens,
            "decoding": "greedy",
            "batch_size": self.batch_size,
            "male_words": list(self.male_words),
            "female_words": list(self.female_words),
        }

    # -- preprocessing --------------------------------------------------------------------------------

    def preprocess(self, images):
        """(B, 3, H, W) float images in [0, 1] on any device -> pixel_values (float32) on that device.

        Emulates what the loaded image processor does to uint8 pixels: the images are first
        quantised to 0-255 levels as the generator's RGB8 payload is (so a tensor and its payload
        give the same pixel values), then resized width first, then height, each pass rounded and
        clamped to 0-255 as torch's uint8 antialiased kernels do; then rescaled and normalised.
        On the CPU this matches ``BlipImageProcessor`` to within one level in under 1% of pixels.
        """
        import torch.nn.functional as F  # deferred: torch

        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
        x = rgb_levels(images)
        th, tw = self.image_size
        if self.do_resize and tuple(x.shape[-2:]) != (th, tw):
            if self.interpolation == "nearest":
                x = F.interpolate(x, size=(th, tw), mode="nearest")
            else:
                kw = {"mode": self.interpolation, "align_corners": False, "antialias": True}
                if x.shape[-1] != tw:
                    x = F.interpolate(x, size=(x.shape[-2], tw), **kw).round_().clamp_(0.0, 255.0)
                if x.shape[-2] != th:
                    x = F.interpolate(x, size=(th, tw), **kw).round_().clamp_(0.0, 255.0)
        mean, std = self._mean.to(x.device), self._std.to(x.device)
        return (x * self._scale - mean) / std

    def _pixels_from_arrays(self, arrays: list[np.ndarray]):
        """Decoded (H, W, 3) uint8 images -> pixel_values on the model's device; same-size images
        are resized together."""
        import torch  # deferred: torch

        th, tw = self.image_size
        out = torch.empty((len(arrays), 3, th, tw), dtype=torch.float32, device=self.device)
        by_shape: dict[tuple, list[int]] = {}
        for i, a in enumerate(arrays):
            by_shape.setdefault(a.shape, []).append(i)
        with torch.inference_mode():
            for idx in by_shape.values():
                for start in range(0, len(idx), self.batch_size):
                    part = idx[start:start + self.batch_size]
                    stacked = np.stack([arrays[i] for i in part])
                    x = torch.from_numpy(stacked).to(self.device).permute(0, 3, 1, 2).float().div_(255.0)
                    out[torch.as_tensor(part, device=self.device)] = self.preprocess(x)
        return out

    # -- answering ------------------------------------------------------------------------------------

    def _prompt_inputs(self, prompts: list[str]):
        """(input_ids, attention_mask) of the prompts, on the device: ``num_query_tokens`` image
        tokens, then the tokenised prompt (with the tokenizer's special tokens, as the processor
        adds them); padded on the right (left for a decoder-only language model)."""
        import torch  # deferred: torch

        key = tuple(prompts)
        if key not in self._prompt_cache:
            cfg = self.model.config
            image_ids = [int(cfg.image_token_index)] * int(cfg.num_query_tokens)
            rows = [image_ids + list(ids) for ids in self.tokenizer(list(prompts))["input_ids"]]
            length = max(len(r) for r in rows)
            pad = self.tokenizer.pad_token_id
            if pad is None:
                pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
            ids = torch.full((len(rows), length), int(pad), dtype=torch.long)
            mask = torch.zeros((len(rows), length), dtype=torch.long)
            for i, r in enumerate(rows):
                if self._decoder_only:
                    ids[i, length - len(r):] = torch.tensor(r)
                    mask[i, length - len(r):] = 1
                else:
                    ids[i, :len(r)] = torch.tensor(r)
                    mask[i, :len(r)] = 1
            self._prompt_cache[key] = (ids.to(self.device), mask.to(self.device))
        return self._prompt_cache[key]

    def image_features(self, pixel_values):
        """The projected Q-Former outputs (B, num_query_tokens, d_text) of preprocessed images,
        computed as ``Blip2ForConditionalGeneration.generate`` computes them."""
        import torch  # deferred: torch

        m = self.model
        pv = pixel_values.to(self.device, dtype=m.vision_model.dtype if hasattr(m.vision_model, "dtype") else m.dtype)
        image_embeds = m.vision_model(pv, return_dict=True).last_hidden_state
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        query_tokens = m.query_tokens.expand(image_embeds.shape[0], -1, -1)
        query_output = m.qformer(query_embeds=query_tokens, encoder_hidden_states=image_embeds,
                                 encoder_attention_mask=image_mask, return_dict=True).last_hidden_state
        if query_output.dtype != image_embeds.dtype:  # the Q-Former is kept in float32
            query_output = query_output.to(image_embeds.dtype)
        return m.language_projection(query_output)

    def _generate(self, features, prompts: list[str]) -> list[list[str]]:
        """Answers [image][prompt] for image features (b, nq, d): one generate call over all pairs."""
        m = self.model
        b, q = features.shape[0], len(prompts)
        ids, mask = self._prompt_inputs(prompts)
        embeds = m.get_input_embeddings()(ids)                      # (q, L, d)
        embeds = embeds.repeat(b, 1, 1)                             # image-major: pair = image * q + question
        pair_ids = ids.repeat(b, 1)
        pair_mask = mask.repeat(b, 1)
        feats = features.repeat_interleave(q, dim=0).to(embeds.device, embeds.dtype)
        image_slots = (pair_ids == m.config.image_token_index).unsqueeze(-1)
        embeds = embeds.masked_scatter(image_slots, feats)
        inputs = {"inputs_embeds": embeds, "attention_mask": pair_mask}
        if self._decoder_only:
            inputs["input_ids"] = pair_ids
        out = m.language_model.generate(**inputs, do_sample=False, num_beams=1,
                                        max_new_tokens=self.max_new_tokens)
        if self._decoder_only and out.shape[1] >= pair_ids.shape[1] and bool((out[:, :pair_ids.shape[1]] == pair_ids).all()):
            out = out[:, pair_ids.shape[1]:]
        texts = [t.strip() for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]
        return [texts[i * q:(i + 1) * q] for i in range(b)]

    def ask(self, pixel_values, questions: list[str]) -> list[list[str]]:
        """Greedy answers ``answers[image][question]`` of preprocessed images (B, 3, h, w) to
        ``questions`` (each put in the prompt template). The image side runs once per image."""
        import torch  # deferred: torch

        questions = list(questions)
        n = int(pixel_values.shape[0])
        if not questions:
            return [[] for _ in range(n)]
        prompts = [self.prompt_template.format(question=q) for q in questions]
        answers: list[list[str]] = []
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                feats = self.image_features(pixel_values[start:start + self.batch_size])
                answers.extend(self._generate(feats, prompts))
        return answers

    def _results(self, answers: list[list[str]]) -> dict[str, list]:
        n = len(answers)
        out: dict[str, list] = {f.name: [None] * n for f in self.output_fields}
        k = 1 if self.gender_question else 0
        names = [name for name, _ in self.attributes]
        for i, a in enumerate(answers):
            if self.gender_question:
                out[GENDER_ANSWER][i] = a[0]
                out[DETECTED_GENDER][i] = parse_gender(a[0], self.male_words, self.female_words)
                out[GENDER_DETECTOR][i] = GenderDetector.BLIP2
            if self.attributes:
                attr = list(a[k:])
                out[ATTRIBUTE_NAMES][i] = list(names)
                out[ATTRIBUTE_ANSWERS][i] = attr
                out[ATTRIBUTE_PRESENT][i] = [parse_yes_no(x) for x in attr]
        return out

    def classify_tensor(self, images) -> dict[str, list]:
        """Answer about (B, 3, H, W) float images in [0, 1] on any device (e.g. the generator's
        output), preprocessed where they are. Returns each of ``output_fields`` as a list of length B."""
        pixel_values = self.preprocess(images)
        return self._results(self.ask(pixel_values, self.questions))

    # -- payload batches ------------------------------------------------------------------------------

    def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        columns = {f.name: [None] * n for f in self.output_fields}
        dec = decode_rows(batch, generated_image_rows(batch))
        if len(dec.rows):
            pixel_values = self._pixels_from_arrays(dec.arrays)
            res = self._results(self.ask(pixel_values, self.questions))
            for j, r in enumerate(dec.rows.tolist()):
                for name, values in res.items():
                    columns[name][r] = values[j]
        for f in self.output_fields:
            batch = with_column(batch, f.name, pa.array(columns[f.name], f.type))
        return batch
