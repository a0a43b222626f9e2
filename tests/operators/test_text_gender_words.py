import pytest
from helpers import captions_table

# Table 5 of paper 002 (word and pronoun rows) and Table 2: caption -> (label, evidence)
TABLE_5 = [
    ("Portrait of young woman programmer working at a computer in the data center filled with display screens",
     "female", [], ["word:woman"]),
    ("Tired young indian programmer almost sleeping at his desk after working on difficult project all day long",
     "male", ["pronoun:his"], []),
    ("Female accountant very busy in office", "female", [], ["word:female"]),
    ("Accountant managing manual bill monitoring tasks in his home office", "male", ["pronoun:his"], []),
    ("Portrait of young male mechanic in bicycle store, Beijing", "male", ["word:male"], []),
    ("African american woman mechanic repairing a motorcycle in a workshop", "female", [], ["word:woman"]),
    ("Attractive woman photographer taking images with dslr camera outdoors in park.", "female", [], ["word:woman"]),
]
TABLE_2 = [
    ("Portrait of smiling young female mechanic inspecting a CV joint on a car in an auto repair shop", "female"),
    ("Muscular bearded athlete drinks water after good workout session in city park", "none"),  # implicit only
    ("Portrait of a salesperson standing in front of electrical wire spool with arms crossed in hardware store", "none"),
]


def run(op, captions):
    out = op(captions_table(captions))
    return list(zip(out.column("caption_gender").to_pylist(), out.column("male_indicators").to_pylist(),
                    out.column("female_indicators").to_pylist()))


@pytest.mark.parametrize("caption,label,male,female", TABLE_5)
def test_table_5_words_and_pronouns(word_indicators, caption, label, male, female):
    assert run(word_indicators, [caption]) == [(label, male, female)]


@pytest.mark.parametrize("caption,label", TABLE_2)
def test_table_2(word_indicators, caption, label):
    assert run(word_indicators, [caption])[0][0] == label


@pytest.mark.parametrize(
    "caption",
    ["The teacher", "the hero of the day", "Shepherd's pie", "Theme park", "Manhattan skyline", "Hershey bar",
     "Human resources", "Sheriff office", "Womanizer", "Boycott", "Girlfriend", "Mandate", "Ladybug", "", None],
)
def test_whole_word_traps_hold_no_indicator(word_indicators, caption):
    assert run(word_indicators, [caption]) == [("none", [], [])]


@pytest.mark.parametrize(
    "caption,expected",
    [
        ("HE is a nurse", ("male", ["pronoun:he"], [])),
        ("She's a pilot", ("female", [], ["pronoun:she"])),
        ("The woman's bag", ("female", [], ["word:woman"])),
        ("He and his wife with her dog", ("both", ["pronoun:he", "pronoun:his"], ["pronoun:her"])),
        ("man, man, MAN and a boy", ("male", ["word:man", "word:boy"], [])),
    ],
)
def test_labels_and_evidence(word_indicators, caption, expected):
    assert run(word_indicators, [caption]) == [expected]


PLURALS = [
    ("Two women engineers", ("female", [], ["word:women"])),
    ("Gentlemen's club, ladies night", ("both", ["word:gentlemen"], ["word:ladies"])),
    ("men and boys at work, girls watching", ("both", ["word:men", "word:boys"], ["word:girls"])),
]


@pytest.mark.parametrize("caption,expected", PLURALS)
def test_plurals_count_only_with_the_option(word_indicators, word_indicators_with_plurals, caption, expected):
    """App. A.5 lists "male, female, man, woman, gent, gentleman, lady, boy, girl": the paper preset
    searches exactly these; --gender-word-plurals adds their plurals."""
    assert run(word_indicators_with_plurals, [caption]) == [expected]
    assert run(word_indicators, [caption])[0][0] == "none"


def test_paper_preset_gender_words_are_app_a5_verbatim(paper_config):
    from pipelines.studies.amplification.caption_settings import effective_gender_words

    g = effective_gender_words(paper_config["gender_indicators"])
    assert sorted(g["male_words"] + g["female_words"]) == sorted(
        "male female man woman gent gentleman lady boy girl".split())
    assert g["gender_word_plurals"] is False
    assert g["male_pronouns"] == ["he", "him", "his", "himself"]
    assert g["female_pronouns"] == ["she", "her", "hers", "herself"]


def test_batch_keeps_row_alignment(word_indicators):
    caps = ["a nurse", "his office", None, "her office", "his and her office", "the hero"]
    assert [r[0] for r in run(word_indicators, caps)] == ["none", "male", "none", "female", "both", "none"]


def test_contradictory_configuration():
    from operators.text_gender_words import GenderWordIndicators

    with pytest.raises(ValueError, match="both male and female"):
        GenderWordIndicators(["person"], ["person"], [], [])
