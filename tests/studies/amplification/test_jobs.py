from helpers import REPO_ROOT
import pytest
import yaml

from pipelines.engine.cli.config import environment, load_config
from pipelines.studies.amplification.jobs import occupations_from


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


def test_job_file_gives_occupations_prompts_and_label():

    from pipelines.studies.amplification.prompts import prompt_table
    from pipelines.studies.amplification.jobs import job_config

    job = REPO_ROOT / "jobs" / "new.yaml"
    cfg, label = job_config(occupations_file=str(job))
    occ = occupations_from(cfg)
    assert label == "new-occupations" and [o.name for o in occ] == ["astronaut", "plumber", "software developer"]
    assert "pipefitters" in occ[1].forms()
    assert prompt_table(occ, cfg["prompts"])["astronaut"] == ["A photo of the face of an astronaut",
                                                             "A photo of an astronaut at work"]
    # --prompt wins over the job file; --occupations over the file's occupations
    cfg2, label2 = job_config(occupations="nurse", prompts=["{occupation} on duty"])
    assert cfg2["prompts"] == ["{occupation} on duty"] and label2 == "nurse"
    with pytest.raises(ValueError, match="placeholder"):
        job_config(prompts=["A photo of a person"])


def test_bad_job_files_are_refused(tmp_path):
    from pipelines.studies.amplification.jobs import job_config

    (tmp_path / "a.yaml").write_text("occupations: [nurse]\nthreshold: 0.5\n")
    with pytest.raises(ValueError, match="unknown keys"):
        job_config(occupations_file=str(tmp_path / "a.yaml"))
    (tmp_path / "b.yaml").write_text("prompts: ['{occupation}']\n")
    with pytest.raises(ValueError, match="occupations"):
        job_config(occupations_file=str(tmp_path / "b.yaml"))
    with pytest.raises(ValueError, match="cannot read"):
        job_config(occupations_file=str(tmp_path / "missing.yaml"))


def _run_id(*argv):
    from pipelines import amplification

    args = amplification.build_parser().parse_args(["run", "--output", "/tmp/unused", *argv])
    from pipelines.engine.cli.options import RunOptions
    from pipelines.engine.run.lifecycle import plan_run
    from pipelines.studies.amplification.captions import CaptionStudy

    study = CaptionStudy()
    return plan_run(RunOptions.from_args(args), study, study.settings(args)).run_id


def test_run_id_follows_the_study_not_the_execution():
    base = _run_id("--occupations", "astronaut,plumber")
    assert base.startswith("astronaut-plumber-") and len(base.rsplit("-", 1)[1]) == 8
    assert _run_id("--occupations", "astronaut,plumber", "--max-retries", "7", "--files-per-shard", "2",
                   "--no-progress", "--ner-actors", "2", "--max-error-rate", "0.5") == base
    assert _run_id("--occupations", "astronaut,plumber", "--nn-k", "7") != base
    assert _run_id("--occupations", "astronaut,plumber", "--prompt", "A photo of {article} {occupation}") != base
    assert _run_id("--occupations", "astronaut,pilot") != base
    assert _run_id("--occupations", "astronaut,plumber", "--run-id", "mine") == "mine"


