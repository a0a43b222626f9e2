"""Triplet prompts of paper 004 (section 3, App. A): caption triplets with their counts, the
profession set of Table S2, profession sentences from a file, and the files written."""

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipelines.studies.exposed.caption_files import read_captions
from pipelines.studies.exposed.profession_set import (
    DEFAULT_TEMPLATES,
    article,
    profession_phrase,
    profession_triplets,
    sentence_triplets,
)
from pipelines.studies.exposed.triplet_tables import write_triplets
from pipelines.studies.exposed.triplets import caption_triplets
from schemas.exposed import (
    COUNT,
    FEMININE,
    HUMAN_WORD,
    HUMAN_WORDS,
    IRREGULAR_PLURALS,
    MASCULINE,
    NEUTRAL,
    NO_PLURAL,
    PROFESSION,
    PROFESSIONS,
    SOURCE_ROW,
    TOPIC,
    TRIPLET_COUNTS,
    TRIPLET_ID,
    TRIPLET_SOURCE,
    TRIPLET_STATUS,
    TRIPLETS,
    TripletOutcome,
)
from schemas.occupations import plural

FILTER_OUTCOMES = {TripletOutcome.KEPT, TripletOutcome.NULL_CAPTION, TripletOutcome.NO_PERSON_WORD,
                   TripletOutcome.HUMAN_WORD, TripletOutcome.UNSWAPPABLE}

CAPTIONS = [
    "People take part in a race.",       # 0 kept
    "A man and his dog",                 # 1 human_word: man, his
    "",                                  # 2 null_caption
    "A red bus on the street",           # 3 no_person_word
    "A person riding a horse",           # 4 kept
    "pEople on a beach",                 # 5 unswappable
    "Two kids with a kid near people",   # 6 human_word: kids, kid
    "A MAN, a Man and a person",         # 7 human_word: man (counted once)
    "Personal computers",                # 8 no_person_word
    "A PERSON WITH AN UMBRELLA",         # 9 kept
]


def counts_of(counts: pa.Table) -> tuple[dict, dict]:
    rows = counts.to_pylist()
    outcomes = {r[TRIPLET_STATUS]: r[COUNT] for r in rows if r[HUMAN_WORD] is None}
    words = {r[HUMAN_WORD]: r[COUNT] for r in rows if r[HUMAN_WORD] is not None}
    return outcomes, words


def human_forms():
    forms = set()
    for words in HUMAN_WORDS.values():
        for w in (w.lower() for w in words):
            forms.add(w)
            if w not in NO_PLURAL:
                forms.add(IRREGULAR_PLURALS.get(w, plural(w)))
    return forms


