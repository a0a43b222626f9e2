"""Generator specs: each model with its own settings, from the study file and the command line, in
the order the module documents; what is fingerprinted; the plan's stage list."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines import dalleval, exposed, gep
from pipelines.engine import generation as G
from pipelines.engine.generation import GeneratorSpec, generation_settings, parse_generator

BLOCK = {"models": ["org/sd15"], "revisions": {}, "images_per_prompt": 5, "steps": 50, "guidance_scale": 7.5,
         "scheduler": "LMSDiscreteScheduler", "seed": 0, "safety_checker": "off"}


def args_of(argv, parser=gep.build_parser):
    return parser().parse_args(["run", "--output", "x", *argv])


def test_a_bare_model_and_a_model_with_settings():
    assert parse_generator("org/sd15") == ("org/sd15", {})
    model, s = parse_generator("stabilityai/sdxl-turbo:steps=1,guidance_scale=0,max_sequence_length=256")
    assert model == "stabilityai/sdxl-turbo"
    assert s == {"steps": "1", "guidance_scale": "0", "max_sequence_length": 256}   # extra values are typed
    # a comma inside a value (a negative prompt) does not start a new setting
    _, s = parse_generator("m:negative_prompt=blurry, low quality, watermark,steps=4")
    assert s == {"negative_prompt": "blurry, low quality, watermark", "steps": "4"}
    # a directory path with a colon-free name, and extra.KEY spelled out
    assert parse_generator("/models/sd:extra.clip_skip=2") == ("/models/sd", {"clip_skip": 2})
    with pytest.raises(ValueError, match="MODEL"):
        parse_generator(":steps=2")


def test_the_study_defaults_apply_to_every_generator():
    gs = generation_settings(BLOCK, args_of([]))
    (spec,) = gs.generators
    assert spec == GeneratorSpec("org/sd15", steps=50, guidance_scale=7.5, scheduler="LMSDiscreteScheduler",
                                 safety_checker="off", family="unknown")
    assert (gs.seed, gs.images_per_prompt) == (0, 5)


def test_precedence_file_default_then_file_model_then_global_flags_then_generator_flag():
    block = {**BLOCK, "models": ["org/a", {"model": "org/b", "steps": 4, "guidance_scale": 1.0,
                                           "negative_prompt": "blurry", "max_sequence_length": 256}]}
    a, b = generation_settings(block, args_of([])).generators
    assert (a.steps, a.guidance_scale, a.negative_prompt) == (50, 7.5, None)
    assert (b.steps, b.guidance_scale, b.negative_prompt, dict(b.extra)) == (4, 1.0, "blurry",
                                                                            {"max_sequence_length": 256})
    # a global flag applies to every generator, over the file's per-model value
    a, b = generation_settings(block, args_of(["--steps", "2"])).generators
    assert (a.steps, b.steps) == (2, 2) and b.guidance_scale == 1.0
    # --generator picks the models; a model the file configures keeps its file settings, and the
    # flag's own settings win over everything
    (b,) = generation_settings(block, args_of(["--steps", "2", "--generator", "org/b:steps=1,width=512"])).generators
    assert (b.steps, b.width, b.guidance_scale, b.negative_prompt) == (1, 512, 1.0, "blurry")


def test_revisions_from_the_file_the_flag_and_the_spec():
    block = {**BLOCK, "models": ["org/a", "org/b"], "revisions": {"org/a": "r1"}}
    a, b = generation_settings(block, args_of(["--generator-revision", "org/b=r2"])).generators
    assert (a.revision, b.revision) == ("r1", "r2")
    (a,) = generation_settings(block, args_of(["--generator", "org/a:revision=r9"])).generators
    assert a.revision == "r9"
    # the command line wins over a file's per-model pin; an empty revision unpins
    block = {**BLOCK, "models": [{"model": "org/a", "revision": "f1"}, "org/b"], "revisions": {"org/b": "f2"}}
    a, b = generation_settings(block, args_of([])).generators
    assert (a.revision, b.revision) == ("f1", "f2")
    a, b = generation_settings(block, args_of(["--generator-revision", "org/a=c1", "--generator-revision",
                                               "org/b="])).generators
    assert (a.revision, b.revision) == ("c1", None)


@pytest.mark.parametrize("argv,match", [
    (["--generator", "org/a", "--generator", "org/a:steps=2"], "listed twice"),
    (["--generator", "org/a", "--generators", "org/b"], "not both"),
    (["--generator", "org/a:steps=many"], "not a number"),
    (["--generator", "org/a:height=100"], "multiple of 8"),
    (["--generator", "org/a:dtype=int8"], "dtype"),
    (["--generator", "org/a:safety_checker=maybe"], "safety_checker"),
])
def test_bad_generator_settings_fail_with_one_line(argv, match):
    with pytest.raises(ValueError, match=match):
        generation_settings(BLOCK, args_of(argv))


def test_the_run_id_follows_the_spec_of_each_model():
    from pipelines.studies.gep import study

    def job(argv):
        from pipelines.engine.cli.options import RunOptions

        args = args_of(argv)
        return study.GepStudy().job(RunOptions.from_args(args), study.settings(args))

    base = job(["--generator", "org/a", "--generator", "org/b"])
    assert job(["--generator", "org/a", "--generator", "org/b"]) == base
    assert job(["--generator", "org/a", "--generator", "org/b:steps=4"]) != base
    assert job(["--generator", "org/a", "--generator", "org/b:negative_prompt=blurry"]) != base
    rec = base["generation"]["generators"][1]
    # org/b is of no family known before loading, unlike the study file's SD models: the pipeline's
    # own defaults, not the paper's protocol (GEP's 50 k-LMS steps), unless it is said to be SD
    assert rec["model"] == "org/b" and rec["family"] == "unknown"
    assert rec["steps"] is None and rec["guidance_scale"] is None and rec["scheduler"] is None
    sd = job(["--generator", "org/a", "--generator", "org/b:family=sd"])["generation"]["generators"][1]
    assert (sd["family"], sd["steps"], sd["guidance_scale"], sd["scheduler"]) == ("sd", 50, 7.5, "LMSDiscreteScheduler")


def test_every_image_study_reads_the_same_generator_flags():
    from pipelines.studies.dalleval import study as dalleval_study
    from pipelines.studies.exposed import settings as exposed_settings

    argv = ["--generator", "org/x:steps=3,negative_prompt=a, b", "--guidance-scale", "2"]
    for parser, settings in ((gep.build_parser, None), (dalleval.build_parser, dalleval_study.settings)):
        args = args_of(argv, parser)
        st = settings(args) if settings else __import__("pipelines.studies.gep.study", fromlist=["x"]).settings(args)
        (spec,) = st.generation.generators
        assert (spec.model, spec.steps, spec.guidance_scale, spec.negative_prompt) == ("org/x", 3, 2.0, "a, b")
    args = exposed.build_parser().parse_args(["run", "--output", "x", *argv])
    (spec,) = exposed_settings.settings(args).generation.generators
    assert (spec.steps, spec.negative_prompt) == (3, "a, b")


def test_extra_call_arguments_are_checked_against_the_pipeline_signature():
    class Pipe:
        def __call__(self, prompt, num_inference_steps=50, negative_prompt=None, max_sequence_length=256):
            return None

    G.check_call_arguments(Pipe(), GeneratorSpec("m", negative_prompt="x", extra=(("max_sequence_length", 77),)))
    with pytest.raises(ValueError, match=r"takes no \['clip_skip'\].*max_sequence_length"):
        G.check_call_arguments(Pipe(), GeneratorSpec("m", extra=(("clip_skip", 2),)))

    class NoNegative:
        def __call__(self, prompt, num_inference_steps=50):
            return None

    with pytest.raises(ValueError, match="negative_prompt"):
        G.check_call_arguments(NoNegative(), GeneratorSpec("m", negative_prompt="x"))


def test_the_plan_builds_the_generator_stage_from_the_spec():
    from operators.base import Resources, Stage
    from operators.image_generation import ImageGenerator
    from operators.image_sink import ImageSink
    from operators.image_skin_tone import SkinToneDetector
    from schemas.dalleval import DALLEVAL_IMAGES

    from pipelines.engine.cli.options import RunOptions

    options = RunOptions.from_args(SimpleNamespace(gen_batch_size=3, gen_actors=2, gen_channels_last=True))
    run = SimpleNamespace(options=options, safety=None,
                          gpu=SimpleNamespace(device="cuda", per_actor=0.5), rd=SimpleNamespace(uri="/runs/r"),
                          st=SimpleNamespace(execution={"stages": {"skin_tone": {"actors": 5}}}))
    spec = GeneratorSpec("org/b", steps=4, guidance_scale=1.0, negative_prompt="blurry", dtype="bfloat16",
                         extra=(("max_sequence_length", 256),))
    from operators.image_clip_gender import ClipGenderClassifier

    head = Stage(ClipGenderClassifier, {})
    plan = G.GenerationPlan(None, DALLEVAL_IMAGES, ImageGenerator, ImageSink, heads=[head],
                            after=[Stage(SkinToneDetector, {})],
                            overrides={SkinToneDetector.stage_name: lambda batch: {"batch_size": batch * 4}})
    gen, skin, sink = G.generator_pipeline(run, plan, spec)
    assert gen.op is ImageGenerator and sink.op is ImageSink and skin.op is SkinToneDetector
    kw = gen.kwargs
    assert (kw["model"], kw["steps"], kw["guidance_scale"], kw["dtype"], kw["device"]) == \
        ("org/b", 4, 1.0, "bfloat16", "cuda")
    assert kw["call_kwargs"] == {"negative_prompt": "blurry", "max_sequence_length": 256}
    assert kw["heads"] == [head] and kw["micro_batch"] == 3 and kw["channels_last"] is True
    assert gen.resources == Resources(num_cpus=gen.declared().num_cpus, num_gpus=0.5, batch_size=3, actors=2)
    assert skin.resources.batch_size == 12 and skin.resources.actors == 5
    assert sink.kwargs["uri"].startswith("/runs/r/images/b-")
    plan.save_images = False
    assert [s.op for s in G.generator_pipeline(run, plan, spec)] == [ImageGenerator, SkinToneDetector]


def test_standin_generators_keep_each_spec_s_settings(tmp_path):
    specs = [GeneratorSpec("org/a", revision="r1", steps=3), GeneratorSpec("org/b", negative_prompt="x")]
    built = G.build_standin_generators(specs, str(tmp_path), shared_text_encoder=(0, 1))
    # named after the requested models (generator-N-standin only when two would share a name)
    assert [s.model for s in built] == [str(tmp_path / "a-standin"), str(tmp_path / "b-standin")]
    assert (built[0].steps, built[0].revision, built[1].negative_prompt) == (3, None, "x")
    enc = [sorted(p.read_bytes() for p in (tmp_path / n / "text_encoder").iterdir())
           for n in ("a-standin", "b-standin")]
    assert enc[0] == enc[1]    # one text encoder, copied
    records = G.load_generators(built, True)
    assert [r["detail"]["spec"]["steps"] for r in records] == [3, 50]
    same = G.build_standin_generators([GeneratorSpec("x/sd"), GeneratorSpec("y/sd")], str(tmp_path / "same"))
    assert [Path(s.model).name for s in same] == ["generator-1-standin", "generator-2-standin"]
    with pytest.raises(ValueError, match="takes no"):
        G.load_generators([built[0].at(built[0].model).__class__(built[0].model, extra=(("no_such_arg", 1),))], True)


def test_a_standin_generator_is_loaded_once_per_process_and_recorded_in_each_run_s_directory(tmp_path, monkeypatch):
    from pipelines.engine.generation import loading

    monkeypatch.setattr(loading, "_LOADED", type(loading._LOADED)())
    calls, real = [], loading.load_text2image
    monkeypatch.setattr(loading, "load_text2image", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    runs = [G.build_standin_generators([GeneratorSpec("org/a", steps=2)], str(tmp_path / r))[0] for r in ("r1", "r2")]
    first, second = (G.load_generators([spec], True)[0]["detail"] for spec in runs)
    assert calls == [runs[0].model]      # the second run's stand-in has the same files: kept, not loaded
    # its record is what a new load of its own directory records
    _, record = real(runs[1].model, None, device="cpu", dtype="float32",
                     safety_checker=runs[1].operator_kwargs()["safety_checker"])
    assert {k: second[k] for k in record} == record and second["path"] == str(tmp_path / "r2" / "a-standin")
    assert first["path"] == str(tmp_path / "r1" / "a-standin") and first["weights_sha256"] == second["weights_sha256"]
    # another sampler is another pipeline; a generator that is not a stand-in is never kept
    G.load_generators([dataclasses.replace(runs[1], scheduler="EulerDiscreteScheduler")], True)
    G.load_generators([runs[1]], False)
    G.load_generators([runs[1]], False)
    assert calls == [runs[0].model] + [runs[1].model] * 3

    def new_sampler(pipe, spec):        # a check that replaces a component of the pipeline it was given
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)

    G.load_generators([runs[1]], True, check=new_sampler)
    assert len(calls) == 4
    G.load_generators([runs[1]], True)   # what the check left is not used again
    assert len(calls) == 5
    # the oldest let go first once more than STANDINS_LOADED_KEPT bytes are kept
    monkeypatch.setattr(loading, "STANDINS_LOADED_KEPT", 1)
    G.load_generators([runs[0]], True)
    assert len(calls) == 5 and len(loading._LOADED) == 1
    G.load_generators([dataclasses.replace(runs[0], scheduler="EulerDiscreteScheduler")], True)
    G.load_generators([runs[0]], True)
    assert len(calls) == 7


def test_a_standin_nsfw_check_is_calibrated_on_the_generators_as_they_load(tmp_path, capsys):
    """Each generator is loaded once on the driver: the stand-in NSFW check's calibration images
    come from the pipeline ``load_generators`` loaded, with the pipeline's own safety checker off
    meanwhile (and back after), the same images a pipeline loaded without its checker gives."""
    import torch

    from operators.support.diffusion import _generate, load_text2image
    from pipelines.engine.generation.loading import CALIBRATION_PROMPTS
    from pipelines.engine.generation.safety import SafetySettings
    from pipelines.standins.diffusion import checker_levels

    (spec,) = G.build_standin_generators([GeneratorSpec("org/a", steps=2)], str(tmp_path))
    safety, checker = G.standin_checker(SafetySettings(exclude=True), str(tmp_path))
    assert (safety.model, safety.revision, safety.exclude) == (str(tmp_path / "nsfw-check-standin"), None, True)
    assert "nsfw-check-standin" in capsys.readouterr().out
    assert G.standin_checker(SafetySettings(policy="off"), str(tmp_path)) == (SafetySettings(policy="off"), None)

    class OwnChecker:   # a pipeline's own checker: never called while calibrating
        def __call__(self, *a, **k):
            raise AssertionError("the pipeline's own checker ran")

    own, seen = OwnChecker(), []

    def with_own_checker(pipe, s):
        pipe.safety_checker = own
        config = dict(pipe.config)
        checker.calibrate(pipe, s)
        seen.append(pipe.safety_checker)
        assert dict(pipe.config) == config          # the pipeline's config as it was

    G.load_generators([spec], True, calibrate=with_own_checker)
    assert seen == [own] and len(checker.images) == 1
    pipe, _ = load_text2image(spec.model, device="cpu", dtype="float32", safety_checker="off")
    with torch.inference_mode():
        alone, _ = _generate(pipe, list(CALIBRATION_PROMPTS), list(range(len(CALIBRATION_PROMPTS))), spec.steps,
                             spec.guidance_scale, spec.height, spec.width, "cpu", spec.call_kwargs)
    assert torch.equal(checker.images[0], checker_levels(alone))
    with pytest.raises(RuntimeError, match="calibration images of 1 generator"):
        checker.build(2)
    assert checker.build(1) == safety.model and (tmp_path / "nsfw-check-standin" / "config.json").is_file()
    # the run's driver: the generators load once, calibrating the checker, which loads after them
    from pipelines.engine.run import lifecycle

    class Study:
        check_generator = None

        def load_models(self, opts, st, gp):
            return []

    safety, checker = G.standin_checker(SafetySettings(), str(tmp_path / "run"))
    records = lifecycle._load_models(Study(), SimpleNamespace(standin_models=True), None, None, [spec], safety,
                                     checker)
    assert len(checker.images) == 1 and torch.equal(checker.images[0], checker_levels(alone))
    assert [r["role"] for r in records] == ["generator", "NSFW check (every model's images)"]
    assert records[1]["model"] == safety.model == checker.path


def test_a_standin_s_calibration_is_generated_once_per_process_by_what_decides_it(tmp_path, monkeypatch):
    """The same stand-in (rebuilt elsewhere with the same seed) at the same settings calibrates a
    later run's checker with the levels generated first, without generating; other steps, another
    sampler, another seed's weights or other torch threads generate again."""
    import torch

    from operators.support.diffusion import load_text2image
    from pipelines.engine.generation import loading

    monkeypatch.setattr(loading, "_CALIBRATED", {})
    calls = []
    real = loading.StandinChecker._images
    monkeypatch.setattr(loading.StandinChecker, "_images",
                        staticmethod(lambda pipe, spec: calls.append(spec.model) or real(pipe, spec)))

    def calibrated(where, spec_kw=None, seed_names=None, scheduler=None):
        specs = [GeneratorSpec("org/a", **({"steps": 2} | (spec_kw or {}))), GeneratorSpec("org/b", steps=2)]
        built = G.build_standin_generators(specs, str(tmp_path / where), seed_names)
        checker = loading.StandinChecker(str(tmp_path / where))
        pipe, _ = load_text2image(built[0].model, device="cpu", dtype="float32", safety_checker="off",
                                  scheduler=scheduler)
        checker.calibrate(pipe, built[0])
        return checker.images[0]

    first = calibrated("one")
    assert len(calls) == 1
    again = calibrated("two")                       # the same files, elsewhere: not generated again
    assert len(calls) == 1 and torch.equal(again, first) and again.dtype == torch.uint8
    assert calibrated("three", {"steps": 3}) is not None and len(calls) == 2
    assert calibrated("four", scheduler="EulerDiscreteScheduler") is not None and len(calls) == 3
    assert calibrated("five", seed_names=["generator-b", "generator-a"]) is not None and len(calls) == 3
    # the second stand-in's seed gives other weights: org/b first
    specs = [GeneratorSpec("org/b", steps=2), GeneratorSpec("org/a", steps=2)]
    built = G.build_standin_generators(specs, str(tmp_path / "six"))
    other = loading.StandinChecker(str(tmp_path / "six"))
    pipe, _ = load_text2image(built[1].model, device="cpu", dtype="float32", safety_checker="off")
    other.calibrate(pipe, built[1])                 # seed 1's weights
    assert len(calls) == 4 and not torch.equal(other.images[0], first)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert calibrated("seven") is not None and len(calls) == 5
    finally:
        torch.set_num_threads(threads)
    assert calibrated("eight") is not None and len(calls) == 5
    # what a process keeps is bounded by bytes: over it, the oldest are let go (the newest kept)
    monkeypatch.setattr(loading, "CALIBRATION_BYTES_KEPT", 1)
    assert calibrated("nine", {"steps": 4}) is not None and len(calls) == 6 and len(loading._CALIBRATED) == 1
    assert calibrated("ten") is not None and len(calls) == 7


