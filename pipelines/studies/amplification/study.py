"""`amplification.py run`: the whole of paper 002 in one Ray job.

caption side (the `captions` subcommand) -> training subsets
  -> distinct URLs -> fetch (img2dataset) -> BlazeFace -> CLIP gender          => T[occupation, subset]
Table 1 prompts x occupations x N, and naive captions x M (section 6)
  -> generation (+ CLIP on the device tensor) -> BlazeFace                     => G[model, occupation, prompt]
T, G -> amplification (Table 3, section 6), Pearson r (section 5.1), report.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.engine.cli.options import RunOptions
from pipelines.engine.report.figures import FigureDir
from pipelines.engine.report.page import model_labels
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study
from pipelines.engine.generation import Generated, GenerationPlan
from pipelines.engine.run.models import (
    STANDIN_GENERATORS,
    standin_clip,
)
from pipelines.studies.amplification import (caption_report, caption_reuse, captions, link_rot, paraphrases,
                                             training_shards)
from pipelines.studies.amplification.training_walk import walk_training
from pipelines.studies.amplification.prompts import prompt_table
from pipelines.studies.amplification import report as rep
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime
from pipelines.studies.amplification import images as image_side
from pipelines.studies.amplification.images import ImageSettings
from pipelines.engine.stream.progress import Phase
from pipelines.engine.stats.summary import (
    summary_rows_captions,
    summary_rows_images,
)
from pipelines.studies.amplification.metrics import SIMILARITY_COLUMNS, image_similarity
from schemas import images as I
from schemas.captions import OCCUPATION, URL
from schemas.subsets import PROMPT_ID, SUBSET
from pipelines.studies.amplification.sample_server import LocalImageServer
from pipelines.studies.amplification.jobs import occupation_spec
from pipelines.engine.stats.headline import protocol_digest
from pipelines.engine.stats import headline
from pipelines.engine.report import page as Pg
from pipelines.studies.amplification.results import (captions_key, compute, generated_images, model_metrics,
                                                     paraphrases_key, table3)
from pipelines.studies.amplification.run_settings import image_settings, load_image_models, image_budgets, AmplificationSettings

SAMPLE_URL_PREFIX = "https://images.example.org/"

RUN_FILES = {  # what the run subcommand writes under --output, besides the caption side's FILES
    "images": "images.parquet",
    "training": "training_percentages",
    "generated": "generated_percentages",
    "table3": "table3",
    "table6": "table6",
    "image_counts": "image_stage_counts",
    "amplification": "amplification.json",
    "report": "report.html",
    "standins": "standin_models",
    "saved_images": "images",
    "ray_stats": "ray_data_stats.txt",
    "image_similarity": "image_similarity",   # section 5.2: CLIP image similarity, naive vs NN
    "walk": "training_walk",                   # section 4: captions walked per group to k counted images
    "link_rot": "link_rot",                    # images that could not be obtained, and whether their captions differ
    "paraphrases": paraphrases.FILES["paraphrases"],            # App. A.6: one row per caption and occupation
    "paraphrase_table": paraphrases.FILES["table"],             # App. A.6 beside section 6, per model
    "paraphrase_image_similarity": paraphrases.FILES["image_similarity"],
}


class AmplificationStudy(ImageStudy):
    """`amplification.py run`: the whole of paper 002 as a study of the engine's lifecycle."""
    name = "paper002-amplification"

    def settings(self, args) -> AmplificationSettings:
        cs = captions.settings(args)  # the job: occupations, prompts, thresholds
        image, recorded = image_settings(args, cs.config)
        para = None
        if getattr(args, "paraphrases", False):
            if image.caption_images <= 0:
                raise ValueError("--paraphrases compares App. A.6 with section 6: it needs --caption-images > 0")
            para = paraphrases.settings_from(args, bool(args.standin_models))
        elif any(getattr(args, f, None) for f in ("paraphrase_endpoint", "paraphrase_local", "paraphrase_file")):
            raise ValueError("--paraphrase-endpoint / --paraphrase-local / --paraphrase-file need --paraphrases")
        # a missing or unreadable input, or a scan --captions-from cannot take over, fails now,
        # before any model loads
        opts = RunOptions.from_args(args)
        return caption_reuse.check_source(opts, captions.planned(opts, AmplificationSettings(
            **{f.name: getattr(cs, f.name) for f in dataclasses.fields(cs)}
            | {"input": captions.validate_input(args, cs), "image": image, "image_recorded": recorded,
               "paraphrase": para})))

    def job(self, opts, st: AmplificationSettings) -> dict:
        return super().job(opts, st) | captions.input_job(opts, st)

    def plan_shape(self, st: AmplificationSettings) -> GenerationPlan:
        return image_side.generation_plan(st.image, None)

    def actor_cpus(self, opts, st: AmplificationSettings) -> float:
        f = opts.flags
        return max(runtime.pool_max(captions.embed_actors(opts, st)) + (f["ner_actors"] if st.names_enabled else 0),
                   f["face_actors"] + f["clip_actors"] + opts.gen_actors,
                   (st.paraphrase.actors + 1) if st.paraphrase else 0)

    standin_generator_names = STANDIN_GENERATORS

    def printed_summary(self, rows: list[dict]) -> tuple[list[dict], str]:
        """The run summary printed at the end: the training subsets' rows (views of the distinct
        URLs' images) stay in run_summary.csv and image_stage_counts.csv."""
        shown = [r for r in rows if not r["branch"].startswith(image_side.TRAINING_ROWS)]
        return shown, None   # per training subset and every outcome per stage: image_stage_counts.csv

    def generators(self, st: AmplificationSettings) -> list:
        return list(st.image.generators)

    def safety(self, st: AmplificationSettings):
        return st.image.safety

    def use_standins(self, opts, st: AmplificationSettings, root: str) -> AmplificationSettings:
        return dataclasses.replace(st, image=dataclasses.replace(st.image, clip=standin_clip(st.image.clip, root)))

    def load_models(self, opts, st: AmplificationSettings, gpu) -> list[dict]:
        records = load_image_models(st.image, opts.standin_models) + captions.load_caption_models(opts, st)
        return records + (paraphrases.check_backend(st.paraphrase, opts.standin_models) if st.paraphrase else [])

    def prepare(self, run: Run) -> GenerationPlan:
        """The caption side, the training images (the walk), the paraphrases; then section 3's and 6's (and
        App. A.6's) requests."""
        opts, rd, cs = run.options, run.rd, run.st
        ray, gp, echo = run.ray, run.gpu, run.echo
        out_fs, out = rd.fs, rd.path
        run_files = RUN_FILES
        per_actor = gp.per_actor
        base: ImageSettings = cs.image

        server_url, rewrite, fetch = None, list(base.url_rewrite), dict(base.fetch)
        uses_sample = [str(p) for p in opts.flags["captions"]] == [str(captions.SAMPLE_INPUT)]
        if uses_sample and not rewrite and base.local_image_server:
            server = run.stack.enter_context(LocalImageServer())
            server_url = server.base_url
            rewrite, fetch = [(SAMPLE_URL_PREFIX, server_url + "/")], fetch | {"allow_local": True}
            print(f"serving the synthetic sample's images from a local server at {server_url} "
                  f"(rewriting {SAMPLE_URL_PREFIX}); local addresses allowed for this run")
        # what this run decided (where images are saved, GPUs, the device, the sample's server), in
        # this run's copy of the image settings: the settings built from preset, file and flags stay
        st = dataclasses.replace(base, save_images=f"{rd.uri}/{run_files['saved_images']}" if opts.save_images else None,
                                 clip_gpus=per_actor, clip=dataclasses.replace(base.clip, device=gp.device),
                                 fetch=fetch, url_rewrite=rewrite)

        caption_metrics, shown = captions.caption_side(run, cs, own_run=False)
        caption_stats = caption_metrics.pop("_stats")
        captions.print_caption_side(rd, shown, brief=True)   # the run summary at the end has its stage counts
        subsets = io.read_parquet(out_fs.open_input_file(f"{out}/{captions.FILES['subsets']}"))
        occupation_list = cs.occupations
        occupations = [o.name for o in occupation_list]
        prompts = prompt_table(occupation_list, cs.prompts)
        train_budgets, gen_budgets = image_budgets(cs.execution)
        selection = captions.selection_config(cs)

        walk = None
        if selection.walks:
            pool = io.read_parquet(out_fs.open_input_file(f"{out}/{captions.FILES['pool']}"))
            print(f"\ntraining images: walking each group's captions until k counted images (k = "
                  f"{selection.sample_size} random, {selection.nn_k} NN; {pool.num_rows:,} candidates) ...")
            walk = walk_training(ray, rd, pool, selection, st, train_budgets,
                                 reselect=lambda f: captions.select_pool(run, cs, selection.pool(f))[0],
                                 max_walk_factor=float(cs.selection.get("max_walk_factor", 20)),
                                 first_round=float(cs.selection.get("walk_first_round", 1)), echo=echo)
            subsets, url_results, train_phase, train_budgets = walk.subsets, walk.url_results, walk.phase, walk.budgets
            _walk_summary(walk)
            io.write_table(subsets, out_fs, f"{out}/{captions.FILES['subsets']}")   # the subsets T is over
            sim = caption_report.similarity_summary(caption_stats, subsets, occupation_list)
            io.write_table_and_csv(sim, out_fs, f"{out}/{captions.FILES['similarity']}")
            caption_metrics["subset_rows"] = caption_report.subset_sizes(subsets)
            caption_metrics["caption_headline"] = caption_report.headline(sim)
            io.write_table_and_csv(walk.groups, out_fs, f"{out}/{run_files['walk']}")
        else:
            print(f"\ntraining images: {image_side.unique_urls(subsets, []).num_rows:,} distinct URLs of "
                  f"{subsets.num_rows:,} subset rows ...")
            url_results, train_phase = image_side.training_images(ray, subsets, st, run=rd, budgets=train_budgets,
                                                                  echo=echo)
        _resumed_note(train_phase)
        train_rows = image_side.training_rows(subsets, url_results)

        requests = image_side.generation_requests(prompts, train_rows, st, caption_prompts=st.caption_images > 0)
        para = paraphrases.run_in_study(run, cs, train_rows) if cs.paraphrase else None
        if para is not None:   # App. A.6: M images per ok paraphrase, after section 6's
            requests = pa.concat_tables([requests, paraphrases.generation_requests(
                para.table, st.caption_images, st.seed, image_side.REQUEST_SCHEMA)])

        def budgets_of(model: str) -> list:
            budgets = [copy.deepcopy(b) for b in gen_budgets]
            for b in budgets:
                b.stage = f"generation ({model})"
            return budgets

        run.memo.update(server_url=server_url, image_settings=st, caption_metrics=caption_metrics,
                        caption_stats=caption_stats, subsets=subsets, occupations=occupations,
                        train_budgets=train_budgets, selection=selection, walk=walk, url_results=url_results,
                        train_phase=train_phase, train_rows=train_rows, para=para)
        # the engine generates with each generator (checkpointed per image, resumable), CLIP on the
        # device tensor, the face filter after
        return image_side.generation_plan(st, requests, budgets_of)

    def analyse(self, run: Run, gen: Generated) -> Outcome:
        """Section 5's and 6's tables from the training and generated images, per generator in the study's order."""
        rd, cs = run.rd, run.st
        recorded = cs.image_recorded
        gp = run.gpu
        out_fs, out = rd.fs, rd.path
        run_files = RUN_FILES
        per_actor = gp.per_actor
        model_records = [r for r in run.models if not r.get("key")]
        m = run.memo
        server_url, st, caption_metrics, subsets = m["server_url"], m["image_settings"], m["caption_metrics"], m["subsets"]
        occupations, train_budgets, selection, walk = m["occupations"], m["train_budgets"], m["selection"], m["walk"]
        url_results, train_phase, train_rows, para = m["url_results"], m["train_phase"], m["train_rows"], m["para"]
        models = run.generator_models
        gen_parts = [gen.images.filter(pc.equal(gen.images.column(I.MODEL), m)).sort_by(image_side.RESULT_ORDER)
                     for m in models] if gen.images is not None else []
        labels = model_labels(models)   # short names in the run summary (the full ids are in metrics.json)
        phases = {f"{source}: {labels[model]}": phase for model, phase in gen.phases.items()
                  for source in (I.Source.GENERATED, I.Source.CAPTION_PROMPT, I.Source.PARAPHRASE_PROMPT)}
        generated = pa.concat_tables(gen_parts) if gen_parts else None
        gen_rows = image_side.generated_rows(generated) if generated is not None else I.IMAGE_RESULTS.empty_table()

        image_sim = training_generated_similarity(subsets, url_results, generated)
        walk_record = _walk_record(walk, selection)
        per_image = pa.concat_tables([train_rows, gen_rows])
        count_rows = image_side.image_stage_counts(url_results, generated if generated is not None else gen_rows, train_rows,
                                                 labels)
        counts = pd.DataFrame(count_rows)
        per_image_df = per_image.to_pandas()
        results = compute(per_image_df, occupations, len(cs.prompts), models)
        head = headline_of(run, results, per_image_df)
        if para is not None:
            para.finish(rd, results, generated, head)
        t3 = table3(results["approaches"], len(cs.prompts), head)

        io.write_table(per_image, out_fs, f"{out}/{run_files['images']}")
        T = results["T"].assign(**{"prompt_id": results["T"]["prompt_id"].astype("Int64").replace(0, pd.NA)})
        io.write_table_and_csv(T, out_fs, f"{out}/{run_files['training']}")
        io.write_table_and_csv(results["G"], out_fs, f"{out}/{run_files['generated']}")
        rot = link_rot.link_rot_table(train_rows, seed=st.seed)   # is T biased by the images it could not see?
        io.write_table_and_csv(rot, out_fs, f"{out}/{run_files['link_rot']}")
        results["link_rot"] = {"table": rot.to_pandas(), "summary": link_rot.link_rot_summary(rot)}
        io.write_table_and_csv(t3, out_fs, f"{out}/{run_files['table3']}")
        io.write_table_and_csv(counts, out_fs, f"{out}/{run_files['image_counts']}")
        io.write_table_and_csv(pd.DataFrame(image_sim["rows"], columns=SIMILARITY_COLUMNS), out_fs,
                               f"{out}/{run_files['image_similarity']}")
        results["image_similarity"] = image_sim
        for i, model in enumerate(models):
            io.write_table_and_csv(results["tables6"][model].assign(model=model), out_fs, f"{out}/{run_files['table6']}_{i + 1}")
        amp_json = {"approaches": results["approaches"], "caption_prompts": results["caption_prompts"],
                    "paraphrase_prompts": results["paraphrase_prompts"],
                    "caption_gender_match": results["caption_gender_match"],
                    "indicator_correlation": results["indicator_correlation"]}
        io.write_text(json.dumps(io.clean_json(amp_json), indent=2, default=str, allow_nan=False), out_fs,
                      f"{out}/{run_files['amplification']}")

        cap_phase = caption_metrics["caption_phase"]
        summary_rows = summary_rows_captions(caption_metrics["counts"], Phase(**{k: v for k, v in cap_phase.items()
                                                                                 if k != "rate_per_s"}),
                                             caption_metrics["attempt_summary"])
        phases[image_side.TRAINING_URLS] = train_phase
        for subset in sorted(set(train_rows.column("subset").to_pylist())):
            phases[f"{image_side.TRAINING_ROWS}{subset}"] = train_phase
        summary_rows += (para.summary_rows() if para is not None else []) + summary_rows_images(count_rows, phases)
        stats = [f"===== {p.name} =====\n{p.ray_stats}" for p in {id(p): p for p in phases.values()}.values()
                 if p.ray_stats]
        io.write_text("\n\n".join(stats) + "\n", out_fs, f"{out}/{run_files['ray_stats']}")

        # (the caption side's means, SBERT cosines and indicator shares, are "caption_headline":
        # "headline" is the run's headline numbers with their intervals, pipelines/engine/stats/headline.py)
        metrics = caption_metrics | {
            "headline": head,
            "stage": "run",
            # fetch: as this run used it (the local image server of the bundled sample allows local addresses)
            "image_config": recorded | {"fetch": dict(st.fetch), "url_rewrite": st.url_rewrite,
                                        "local_image_server": server_url,
                                        "standin_models": run.options.standin_models,
                                        "gpus_per_actor": per_actor, "gpu_plan": gp.as_dict(),
                                        "generators": models,
                                        "clip": st.clip},
            "image_models": model_records,
            "image_counts": counts.to_dict("records"),
            "images": {"training_rows": train_rows.num_rows, "distinct_urls": url_results.num_rows,
                       "generated_rows": gen_rows.num_rows,
                       # --training-images: the shards read, and the corrupt ones named with their lost samples
                       **({"training_shards": training_shards.shard_statistics(st.shards, url_results)}
                          if st.shards is not None else {})},
            "training_walk": walk_record,
            "results": {
                "table3": t3.to_dict("records"),
                "caption_prompts": {m: {k: v["average"] for k, v in r.items()}
                                    for m, r in results["caption_prompts"].items()},
                "caption_gender_match": results["caption_gender_match"],
                "image_similarity": {"per_model": image_sim["per_model"], "definition": image_sim["definition"]},
                "indicator_correlation": results["indicator_correlation"],
                "link_rot": results["link_rot"]["summary"],
                **({"paraphrases": para.metrics(results)} if para is not None else {}),
            },
            "error_budgets": caption_metrics["error_budgets"] + [b.as_dict() for b in train_budgets]
            + ([para.budget.as_dict()] if para is not None else []),
        }
        results["training_walk"] = walk_record
        data = {"results": results, "t3": t3, "counts": counts, "headline": head, "caption_counts": caption_metrics["counts"],
                "models": model_records + _caption_models(caption_metrics),
                "meta": {"output": rd.display(), "input": ", ".join(map(str, run.options.flags["captions"])),
                         "occupations": len(occupations), "images": per_image.num_rows,
                         "local_image_server": server_url}}
        return Outcome(metrics, summary_rows, data)

    def report(self, run: Run, outcome: Outcome) -> None:
        d, rd = outcome.data, run.rd
        html_doc = rep.render_html(d["results"], d["t3"], d["counts"], d["caption_counts"], d["models"], d["meta"],
                                   figures=FigureDir(rd.fs, rd.path), headline=d["headline"])
        io.write_text(html_doc, rd.fs, f"{rd.path}/{RUN_FILES['report']}")

        labels = Pg.model_labels(d["results"]["approaches"])    # models printed by their short labels
        head = {**d["headline"], "subjects": [{**s, "name": Pg.label(labels, s["name"]),
                                               "display": Pg.label(labels, s["name"])}
                                              for s in d["headline"]["subjects"]]}
        _print_summary(rd.display(), rep.labelled_counts(d["counts"], labels), Pg.relabel(d["t3"], labels),
                       rep.labelled(d["results"], labels), d["models"], RUN_FILES, head)


