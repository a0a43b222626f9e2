"""Command-line behaviour that needs no Ray: help text and input errors raised before any work."""

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import amplification


def test_every_option_is_explained():
    parser = amplification.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["captions"]
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help text"
    assert "--captions" in sub.format_help() and "--no-indicator-mode" in sub.format_help()


def test_missing_text_column_fails_at_once(tmp_path, capsys):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"URL": ["u"], "title": ["a nurse"]}), bad)   # no caption-like column
    assert amplification.main(["captions", "--captions", str(bad), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "no caption column" in err and "--caption-column" in err
    assert not (tmp_path / "out").exists()
    # a column named explicitly must exist
    assert amplification.main(["captions", "--captions", str(bad), "--output", str(tmp_path / "out"),
                               "--caption-column", "TEXT"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'TEXT'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unreadable_file_fails_at_once(tmp_path, capsys):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 garbage")
    assert amplification.main(["captions", "--captions", str(bad), "--output", str(tmp_path / "out")]) == 2
    assert str(bad) in capsys.readouterr().err


def test_unloadable_model_fails_before_data_is_read(tmp_path, capsys):
    pq.write_table(pa.table({"URL": ["u"], "TEXT": ["a nurse"]}), tmp_path / "in.parquet")
    rc = amplification.main(["captions", "--captions", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
                             "--spacy-model", "xx_missing_pipeline"])
    assert rc == 2 and "xx_missing_pipeline" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bundled_sample_is_the_generator_output():
    from pipelines.synthetic_laion import generate

    bundled = pq.read_table(amplification.SAMPLE_INPUT)
    assert bundled.equals(generate(30000, seed=0), check_metadata=False)
    assert bundled.schema.metadata[b"synthetic"] == b"true"


# --output that cannot take results: one line, exit 2, before any model loads or data is read
import pytest  # noqa: E402

from pipelines import dalleval, gep  # noqa: E402

_OUTPUT_COMMANDS = [
    (amplification.main, ["run", "--standin-models"]),
    (amplification.main, ["captions"]),
    (amplification.main, ["summarize", "--percentages", "tests/data/paper002_table6.csv"]),
    (gep.main, ["run", "--standin-models"]),
    (gep.main, ["summarize", "--frequencies", "tests/data/paper001_tables11_12.csv"]),
    (dalleval.main, ["run", "--standin-models"]),
    (dalleval.main, ["summarize", "--counts", "tests/data/paper000_tables16_17.csv"]),
]


def _bad_outputs(tmp_path):
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a directory")
    return {"an existing file": (str(a_file), "is an existing file"),
            "a path under a file": (str(a_file / "sub"), "not a writable directory"),
            "an unwritable place": ("/proc/t2i-no-such-dir/out", "not a writable directory")}


@pytest.mark.parametrize("main,argv", _OUTPUT_COMMANDS,
                         ids=[f"{m.__module__.split('.')[-1]}-{a[0]}" for m, a in _OUTPUT_COMMANDS])
def test_bad_output_fails_at_once_with_one_line(tmp_path, capsys, monkeypatch, main, argv):
    from pipelines.engine import generation
    from pipelines.engine.run import models
    from pipelines.engine.stream import runtime
    from pipelines.studies.amplification import study
    from pipelines.studies.dalleval import study as dalleval_study
    from pipelines.studies.gep import study as gep_study

    def no_model_may_load(*a, **k):
        raise AssertionError("a model was loaded before --output was checked")

    for module in (models, generation, study, gep_study, dalleval_study):
        for name in ("clip_record", "build_standin_clip", "load_generators", "build_standin_generators"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, no_model_may_load)
    monkeypatch.setattr(runtime, "init_ray", no_model_may_load)
    for what, (output, message) in _bad_outputs(tmp_path).items():
        assert main([*argv, "--output", output]) == 2, what
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error: --output") and message in err, (what, err)
        assert "Traceback" not in err and output in err


def test_a_full_disk_is_one_line_and_other_os_errors_keep_their_traceback(capsys):
    import errno

    from pipelines.engine.cli.cli import exit_code

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/_work/part-3.parquet")

    assert exit_code(full) == 5
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "No space left on device while writing /runs/r/_work/part-3.parquet" in err
    assert "resumes" in err

    def denied():
        raise PermissionError(errno.EACCES, "Permission denied", "/x")

    with pytest.raises(PermissionError):
        exit_code(denied)


def test_native_stderr_lines_of_a_model_load_are_silenced_and_errors_still_raise(capfd):
    import os

    from pipelines.engine.run.models import native_stderr_silenced

    with native_stderr_silenced():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    with pytest.raises(RuntimeError, match="cannot load"):
        with native_stderr_silenced():
            raise RuntimeError("cannot load")
    os.write(2, b"restored\n")
    assert capfd.readouterr().err == "restored\n"
