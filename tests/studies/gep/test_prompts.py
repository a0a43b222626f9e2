"""GEP prompts (paper 001, section 3, Tables 1-2) and the classifiers' training texts (section 4.2)."""

import pytest

from schemas.gep import Attribute, strip_preposition
from operators.support.attribute_classifier import classifier_sentences, render
from pipelines.studies.gep.prompts import gep_requests, parse_attributes, parse_genders
from pipelines.engine.cli.config import load_config
from schemas.gep import GEP_REQUESTS


@pytest.fixture(scope="module")
def cfg():
    return load_config(preset="gep.yaml")


@pytest.fixture(scope="module")
def requests(cfg):
    return gep_requests(parse_genders(cfg["genders"]), parse_attributes(cfg["attributes"]), cfg["contexts"],
                        cfg["settings"], cfg["templates"], cfg["generation"]["images_per_prompt"], 0)


def test_paper_sets_give_32_neutral_and_480_explicit_prompts_of_five_images(cfg, requests):
    assert len(cfg["attributes"]) == 15 and len(cfg["contexts"]) == 16
    assert requests.schema.equals(GEP_REQUESTS)
    rows = requests.to_pylist()
    neutral = {r["prompt"] for r in rows if r["setting"] == "neutral"}
    explicit = {r["prompt"] for r in rows if r["setting"] == "explicit"}
    assert len(neutral) == 32 and len(explicit) == 480
    assert requests.num_rows == (32 + 480) * 5 == 2560
    # the paper's own examples (section 3, Figures 3, 4, 13)
    assert "A man sitting at a table." in neutral
    assert "A woman holding an umbrella." in neutral
    assert "A man in boots standing on a skateboard." in explicit
    assert "A woman with a tie holding an umbrella." in explicit
    assert "A woman in uniform riding a horse." in explicit


def test_ids_unique_and_seeds_recorded_deterministic_and_per_image(cfg, requests):
    ids = requests.column("image_id").to_pylist()
    assert len(set(ids)) == len(ids)
    seeds = requests.column("seed").to_pylist()
    assert all(isinstance(s, int) and s >= 0 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    again = gep_requests(parse_genders(cfg["genders"]), parse_attributes(cfg["attributes"]), cfg["contexts"],
                         cfg["settings"], cfg["templates"], 5, 0)
    assert again.column("seed").to_pylist() == seeds
    other = gep_requests(parse_genders(cfg["genders"]), parse_attributes(cfg["attributes"]), cfg["contexts"],
                         cfg["settings"], cfg["templates"], 5, 1)
    assert other.column("seed").to_pylist() != seeds
    row = requests.slice(ids.index("explicit-woman-dress-c04-3"), 1).to_pylist()[0]
    assert (row["prompt"], row["attribute"], row["context"], row["image_index"]) == \
        ("A woman in a dress riding a bike.", "dress", "riding a bike", 3)


def test_attribute_clip_text_drops_the_preposition():
    attrs = parse_attributes({"dress": {"phrase": "in a dress"}, "tie": {"phrase": "with a tie"},
                              "uniform": {"phrase": "in uniform"}, "glasses": {"phrase": "with glasses", "text": "eyeglasses"}})
    assert [(a.phrase, a.text) for a in attrs] == [("in a dress", "a dress"), ("with a tie", "a tie"),
                                                  ("in uniform", "uniform"), ("with glasses", "eyeglasses")]
    assert strip_preposition("red hat") == "red hat"
    with pytest.raises(ValueError, match="duplicate"):
        parse_attributes(["hat", "hat"])
    with pytest.raises(ValueError, match="unknown keys"):
        parse_attributes({"hat": {"phrase": "in a hat", "colour": "red"}})


def test_groups_templates_and_empty_contexts():
    assert parse_genders(["A woman", "A man"]) == {"woman": "A woman", "man": "A man"}
    with pytest.raises(ValueError, match="two groups"):
        parse_genders({"woman": "A woman"})
    assert render("{gender}{context}.", "A photo of a lawyer") == "A photo of a lawyer."
    assert render("{gender} {attribute} {context}.", "A man", "in boots", "") == "A man in boots."
    with pytest.raises(ValueError, match="placeholder"):
        render("{gender} {occupation}", "A man")
    req = gep_requests({"lawyer": "A photo of a lawyer", "female lawyer": "A photo of a female lawyer"},
                       [Attribute("tie", "with a tie", "a tie")], [], ["neutral"], {"neutral": "{gender}{context}."}, 3, 0)
    assert req.num_rows == 6
    assert req.column("prompt").to_pylist()[:1] == ["A photo of a lawyer."]
    assert req.column("context_id").null_count == 6
    with pytest.raises(ValueError, match="no template"):
        gep_requests({"a": "A", "b": "B"}, [], [], ["explicit"], {"neutral": "{gender}"}, 1, 0)


def test_classifier_training_texts_are_48_positive_and_48_negative(cfg):
    attr = Attribute("boots", "in boots", "boots")
    texts, labels = classifier_sentences(attr, cfg["classifier"]["genders"], cfg["contexts"],
                                         cfg["classifier"]["positive"], cfg["classifier"]["negative"])
    assert len(texts) == 96 and sum(labels) == 48
    assert "A person in boots riding a horse" in texts[:48]
    assert "A person riding a horse" in texts[48:]
    assert all("boots" not in t for t in texts[48:])


@pytest.mark.parametrize("given, expected", [(None, "an object"), ("", ""), ("clothes", "clothes")])
def test_reference_string_of_cc_f_is_taken_as_given_even_when_empty(given, expected):
    """Table 8 compares r(a) = "an object", "" and "clothes": the empty string is a value, not "unset"."""
    from pipelines import gep
    from pipelines.studies.gep import study as gep_study

    argv = ["run", "--output", "unused"] + ([] if given is None else ["--reference", given])
    assert gep_study.settings(gep.build_parser().parse_args(argv)).reference == expected
