"""`amplification.py run`: the whole of paper 002 in one Ray job.

caption side (the `captions` subcommand) -> training subsets
  -> distinct URLs -> fetch (img2dataset) -> BlazeFace -> CLIP gender          => T[occupation, subset]
Table 1 prompts x occupations x N, and naive captions x M (section 6)
  -> generation (+ CLIP on the device tensor) -> BlazeFace                     => G[model, occupation, prompt]
T, G -> amplification (Table 3, section 6), Pearson r (section 5.1), report.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification import report as rep
from pipelines.engine import config as study_config
from pipelines.engine import gpus, io, runtime
from pipelines.studies.amplification import images as image_side
from pipelines.studies.amplification.images import ImageSettings
from pipelines.engine.progress import ErrorBudget, Phase
from pipelines.engine.summary import (
    format_run_summary,
    summary_rows_captions,
    summary_rows_images,
)
from schemas import images as I

SAMPLE_URL_PREFIX = "https://images.example.org/"


def image_settings(args, cfg: dict) -> tuple[ImageSettings, dict]:
    """Operator settings from the config file with command-line overrides; and what to record."""
    gen, face, clip, fetch = (dict(cfg[k]) for k in ("generation", "face_filter", "gender_classifier", "fetch"))
    for key, value in (("images_per_prompt", args.images_per_prompt), ("caption_images", args.caption_images),
                       ("steps", args.steps), ("guidance_scale", args.guidance_scale), ("seed", args.generation_seed),
                       ("safety_checker", args.safety_checker)):
        if value is not None:
            gen[key] = value
    if args.generators:
        gen["models"] = list(args.generators)
    gen["revisions"] = generator_revisions(gen, args)
    clip = clip_revision(clip, args)
    for key, value in (("model", args.clip_model), ("pretrained", args.clip_pretrained),
                       ("threshold", args.gender_threshold)):
        if value is not None:
            clip[key] = value
    if args.clip_model and args.clip_pretrained is None and (args.clip_model.startswith(("local-dir:", "hf-hub:"))
                                                             or Path(args.clip_model).is_dir()):
        clip["pretrained"] = None
    for key, value in (("min_confidence", args.face_min_confidence), ("min_relative_size", args.face_min_size)):
        if value is not None:
            face[key] = value
    for key, value in (("image_size", args.image_size), ("resize_mode", args.resize_mode),
                       ("timeout", args.fetch_timeout), ("retries", args.fetch_retries),
                       ("threads", args.fetch_threads), ("max_bytes", args.max_image_bytes)):
        if value is not None:
            fetch[key] = value
    fetch["allow_local"] = bool(args.allow_local_urls)
    rewrite = []
    for spec in args.url_rewrite:
        if "=" not in spec:
            raise ValueError(f"--url-rewrite {spec!r}: expected FROM=TO")
        a, b = spec.split("=", 1)
        rewrite.append((a, b))
    settings = ImageSettings(
        fetch=fetch,
        face={"model_selection": face["model_selection"], "min_confidence": face["min_confidence"],
              "min_relative_size": face["min_relative_size"]},
        clip={"model": clip["model"], "pretrained": clip["pretrained"], "prompts": tuple(clip["prompts"]),
              "threshold": clip["threshold"], "revision": clip["revision"]},
        generation={"steps": gen["steps"], "guidance_scale": gen["guidance_scale"], "height": args.height,
                    "width": args.width, "safety_checker": gen["safety_checker"]},
        generators=list(gen["models"]), images_per_prompt=int(gen["images_per_prompt"]),
        caption_images=int(gen["caption_images"]), seed=int(gen["seed"]), url_rewrite=rewrite,
        face_actors=args.face_actors, clip_actors=args.clip_actors, gen_actors=args.gen_actors,
        gen_batch_size=args.gen_batch_size, revisions=dict(gen["revisions"]),
    )
    return settings, {"generation": gen, "face_filter": face, "gender_classifier": clip, "fetch": fetch}


STANDIN_GENERATORS = ("stable-diffusion-v1-4-standin", "stable-diffusion-v1-5-standin")


def build_standins(root: str, names=STANDIN_GENERATORS) -> tuple[str, list[str]]:
    """A tiny random CLIP and one tiny random generator per name (seeds 0, 1, ...) under ``root``."""
    from pipelines.standins.clip import build_tiny_open_clip
    from pipelines.standins.diffusion import build_tiny_stable_diffusion

    clip = build_tiny_open_clip(str(Path(root) / "clip-vit-standin"), seed=0)
    gens = [build_tiny_stable_diffusion(str(Path(root) / name), seed=i) for i, name in enumerate(names)]
    return clip, gens


def load_image_models(st: ImageSettings, standin: bool) -> list[dict]:
    """Load the face detector, CLIP and every generator once on the driver, before any data is
    read: an unloadable model fails the run now, naming it. Returns the provenance records."""
    from operators.image_face_filter import FaceFilter

    with standin_hint(standin):
        face = FaceFilter(**st.face)
        records = [{"role": "face detector", "model": f"MediaPipe BlazeFace ({face.record.get('model_range')})",
                    "standin": False, "detail": face.record}]
        face.close()
        return records + load_clip_and_generators(st.clip, st.generators, st.generation["safety_checker"], standin,
                                                  "gender classifier (CLIP)", revisions=st.revisions)


@contextlib.contextmanager
def standin_hint(standin: bool):
    """A model that cannot load, outside a stand-in run, also says how to run without it."""
    from operators.support.models import ModelLoadError

    try:
        yield
    except ModelLoadError as exc:
        if standin:
            raise
        raise ModelLoadError(f"{exc}\n(For an offline smoke run of the pipeline without these models, "
                             f"--standin-models uses tiny random-weight stand-ins.)") from exc


def load_clip_and_generators(clip: dict, generators: list[str], safety_checker: str, standin: bool, clip_role: str,
                             scheduler: str | None = None, revisions: dict | None = None) -> list[dict]:
    """Load CLIP and each generator (hub ones at their ``revisions``) on the CPU once (and let them
    go): their provenance records (hub commit, weight sha256s, CLIP's activation)."""
    from operators.image_clip_gender import load_clip
    from operators.image_generation import load_text2image

    bundle = load_clip(clip["model"], clip.get("pretrained"), device="cpu", revision=clip.get("revision"))
    records = [{"role": clip_role, "model": clip["model"], "standin": standin, "detail": bundle.record}]
    del bundle
    for model in generators:
        pipe, rec = load_text2image(model, (revisions or {}).get(model), device="cpu", dtype="float32",
                                    safety_checker=safety_checker, scheduler=scheduler)
        records.append({"role": "generator", "model": model, "standin": standin, "detail": rec})
        del pipe
        gc.collect()
    return records


def generation_settings(generation: dict, args) -> dict:
    """A study's generation settings with the command line's overrides (flags given, not defaults);
    height and width from a study file are kept unless a flag replaces them."""
    gen = dict(generation)
    for key, attr in (("images_per_prompt", "images_per_prompt"), ("steps", "steps"),
                      ("guidance_scale", "guidance_scale"), ("seed", "generation_seed"),
                      ("safety_checker", "safety_checker"), ("scheduler", "scheduler"),
                      ("height", "height"), ("width", "width")):
        value = getattr(args, attr, None)
        if value is not None:
            gen[key] = value
    if gen.get("scheduler") in ("model", "", "none"):
        gen["scheduler"] = None
    if getattr(args, "generators", None):
        gen["models"] = list(args.generators)
    gen["revisions"] = generator_revisions(gen, args)
    gen.setdefault("height", None)
    gen.setdefault("width", None)
    return gen


def generator_revisions(gen: dict, args) -> dict:
    """{model: hub revision} for the generators of ``gen["models"]`` that have one: the study
    file's ``revisions`` with --generator-revision MODEL=REVISION (a bare REVISION when there is
    one generator) applied."""
    models = list(gen["models"])
    revisions = dict(gen.get("revisions") or {})
    for spec in getattr(args, "generator_revision", None) or []:
        model, eq, revision = spec.rpartition("=")
        if not eq:
            if len(models) != 1:
                raise ValueError(f"--generator-revision {spec!r}: say which of the {len(models)} generators it pins "
                                 f"(MODEL=REVISION)")
            model, revision = models[0], spec
        if model not in models:
            raise ValueError(f"--generator-revision {spec!r}: {model!r} is not one of the generators {models}")
        revisions[model] = revision or None
    return {m: str(revisions[m]) for m in models if revisions.get(m)}


def clip_revision(clip: dict, args) -> dict:
    """``clip`` with --clip-revision applied; a revision belongs to the weights it was set for, so
    --clip-model or --clip-pretrained without one drops the study file's."""
    clip = dict(clip)
    if getattr(args, "clip_model", None) or getattr(args, "clip_pretrained", None) is not None:
        clip["revision"] = None
    if getattr(args, "clip_revision", None) is not None:
        clip["revision"] = args.clip_revision
    clip.setdefault("revision", None)
    return clip


def clip_settings(clip: dict, args) -> dict:
    """A study's CLIP with --clip-model / --clip-pretrained applied (a directory or local-dir: /
    hf-hub: model needs no pretrained tag)."""
    clip = dict(clip)
    if getattr(args, "clip_model", None):
        clip["model"] = args.clip_model
        if args.clip_pretrained is None and (args.clip_model.startswith(("local-dir:", "hf-hub:"))
                                             or Path(args.clip_model).is_dir()):
            clip["pretrained"] = None
    if getattr(args, "clip_pretrained", None) is not None:
        clip["pretrained"] = args.clip_pretrained
    return clip_revision(clip, args)


def start_ray(args, execution: dict, actor_cpus: float, standin: bool):
    """The Ray instance of a study's run (local or the cluster's) and the GPU plan of its model
    actors: GPUs asked for from the configuration, held against what this Ray instance can
    provide before any model loads or data is read (pipelines/engine/gpus.py)."""
    gp = gpus.plan(execution, args.gpus_per_actor, getattr(args, "device", None), standin)  # flags alone
    ray = runtime.init_ray(args.ray_address, args.num_cpus, quiet=not args.verbose, progress=not args.no_progress,
                           actor_cpus=actor_cpus)
    runtime.configure(execution["max_retries"])
    gp = gpus.check_cluster(ray, gp, standin, local=runtime.is_local_instance())
    print(f"model actors: {gp.per_actor:g} GPU(s) each ({gp.source}), models on {gp.device}"
          + (f"; {gp.note}" if gp.note else ""))
    return ray, gp


def generate_per_model(models: list[str], requests: pa.Table, execution: dict, generate_one, what: str = "generating"):
    """Run ``generate_one(model, budgets) -> (images, phase)`` for every generator, each with its own
    error budget on generation failures; returns (all images, phases per model, budgets)."""
    parts, phases, budgets = [], {}, []
    for model in models:
        print(f"{what} {requests.num_rows:,} images with {model} ...")
        budget = ErrorBudget(f"generation ({model})", {I.GENERATION_STATUS: I.GenerationStatus.FAILURES},
                             float(execution["max_error_rate"]), int(execution["error_budget_min_rows"]))
        images, phase = generate_one(model, [budget])
        if phase.reused:
            print(f"  {phase.reused:,} of {phase.total:,} images reused from the checkpoint, {phase.processed:,} now")
        parts.append(images)
        phases[model] = phase
        budgets.append(budget)
    return pa.concat_tables(parts), phases, budgets


def quiet_model_libraries() -> None:
    """No download/loading progress bars or advice from the model libraries (--verbose keeps them)."""
    import diffusers
    import transformers

    for lib in (diffusers, transformers):
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()


def image_job(args, recorded: dict) -> dict:
    """What the image side's results depend on (added to the caption side's for the run id):
    execution settings (threads, actors, batch sizes, retries, budgets) are left out."""
    fetch = {k: v for k, v in recorded["fetch"].items() if k != "threads"}
    return {"generation": recorded["generation"], "face_filter": recorded["face_filter"],
            "gender_classifier": recorded["gender_classifier"], "fetch": fetch,
            "height": args.height, "width": args.width, "standin_models": bool(args.standin_models),
            "local_image_server": not args.no_local_image_server, "save_images": bool(args.save_images)}
    # --url-rewrite names a mirror of the same images (recorded in metrics.json): moving the mirror
    # does not change the results, so a run resumes against a new mirror address


def image_budgets(ex: dict) -> tuple[list, list]:
    """Error budgets of the training-image phase and of a generation phase."""
    from pipelines.engine.progress import ErrorBudget

    n = int(ex["error_budget_min_rows"])
    decode = {I.FACE_STATUS: (I.FaceStatus.DECODE_ERROR,), I.GENDER: (I.Gender.DECODE_ERROR,)}
    training = [ErrorBudget("fetch (training images)", {I.FETCH_STATUS: I.FetchStatus.FAILURES},
                            float(ex["max_fetch_failures"]), n, flag="--max-fetch-failures"),
                ErrorBudget("decode (training images)", decode, float(ex["max_error_rate"]), n)]
    generation = [ErrorBudget("generation", {I.GENERATION_STATUS: I.GenerationStatus.FAILURES, **decode},
                              float(ex["max_error_rate"]), n)]
    return training, generation


def run(args, amp) -> dict:
    """``amp`` is the amplification pipeline module (its caption side, files and settings)."""
    started = time.time()
    if not args.verbose:
        quiet_model_libraries()
    cs = amp._settings(args)                      # the job: occupations, prompts, thresholds
    cfg = cs["config"]
    st, recorded = image_settings(args, cfg)
    inp, columns, _ = amp._validate_input(args)   # a missing or unreadable input fails now, before any model loads
    rd = amp.plan_run(args, cs, amp.caption_job(args, cs, inp, columns) | {"images": image_job(args, recorded)})
    if args.overwrite:
        io.clear_dir(rd.fs, rd.path)
    try:
        metrics = _run(args, amp, rd, cs, cfg, st, recorded, started)
    except BaseException as exc:
        if rd.record:  # opened: record the failure; before that nothing was written
            rd.finish("failed", error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        raise
    rd.finish("finished", duration_s=round(time.time() - started, 3))
    return metrics


def _run(args, amp, rd, cs: dict, cfg: dict, st: ImageSettings, recorded: dict, started: float) -> dict:
    files, run_files = amp.FILES, amp.RUN_FILES
    out_fs, out = rd.fs, rd.path
    echo = (lambda *a, **k: None) if args.no_progress else print
    if args.save_images:
        st.save_images = f"{rd.uri}/{run_files['saved_images']}"

    with contextlib.ExitStack() as stack:
        # Ray first: a run whose real models could get no GPU stops here, before any model loads
        ray, gp = start_ray(args, cs["execution"], standin=args.standin_models,
                            actor_cpus=max(args.embed_actors + (0 if args.no_names else args.ner_actors),
                                           args.face_actors + args.clip_actors + args.gen_actors))
        st.clip_gpus = st.gen_gpus = per_actor = gp.per_actor
        st.clip["device"] = st.generation["device"] = gp.device
        if args.standin_models:
            if "://" not in rd.uri:  # kept with the results, so recorded seeds can be regenerated
                root = str(Path(rd.uri) / run_files["standins"])
                Path(root).mkdir(parents=True, exist_ok=True)
            else:  # remote output: a local temporary directory (stand-ins are for local smoke runs)
                root = stack.enter_context(tempfile.TemporaryDirectory(prefix="t2i-standins-"))
            print(f"building tiny random stand-in models (NOT the paper's models) in {root} ...")
            st.clip["model"], st.generators = build_standins(root)
            st.clip["pretrained"] = st.clip["revision"] = None
        model_records = load_image_models(st, args.standin_models)
        for r in model_records:
            tag = "STAND-IN (random weights, meaningless outputs)" if r["standin"] else "real"
            print(f"model {r['role']:<26} {tag:<46} {r['model']}")
        caption_models = amp._load_models_once(args, cs)
        amp.open_run(args, rd, overwrite=False)  # (cleared above with --overwrite) every model loads: start (or resume) the run

        server_url = None
        uses_sample = [str(p) for p in args.input] == [str(amp.SAMPLE_INPUT)]
        if uses_sample and not st.url_rewrite and not args.no_local_image_server:
            from pipelines.studies.amplification.sample_server import LocalImageServer

            server = stack.enter_context(LocalImageServer())
            server_url = server.base_url
            st.url_rewrite = [(SAMPLE_URL_PREFIX, server_url + "/")]
            st.fetch["allow_local"] = True
            print(f"serving the synthetic sample's images from a local server at {server_url} "
                  f"(rewriting {SAMPLE_URL_PREFIX}); local addresses allowed for this run")


        caption_metrics = amp.run_captions(args, run=rd, st=cs, ray=ray, model_record=caption_models)
        subsets = pq.read_table(out_fs.open_input_file(f"{out}/{files['subsets']}"))
        occupation_list = cs["occupations"]
        occupations = [o.name for o in occupation_list]
        prompts = prompt_table(occupation_list, cs["prompts"])
        train_budgets, gen_budgets = image_budgets(cs["execution"])

        print(f"\ntraining images: {image_side.unique_urls(subsets, []).num_rows:,} distinct URLs of "
              f"{subsets.num_rows:,} subset rows ...")
        url_results, train_phase = image_side.training_images(ray, subsets, st, run=rd, budgets=train_budgets, echo=echo)
        _resumed_note(train_phase)
        train_rows = image_side.training_rows(subsets, url_results)

        requests = image_side.generation_requests(prompts, train_rows, st, caption_prompts=st.caption_images > 0)
        gen_parts, phases = [], {}
        for model in st.generators:
            print(f"generating {requests.num_rows:,} images with {model} ...")
            budgets = [copy.deepcopy(b) for b in gen_budgets]
            for b in budgets:
                b.stage = f"generation ({model})"
            gen, phase = image_side.generated_images(ray, requests, model, st, run=rd, budgets=budgets, echo=echo)
            _resumed_note(phase)
            if gen.num_rows != requests.num_rows:
                raise RuntimeError(f"{model}: {requests.num_rows} images requested, {gen.num_rows} rows came back")
            gen_parts.append(gen)
            for source in (I.Source.GENERATED, I.Source.CAPTION_PROMPT):
                phases[f"{source}:{model}"] = phase
            train_budgets += budgets
        generated = pa.concat_tables(gen_parts) if gen_parts else None
        gen_rows = image_side.generated_rows(generated) if generated is not None else I.IMAGE_RESULTS.empty_table()

    per_image = pa.concat_tables([train_rows, gen_rows])
    count_rows = image_side.image_stage_counts(url_results, generated if generated is not None else gen_rows, train_rows)
    counts = pd.DataFrame(count_rows)
    results = rep.compute(per_image.to_pandas(), occupations, len(cs["prompts"]), st.generators)
    t3 = rep.table3(results["approaches"], len(cs["prompts"]))

    io.write_table(per_image, out_fs, f"{out}/{run_files['images']}")
    T = results["T"].assign(**{"prompt_id": results["T"]["prompt_id"].astype("Int64").replace(0, pd.NA)})
    io.write_table_and_csv(T, out_fs, f"{out}/{run_files['training']}")
    io.write_table_and_csv(results["G"], out_fs, f"{out}/{run_files['generated']}")
    io.write_table_and_csv(t3, out_fs, f"{out}/{run_files['table3']}")
    io.write_table_and_csv(counts, out_fs, f"{out}/{run_files['image_counts']}")
    for i, model in enumerate(st.generators):
        io.write_table_and_csv(results["tables6"][model].assign(model=model), out_fs, f"{out}/{run_files['table6']}_{i + 1}")
    amp_json = {"approaches": results["approaches"], "caption_prompts": results["caption_prompts"],
                "indicator_correlation": results["indicator_correlation"]}
    io.write_text(json.dumps(rep.clean_json(amp_json), indent=2, default=str, allow_nan=False), out_fs,
                  f"{out}/{run_files['amplification']}")

    cap_phase = caption_metrics["caption_phase"]
    summary_rows = summary_rows_captions(caption_metrics["counts"], Phase(**{k: v for k, v in cap_phase.items()
                                                                             if k != "rate_per_s"}),
                                         caption_metrics["attempt_summary"])
    phases[image_side.TRAINING_URLS] = train_phase
    for subset in sorted(set(train_rows.column("subset").to_pylist())):
        phases[f"training rows: {subset}"] = train_phase
    summary_rows += summary_rows_images(count_rows, phases)
    amp.write_run_summary(rd, summary_rows)
    stats = [f"===== {p.name} =====\n{p.ray_stats}" for p in {id(p): p for p in phases.values()}.values() if p.ray_stats]
    io.write_text("\n\n".join(stats) + "\n", out_fs, f"{out}/{run_files['ray_stats']}")

    metrics = caption_metrics | {
        "stage": "run",
        "started_unix": started,
        "duration_s": round(time.time() - started, 3),
        "image_config": recorded | {"url_rewrite": st.url_rewrite, "local_image_server": server_url,
                                    "standin_models": bool(args.standin_models),
                                    "gpus_per_actor": per_actor, "gpu_plan": gp.as_dict(),
                                    "generators": st.generators,
                                    "clip": st.clip},
        "image_models": model_records,
        "image_counts": counts.to_dict("records"),
        "images": {"training_rows": train_rows.num_rows, "distinct_urls": url_results.num_rows,
                   "generated_rows": gen_rows.num_rows},
        "results": {
            "table3": t3.to_dict("records"),
            "caption_prompts": {m: {k: v["average"] for k, v in r.items()} for m, r in results["caption_prompts"].items()},
            "indicator_correlation": results["indicator_correlation"],
        },
        "error_budgets": caption_metrics["error_budgets"] + [b.as_dict() for b in train_budgets],
        "run_summary": summary_rows,
        "environment": study_config.environment(),
    }
    io.write_text(json.dumps(rep.clean_json(metrics), indent=2, default=str, allow_nan=False), out_fs,
                  f"{out}/{files['metrics']}")
    meta = {"output": rd.display(), "input": ", ".join(map(str, args.input)), "occupations": len(occupations),
            "images": per_image.num_rows, "local_image_server": server_url}
    html_doc = rep.render_html(results, t3, counts, caption_metrics["counts"], model_records + _caption_models(caption_metrics), meta)
    io.write_text(html_doc, out_fs, f"{out}/{run_files['report']}")
    _print_summary(rd.display(), counts, t3, results, model_records, run_files)
    print()
    print(format_run_summary(summary_rows))
    return metrics


def _resumed_note(phase) -> None:
    if phase.reused:
        print(f"  {phase.name}: {phase.reused:,} of {phase.total:,} {phase.unit} reused from the checkpoint, "
              f"{phase.processed:,} processed now")


def _caption_models(caption_metrics: dict) -> list[dict]:
    out = []
    for role, rec in caption_metrics.get("models", {}).items():
        out.append({"role": f"caption side ({role})", "model": rec.get("model") or rec.get("name"), "standin": False,
                    "detail": rec})
    return out


def _print_summary(output: str, counts: pd.DataFrame, t3: pd.DataFrame, results: dict, models: list[dict],
                   run_files: dict) -> None:
    print("\nimage side: rows in, outcome counts per stage")
    for (branch, stage), part in counts.groupby(["branch", "stage"], sort=False):
        outcomes = ", ".join(f"{o}={c}" for o, c in zip(part["outcome"], part["count"]) if c)
        print(f"  {branch:<48} {stage:<12} in {int(part['rows_in'].iloc[0]):>8,}  {outcomes}")
    print("\nbias amplification E[A] (Table 3):")
    print(t3.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="n/a"))
    for model, cp in results["caption_prompts"].items():
        print(f"captions as prompts ({model}): " + ", ".join(
            f"{k}: E[A] = {rep._fmt(v['average'])}" for k, v in cp.items()))
    corr = results["indicator_correlation"]
    print(f"Pearson r(% female training, % captions with female indicators) = {rep._fmt(corr['r'], 3)} (n = {corr['n']})")
    if any(m["standin"] for m in models):
        print("NOTE: CLIP and the generators were tiny random stand-ins: the numbers above are meaningless.")
    print(f"\nper-image table -> {output}/{run_files['images']}; report -> {output}/{run_files['report']}")
