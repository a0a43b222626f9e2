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


SHARED = ("--output", "--run-id", "--ray-address", "--num-cpus", "--max-retries", "--no-progress", "--verbose",
          "--overwrite", "--clip-model", "--clip-pretrained", "--clip-revision")


def _commands():
    import argparse

    from pipelines import amplification, dalleval, exposed, gep

    for name, module, command in (("amplification", amplification, "run"), ("gep", gep, "run"),
                                  ("dalleval", dalleval, "run"), ("dalleval", dalleval, "alignment"),
                                  ("exposed", exposed, "run")):
        sub = next(a for a in module.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        yield f"{name} {command}", sub.choices[command]


def test_the_shared_options_are_declared_once_with_one_meaning():
    """The run-control, output and CLIP options come from pipelines/engine/cli/arguments.py: the same
    flags, types and defaults in every study's run command (only the CLIP default's name differs)."""
    seen = {}
    for label, parser in _commands():
        actions = {o: a for a in parser._actions for o in a.option_strings}
        for flag in SHARED:
            a = actions[flag]
            key = (a.dest, a.type, a.default, a.required, a.nargs, type(a).__name__,
                   None if flag.startswith(("--clip", "--run-id")) else a.help)   # one text, where it has one meaning
            seen.setdefault(flag, {})[label] = key
    for flag, per in seen.items():
        assert len(set(per.values())) == 1, (flag, per)
