"""The run id derived from the settings themselves: every field by construction, what only says
how a run executes left out everywhere, a study's analysis-only fields left out by declaration."""

import dataclasses
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from pipelines.engine.cli.options import RunOptions
from pipelines.engine.run.fingerprint import settings_job
from pipelines.engine.run.models import ModelSpec


@dataclass(frozen=True)
class Inner:
    threshold: float = 0.5
    rule: str = "any"
    batch_size: int = 8


@dataclass(frozen=True)
class Settings:
    label: str = "job"
    words: tuple = ("a", "b")
    inner: Inner = field(default_factory=Inner)
    model: ModelSpec = field(default_factory=lambda: ModelSpec("org/m", options={"batch_size": 4, "prompts": ["x"]}))
    execution: dict = field(default_factory=lambda: {"max_retries": 3})
    table: pa.Table | None = None

    not_in_run_id = ("inner.rule",)


def test_every_field_is_in_the_job_but_what_says_how_it_executes():
    job = settings_job(Settings(table=pa.table({"p": ["x", "y"]})))
    assert set(job) == {"words", "inner", "model", "table"}           # label and execution left out
    assert job["inner"] == {"threshold": 0.5}                        # batch size everywhere; declared rule
    assert job["model"] == {"model": "org/m", "revision": None, "prompts": ["x"]}
    assert job["table"]["rows"] == 2


@pytest.mark.parametrize("change, same", [
    ({"words": ("a", "c")}, False),
    ({"inner": Inner(threshold=0.6)}, False),
    ({"table": pa.table({"p": ["x", "z"]})}, False),
    ({"model": ModelSpec("org/m", options={"batch_size": 4, "prompts": ["y"]})}, False),
    ({"inner": Inner(rule="all")}, True),                            # declared analysis-only
    ({"inner": Inner(batch_size=64)}, True),
    ({"model": ModelSpec("org/m", options={"batch_size": 64, "prompts": ["x"]})}, True),
    ({"execution": {"max_retries": 9}}, True),
    ({"label": "other"}, True),
])
def test_a_setting_changes_the_job_unless_it_only_says_how_it_executes(change, same):
    base = Settings(table=pa.table({"p": ["x", "y"]}))
    assert (settings_job(dataclasses.replace(base, **change)) == settings_job(base)) is same


def test_a_field_added_to_a_settings_class_is_in_the_job_by_construction():
    @dataclass(frozen=True)
    class Grown(Settings):
        new_knob: int = 1

    assert settings_job(Grown(new_knob=2)) != settings_job(Grown(new_knob=1))


def _job(parser, argv):
    args = parser().parse_args(argv)
    from pipelines import dalleval, gep

    study = {("dalleval", "run"): "pipelines.studies.dalleval.study:DallEvalStudy",
             ("dalleval", "skills"): "pipelines.studies.dalleval.skills_study:SkillsStudy",
             ("gep", "run"): "pipelines.studies.gep.study:GepStudy"}[
        ("dalleval" if parser is dalleval.build_parser else "gep", argv[0])]
    module, name = study.split(":")
    s = getattr(__import__(module, fromlist=[name]), name)()
    return s.job(RunOptions.from_args(args), s.settings(args))


@pytest.mark.parametrize("cmd, changed, kept", [
    (["dalleval", "run"], ["--steps", "3"], ["--gen-batch-size", "2", "--gen-actors", "3", "--num-cpus", "2"]),
    (["dalleval", "skills"], ["--prompts-per-skill", "4"], ["--threshold", "0.9"]),   # scoring: after the images
    (["gep", "run"], ["--attributes", "boots"], ["--ensemble", "3"]),                # the classifier: after them
])
def test_each_image_study_s_run_id_follows_its_settings_not_its_execution(cmd, changed, kept):
    from pipelines import dalleval, gep

    parser = {"dalleval": dalleval.build_parser, "gep": gep.build_parser}[cmd[0]]
    base = _job(parser, [cmd[1], "--output", "x"])
    assert _job(parser, [cmd[1], "--output", "x", *changed]) != base
    assert _job(parser, [cmd[1], "--output", "x", *kept]) == base
