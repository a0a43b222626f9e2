import pytest

from pipelines.studies.amplification.prompts import prompt_table
from schemas.occupations import Occupation, indefinite_article


def test_table_1_prompts(occupations, paper_config):
    prompts = prompt_table(occupations, paper_config["prompts"])
    assert prompts["engineer"] == [
        "A photo of the face of an engineer",
        "A portrait photo of an engineer",
        "A photo of an engineer smiling",
        "A photo of an engineer at work",
    ]
    assert prompts["ceo"][0] == "A photo of the face of a CEO"
    assert prompts["hairdresser"][1] == "A portrait photo of a hairdresser"
    assert prompts["prime minister"][3] == "A photo of a prime minister at work"
    assert len(prompts) == 62 and all(len(p) == 4 for p in prompts.values())


@pytest.mark.parametrize(
    "word,article",
    [("accountant", "an"), ("architect", "an"), ("intern", "an"), ("author", "an"), ("engineer", "an"),
     ("nurse", "a"), ("housekeeper", "a"), ("university lecturer", "a"), ("hour worker", "an"), ("EU official", "a")],
)
def test_articles(word, article):
    assert indefinite_article(word) == article


def test_template_without_placeholder():
    with pytest.raises(ValueError, match="placeholder"):
        prompt_table([Occupation("nurse")], ["A photo"])