def _caption_settings(*argv):
    from pipelines import amplification
    from pipelines.studies.amplification.caption_settings import settings

    return settings(amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused", *argv]))


def test_paper_preset_reads_the_paper_and_each_other_reading_is_one_flag():
    """Paper 002's preset with no flags: App. A.5's gender words verbatim, one search word per
    occupation (Table 4), SBERT in fp32; plurals of gender words, occupation forms and fp16 SBERT
    are options, and each option names another run."""
    st = _caption_settings()
    gi = st.gender_indicators
    assert sorted(gi["male_words"]) == ["boy", "gent", "gentleman", "male", "man"]
    assert sorted(gi["female_words"]) == ["female", "girl", "lady", "woman"]
    assert st.occupation_forms == "plural" and st.models["sbert_precision"] == "fp32"
    hair = [o for o in st.occupations if o.name == "hairdresser"]
    assert len(hair) == 1 and hair[0].terms == ("hairdresser",)

    opt = _caption_settings("--gender-word-plurals", "--occupation-forms", "singular", "--sbert-precision", "fp16")
    assert {"men", "boys", "gentlemen"} <= set(opt.gender_indicators["male_words"])
    assert {"women", "ladies", "girls"} <= set(opt.gender_indicators["female_words"])
    assert opt.occupation_forms == "singular" and opt.models["sbert_precision"] == "fp16"
    base = _run_id("--occupations", "astronaut,plumber")
    for flags in (["--gender-word-plurals"], ["--occupation-forms", "singular"], ["--sbert-precision", "fp16"]):
        assert _run_id("--occupations", "astronaut,plumber", *flags) != base, flags
    assert _run_id("--occupations", "astronaut,plumber", "--occupation-forms", "plural") == base


def test_occupations_matching_no_caption_are_named_and_none_matching_is_an_error(capsys):
    import pyarrow as pa

    from pipelines.engine.storage import io
    from pipelines.studies.amplification.captions import unmatched_occupations
    from schemas.subsets import SIMILARITY_SUMMARY

    def sim(counts):
        rows = [{"occupation": o, "matched_captions": n, "random_sample_size": 0, "nn_selected": 0}
                for o, n in counts.items()]
        return pa.Table.from_pylist(rows, schema=SIMILARITY_SUMMARY)

    assert unmatched_occupations(sim({"nurse": 3, "barista": 0, "dog walker": 0})) == ["barista", "dog walker"]
    out = capsys.readouterr().out
    assert out.startswith("warning: 2 of 3 occupation(s) match no caption") and "barista, dog walker" in out
    assert unmatched_occupations(sim({"nurse": 3})) == [] and capsys.readouterr().out == ""
    with pytest.raises(io.InputError, match="no caption of the input names any of the 2 occupation"):
        unmatched_occupations(sim({"barista": 0, "dog walker": 0}))


def test_a_caption_setting_enters_the_run_id_by_construction(tmp_path):
    """The run id is derived from the settings object, not from a list of keys: a caption-stage
    setting no hand-written job listed (the SBERT spec's screen margin with --sbert-backend torch,
    from the configuration's models block) names another run, and so does a setting a settings
    class gains later; what only changes how the run executes keeps the run id."""
    import dataclasses

    from pipelines import amplification
    from pipelines.engine.cli.options import RunOptions
    from pipelines.engine.run import rundir
    from pipelines.studies.amplification.caption_settings import CaptionSettings
    from pipelines.studies.amplification.captions import CaptionStudy

    occupations = ("--occupations", "astronaut,plumber", "--sbert-backend", "torch")
    base = _run_id(*occupations)
    margin = tmp_path / "margin.yaml"
    margin.write_text(yaml.safe_dump({"models": {"sbert_screen_margin": 0.01}}))
    assert _run_id(*occupations, "--config", str(margin)) != base
    execution = tmp_path / "execution.yaml"
    execution.write_text(yaml.safe_dump({"execution": {"scan_fragment_rows": 1000, "sbert_fold_duplicates": "off",
                                                       "files_per_shard": 1}}))
    assert _run_id(*occupations, "--config", str(execution)) == base
    for flags in (["--embed-actors", "3"], ["--scan-batch-size", "64"], ["--num-cpus", "3"], ["--sbert-fold", "off"],
                  ["--embed-gpus", "1"], ["--device", "cpu"], ["--ner-actors", "3"]):
        assert _run_id(*occupations, *flags) == base, flags
    assert _run_id(*occupations, "--no-names") != base

    @dataclasses.dataclass(frozen=True)
    class WithNewSetting(CaptionSettings):
        new_threshold: float = 0.5

    args = amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused", *occupations])
    study, opts = CaptionStudy(), RunOptions.from_args(args)
    st = study.settings(args)
    new = WithNewSetting(**{f.name: getattr(st, f.name) for f in dataclasses.fields(st)})

    def fingerprint(s):
        return rundir.fingerprint(rundir.plain(study.job(opts, s)))

    assert fingerprint(dataclasses.replace(new, new_threshold=0.6)) != fingerprint(new)
    assert fingerprint(dataclasses.replace(st, execution=dict(st.execution, max_retries=9))) == fingerprint(st)


def test_the_image_side_run_id_follows_its_settings_not_its_execution():
    from pipelines import amplification
    from pipelines.engine.cli.options import RunOptions
    from pipelines.engine.run.lifecycle import plan_run
    from pipelines.studies.amplification.study import AmplificationStudy

    def run_id(*argv):
        args = amplification.build_parser().parse_args(["run", "--output", "/tmp/unused", "--standin-models",
                                                        "--occupations", "astronaut,plumber", *argv])
        study = AmplificationStudy()
        return plan_run(RunOptions.from_args(args), study, study.settings(args)).run_id

    base = run_id()
    for flags in (["--face-actors", "3", "--clip-actors", "2"], ["--gen-actors", "2", "--gen-batch-size", "3"],
                  ["--fetch-threads", "4", "--num-cpus", "3"], ["--save-images"],
                  ["--url-rewrite", "https://images.example.org/=http://mirror.example/"]):
        assert run_id(*flags) == base, flags
    for flags in (["--face-min-size", "0.2"], ["--gender-threshold", "0.8"], ["--steps", "3"],
                  ["--images-per-prompt", "7"], ["--no-local-image-server"], ["--no-names"]):
        assert run_id(*flags) != base, flags
