"""Objects and prompt-image dependency groups of generated images, on the generator's device
(paper 004, sections 5-6, App. A).

A *generation companion* of ``TripletGenerator`` (not a standalone Ray stage): while a unit's
three images are generated, the UNet's cross-attention is recorded (``capture``); once they are on
the device, ``analyse`` makes, per image and without moving the images:

1. the **noun set**: the prompt's lemmatised nouns (spaCy, ``operators.text_prompt_nouns``; the
   paper used NLTK);
2. the **word masks**: DAAM heat maps of each noun's tokens (``operators.support.cross_attention``:
   conditional half, summed over heads and steps per layer, bicubic-upsampled, clamped, averaged
   over layers; a noun's map is the mean over its tokens at every occurrence), min-max normalised
   and binarised at θ (0.35);
3. the **objects**: open-vocabulary boxes and SAM masks for the vocabulary "the unit's nouns + tag
   list" (``operators.image_grounded_segmentation``; thresholds 0.25 / 0.2 / NMS 0.5): the union of
   the three prompts' nouns, so the neutral, feminine and masculine images of a unit are queried
   with the identical text (``unit_vocabulary``);
4. each object's **dependency group** from the coverage of its mask by the word masks (σ 0.7, 0.25
   when both refer to humans) and whether its label is a prompt noun; the unmatched nouns are
   **hidden** (``operators.support.dependency``).

Output per image (``schemas.exposed.DEPENDENCY_COLUMNS``): the noun set, the detection lists with
``detection_status`` ok, each object's group, the hidden nouns, the nouns with a mask, their masks
(COCO RLE) and 64 x 64 heat-map previews. An image the generator did not produce (blocked by the
safety checker, out of memory) gets ``no_image`` and empty object lists; if the analysis raises on a
call's images, they get ``error`` with the exception in ``detection_detail`` and null lists, and
the study counts them against its error budget. Generation itself is never changed: the attention
recorder reads the layers' inputs and recomputes the probabilities on the side.

Memory: the per-layer attention sums (images x positions x 76 tokens, a few MB per image) live only
during the pipeline call; the full-size heat maps only for the prompt's own tokens and only inside
``analyse``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

from operators.support.diffusion import _out_of_memory
from operators.image_grounded_segmentation import (
    BOX_THRESHOLD,
    DEFAULT_DETECTOR,
    DEFAULT_SEGMENTER,
    NMS_IOU,
    TEXT_THRESHOLD,
    GroundedSegmenter,
    to_u8,
)
from operators.support import rle
from operators.support.cross_attention import CrossAttentionCapture
from operators.support.attention_capture import capture_for
from operators.support.dependency import (
    SIGMA,
    SIGMA_HUMAN,
    THETA,
    attention_masks_torch,
    coverage_matrix_torch,
    groups_from_coverage,
    min_max_torch,
)
from operators.text_prompt_nouns import DEFAULT_SPACY_MODEL, NOUN_TAGS, load_tagger, noun_forms
from schemas.exposed import (
    ATTENTION_MAP_SIZE,
    ATTENTION_MAPS,
    ATTENTION_MASKS,
    ATTENTION_WORDS,
    DEPENDENCY_COLUMNS,
    DETECTION_COLUMNS,
    DETECTION_DETAIL,
    DETECTION_STATUS,
    HIDDEN_NOUNS,
    HUMAN_REFERENCE_WORDS,
    TRIPLET_GENDER_LEMMAS,
    OBJECT_GROUPS,
    PROMPT_NOUNS,
    DetectionStatus,
)

log = logging.getLogger(__name__)

STAGE_PROMPT_DEPENDENCY = "prompt_dependency"


# prompt tokens a transformer's joint-attention recorder keeps (see PromptDependency.capture)
JOINT_ATTENTION_TOKENS = 128


def no_image() -> dict:
    """The dependency columns of an image that was not produced: no_image, empty object lists,
    nothing else (the noun set, which needs no image, is added where the prompt is known)."""
    row = {f.name: None for f in DEPENDENCY_COLUMNS}
    row.update({f.name: [] for f in DETECTION_COLUMNS})
    row[DETECTION_STATUS] = DetectionStatus.NO_IMAGE
    return row


def _word_position(text: str, word: str) -> int:
    """Where ``word`` first occurs in ``text`` as a whole word (not inside a longer word), or -1."""
    m = re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text)
    return m.start() if m else -1


class PromptDependency:
    """Noun sets, word masks, objects and dependency groups of images generated inside ``capture``."""

    stage_name = STAGE_PROMPT_DEPENDENCY
    output_fields = tuple(DEPENDENCY_COLUMNS)

    def __init__(self, detector: str = DEFAULT_DETECTOR, segmenter: str = DEFAULT_SEGMENTER,
                 detector_revision: str | None = None, segmenter_revision: str | None = None,
                 box_threshold: float = BOX_THRESHOLD, text_threshold: float = TEXT_THRESHOLD,
                 nms_iou: float = NMS_IOU, vocabulary: Sequence[str] = (), spacy_model: str = DEFAULT_SPACY_MODEL,
                 theta: float = THETA, sigma: float = SIGMA, sigma_human: float = SIGMA_HUMAN,
                 device: str = "auto", dtype: str = "auto", max_labels_per_query: int | None = None,
                 attention_layers: str = "daam", share_nouns: bool = True):
        for name, value in (("theta", theta), ("sigma", sigma), ("sigma_human", sigma_human)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.theta, self.sigma, self.sigma_human = float(theta), float(sigma), float(sigma_human)
        if attention_layers not in CrossAttentionCapture.LAYERS:
            raise ValueError(f"attention_layers must be one of {CrossAttentionCapture.LAYERS}, got {attention_layers!r}")
        self.attention_layers = attention_layers
        self.share_nouns = bool(share_nouns)
        self.nlp = load_tagger(spacy_model)
        self.segmenter = GroundedSegmenter(detector, segmenter, detector_revision, segmenter_revision, box_threshold,
                                           text_threshold, nms_iou, list(vocabulary), device, dtype,
                                           max_labels_per_query)
        self.device = self.segmenter.device
        # detected labels are compared with lemmatised nouns: each vocabulary entry's lemma
        # ("women" -> woman, "glasses" -> glass), so a plural tag is explicit when the prompt has the noun
        self.lemmas = {t: self.lemma(t) for t in self.segmenter.vocabulary}
        self.record = {
            "stage": self.stage_name,
            "nouns": {"spacy_model": spacy_model, "version": self.nlp.meta.get("version"),
                      "noun_tags": list(NOUN_TAGS), "lemmatised": True,
                      "shared_per_unit": self.share_nouns,
                      "profession_units": "the neutral prompt tagged with the profession replaced by 'person', "
                                          "plus the profession's nouns (profession_noun_forms)"},
            "attention": {"method": ("DAAM's defaults (castorini/daam): down/up-block attn2, no mid block, maps "
                                     "at 1/8 of the latent grid skipped; conditional half, summed over heads and "
                                     "steps per layer, bicubic to the latent grid, clamped at 0, mean over layers, "
                                     "bicubic to the image" if attention_layers == "daam" else
                                     "every attn2 (mid block included): conditional half, summed over heads and "
                                     "steps per layer, bicubic to the image, clamped at 0, mean over layers")
                          + "; noun map = mean of its tokens", "layers": attention_layers,
                          "theta": self.theta, "mask_set": "one mask per prompt noun", "preview": ATTENTION_MAP_SIZE},
            "groups": {"sigma": self.sigma, "sigma_human": self.sigma_human,
                       "human_words": list(HUMAN_REFERENCE_WORDS)},
            "detection": self.segmenter.record,
            "labels": "the detected vocabulary entry, lemmatised token by token with the noun set's spaCy pipeline",
        }

    def lemma(self, label: str) -> str:
        """A vocabulary entry lemmatised as the noun set is (each token's lemma, lower case)."""
        return " ".join(t.lemma_.lower() or t.text.lower() for t in self.nlp(label)) or label

    # -- generation side ----------------------------------------------------------------------------

    def capture(self, pipe, guidance: bool):
        """The recorder to wrap the pipeline call in (``with``): a UNet's cross-attention (DAAM), or
        the joint attention of an SD 3 / FLUX transformer (``operators.support.joint_attention``),
        with the tokenizer of the tokens it records (``capture.tokenizer``). A transformer records
        the first JOINT_ATTENTION_TOKENS tokens of its T5 segment (project choice: the heat maps of
        all 256-512 T5 positions of FLUX at 1024 px would take gigabytes; prompts longer than that
        get no maps for their later words)."""
        return capture_for(pipe, guidance, layers=self.attention_layers,
                           tokens=None if getattr(pipe, "unet", None) is not None else JOINT_ATTENTION_TOKENS)

    # -- analysis ------------------------------------------------------------------------------------

    def nouns(self, prompts: Sequence[str]) -> list[dict[str, list[str]]]:
        """{lemma: surface forms} of each prompt's nouns (noun set = its keys)."""
        texts = [p if isinstance(p, str) else "" for p in prompts]
        return [noun_forms(doc) for doc in self.nlp.pipe(texts)]

    @staticmethod
    def shared_noun_forms(prompts: Sequence[str], forms: Sequence[dict[str, list[str]]]) -> list[dict[str, list[str]]]:
        """One noun set for the prompts of a unit, apart from the words they differ in by
        construction (``TRIPLET_GENDER_LEMMAS``): each prompt keeps its own gender nouns, and every
        other noun tagged in any of the three prompts is a noun of all three ("A botanist studies
        ..." tags botanist as an adjective where "A female botanist studies ..." tags it a noun: the
        three images are analysed against the same nouns either way). Each prompt's nouns are in
        the order of their first word in that prompt; a noun's surface forms are those found in it."""
        shared: dict[str, list[str]] = {}
        for f in forms:
            for lemma, words in f.items():
                if lemma not in TRIPLET_GENDER_LEMMAS:
                    known = shared.setdefault(lemma, [])
                    known += [w for w in words if w not in known]
        out = []
        for prompt, f in zip(prompts, forms):
            text = prompt.lower() if isinstance(prompt, str) else ""
            where = {w: _word_position(text, w) for words in [*shared.values(), *f.values()] for w in words}
            mine = {lemma: list(words) for lemma, words in f.items() if lemma in TRIPLET_GENDER_LEMMAS}
            for lemma, words in shared.items():
                present = [w for w in words if where[w] >= 0]
                if present:
                    mine[lemma] = present
            order = {lemma: min((where[w] for w in words if where[w] >= 0), default=len(text))
                     for lemma, words in mine.items()}
            out.append(dict(sorted(mine.items(), key=lambda kv: order[kv[0]])))
        return out

    def profession_noun_forms(self, prompt: str, profession: str) -> dict[str, list[str]] | None:
        """The nouns of a Profession prompt read with the profession out of the tagger's way: the
        prompt tagged with the profession phrase replaced by "person" (spaCy reads "A botanist
        studies samples ..." as adjective + noun "studies", "A person studies samples ..." right),
        then the profession's own nouns (the phrase tagged alone after "a"; its last word always).
        None when the prompt does not name the profession."""
        if not isinstance(prompt, str) or not profession:
            return None
        m = re.search(r"(?<![\w-])" + re.escape(profession) + r"(?![\w-])", prompt, flags=re.IGNORECASE)
        if m is None:
            return None
        forms = noun_forms(self.nlp(prompt[:m.start()] + "person" + prompt[m.end():]))
        if not re.search(r"(?<![\w-])person(?![\w-])", prompt, flags=re.IGNORECASE):
            forms.pop("person", None)                       # the placeholder, not a word of the prompt
        surface = prompt[m.start():m.end()].lower().split()
        phrase = self.nlp("a " + " ".join(surface))
        own = {t.lemma_.lower(): [t.text.lower()] for t in phrase[1:] if t.pos_ in NOUN_TAGS and t.lemma_.strip()}
        head = phrase[-1]
        own.setdefault(head.lemma_.lower() or head.text.lower(), [head.text.lower()])
        for lemma, words in own.items():
            known = forms.setdefault(lemma, [])
            known += [w for w in words if w not in known]
        return forms

    def unit_forms(self, prompts: Sequence[str], forms: Sequence[dict[str, list[str]]],
                   profession: str | None) -> list[dict[str, list[str]]]:
        """One unit's noun sets: with its ``profession``, the neutral prompt's ``profession_noun_forms``
        for all three plus each prompt's own gender nouns; then ``shared_noun_forms``."""
        template = self.profession_noun_forms(prompts[0], profession) if profession else None
        if template is not None:
            common = {lemma: w for lemma, w in template.items() if lemma not in TRIPLET_GENDER_LEMMAS}
            forms = [{**{lemma: w for lemma, w in f.items() if lemma in TRIPLET_GENDER_LEMMAS}, **common}
                     for f in forms]
        return self.shared_noun_forms(prompts, forms)

    @staticmethod
    def unit_vocabulary(noun_sets: Sequence[Sequence[str]]) -> list[str]:
        """The detector's noun list for every image of one unit: the union of its prompts' nouns,
        in order of first appearance over (neutral, feminine, masculine). All three images are
        queried with this one list (then the tags), so the detector's text input, and how its
        256-token queries split, is the same for the three images of a contrast."""
        return list(dict.fromkeys(n for nouns in noun_sets for n in nouns))

    def analyse(self, images, prompts: Sequence[str], capture: CrossAttentionCapture, tokenizer,
                latent_hw: tuple[int, int], skip=None, unit_size: int = 3,
                professions: Sequence[str | None] | None = None) -> dict[str, list]:
        """Per image of ``images`` (N, 3, H, W) in [0, 1] (generated from ``prompts`` inside
        ``capture``): ``DEPENDENCY_COLUMNS`` as lists of length N. ``skip[i]``: image i was not
        produced (blocked): no_image. The images come in units of ``unit_size`` consecutive ones
        (a triplet's neutral, feminine, masculine): the detector vocabulary is the unit's
        (``unit_vocabulary``); each image's own noun set decides what is explicit. ``professions``:
        per image, its unit's profession (Profession triplets; None for captions): the unit's noun
        sets are then read with the profession out of the tagger's way (``unit_forms``)."""
        n = int(images.shape[0])
        if unit_size < 1 or n % unit_size:
            raise ValueError(f"{n} images do not make whole units of {unit_size}")
        skip = np.zeros(n, bool) if skip is None else np.asarray(skip, bool)
        forms = self.nouns(prompts)
        if unit_size > 1 and self.share_nouns:
            prof = list(professions) if professions is not None else [None] * n
            forms = [f for u in range(0, n, unit_size)
                     for f in self.unit_forms(prompts[u:u + unit_size], forms[u:u + unit_size], prof[u])]
        out: dict[str, list] = {f.name: [None] * n for f in self.output_fields}
        todo = [i for i in range(n) if not skip[i]]
        for i in range(n):
            if skip[i]:
                for name, value in no_image().items():
                    out[name][i] = value
        out[PROMPT_NOUNS] = [list(f) for f in forms]
        shared = [self.unit_vocabulary(out[PROMPT_NOUNS][u:u + unit_size]) for u in range(0, n, unit_size)]
        unit_nouns = [shared[i // unit_size] for i in range(n)]
        try:
            if todo:
                self._analyse(images, prompts, forms, capture, tokenizer, latent_hw, todo, out, unit_nouns)
        except Exception as exc:  # noqa: BLE001 -- recorded per image and counted by the study's error budget
            if _out_of_memory(exc):
                raise      # the generator halves its batch and tries again
            detail = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
            log.warning("prompt-dependency analysis failed on %d images: %s", len(todo), detail)
            for i in todo:
                for f in self.output_fields:
                    if f.name != PROMPT_NOUNS:
                        out[f.name][i] = None
                out[DETECTION_STATUS][i] = DetectionStatus.ERROR
                out[DETECTION_DETAIL][i] = detail
        finally:
            capture.release()
        return out

    def _analyse(self, images, prompts, forms, capture, tokenizer, latent_hw, todo, out, unit_nouns) -> None:
        import torch  # deferred: torch
        import torch.nn.functional as F  # deferred: torch

        height, width = int(images.shape[-2]), int(images.shape[-1])
        positions = []
        for i in todo:
            per_form = capture.word_positions(tokenizer, prompts[i],
                                                            [w for fs in forms[i].values() for w in fs])
            positions.append({lemma: sorted({p for w in fs for p in per_form.get(w, ())})
                              for lemma, fs in forms[i].items()})
        found = self.segmenter.detect_u8(to_u8(images[todo]), [unit_nouns[i] for i in todo])
        for d in found:
            d["labels"] = [self.lemmas.get(label, label) for label in d["labels"]]   # prompt nouns are lemmas already
        detected = GroundedSegmenter.columns(found)
        # the full-size maps only now, for the prompts' own tokens: the encoder reads BOS + at most
        # model_max_length - 2 prompt tokens + EOS, so later positions were never seen
        seen = getattr(capture, "prompt_tokens", None) or max(1, int(getattr(tokenizer, "model_max_length", 77)) - 2)
        longest = min(seen, max((p for ps in positions for v in ps.values() for p in v), default=-1) + 1)
        maps = capture.heat_maps(latent_hw, (height, width), tokens=longest) if longest > 0 else None
        for k, i in enumerate(todo):
            for f in DETECTION_COLUMNS:
                out[f.name][i] = detected[f.name][k]
            limit = 0 if maps is None else min(int(maps.shape[1]), seen)
            kept = {w: [p for p in ps if p < limit] for w, ps in positions[k].items()}
            words = [w for w, ps in kept.items() if ps]
            if words:
                heat = torch.stack([maps[i, kept[w]].mean(dim=0) for w in words])
                word_masks = attention_masks_torch(heat, self.theta)
                obj_masks = found[k]["masks"]
                cover = (coverage_matrix_torch(obj_masks.to(word_masks.device), word_masks) if obj_masks.shape[0]
                         else np.zeros((0, len(words))))
                small = F.interpolate(heat[None].float(), (ATTENTION_MAP_SIZE, ATTENTION_MAP_SIZE), mode="area")[0]
                norm = min_max_torch(small)[0].mul_(255.0).round_().clamp_(0, 255)
                out[ATTENTION_MAPS][i] = [bytes(r) for r in norm.to(torch.uint8).cpu().numpy()]
                out[ATTENTION_MASKS][i] = rle.encode_many(word_masks.cpu().numpy())
            else:
                cover = np.zeros((len(found[k]["labels"]), 0))
                out[ATTENTION_MAPS][i], out[ATTENTION_MASKS][i] = [], []
            out[ATTENTION_WORDS][i] = words
            groups, hidden = groups_from_coverage(found[k]["labels"], out[PROMPT_NOUNS][i], words, cover, self.sigma,
                                                  self.sigma_human)
            out[OBJECT_GROUPS][i], out[HIDDEN_NOUNS][i] = groups, hidden
            out[DETECTION_STATUS][i] = DetectionStatus.OK
        del maps