def test_the_negative_prompt_reaches_the_pipeline_call(tmp_path, capsys):
    import numpy as np

    from operators.image_generation import ImageGenerator

    (spec,) = G.build_standin_generators([GeneratorSpec("org/a", steps=2, height=32, width=32)], str(tmp_path))
    # the requested model is replaced with a word, naming it and its stand-in
    assert "generator org/a -> tiny random sd stand-in a-standin" in capsys.readouterr().out
    plain = ImageGenerator(**{**spec.operator_kwargs(), "device": "cpu"})
    negative = ImageGenerator(**{**dataclasses.replace(spec, negative_prompt="a red square").operator_kwargs(),
                                 "device": "cpu"})
    assert negative.record["call_kwargs"] == {"negative_prompt": "a red square"}
    a, b = plain.regenerate("a photo of a nurse", 7), negative.regenerate("a photo of a nurse", 7)
    assert a.shape == b.shape == (32, 32, 3) and not np.array_equal(a, b)
    assert np.array_equal(a, plain.regenerate("a photo of a nurse", 7))


def test_a_plan_s_heads_are_fingerprinted_and_counted():
    import pyarrow as pa

    from operators.base import Stage
    from operators.image_clip_embedding import ClipImageEmbedder
    from pipelines.engine.stream.progress import Phase
    from pipelines.studies.gep import study
    from schemas import gep as S
    from schemas.images import GENERATION_STATUS, MODEL

    args = args_of(["--generator", "org/a"])
    st = study.settings(args)
    from pipelines.engine.cli.options import RunOptions

    job = study.GepStudy().job(RunOptions.from_args(args), st)
    heads = job["plan"]["heads"]
    assert [h["op"] for h in heads] == ["operators.image_clip_embedding.ClipImageEmbedder"]
    from operators.image_generation import ImageGenerator

    other = G.plan_job(G.GenerationPlan(None, S.GEP_IMAGES, ImageGenerator,
                                        heads=[Stage(ClipImageEmbedder, {"model": "other"})]))
    assert other["heads"] != heads     # a head's setting is part of the run's identity
    images = pa.table({MODEL: ["m"] * 4, GENERATION_STATUS: ["ok", "ok", "ok", "generation_error"],
                       S.EMBEDDING: pa.array([[0.1], None, [0.2], None], pa.list_(pa.float32()))})
    phase = Phase("generate m", "images", 4)
    phase.processed = 4
    gen, head = G.generation_rows(images, 4, {"m": phase}, heads=[Stage(ClipImageEmbedder, {})])
    assert (gen["stage"], gen["rows_in"], gen["kept"]) == ("generate", 4, 3)
    assert (head["stage"], head["rows_in"], head["kept"], head["dropped"]) == ("clip_embed", 3, 2, 1)
    assert "no_embedding" in str(head)