def training_generated_similarity(subsets: pa.Table, url_results: pa.Table, generated: pa.Table | None) -> dict:
    """Section 5.2's CLIP image similarity (``metrics.image_similarity``) from the subsets, the
    training URLs' results and the generated images, all with their CLIP embeddings."""
    vectors = dict(zip(url_results.column(URL).to_pylist(), url_results.column(I.CLIP_EMBEDDING).to_pylist())) \
        if I.CLIP_EMBEDDING in url_results.column_names else {}
    train = subsets.select([OCCUPATION, SUBSET, PROMPT_ID, URL]).to_pandas()
    train[I.CLIP_EMBEDDING] = train[URL].map(vectors)
    gen = pd.DataFrame(columns=[I.MODEL, OCCUPATION, PROMPT_ID, I.CLIP_EMBEDDING])
    if generated is not None and generated.num_rows and I.CLIP_EMBEDDING in generated.column_names:
        mine = generated.filter(pc.equal(generated.column(I.SOURCE), I.Source.GENERATED))
        gen = mine.select([I.MODEL, OCCUPATION, PROMPT_ID, I.CLIP_EMBEDDING]).to_pandas()
    return image_similarity(train, gen)


def _with_interval(metrics: dict, model: str, name: str, value, key=captions_key) -> str:
    """Section 6's (or with ``key`` App. A.6's) E[A] of ``model`` as printed, with its interval."""
    m = metrics.get((model, key(name)))
    return rep.interval_text(value, m["low"], m["high"]) if m else rep._fmt(value)


