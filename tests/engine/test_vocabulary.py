"""One command-line vocabulary across the studies: the same name means the same thing everywhere,
and the earlier spellings still work for one release, with a warning."""

import pytest

from pipelines import amplification, dalleval, exposed, gep


def parse(parser, argv):
    return parser().parse_args(argv)


def test_caption_input_and_column_have_one_name(capsys):
    a = parse(amplification.build_parser, ["captions", "--output", "o", "--captions", "x.parquet",
                                           "--caption-column", "caption"])
    assert (a.captions, a.caption_column) == (["x.parquet"], "caption")
    t = parse(exposed.build_parser, ["triplets", "--output", "o", "--captions", "x.csv", "--caption-column", "c",
                                     "--profession-set"])
    assert (t.captions, t.caption_column, t.profession_set) == ("x.csv", "c", True)
    r = parse(dalleval.build_parser, ["alignment", "--output", "o", "--captions", "c.parquet",
                                      "--caption-column", "text"])
    assert (r.captions, r.caption_column) == ("c.parquet", "text")
    e = parse(exposed.build_parser, ["run", "--output", "o", "--captions", "coco=c.parquet", "--caption-column", "t"])
    assert e.caption_column == "t"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("parser,argv,attr,value,old", [
    (amplification.build_parser, ["captions", "--output", "o", "--input", "a", "b"], "captions", ["a", "b"], "--input"),
    (amplification.build_parser, ["run", "--output", "o", "--text-column", "caption"], "caption_column", "caption",
     "--text-column"),
    (exposed.build_parser, ["triplets", "--output", "o", "--input", "x.csv"], "captions", "x.csv", "--input"),
    (exposed.build_parser, ["triplets", "--output", "o", "--column", "c"], "caption_column", "c", "--column"),
    (exposed.build_parser, ["triplets", "--output", "o", "--professions"], "profession_set", True, "--professions"),
])
def test_old_spellings_still_work_and_warn(capsys, parser, argv, attr, value, old):
    assert getattr(parse(parser, argv), attr) == value
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and old in err and "deprecated" in err


@pytest.mark.parametrize("parser,argv,default", [
    (gep.build_parser, ["run", "--output", "o"], True),
    (dalleval.build_parser, ["run", "--output", "o"], True),
    (dalleval.build_parser, ["skills", "--output", "o"], True),
    (dalleval.build_parser, ["alignment", "--output", "o"], True),
    (exposed.build_parser, ["run", "--output", "o"], True),
    (amplification.build_parser, ["run", "--output", "o"], False),
])
def test_save_images_is_one_switch_with_the_study_s_default(parser, argv, default):
    assert parse(parser, argv).save_images is default
    assert parse(parser, [*argv, "--save-images"]).save_images is True
    assert parse(parser, [*argv, "--no-save-images"]).save_images is False


@pytest.mark.parametrize("parser,cmd", [(gep.build_parser, "run"), (dalleval.build_parser, "run"),
                                        (dalleval.build_parser, "skills"), (dalleval.build_parser, "alignment"),
                                        (exposed.build_parser, "run"), (amplification.build_parser, "run")])
def test_every_image_study_has_the_same_generation_options(parser, cmd):
    args = parse(parser, [cmd, "--output", "o", "--generator", "m:steps=2", "--steps", "3", "--guidance-scale", "2",
                          "--negative-prompt", "blurry", "--dtype", "bfloat16", "--generation-seed", "4",
                          "--gen-batch-size", "2", "--gen-actors", "1"])
    assert (args.generator, args.steps, args.guidance_scale, args.negative_prompt, args.dtype,
            args.generation_seed) == (["m:steps=2"], 3, 2.0, "blurry", "bfloat16", 4)


def test_a_subset_flag_keeps_the_configured_order_and_names_unknown_entries():
    from pipelines.engine.cli.config import only

    assert only(["nurse", "pilot", "chef"], "chef, nurse", "--professions") == ["nurse", "chef"]
    assert only(["a", "b"], None, "--x") == ["a", "b"]
    with pytest.raises(ValueError, match=r"--professions: \['astronaut'\]"):
        only(["nurse"], "nurse,astronaut", "--professions")


def test_every_error_budget_declares_the_budget_contract():
    from pipelines.engine.stream.progress import Budget, ErrorBudget
    from pipelines.studies.amplification.caption_scan import _TallyBudget

    assert isinstance(ErrorBudget("s", {}, 0.05, 10), Budget)
    assert isinstance(_TallyBudget(ErrorBudget("s", {}, 0.05, 10)), Budget)