@pytest.fixture
def caption_file(tmp_path):
    path = tmp_path / "captions.txt"
    path.write_text("\n".join(CAPTIONS) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# reading


def test_read_captions_every_format(tmp_path):
    caps = ["A person, with a comma", 'A "quoted" caption', "people"]
    (tmp_path / "c.txt").write_text("\r\n".join(caps) + "\r\n", encoding="utf-8")
    pd.DataFrame({"TEXT": caps, "n": [1, 2, 3]}).to_csv(tmp_path / "c.csv", index=False)
    (tmp_path / "c.tsv").write_text("id\tTEXT\n" + "".join(f"{i}\t{c}\n" for i, c in enumerate(caps)), encoding="utf-8")
    pq.write_table(pa.table({"TEXT": caps, "n": [1, 2, 3]}), tmp_path / "c.parquet")
    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(pa.table({"TEXT": caps[:2]}), d / "part-0.parquet")
    pq.write_table(pa.table({"TEXT": caps[2:]}), d / "part-1.parquet")
    pq.write_table(pa.table({"TEXT": ["ignored"]}), d / ".part-2.parquet.tmp.parquet")
    for name in ("c.txt", "c.csv", "c.tsv", "c.parquet", "dir"):
        table = pa.concat_tables(read_captions(tmp_path / name, "TEXT"))
        assert table.column_names == ["TEXT", SOURCE_ROW], name
        assert table["TEXT"].to_pylist() == caps, name
        assert table[SOURCE_ROW].to_pylist() == [0, 1, 2], name


def test_read_captions_is_batched_and_numbers_rows_across_batches(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("".join(f"caption {i}\n" for i in range(2500)), encoding="utf-8")
    batches = list(read_captions(path, "TEXT", batch_rows=1000))
    assert [b.num_rows for b in batches] == [1000, 1000, 500]
    rows = pa.concat_tables(batches)[SOURCE_ROW].to_pylist()
    assert rows == list(range(2500))


def test_read_captions_text_lines_keep_blank_lines_as_rows(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffa person\n\n  \npeople".encode("utf-8"))
    t = pa.concat_tables(read_captions(path, "caption"))
    assert t["caption"].to_pylist() == ["a person", "", "  ", "people"]
    assert t[SOURCE_ROW].to_pylist() == [0, 1, 2, 3]


def test_read_captions_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        list(read_captions(tmp_path / "nope.parquet"))
    pq.write_table(pa.table({"caption": ["x"], "url": ["u"]}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"'TEXT' not found.*\['caption', 'url'\]"):
        list(read_captions(tmp_path / "c.parquet", "TEXT"))
    (tmp_path / "c.csv").write_text("caption\nx\n")
    with pytest.raises(ValueError, match=r"'TEXT' not found.*\['caption'\]"):
        list(read_captions(tmp_path / "c.csv", "TEXT"))
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(ValueError, match="expected a .parquet file"):
        list(read_captions(tmp_path / "c.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no parquet file"):
        list(read_captions(tmp_path / "empty"))


# --------------------------------------------------------------------------------------------
# caption triplets


def test_caption_triplets(caption_file):
    triplets, counts = caption_triplets(caption_file, "coco")
    assert triplets.schema.equals(TRIPLETS) and counts.schema.equals(TRIPLET_COUNTS)
    assert triplets[SOURCE_ROW].to_pylist() == [0, 4, 9]
    assert triplets[TRIPLET_ID].to_pylist() == ["coco-0000000", "coco-0000004", "coco-0000009"]
    assert set(triplets[TRIPLET_SOURCE].to_pylist()) == {"coco"}
    assert triplets[NEUTRAL].to_pylist() == [CAPTIONS[0], CAPTIONS[4], CAPTIONS[9]]
    assert triplets[FEMININE].to_pylist() == ["Women take part in a race.", "A woman riding a horse",
                                              "A WOMAN WITH AN UMBRELLA"]
    assert triplets[MASCULINE].to_pylist() == ["Men take part in a race.", "A man riding a horse",
                                               "A MAN WITH AN UMBRELLA"]
    assert triplets[TOPIC].null_count == triplets[PROFESSION].null_count == 3

    outcomes, words = counts_of(counts)
    assert outcomes == {TripletOutcome.KEPT: 3, TripletOutcome.NULL_CAPTION: 1, TripletOutcome.NO_PERSON_WORD: 2,
                        TripletOutcome.HUMAN_WORD: 3, TripletOutcome.UNSWAPPABLE: 1}
    assert sum(outcomes.values()) == len(CAPTIONS)
    # a caption counts once under each human word it names
    assert words == {"man": 2, "his": 1, "kids": 1, "kid": 1}
    assert set(counts[TRIPLET_SOURCE].to_pylist()) == {"coco"}


def test_every_outcome_is_counted_even_when_zero(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a dog\n", encoding="utf-8")
    triplets, counts = caption_triplets(path, "gcc")
    outcomes, words = counts_of(counts)
    assert triplets.num_rows == 0 and triplets.schema.equals(TRIPLETS)
    assert set(outcomes) == FILTER_OUTCOMES and outcomes[TripletOutcome.NO_PERSON_WORD] == 1
    assert sum(outcomes.values()) == 1 and words == {}


def test_limit(caption_file):
    triplets, counts = caption_triplets(caption_file, "coco", limit=5)
    outcomes, _ = counts_of(counts)
    assert sum(outcomes.values()) == 5
    assert triplets[SOURCE_ROW].to_pylist() == [0, 4]
    with pytest.raises(ValueError, match="limit"):
        caption_triplets(caption_file, "coco", limit=-1)


def test_source_name_is_checked(caption_file):
    with pytest.raises(ValueError, match="source"):
        caption_triplets(caption_file, "my source")


def test_counts_add_up_over_many_batches(tmp_path):
    """Over several reader batches: the counts add up, the per-word counts equal a count made
    independently with Python, and the triplets are the captions the rule keeps."""
    import random

    rng = random.Random(3)
    vocab = ["a", "dog", "on", "the", "beach", "red", "bus", "person", "people", "People", "PERSON", "pErson",
             "man", "women", "his", "kids", "Kid", "her", "crew", "personal", "human", "salesperson"]
    caps = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 7))) for _ in range(40000)]
    caps[123] = ""
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"caption": caps}), path, row_group_size=7000)
    triplets, counts = caption_triplets(path, "flickr30k", column="caption")
    outcomes, words = counts_of(counts)
    assert sum(outcomes.values()) == len(caps)
    forms = human_forms()
    expected_words = Counter()
    expected_kept = []
    for i, c in enumerate(caps):
        toks = [t.lower() for t in re.findall(r"\w+", c)]
        found = {t for t in toks if t in forms}
        expected_words.update(found)
        if not found and any(t in ("person", "people") for t in toks) and "pErson" not in c.split():
            expected_kept.append(i)
    assert words == dict(expected_words)
    assert outcomes[TripletOutcome.HUMAN_WORD] == sum(
        any(t.lower() in forms for t in re.findall(r"\w+", c)) for c in caps)
    assert triplets[SOURCE_ROW].to_pylist() == expected_kept
    assert outcomes[TripletOutcome.KEPT] == len(expected_kept)
    ids = triplets[TRIPLET_ID].to_pylist()
    assert len(set(ids)) == len(ids) and ids[-1] == f"flickr30k-{expected_kept[-1]:07d}"


