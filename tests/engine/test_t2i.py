"""`t2i <study> <command>`: the one console command dispatches to each study's entry point."""

import json

import pytest

from helpers import REPO_ROOT
from pipelines import t2i

DATA = REPO_ROOT / "tests" / "data"


def test_t2i_runs_a_study_command_as_its_script_does(tmp_path):
    from pipelines import gep

    args = ["summarize", "--frequencies", str(DATA / "paper001_tables11_12.csv")]
    assert t2i.main(["gep", *args, "--output", str(tmp_path / "a")]) == 0
    assert gep.main([*args, "--output", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "gep_summary.json").read_text()) for d in ("a", "b"))
    assert a == b and a                         # the same command, the same results


def test_every_study_is_registered_and_listed(capsys):
    assert set(t2i.STUDIES) == {"amplification", "gep", "dalleval", "exposed"}
    assert t2i.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in t2i.STUDIES)
    assert t2i.main([]) == 2


@pytest.mark.parametrize("argv", [["nope", "run"], ["GEP"]])
def test_an_unknown_study_is_one_line_and_exit_2(argv, capsys):
    assert t2i.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown study") and "amplification" in err
