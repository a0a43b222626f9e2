"""Command-line behaviour that needs no Ray: help text and input errors raised before any work."""

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import amplification


def test_every_option_is_explained():
    parser = amplification.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["captions"]
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help text"
    assert "--input" in sub.format_help() and "--no-indicator-mode" in sub.format_help()


def test_missing_text_column_fails_at_once(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"URL": ["u"], "caption": ["a nurse"]}), bad)
    assert amplification.main(["captions", "--input", str(bad), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'TEXT'" in err
    assert not (tmp_path / "out").exists()


def test_unreadable_file_fails_at_once(tmp_path, capsys):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 garbage")
    assert amplification.main(["captions", "--input", str(bad), "--output", str(tmp_path / "out")]) == 2
    assert str(bad) in capsys.readouterr().err


def test_unloadable_model_fails_before_data_is_read(tmp_path, capsys):
    pq.write_table(pa.table({"URL": ["u"], "TEXT": ["a nurse"]}), tmp_path / "in.parquet")
    rc = amplification.main(["captions", "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
                             "--spacy-model", "xx_missing_pipeline"])
    assert rc == 2 and "xx_missing_pipeline" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bundled_sample_is_the_generator_output():
    from pipelines.synthetic_laion import generate

    bundled = pq.read_table(amplification.SAMPLE_INPUT)
    assert bundled.equals(generate(30000, seed=0), check_metadata=False)
    assert bundled.schema.metadata[b"synthetic"] == b"true"