# --------------------------------------------------------------------------------------------
# profession triplets (Table S2)


@pytest.fixture(scope="module")
def professions():
    return profession_triplets()


def test_every_table_s2_name_in_every_template(professions):
    triplets, counts = professions
    assert triplets.schema.equals(TRIPLETS)
    assert len(PROFESSIONS) == 16 and sum(len(v) for v in PROFESSIONS.values()) == 320
    assert set(DEFAULT_TEMPLATES) == set(PROFESSIONS) and all(len(t) == 3 for t in DEFAULT_TEMPLATES.values())
    assert triplets.num_rows == 320 * 3
    pairs = Counter(zip(triplets[TOPIC].to_pylist(), triplets[PROFESSION].to_pylist()))
    assert pairs == Counter({(topic, name): 3 for topic, names in PROFESSIONS.items() for name in names})
    # the duplicates of Table S2 appear under both of their topics
    by_name = Counter(triplets[PROFESSION].to_pylist())
    assert by_name["Sommelier"] == by_name["Nutritionist"] == 6
    ids = triplets[TRIPLET_ID].to_pylist()
    assert len(set(ids)) == len(ids)
    assert "profession-business-and-finance-0000" in ids and "profession-science-0059" in ids
    assert set(triplets[TRIPLET_SOURCE].to_pylist()) == {"profession"}
    outcomes, _ = counts_of(counts)
    assert outcomes[TripletOutcome.KEPT] == 960 and sum(outcomes.values()) == 960


def _vowel_sound(phrase: str) -> bool:
    first = phrase.split()[0]
    if first.isupper() and len(first) > 1:  # read letter by letter
        return first[0] in "AEFHILMNORSX"
    return first[0].lower() in "aeiou" and not first.lower().startswith(("uni", "use", "eu"))


def test_neutral_sentences_and_their_articles(professions):
    triplets, _ = professions
    for row in triplets.to_pylist():
        phrase = profession_phrase(row[PROFESSION])
        expected = ("An " if _vowel_sound(phrase) else "A ") + phrase + " "
        assert row[NEUTRAL].startswith(expected), row
        # the feminine / masculine prompts put female / male before the profession: the article is "A"
        assert row[FEMININE] == "A female " + phrase + row[NEUTRAL][len(expected) - 1:]
        assert row[MASCULINE] == "A male " + phrase + row[NEUTRAL][len(expected) - 1:]