# ------------------------------------------------------------------------------ headline numbers
def headline_of(run: Run, results: dict, images: pd.DataFrame) -> dict:
    """metrics.json's ``headline``: per generator, E[A] per approach (average and per prompt) and
    section 6's, each with its bootstrap interval over occupations; writes headline_units.parquet."""

    standin = run.options.standin_models
    per_model = model_metrics(results["approaches"], results["caption_prompts"], results.get("paraphrase_prompts"),
                              run.options.intervals.seed)
    subjects = []
    for model in run.generator_models:
        record = next((r for r in run.models if r.get("role") == "generator" and r.get("model") == model),
                      {"model": model})
        counted, excluded = generated_images(images, model)
        subjects.append(headline.Subject(model, headline.subject_identity(record), per_model.get(model, []),
                                         images=counted, excluded=excluded))
    return headline.write(run.rd, AmplificationStudy.name, subjects, protocol(run.st, standin),
                          run.options.intervals, standin)


def protocol(st: AmplificationSettings, standin: bool = False) -> dict:
    """What two runs must share for their E[A] to be compared: the occupations, prompts, training
    sample (selection, indicators, SBERT, the caption data's size), images per prompt and seed, the
    face filter and the gender classifier. Not the generators, not execution settings. A stand-in
    run's CLIP is recorded as the stand-in (its directory differs from run to run)."""

    rec = st.image_recorded
    gen, clip = rec["generation"], rec["gender_classifier"]
    classifier = {"standin": True} if standin else {k: clip.get(k) for k in ("model", "pretrained", "revision")} \
        | {"prompts": protocol_digest(list(clip["prompts"]))}
    inp = st.input[0] if st.input else None
    return {"study": AmplificationStudy.name,
            "occupations": protocol_digest([occupation_spec(o) for o in st.occupations]),
            "occupation_forms": st.occupation_forms, "prompts": protocol_digest(list(st.prompts)),
            "images_per_prompt": int(gen["images_per_prompt"]), "caption_images": int(gen["caption_images"]),
            "seed": int(gen["seed"]), "safety": gen["safety"],
            # pool_factor and walk_first_round: how much is fetched per round of the walk, not what it selects
            "selection": {k: v for k, v in st.selection.items() if k not in ("pool_factor", "walk_first_round")},
            "gender_indicators": protocol_digest(st.gender_indicators | {"names_enabled": st.names_enabled}),
            "sbert": st.models, "training_captions": None if inp is None else int(inp.num_rows),
            "training_image_size": {k: rec["fetch"].get(k) for k in ("image_size", "resize_mode")},
            "face_filter": rec["face_filter"], "gender_classifier": classifier | {"threshold": clip["threshold"]}}


