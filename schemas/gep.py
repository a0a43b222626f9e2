"""Column names and schemas of the GEP study (paper 001, "Auditing Gender Presentation Differences").

One row per generated image (``GEP_IMAGES``): which setting, gender indicator, attribute and
context its prompt was built from, its seed, its generation status and its L2-normalised CLIP
image embedding. Scoring adds one row per (image, scored attribute) (``GEP_SCORES``): in the
neutral setting every attribute of A is scored on every image, in the explicit setting only the
attribute named in the image's prompt (section 3). Aggregating scores per (model, setting, gender,
attribute) gives the attribute frequencies (``GEP_FREQUENCIES``, Eq. 1 / Eqs. 4, 5, 7), from which
the GEP vectors and scores follow (Eq. 2).

"gender" is the label of a gender indicator g in G ("woman" for "A woman"); a study may use any
groups (section 7: "lawyer", "female lawyer", ...), and the column keeps its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from schemas.fields import typed
from schemas.images import IMAGE_ID, MODEL, generated_images, prompt_index_seed

SETTING = "setting"            # "neutral" ("[g] [c]") or "explicit" ("[g] [a] [c]")
GENDER = "gender"              # label of the gender indicator (group) of the prompt
GENDER_TEXT = "gender_text"    # its text in the prompt ("A woman")
ATTRIBUTE = "attribute"        # attribute name ("dress"); in the image table: the prompt's (null when neutral)
CONTEXT_ID = "context_id"      # 0-based index into C (null when the study has no contexts)
CONTEXT = "context"            # context text ("riding a bike")
EMBEDDING = "clip_embedding"   # list<float32>: L2-normalised CLIP image embedding (null when no image)

# scores of one (image, attribute): the three automatic estimators of section 4
SCORE_C = "c"                  # cos(C(I), C(a))                                    (Eq. 4)
SCORE_CC = "cc"                # cos(C(I), C(a)) - cos(C(I), C(r(a)))               (Eq. 5)
SCORE_CLS = "cls"              # ensemble mean of cls(C(I)), cross-modal classifiers (Eq. 7)

# frequencies and GEP vectors
ESTIMATOR = "estimator"        # "human", "C", "CC", "CLS"
FREQUENCY = "frequency"        # f_ij (human: share of images showing the attribute; else the mean score)
IMAGES = "images"              # images behind a frequency
PRESENT = "present"            # human annotation: 0/1, the attribute is visible on the person
SCORE = "score"                # one estimator's value for one (image, attribute): C, CC, CLS or the 0/1 label


def low(column: str) -> str:
    """The column of the lower end of ``column``'s interval ("gep" -> "gep_low")."""
    return f"{column}_low"


def high(column: str) -> str:
    """The column of the upper end of ``column``'s interval ("gep" -> "gep_high")."""
    return f"{column}_high"


class Setting:
    NEUTRAL = "neutral"
    EXPLICIT = "explicit"
    ALL = (NEUTRAL, EXPLICIT)


class Estimator:
    HUMAN = "human"
    C = "C"
    CC = "CC"
    CLS = "CLS"
    AUTO = (C, CC, CLS)
    COLUMNS = {C: SCORE_C, CC: SCORE_CC, CLS: SCORE_CLS}   # estimator -> its score column


GEP_REQUESTS = pa.schema([
    *typed(pa.string(), IMAGE_ID, SETTING, GENDER, nullable=False),
    *typed(pa.string(), GENDER_TEXT, ATTRIBUTE),
    pa.field(CONTEXT_ID, pa.int32()),
    pa.field(CONTEXT, pa.string()),
    *prompt_index_seed(nullable=False),
])

EMBEDDING_COLUMNS = pa.schema([pa.field(EMBEDDING, pa.list_(pa.float32()))])

GEP_IMAGES = generated_images(GEP_REQUESTS, *EMBEDDING_COLUMNS)

GEP_SCORES = pa.schema([
    pa.field(IMAGE_ID, pa.string(), nullable=False),
    pa.field(MODEL, pa.string()),
    *typed(pa.string(), SETTING, GENDER, ATTRIBUTE, nullable=False),
    pa.field(CONTEXT_ID, pa.int32()),
    *typed(pa.float32(), SCORE_C, SCORE_CC, SCORE_CLS),
])

GEP_FREQUENCIES = pa.schema([
    pa.field(MODEL, pa.string()),
    *typed(pa.string(), SETTING, GENDER, ATTRIBUTE, ESTIMATOR, nullable=False),
    pa.field(FREQUENCY, pa.float64()),
    pa.field(IMAGES, pa.int64()),
])

ANNOTATIONS = pa.schema([
    *typed(pa.string(), IMAGE_ID, ATTRIBUTE, nullable=False),
    pa.field(PRESENT, pa.int8(), nullable=False),
])


_PREPOSITIONS = ("in", "with", "wearing", "on")


def clean_text(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Attribute:
    """An attribute of A: its name ("dress"), the phrase in prompts ("in a dress") and the text CLIP
    compares images with in C-f / CC-f ("a dress": the phrase without its preposition, section 4.1)."""

    name: str
    phrase: str
    text: str

    @classmethod
    def parse(cls, name: str, spec) -> "Attribute":
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"attribute name must be a non-empty string, got {name!r}")
        if spec is None or isinstance(spec, str):
            spec = {"phrase": spec or name}
        if not isinstance(spec, Mapping):
            raise ValueError(f"attribute {name!r}: expected a phrase or a mapping with phrase/text, got {spec!r}")
        unknown = set(spec) - {"phrase", "text"}
        if unknown:
            raise ValueError(f"attribute {name!r}: unknown keys {sorted(unknown)} (known: phrase, text)")
        phrase = clean_text(str(spec.get("phrase") or name))
        text = clean_text(str(spec["text"])) if spec.get("text") else strip_preposition(phrase)
        return cls(name.strip(), phrase, text)


def strip_preposition(phrase: str) -> str:
    """ "in a dress" -> "a dress", "with gloves" -> "gloves"; a phrase without one is kept."""
    words = phrase.split()
    if len(words) > 1 and words[0].lower() in _PREPOSITIONS:
        return " ".join(words[1:])
    return phrase
