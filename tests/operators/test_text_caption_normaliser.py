"""Control and invisible characters in captions: rewritten once, counted, never a changed gender."""

import pyarrow as pa
from helpers import captions_table

from operators.base import run_counted
from operators.text_caption_normaliser import CONTROL_CHARACTERS, INVISIBLE_CHARACTERS, CaptionNormaliser, normalise
from operators.text_caption_validator import CaptionValidator


def test_control_characters_become_spaces_and_invisible_marks_go():
    text = pa.array(["Doctor\x00Susan Wilson", "nurse\x1b[31m", "a\u0085b", "a nurse\u200bat work",
                     "doc\u00adtor", "\ufeffteacher", "chef\u202ein", "tab\tline\nfeed\r", None, "plain"])
    out, n_control, n_invisible = normalise(text)
    assert out.to_pylist() == ["Doctor Susan Wilson", "nurse [31m", "a b", "a nurse at work", "doctor", "teacher",
                               "chefin", "tab\tline\nfeed\r", None, "plain"]
    assert (n_control, n_invisible) == (4, 3)


def test_the_stage_counts_what_it_changed_and_drops_nothing():
    batch = captions_table(["ok", "a\x00b", "c\u00add\x07", None])
    out, counts = run_counted(CaptionNormaliser(), batch)
    assert out.num_rows == 4 and out.column("caption").to_pylist() == ["ok", "a b", "cd ", None]
    assert counts == {"rows_in": 4, "rows_out": 4, CONTROL_CHARACTERS: 2, INVISIBLE_CHARACTERS: 1}
    clean = captions_table(["nothing to do"])
    out, counts = run_counted(CaptionNormaliser(), clean)
    assert out.equals(clean) and counts[CONTROL_CHARACTERS] == counts[INVISIBLE_CHARACTERS] == 0


def test_a_nul_cannot_change_a_captions_gender(word_indicators, name_indicators):
    """The stages of the caption scan in their order: the NUL caption reads as the spaced one."""
    captions = ["Doctor\x00Susan Wilson", "Doctor Susan Wilson", "Senator\x00Kirsten Gillibrand\x00speaks"]
    table = pa.table({"TEXT": captions, "URL": ["u"] * 3})
    rows = name_indicators(word_indicators(run_counted(CaptionNormaliser(),
                                                       run_counted(CaptionValidator("TEXT", "URL"), table)[0])[0]))
    got = rows.select(["caption_gender", "female_indicators", "male_indicators"]).to_pylist()
    assert got[0] == got[1] and got[0]["caption_gender"] == "female"
    assert got[0]["female_indicators"] == ["name:Susan"] and got[0]["male_indicators"] == []
    assert got[2]["female_indicators"] == ["name:Kirsten"]


def test_it_runs_right_after_the_validator_in_the_caption_scan():
    from pipelines import amplification
    from pipelines.engine.cli.options import RunOptions
    from pipelines.studies.amplification.caption_settings import settings
    from pipelines.studies.amplification.caption_stages import caption_stages

    args = amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused"])
    names = [s.op.__name__ for s in caption_stages(settings(args), RunOptions.from_args(args),
                                                   {"text_column": "TEXT", "url_column": "URL"})]
    assert names[:3] == ["CaptionValidator", "CaptionNormaliser", "OccupationMatcher"]