def run(args) -> dict:
    """`amplification.py run`."""
    return run_study(AmplificationStudy(), args)


def _walk_record(walk, selection) -> dict:
    """metrics.json's record of the training walk (section 4's k counted images)."""
    rec = {"training_sample": selection.training_sample, "nn_sample": selection.nn_sample}
    if walk is None:
        return rec | {"walked": False}
    g = walk.groups.to_pandas()
    short = g[g["shortfall"] > 0]
    return rec | {
        "walked": True, "rounds": walk.rounds, "pool_factor": walk.pool_factor, "reselections": walk.reselections,
        "groups": int(len(g)), "groups_short": int(len(short)),
        "captions_walked": int(g["walked_captions"].sum()), "counted_images": int(g["counted_images"].sum()),
        "short": [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in short.to_dict("records")],
    }


def _walk_summary(walk) -> None:
    g = walk.groups.to_pandas()
    if g.empty:
        return
    short = g[g["shortfall"] > 0]
    print(f"  walked {int(g['walked_captions'].sum()):,} captions in {walk.rounds} round(s) to "
          f"{int(g['counted_images'].sum()):,} counted images over {len(g)} group(s); "
          + (f"{len(short)} group(s) short of k: " + ", ".join(
              f"{r.occupation}/{r.subset}{'' if pd.isna(r.prompt_id) else f'#{int(r.prompt_id)}'} "
              f"{int(r.counted_images)}/{int(r.target)}" for r in short.head(8).itertuples())
             + (" ..." if len(short) > 8 else "") if len(short) else "every group reached k"))


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
                   run_files: dict, head: dict) -> None:
    level = int(round(head["interval"]["level"] * 100))
    print(f"\nbias amplification E[A] [{level}% interval, bootstrap over occupations] (Table 3; the images behind "
          f"each cell, and why a cell is n/a: {run_files['table3']}.csv)")
    shown = rep.table3_text(t3)
    shown = shown[[c for c in shown.columns if not c.startswith(("n_", "excluded_"))]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="n/a"))
    captions = {(s["name"], m["key"]): m for s in head["subjects"] for m in s["metrics"]}
    for model, cp in results["caption_prompts"].items():
        gm = results.get("caption_gender_match", {}).get(model)
        match = (f"; gender of the training image matched for {rep._fmt(gm['percent'])}% of {gm['images']} images "
                 f"from captions with indicators (paper: 98.41%)") if gm else ""
        print(f"captions as prompts ({model}): " + ", ".join(
            f"{k}: E[A] = {_with_interval(captions, model, k, v['average'])}" for k, v in cp.items()) + match)
    for model, pp in (results.get("paraphrase_prompts") or {}).items():
        print(f"paraphrases as prompts, App. A.6 ({model}): " + ", ".join(
            f"{k}: E[A] = {_with_interval(captions, model, k, v['average'], paraphrases_key)}"
            for k, v in pp.items()) + " (the paper: 0.69 all, 2.49 no indicators; section 6 0.68 and 2.05)")
    if results.get("paraphrases"):
        ps = results["paraphrases"]
        print(f"  paraphrases: {ps['requests']} captions, " + ", ".join(f"{k} {v}" for k, v in ps["statuses"].items() if v)
              + f"; SBERT cosine to the caption, mean {rep._fmt(ps['sbert_cosine']['mean'], 3)} "
              f"({RUN_FILES['paraphrase_table']}.csv)")
    sims = results.get("image_similarity", {}).get("per_model", {})
    if sims:
        print("CLIP image similarity of training and generated images, naive -> NN (the paper: +13%): " + "; ".join(
            f"{model} {rep._fmt(sim['naive'], 3)} -> {rep._fmt(sim['nn'], 3)} ({rep._fmt(sim['nn_change_percent'])}%, "
            f"{sim['pairs']} pairs)" for model, sim in sims.items()))
    corr = results["indicator_correlation"]
    print(f"Pearson r(% female training, % captions with female indicators) = {rep._fmt(corr['r'], 3)} (n = {corr['n']})")
    if any(m["standin"] for m in models):
        print("NOTE: CLIP and the generators were tiny random stand-ins: the numbers above are meaningless.")