def test_execution_stages_reach_the_heads_inside_the_generator():
    from operators.base import Stage
    from operators.image_clip_alignment import ClipAlignmentScorer
    from operators.image_fid_features import FidFeatureExtractor
    from operators.image_generation import ImageGenerator
    from pipelines.engine.stream import stages

    gen = Stage(ImageGenerator, {"model": "m", "heads": [Stage(ClipAlignmentScorer, {"batch_size": 32}),
                                                          Stage(FidFeatureExtractor, {"batch_size": 32})]})
    (out,) = stages.configure([gen], stages.overrides({"stages": {"generate.fid_features": {"batch_size": 8},
                                                                  "fid_features": {"actors": 3}}}))
    assert [h.kwargs["batch_size"] for h in out.kwargs["heads"]] == [32, 8]
    described = stages.describe([out])[0]["inside"]
    assert [(d["stage"], d["batch_size"]) for d in described] == [("generate.clip_alignment", 32),
                                                                   ("generate.fid_features", 8)]
    with pytest.raises(ValueError, match="runs inside generate"):
        stages.configure([gen], {"generate.fid_features": {"actors": 4}})


@pytest.mark.parametrize("model,match", [
    ("/no/such/models/sd", "no such directory"), ("./models/sd", "no such directory"),
    ("org/sd/unet", "no such directory"), ("org/has space", "neither a local directory nor a Hugging Face repo id"),
    ("org--x/model", "neither a local directory nor a Hugging Face repo id")])