@pytest.mark.parametrize(
    "name,neutral_start",
    [
        ("Ecologist", "An ecologist "),
        ("AI Ethics Researcher", "An AI ethics researcher "),
        ("IT Support Specialist", "An IT support specialist "),
        ("UI Designer", "A UI designer "),
        ("CNC Machinist", "A CNC machinist "),
        ("TV News Reporter", "A TV news reporter "),
        ("Event DJ", "An event DJ "),
        ("Import-Export Specialist", "An import-export specialist "),
        ("Marine Biologist", "A marine biologist "),
        ("Orthopedic Surgeon", "An orthopedic surgeon "),
        ("Chief Executive Officer", "A chief executive officer "),
    ],
)
def test_acronyms_and_articles(professions, name, neutral_start):
    triplets, _ = professions
    rows = [r for r in triplets.to_pylist() if r[PROFESSION] == name]
    assert rows and all(r[NEUTRAL].startswith(neutral_start) for r in rows)
    female = "A female " + neutral_start.split(" ", 1)[1]
    assert all(r[FEMININE].startswith(female) for r in rows)


def test_templates_name_no_one_else():
    """No template carries a Table S1 word of its own (the profession aside): the three prompts
    differ only in the gender word."""
    forms = human_forms()
    for topic, templates in DEFAULT_TEMPLATES.items():
        for t in templates:
            words = re.findall(r"\w+", t.replace("{profession}", " ").lower())
            assert not (set(words) & forms), (topic, t)
            assert t.startswith("{A} {profession} ")


def test_per_topic_and_custom_templates():
    triplets, _ = profession_triplets(per_topic=2)
    assert triplets.num_rows == 32
    assert Counter(triplets[TOPIC].to_pylist()) == Counter({t: 2 for t in PROFESSIONS})
    # template by template: the first triplets of a topic cover its first professions
    assert triplets.filter(pc.equal(triplets[TOPIC], "Science"))[PROFESSION].to_pylist() == ["Botanist", "Geologist"]
    custom, _ = profession_triplets(templates={"Lab": ["In the lab, {a} {profession} works"]},
                                    professions={"Lab": ["Chemist", "Epidemiologist"]})
    assert custom[NEUTRAL].to_pylist() == ["In the lab, a chemist works", "In the lab, an epidemiologist works"]
    assert custom[FEMININE].to_pylist() == ["In the lab, a female chemist works", "In the lab, a female epidemiologist works"]
    assert custom[TRIPLET_ID].to_pylist() == ["profession-lab-0000", "profession-lab-0001"]
    with pytest.raises(ValueError, match="no template for topic"):
        profession_triplets(templates={"Lab": ["{A} {profession}"]}, professions={"Art": ["Curator"]})
    with pytest.raises(ValueError, match="profession"):
        profession_triplets(templates={"Lab": ["{A} {job}"]}, professions={"Lab": ["Chemist"]})
    with pytest.raises(ValueError, match="per_topic"):
        profession_triplets(per_topic=0)


def test_article_rules():
    assert article("ecologist") == "an" and article("botanist") == "a"
    assert article("university lecturer") == "a" and article("hour") == "an"
    assert article("MRI technician") == "an" and article("DJ") == "a"
    assert profession_phrase("TV News Reporter") == "TV news reporter"


# --------------------------------------------------------------------------------------------
# sentences from a file


