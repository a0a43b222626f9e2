import pytest
import yaml

from pipelines.engine.config import environment, load_config, occupations_from


def test_preset_holds_the_papers_lists(paper_config):
    gi = paper_config["gender_indicators"]
    for w in ("male", "man", "gent", "gentleman", "boy"):
        assert w in gi["male_words"]
    for w in ("female", "woman", "lady", "girl"):
        assert w in gi["female_words"]
    assert gi["male_pronouns"] == ["he", "him", "his", "himself"]
    assert gi["female_pronouns"] == ["she", "her", "hers", "herself"]
    assert paper_config["selection"]["sample_size"] == 500 and paper_config["selection"]["nn_k"] == 500


def test_user_yaml_overrides_and_rejects_typos(tmp_path):
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump({"occupations": ["dog walker"], "selection": {"nn_k": 50}}))
    cfg = load_config(p)
    assert [o.name for o in occupations_from(cfg)] == ["dog walker"]
    assert cfg["selection"] == {**load_config()["selection"], "nn_k": 50}
    p.write_text(yaml.safe_dump({"selection": {"nnk": 50}}))
    with pytest.raises(ValueError, match="nnk"):
        load_config(p)


def test_occupations_from_command_line_and_file(paper_config, tmp_path):
    occ = occupations_from(paper_config, names="CEO, fashion_designer,dog walker")
    assert [o.name for o in occ] == ["ceo", "fashion designer", "dog walker"]
    assert occ[0].prompt_name == "CEO"  # the preset's settings are kept
    f = tmp_path / "occ.yaml"
    f.write_text(yaml.safe_dump({"occupations": [{"name": "barista", "terms": ["barista", "coffee maker"]}]}))
    assert occupations_from(paper_config, file=str(f))[0].forms() == ("barista", "baristas", "coffee maker", "coffee makers")


def test_environment_records_versions():
    env = environment()
    assert env["packages"]["ray"] and env["packages"]["pyarrow"] and env["packages"]["spacy"]