def test_a_generator_that_names_no_loadable_model_is_refused_before_any_work(model, match, tmp_path):
    """Known offline, with or without --standin-models: a path that is no directory, a
    name that is no hub repo id. (A valid hub id may exist: a real run finds out when it loads it.)"""
    for standin in ([], ["--standin-models"]):
        with pytest.raises(ValueError, match=match):
            generation_settings(BLOCK, args_of(["--generators", model, *standin]))
    (tmp_path / "sd").mkdir()   # an existing directory is a local model (its files are checked when it loads)
    (spec,) = generation_settings(BLOCK, args_of(["--generators", str(tmp_path / "sd"), "--standin-models"])).generators
    assert spec.model == str(tmp_path / "sd")
    assert generation_settings(BLOCK, args_of(["--generators", "org/invented-model"])).generators[0].family == "unknown"


def test_standin_models_refuse_a_hub_id_of_no_known_family_unless_its_family_is_given(capsys):
    """A stand-in replaces the model without looking for it, so an invented id ran as if it
    existed. A hub id this project knows, or one with its family given, is accepted."""
    with pytest.raises(ValueError, match=r"generator 'org/invented-model': not a local directory, not a hub id this "
                                         r"project knows .* --generator org/invented-model:family=FAMILY"):
        generation_settings(BLOCK, args_of(["--generators", "org/invented-model", "--standin-models"]))
    known = generation_settings(BLOCK, args_of(["--generators", "stabilityai/sdxl-turbo", "--standin-models"]))
    assert known.generators[0].family == "sdxl"
    for family in ("sd", "unknown"):
        (spec,) = generation_settings(BLOCK, args_of(["--generator", f"org/invented-model:family={family}",
                                                      "--standin-models"])).generators
        assert spec.family == family
    # the command line: one line, exit 2, before Ray or any model starts
    assert dalleval.main(["run", "--output", "unused-never-written", "--standin-models", "--generators",
                          "org/invented-model"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: generator 'org/invented-model': not a local directory") and len(err.splitlines()) == 1
    assert "Traceback" not in err and not Path("unused-never-written").exists()


def test_cpu_offload_is_the_card_s_recommendation_a_per_model_setting_and_not_in_the_run_id(capsys):
    """HiDream-I1, Lumina 2 and Chroma offload by their cards' examples; a spec turns it on or off;
    on GPU actors it reaches the loader and sizes the node by the largest component; on a CPU it is
    not applied (and the run says so); the run id is the same with it on or off."""
    from operators.image_generation import ImageGenerator
    from pipelines.engine.cli.options import RunOptions
    from schemas.gep import GEP_IMAGES

    hidream, lumina, chroma, sdxl = ("HiDream-ai/HiDream-I1-Full", "Alpha-VLLM/Lumina-Image-2.0",
                                     "lodestones/Chroma1-HD", "stabilityai/stable-diffusion-xl-base-1.0")
    cards = generation_settings({"models": [hidream, lumina, chroma, sdxl]})
    assert [s.cpu_offload for s in cards.generators] == [True, True, True, None]
    assert "CPU offload as the model card of Alpha-VLLM/Lumina-Image-2.0" in cards.generators[1].defaults_from
    assert [s.record().get("cpu_offload") for s in cards.generators] == [True, True, True, None]
    assert "cpu_offload" not in cards.generators[3].record()
    user = generation_settings({"models": []}, SimpleNamespace(generator=[
        f"{hidream}:cpu_offload=false", f"{lumina}", f"{chroma}:cpu_offload=no", f"{sdxl}:cpu_offload=true"]))
    assert [s.cpu_offload for s in user.generators] == [False, True, False, True]
    assert user.job() == cards.job()                         # where the weights wait is not what is computed
    from pipelines.engine.run.fingerprint import settings_job

    assert settings_job([user.generators[0]]) == settings_job([cards.generators[0]])   # a spec list (paper 002's)
    from pipelines.engine.stats.headline import subject_identity

    identity = [subject_identity({"model": s.model, "detail": {"spec": s.record()}})
                for s in (cards.generators[0], user.generators[0])]
    assert identity[0] == identity[1]                        # `compare` joins a model run with and without it
    with pytest.raises(ValueError, match=r"^--generator org/a: cpu_offload='maybe' is not true or false$"):
        generation_settings({"models": []}, SimpleNamespace(generator=["org/a:cpu_offload=maybe"]))

    def stage(spec, per_actor, device="cuda", flag=False):
        run = SimpleNamespace(options=RunOptions.from_args(SimpleNamespace(gen_cpu_offload=flag)), safety=None,
                              gpu=SimpleNamespace(device=device, per_actor=per_actor),
                              rd=SimpleNamespace(uri="/runs/r"), st=SimpleNamespace(execution={"stages": {}}))
        plan = G.GenerationPlan(None, GEP_IMAGES, ImageGenerator, None)
        return G.generator_pipeline(run, plan, spec)[0]

    on, off = cards.generators[0], user.generators[0]
    gen = stage(on, 1.0)
    assert gen.kwargs["cpu_offload"] is True and gen.resources.resources == {"large_gpu": 1.0}   # 17B MMDiT
    gen = stage(off, 1.0)
    assert "cpu_offload" not in gen.kwargs and gen.resources.resources == {"xlarge_gpu": 1.0}   # the whole 72 GiB
    capsys.readouterr()
    gen = stage(on, 0.0, device="auto")                      # a CPU run: the whole model, said once
    assert "cpu_offload" not in gen.kwargs and not gen.resources.resources
    assert "HiDream-I1-Full: CPU offload (cpu_offload=true) applies when the generator actors get a GPU" \
        in capsys.readouterr().out
    assert stage(cards.generators[3], 1.0, flag=True).kwargs["cpu_offload"] is True   # --gen-cpu-offload: every one
    assert "cpu_offload" not in stage(cards.generators[3], 1.0).kwargs