def test_sentence_triplets(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text(
        "\n".join([
            "An ecologist studies the ecosystem in a lush green forest",  # 0: the paper's example
            "A culinary tour guide walks through a market",               # 1: the longest name wins
            "",                                                           # 2: null
            "A dog sleeps on a sofa",                                     # 3: no profession
            "AN IT SUPPORT SPECIALIST fixes a laptop",                    # 4: any case
            "Pastry chef at work",                                        # 5: at the start
            "The import-export specialist checks a crate",                # 6: hyphenated name
            "A chefs' table",                                             # 7: "chefs" is not "chef"
        ]) + "\n",
        encoding="utf-8",
    )
    triplets, counts = sentence_triplets(path)
    assert triplets.schema.equals(TRIPLETS)
    rows = {r[SOURCE_ROW]: r for r in triplets.to_pylist()}
    assert sorted(rows) == [0, 1, 4, 5, 6]
    assert rows[0][FEMININE] == "A female ecologist studies the ecosystem in a lush green forest"
    assert rows[0][MASCULINE] == "A male ecologist studies the ecosystem in a lush green forest"
    assert (rows[0][TOPIC], rows[0][PROFESSION]) == ("Science", "Ecologist")
    assert rows[1][PROFESSION] == "Culinary Tour Guide"
    assert rows[1][FEMININE] == "A female culinary tour guide walks through a market"
    assert rows[4][FEMININE] == "A female IT SUPPORT SPECIALIST fixes a laptop"
    assert rows[5][MASCULINE] == "Male Pastry chef at work"
    assert rows[6][FEMININE] == "The female import-export specialist checks a crate"
    assert rows[0][TRIPLET_ID] == "profession-0000000" and rows[0][TRIPLET_SOURCE] == "profession"
    outcomes, _ = counts_of(counts)
    assert outcomes == {TripletOutcome.KEPT: 5, TripletOutcome.NULL_CAPTION: 1, TripletOutcome.NO_PROFESSION: 2}


def test_sentence_triplets_without_any_profession_and_a_plain_name_list(tmp_path):
    path = tmp_path / "s.csv"
    pd.DataFrame({"sentence": ["A cat on a mat", "A sommelier tastes a wine"]}).to_csv(path, index=False)
    triplets, counts = sentence_triplets(path, column="sentence", professions=["Baker"])
    assert triplets.num_rows == 0 and triplets.schema.equals(TRIPLETS)
    assert counts_of(counts)[0][TripletOutcome.NO_PROFESSION] == 2
    triplets, _ = sentence_triplets(path, column="sentence")
    assert triplets[PROFESSION].to_pylist() == ["Sommelier"]
    assert triplets[TOPIC].to_pylist() == ["Travel and Hospitality"]  # the first topic listing it


# --------------------------------------------------------------------------------------------
# writing


def test_write_triplets(tmp_path, caption_file):
    triplets, counts = caption_triplets(caption_file, "coco")
    out = tmp_path / "out" / "triplets"
    paths = write_triplets(triplets, counts, out)
    assert sorted(p.name for p in out.iterdir()) == ["triplet_counts.csv", "triplet_counts.json", "triplets.parquet"]
    assert pq.read_table(paths["triplets"]).equals(triplets)
    csv = pd.read_csv(paths["counts_csv"])
    assert list(csv.columns) == TRIPLET_COUNTS.names and csv[COUNT].sum() == counts[COUNT].to_numpy().sum()
    assert json.loads(Path(paths["counts_json"]).read_text()) == counts.to_pylist()
    # written again: replaced, no temporary file left behind
    write_triplets(triplets.slice(0, 1), counts, out)
    assert pq.read_table(paths["triplets"]).num_rows == 1
    assert sorted(p.name for p in out.iterdir()) == ["triplet_counts.csv", "triplet_counts.json", "triplets.parquet"]


def _runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


OUTPUTS = ["run.json", "triplet_counts.csv", "triplet_counts.json", "triplets.parquet", "triplets_config.json"]


def test_run_command(tmp_path, caption_file, capsys):
    """The command writes into a run folder <output>/exposed-triplets-<8 hex>/ with run.json holding
    its configuration; it prints the run id first and the results path last."""
    from types import SimpleNamespace

    from pipelines.studies.exposed.triplets import run_command

    out = run_command(SimpleNamespace(captions=str(caption_file), caption_column="TEXT", source=None,
                                      profession_set=False, per_topic=None, output=str(tmp_path / "c")))
    run = tmp_path / "c" / out["run_id"]
    assert re.fullmatch(r"exposed-triplets-[0-9a-f]{8}", out["run_id"]) and _runs(tmp_path / "c") == [run]
    assert sorted(p.name for p in run.iterdir()) == OUTPUTS
    assert out["triplets"] == 3 and not out["reused"]
    assert {k: Path(v).parent for k, v in out["paths"].items()} == dict.fromkeys(out["paths"], run)
    table = pq.read_table(run / "triplets.parquet")
    assert table[TRIPLET_ID].to_pylist()[0] == "captions-0000000"  # the source defaults to the file name
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"run {out['run_id']}: results -> {run}"
    assert "  human_word (man)" in "\n".join(lines) and lines[-1] == f"results: {run}/"
    record = json.loads((run / "run.json").read_text())
    assert record["run_id"] == out["run_id"] and record["status"] == "finished"
    assert record["fingerprint"].startswith(out["run_id"][-8:])
    config = record["config"]
    assert config["mode"] == "captions" and config["source"] == "captions" and config["column"] == "TEXT"
    assert config["input"]["files"] == [str(caption_file.resolve())]
    assert config["input"]["data"][str(caption_file.resolve())].startswith(f"size={caption_file.stat().st_size} ")
    assert "bridemaid" in config["filter"]["human_words"]["others"]
    assert config["filter"]["person_words"]["person"] == ["woman", "man"]
    details = json.loads((run / "triplets_config.json").read_text())
    assert details["input_path"] == str(caption_file) and details["triplets"] == 3
    assert details["run_id"] == out["run_id"] and details["input"] == config["input"]
    assert details["environment"]["packages"] and sum(r[COUNT] for r in details["counts"]) > len(CAPTIONS)

    out = run_command(SimpleNamespace(captions=None, caption_column="TEXT", source=None, profession_set=True,
                                      per_topic=1, output=str(tmp_path / "p")))
    assert out["triplets"] == 16
    config = json.loads((tmp_path / "p" / out["run_id"] / "run.json").read_text())["config"]
    assert config["mode"] == "profession_templates" and config["per_topic"] == 1 and "input" not in config
    assert config["templates"]["Science"] == list(DEFAULT_TEMPLATES["Science"]) and len(config["professions"]) == 16
    with pytest.raises(ValueError, match="--captions"):
        run_command(SimpleNamespace(captions=None, profession_set=False, output=str(tmp_path / "x")))


def test_the_same_command_finds_its_run_folder_again(tmp_path, caption_file, capsys):
    from pipelines import exposed

    argv = ["triplets", "--captions", str(caption_file), "--output", str(tmp_path)]
    assert exposed.main(argv) == 0
    [run] = _runs(tmp_path)
    first = (run / "triplets.parquet").read_bytes()
    capsys.readouterr()
    assert exposed.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert _runs(tmp_path) == [run]
    assert lines[0] == f"run {run.name}: resuming in {run}" and "its triplets are reused" in lines[1]
    assert "3 triplets from captions" in lines and lines[-1] == f"results: {run}/"
    assert (run / "triplets.parquet").read_bytes() == first
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "finished"
    assert [(a["resumed"], a["reused"], a["status"]) for a in record["attempts"]] == [
        (False, False, "finished"), (True, True, "finished")]
    # an unfinished run (a killed attempt) is made again in the same folder
    (run / "triplets.parquet").unlink()
    assert exposed.main(argv) == 0
    assert _runs(tmp_path) == [run] and pq.read_table(run / "triplets.parquet").num_rows == 3
    assert json.loads((run / "run.json").read_text())["attempts"][-1]["reused"] is False
    # --overwrite discards the folder and starts again
    assert exposed.main([*argv, "--overwrite"]) == 0
    record = json.loads((run / "run.json").read_text())
    assert len(record["attempts"]) == 1 and record["attempts"][0]["reused"] is False


def test_another_configuration_gets_another_run_folder(tmp_path, caption_file):
    from pipelines import exposed

    base = ["triplets", "--output", str(tmp_path)]
    variants = [
        ["--captions", str(caption_file)],
        ["--captions", str(caption_file), "--source", "coco"],
        ["--profession-set"],
        ["--profession-set", "--per-topic", "1"],
        ["--profession-set", "--per-topic", "2"],
        ["--profession-set", "--captions", str(caption_file)],
    ]
    for v in variants:
        assert exposed.main([*base, *v]) == 0, v
    runs = _runs(tmp_path)
    assert len(runs) == len(variants) and all(r.name.startswith("exposed-triplets-") for r in runs)
    for r in runs:
        assert sorted(p.name for p in r.iterdir()) == OUTPUTS
    # the input rewritten in place (same name): a run of its own, never the old triplets
    caption_file.write_text("A person reads.\n", encoding="utf-8")
    assert exposed.main([*base, *variants[0]]) == 0
    new = sorted(set(_runs(tmp_path)) - set(runs))
    assert len(new) == 1 and pq.read_table(new[0] / "triplets.parquet").num_rows == 1


def test_run_id_and_refusals(tmp_path, caption_file, capsys):
    from pipelines import exposed

    base = ["triplets", "--output", str(tmp_path), "--run-id", "mine"]
    assert exposed.main([*base, "--profession-set", "--per-topic", "1"]) == 0
    assert _runs(tmp_path) == [tmp_path / "mine"]
    assert json.loads((tmp_path / "mine" / "run.json").read_text())["run_id"] == "mine"
    capsys.readouterr()
    # another configuration under the same --run-id: refused, naming what differs, nothing changed
    assert exposed.main([*base, "--profession-set", "--per-topic", "2"]) == 2
    assert "differs in: per_topic" in capsys.readouterr().err
    assert pq.read_table(tmp_path / "mine" / "triplets.parquet").num_rows == 16
    # ... unless --overwrite
    assert exposed.main([*base, "--profession-set", "--per-topic", "2", "--overwrite"]) == 0
    assert pq.read_table(tmp_path / "mine" / "triplets.parquet").num_rows == 32
    # bad inputs fail before a run folder is written
    empty = tmp_path / "empty"
    assert exposed.main(["triplets", "--output", str(empty), "--captions", str(tmp_path / "missing.txt")]) == 2
    csv = tmp_path / "c.csv"
    csv.write_text("title\nA person\n", encoding="utf-8")   # no caption-like column
    assert exposed.main(["triplets", "--output", str(empty), "--captions", str(csv)]) == 2
    assert "no caption column" in capsys.readouterr().err
    assert not empty.exists() or not any(empty.iterdir())
    assert exposed.main(["triplets", "--output", str(empty), "--captions", str(csv), "--caption-column",
                         "title"]) == 0
    named = tmp_path / "n.csv"                                  # a caption column is recognised
    named.write_text("caption\nA person\n", encoding="utf-8")
    assert exposed.main(["triplets", "--output", str(tmp_path / "named"), "--captions", str(named)]) == 0


def test_parquet_captions_from_an_fsspec_uri(tmp_path):
    """LAION-style parquet on an object store: read through fsspec (here the in-memory filesystem),
    a folder recursively, the same triplets and counts as from local disk."""
    import fsspec

    from pipelines.studies.exposed.triplets import caption_triplets

    table = pa.table({"TEXT": ["A person runs.", "A man runs.", "People sing.", None], "URL": ["u"] * 4})
    local = tmp_path / "laion"
    local.mkdir()
    pq.write_table(table.slice(0, 2), local / "part-0.parquet")
    pq.write_table(table.slice(2), local / "part-1.parquet")
    fs = fsspec.filesystem("memory")
    for name in ("part-0.parquet", "part-1.parquet"):
        fs.pipe(f"/laion-test/{name}", (local / name).read_bytes())
    remote, remote_counts = caption_triplets("memory://laion-test", "laion")
    here, here_counts = caption_triplets(str(local), "laion")
    assert remote.equals(here) and remote_counts.equals(here_counts)
    assert remote.column("neutral").to_pylist() == ["A person runs.", "People sing."]
    assert remote.column("source_row").to_pylist() == [0, 2]
    with pytest.raises(ValueError, match="does not exist"):
        caption_triplets("memory://nowhere-here", "laion")
    fs.pipe("/laion-txt/c.txt", b"A person runs.\n")
    with pytest.raises(ValueError, match="only parquet"):
        caption_triplets("memory://laion-txt/c.txt", "laion")
