"""`dalleval.py alignment`: image-text alignment and image quality (paper 000, App. D, Table 19)
as one Ray job, with CLIPScore as the widely used modern alternative.

captions (e.g. COCO val2014 as parquet; one drawn per image, 30K drawn), one image each with a
recorded seed
  -> generation (any diffusers model), and on the generator's device, while the image is there:
     CLIP ViT-B/32 image and caption embeddings with their cosine, and the image's FID features
     (Inception v3 pool3 by default; pluggable)                              [Ray Data, GPU actors]
  reference images (the real images FID compares with) -> their FID features   [Ray Data actors]
  -> CLIP R-precision (true caption among 99 random others, R = 1), CLIPScore, FID (torchmetrics'
     Fréchet distance of the two feature sets), each with the number of images behind it;
     images.parquet, reference_features.parquet, alignment_quality.csv, metrics.json, report.html.

Generated rows are checkpointed by (model, image id) as they arrive and the reference features
once computed, so an interrupted run resumes where it stopped; the measures are recomputed from
the stored vectors every time (another negative sample needs no new image).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Stage, conform
from operators.image_clip_alignment import ClipAlignmentScorer
from operators.image_fid_features import FidFeatureExtractor, load_fid_extractor
from operators.image_generation import ImageGenerator
from operators.image_sink import ImageSink
from pipelines.engine.storage import io
from pipelines.engine.storage.inputs import resolve_parquet_inputs
from pipelines.engine.stream import runtime, scan, stages
from pipelines.engine.stats import headline as HL
from pipelines.engine.report.figures import FigureDir
from pipelines.engine.generation import Generated, GenerationPlan, generation_rows
from pipelines.engine.run.lifecycle import ImageStudy, Outcome, Run, run_study
from pipelines.engine.run.models import clip_record, standin_clip
from pipelines.engine.stream.progress import Phase
from pipelines.engine.stats.summary import stage_row
from pipelines.studies.dalleval import alignment_metrics as AM
from pipelines.standins.fid import tiny_fid_extractor
from pipelines.studies.dalleval import headlines as H
from pipelines.studies.dalleval import report_alignment
from schemas import alignment as A
from schemas.images import IMAGE_ID
from schemas.images import IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH, MODEL
from schemas.images import GENERATION_STATUS, GenerationStatus
from schemas.subsets import PROMPT
from operators.image_clip_embedding import embeddings_of
from pipelines.studies.dalleval.alignment_inputs import read_captions, requests_of, reference_kind, reference_sources, bundled_reference, _payload, read_files, image_key, effective_pairing, reference_captions, paired_paths, _attach, _read_parquet
from pipelines.studies.dalleval.alignment_settings import AlignmentSettings, fid_block, settings, captions_digest

VECTORS = (A.CLIP_IMAGE_EMBEDDING, A.CLIP_TEXT_EMBEDDING, A.FID_FEATURES)
FILES = {
    "images": "images",                         # per image: caption, seed, status, embeddings, cosine, FID features
    "reference": "reference_features.parquet",  # per reference image: FID features
    "table": "alignment_quality.csv",           # Table 19 shape: R-precision, CLIPScore, FID, n behind each
    "metrics": "metrics.json",
    "report": "report.html",
    "images_dir": "images",
}


def parquet_reference(ray, spec: str, col: str, idc: str | None, caption_col: str | None):
    """A Ray dataset of reference-image payloads from parquet (a file, or every ``*.parquet`` under a
    directory): the image bytes of ``col`` (raw bytes or Hugging Face image structs), the id of
    ``idc`` and the caption of ``caption_col`` where given."""
    inp = resolve_parquet_inputs(spec)
    columns = [col] + ([idc] if idc else []) + ([caption_col] if caption_col else [])
    ds = scan.parquet_dataset(ray, inp.filesystem, inp.files, columns=columns)

    def to_payload(b: pa.Table) -> pa.Table:
        blobs = b.column(col).to_pylist()
        blobs = [v.get("bytes") if isinstance(v, dict) else v for v in blobs]  # HF image structs
        ids = [str(v) for v in b.column(idc).to_pylist()] if idc else [None] * len(blobs)
        out = _payload(ids, blobs)
        return out.append_column(PROMPT, b.column(caption_col).cast(pa.string())) if caption_col else out

    return ds.map_batches(to_payload, batch_format="pyarrow")


def reference_features(ray, st: "AlignmentSettings", rd, per_actor: float, device: str = "auto") -> tuple[pa.Table, Phase]:
    """FID features of every reference image (checkpointed once computed); with captions for the
    images (pairing "captions" or a parquet caption column) also their CLIP embeddings."""
    path = f"{rd.path}/{FILES['reference']}"
    kind, paths = reference_sources(st.reference)
    phase = Phase("reference features", "images", 0)
    if kind == "statistics":
        return A.REFERENCE_FEATURES.empty_table(), phase
    if io.exists(rd.fs, path):
        done = _read_parquet(rd.fs, path)
        phase.total = phase.reused = done.num_rows
        print(f"  reference features: {done.num_rows:,} reused from the checkpoint")
        return done, phase
    fid, clip = st.fid, st.clip
    captions = reference_captions(st.reference, st.caption_groups)
    caption_col = st.reference.get("caption_column") if kind == "parquet" else None
    with_clip = captions is not None or bool(caption_col)
    pipeline = [Stage(FidFeatureExtractor, {"extractor": fid.model, "weights": fid.get("weights"),
                                            "factory": st.fid_factory,
                                            "batch_size": int(fid["batch_size"]), "device": device})]
    if with_clip:   # Table 19's real-image row: the images against their own captions
        pipeline.append(Stage(ClipAlignmentScorer, {"model": clip.model, "pretrained": clip.get("pretrained"),
                                                    "revision": clip.revision,
                                                    "batch_size": int(clip["batch_size"]),
                                                    "device": device}))
    pipeline = stages.configure(pipeline, {FidFeatureExtractor.stage_name: {"num_gpus": per_actor},
                                           ClipAlignmentScorer.stage_name: {"num_gpus": per_actor}})
    if kind == "bundled":
        ds = runtime.from_table(ray, bundled_reference(), 8)
    elif kind == "files":
        if captions is not None:
            paths = paired_paths(paths, captions, st.reference.get("max_images"))
        ds = runtime.from_table(ray, pa.table({A.REFERENCE_ID: pa.array(paths, pa.string())}), 64)
        ds = ds.map_batches(read_files, batch_format="pyarrow")
    else:
        ds = parquet_reference(ray, paths[0], st.reference.get("image_column") or "image",
                               st.reference.get("id_column"), caption_col)
    ds = ds.map_batches(_attach, fn_args=(captions, caption_col), batch_format="pyarrow")
    if kind == "parquet" and st.reference.get("max_images"):   # after the pairing filter: N paired images
        ds = ds.limit(int(st.reference["max_images"]))
    print("computing the FID features" + (" and CLIP embeddings" if with_clip else "") + " of the reference images ...")
    import time

    t0 = time.time()
    keep = [A.REFERENCE_ID, A.FID_FEATURES, PROMPT] + ([f.name for f in A.CLIP_ALIGNMENT_COLUMNS] if with_clip else [])
    refs = stages.run(ds, pipeline).drop_columns([IMAGE, IMAGE_ENCODING, IMAGE_HEIGHT, IMAGE_WIDTH]).to_arrow_refs()
    parts = [conform(t.select(keep), A.REFERENCE_FEATURES) for t in ray.get(refs) if t.num_rows]
    table = pa.concat_tables(parts) if parts else A.REFERENCE_FEATURES.empty_table()
    if kind == "parquet" and not st.reference.get("id_column"):
        table = table.set_column(table.schema.get_field_index(A.REFERENCE_ID), A.REFERENCE_ID,
                                 pa.array([str(i) for i in range(table.num_rows)], pa.string()))
    status = pc.if_else(pc.is_valid(table.column(A.FID_FEATURES)), A.ReferenceStatus.OK,
                        A.ReferenceStatus.DECODE_ERROR)
    table = table.set_column(table.schema.get_field_index(A.REFERENCE_STATUS), A.REFERENCE_STATUS, status)
    table = conform(table, A.REFERENCE_FEATURES)
    io.write_table(table, rd.fs, path)
    phase.total = phase.processed = table.num_rows
    phase.seconds = time.time() - t0
    return table, phase


def pairing_record(st: "AlignmentSettings", reference: pa.Table) -> dict:
    """What the FID and the real-image row compared with: the reference kind, pairing, extractor,
    how many of the drawn captions' images were found, and whether the pairing is the released
    code's (comparable with Table 19's FID column)."""
    kind = reference_kind(st.reference)
    rec = {"kind": kind, "pairing": effective_pairing(st.reference), "extractor": st.fid.model,
           "statistics": str(st.reference["statistics"]) if kind == "statistics" else None,
           "comparable_with_table19_fid": bool(kind == "statistics" and st.fid.model == "torchvision"),
           "comparable_note": "Table 19's FID (released code): torchvision's ImageNet Inception v3 against DM-GAN's "
                              "precomputed COCO val2014 statistics (coco_val.npz): --fid-extractor torchvision "
                              "--reference-statistics coco_val.npz"}
    if rec["pairing"] == "captions":
        drawn = len(st.caption_groups or {})
        found = len({image_key(v) for v in reference.column(A.REFERENCE_ID).to_pylist()})
        rec.update({"drawn_captions": drawn, "images_found": found, "images_missing": drawn - found})
    return rec


# ------------------------------------------------------------------------------------ generation
def generation_plan(st: AlignmentSettings, requests: pa.Table, save_images: bool) -> GenerationPlan:
    """Each caption's image; CLIP embeddings + cosine and FID features on the generator's device."""
    clip, fid = st.clip, st.fid
    heads = [Stage(ClipAlignmentScorer, {"model": clip.model, "pretrained": clip.get("pretrained"),
                                         "revision": clip.revision, "batch_size": int(clip["batch_size"])}),
             Stage(FidFeatureExtractor, {"extractor": fid.model, "weights": fid.get("weights"),
                                         "factory": st.fid_factory, "batch_size": int(fid["batch_size"])})]
    return GenerationPlan(requests, A.ALIGNMENT_IMAGES, ImageGenerator, ImageSink, heads=heads, key=IMAGE_ID,
                          save_images=save_images,
                          images_dir=FILES["images_dir"], what="generating and scoring")


# ------------------------------------------------------------------------------------ the study
class AlignmentStudy(ImageStudy):
    """App. D of paper 000 as a study of the engine's lifecycle."""
    name = "paper000-dalleval-alignment"

    plan_of = staticmethod(generation_plan)

    def settings(self, args) -> AlignmentSettings:
        st = settings(args)
        captions, counts = read_captions(st.captions)
        # image id -> the drawn caption (pairing "captions" finds the reference images by it)
        groups = {g: t for g, t in zip(captions.column(A.CAPTION_GROUP).to_pylist(),
                                       captions.column(PROMPT).to_pylist()) if g is not None}
        st = dataclasses.replace(st, caption_counts=counts, caption_groups=groups,
                                 requests=requests_of(captions, st.generation.seed))
        reference_sources(st.reference)   # a missing reference set fails now, before anything starts
        reference_captions(st.reference, st.caption_groups)   # and so does pairing by image id without image ids
        return st


    def announce(self, opts, st: AlignmentSettings) -> None:
        c = st.caption_counts
        kind, paths = reference_sources(st.reference)
        ref = {"bundled": "scikit-image's bundled photos (stand-in reference)", "parquet": f"parquet {paths and paths[0]}",
               "files": f"{len(paths or []):,} image files",
               "statistics": f"precomputed statistics {paths and paths[0]}"}[kind]
        if effective_pairing(st.reference) == "captions":
            ref += " (only the drawn captions' own images, by image id)"
        wanted = int(st.r_precision["negatives"])
        texts = st.requests.column(PROMPT).to_pylist() if st.requests is not None else []
        k = AM.negatives_per_image(len(texts), wanted, texts)   # fewer when there are fewer other captions
        negatives = f"{k} negatives" + (f"; {wanted} configured, fewer other captions" if k < wanted else "")
        print(f"DALL-Eval alignment / quality: {c['kept']:,} captions ({c['read']:,} read), one image each per "
              f"generator; CLIP {st.clip.model} R-precision (1 + {negatives}), CLIPScore; "
              f"FID ({'a tiny stand-in' if opts.standin_models else st.fid.model}) against {ref}")

    def actor_cpus(self, opts, st: AlignmentSettings) -> float:
        return opts.gen_actors + 1

    def use_standins(self, opts, st: AlignmentSettings, root: str) -> AlignmentSettings:
        """The tiny random CLIP; the tiny FID extractor in place of a built-in one without local
        weights (a plug-in or given weights are kept)."""
        fid, factory = st.fid, st.fid_factory
        if fid.model in ("inception", "torchvision") and fid.get("weights") is None:
            fid, factory = fid.standin_at(STANDIN_FID, weights=None), tiny_fid_extractor
        return dataclasses.replace(st, clip=standin_clip(st.clip, root), fid=fid, fid_factory=factory)

    def load_models(self, opts, st: AlignmentSettings, gpu) -> list[dict]:
        records = [clip_record(st.clip, opts.standin_models, "CLIP (R-precision, CLIPScore)")]
        fid = load_fid_extractor(st.fid.model, st.fid.get("weights"), device="cpu", factory=st.fid_factory)
        records.append({"role": "FID features", "model": st.fid.model, "standin": opts.standin_models,
                        "detail": getattr(fid, "record", {})})
        del fid
        return records

    def prepare(self, run: Run) -> GenerationPlan:
        run.memo["reference"] = reference_features(run.ray, run.st, run.rd, run.gpu.per_actor, run.gpu.device)
        return super().prepare(run)

    def analyse(self, run: Run, generated: Generated) -> Outcome:
        st, rd = run.st, run.rd
        requests = st.requests
        reference, ref_phase = run.memo["reference"]
        images, phases = generated.images, generated.phases
        table, units = measure_units(images, reference, st)
        headline = headline_section(run, images, reference, units)
        table = with_intervals(table, H.by_model(headline))
        pairing = pairing_record(st, reference)
        io.write_table_and_csv(images, rd.fs, f"{rd.path}/{FILES['images']}", csv_without=VECTORS)
        io.write_text(table.to_csv(index=False), rd.fs, f"{rd.path}/{FILES['table']}")
        save_images = run.options.save_images
        ok_ref = int(pc.sum(pc.equal(reference.column(A.REFERENCE_STATUS), A.ReferenceStatus.OK)).as_py() or 0)
        metrics = {
            "config": {"images": run.rd.job, "r_precision": st.r_precision,
                       "clip_score": st.clip_score, "execution": st.execution, **run.generation_config(),
                       "clip_loaded": st.clip, "fid_loaded": fid_block(st.fid)},
            "captions": st.caption_counts,
            "reference": {"images": reference.num_rows, "ok": ok_ref},
            "fid_reference": pairing,
            "results": table.to_dict("records"),
            "headline": headline,
        }
        c = st.caption_counts
        rows = [stage_row(None, "captions", "read + sample", c["read"], c["kept"],
                          {"null_or_blank": c["null_or_blank"],
                           "not_sampled": c["read"] - c["null_or_blank"] - c["kept"]}, c["read"]),
                stage_row(ref_phase, "reference images", "fid features", reference.num_rows, ok_ref,
                          {A.ReferenceStatus.DECODE_ERROR: reference.num_rows - ok_ref}, ref_phase.processed)]
        rows += generation_rows(images, requests.num_rows, phases, scored_rows)
        return Outcome(metrics, rows, {"images": images, "table": table, "save_images": save_images,
                                       "reference": reference, "pairing": pairing, "headline": headline})

    def report(self, run: Run, outcome: Outcome) -> None:
        st, rd, d = run.st, run.rd, outcome.data
        meta = {"run_id": rd.run_id, "output": rd.display(), "models": run.generator_models,
                "standin": run.options.standin_models, "captions": st.caption_counts,
                "reference": reference_kind(st.reference), "fid": fid_block(st.fid), "clip": st.clip.record(),
                "r_precision": st.r_precision, "pairing": d["pairing"],
                "images_dir": FILES["images_dir"] if d["save_images"] else None,
                "examples": int(st.report.get("examples", 8)), "headline": d["headline"]}
        html = report_alignment.render_html(meta, d["images"], d["table"], run.models, figures=FigureDir(rd.fs, rd.path))
        io.write_text(html, rd.fs, f"{rd.path}/{FILES['report']}")
        print(report_alignment.format_table(d["table"], standin=run.options.standin_models))
        print(f"\nwrote {rd.display()}/: {FILES['report']}, {FILES['metrics']}, {FILES['images']}.parquet/.csv, "
              f"{FILES['reference']}, {FILES['table']}" + (f", {FILES['images_dir']}/" if d["save_images"] else ""))


# the stand-in FID extractor: passed as a function (no module loaded by a string); its name is what
# the run records
STANDIN_FID = "pipelines.standins.fid:tiny_fid_extractor"


def run(args) -> dict:
    """`dalleval.py alignment`."""
    return run_study(AlignmentStudy(), args)


# ------------------------------------------------------------------------------------ measures
def _vectors(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:

    return embeddings_of(table.column(column))


REAL_IMAGES = "real images (reference)"


def measures(images: pa.Table, reference: pa.Table, st: AlignmentSettings) -> pd.DataFrame:
    """Table 19's shape per model: R-precision, CLIPScore and FID with the images behind each; and,
    when the reference images have captions, Table 19's real-image row (R-precision and CLIPScore
    of the reference images against their own captions)."""
    return measure_units(images, reference, st)[0]


def _clip_score_units(table: pa.Table, id_column: str, w: float) -> tuple[dict, tuple]:
    """CLIPScore of the rows with a cosine, and its units: (ids, w max(cos, 0) per image)."""
    cos = table.column(A.CLIP_COSINE).to_numpy(zero_copy_only=False)
    ok = ~pd.isna(cos)
    cos = cos[ok].astype(np.float64)
    ids = np.asarray(table.column(id_column).to_pylist(), dtype=object)[ok].tolist()
    s = AM.clip_score(cos, w=w) if len(cos) else {"clip_score": None, "clip_score_100": None, "n": 0}
    return ({"clip_score": s["clip_score"], "clip_score_100": s["clip_score_100"], "clip_score_n": s["n"]},
            (ids, (w * np.maximum(cos, 0.0)).tolist()) if len(cos) else None)


def measure_units(images: pa.Table, reference: pa.Table, st: AlignmentSettings) -> tuple[pd.DataFrame, dict]:
    """``measures``' table and, per row (model, or the real images), the units behind its
    R-precision and CLIPScore: {row: {"r_precision": (ids, values), "clip_score": (ids, values)}},
    each a per-image value whose mean is the row's figure (ids: the image id, or the reference id)."""
    stats = AM.load_statistics(str(st.reference["statistics"])) if reference_kind(st.reference) == "statistics" \
        else None
    ref, ref_ok = _vectors(reference, A.FID_FEATURES)
    ref = ref[ref_ok]
    w = float(st.clip_score["w"])
    rows, units = [], {}
    for model in dict.fromkeys(images.column(MODEL).to_pylist()):
        mine = images.filter(pc.equal(images.column(MODEL), model))
        rp, rp_units = _alignment(mine, st.r_precision, IMAGE_ID)
        cs, cs_units = _clip_score_units(mine, IMAGE_ID, w)
        row = {"model": model, **rp, "r_precision_reading": st.r_precision["reading"], **cs}
        units[model] = {"r_precision": rp_units, "clip_score": cs_units}
        feats, ok_f = _vectors(mine, A.FID_FEATURES)
        if stats is not None and ok_f.sum() >= 2:
            f = AM.fid_from_statistics(feats[ok_f], *stats)
            row.update({"fid": f["fid"], "fid_n_generated": f["n_generated"], "fid_n_reference": None})
        elif stats is None and ok_f.sum() >= 2 and len(ref) >= 2:
            f = AM.fid(feats[ok_f], ref)
            row.update({"fid": f["fid"], "fid_n_generated": f["n_generated"], "fid_n_reference": f["n_reference"]})
        else:
            row.update({"fid": None, "fid_n_generated": int(ok_f.sum()), "fid_n_reference": int(len(ref))})
        rows.append(row)
    if reference.num_rows and A.CLIP_COSINE in reference.column_names \
            and pc.sum(pc.is_valid(reference.column(A.CLIP_COSINE))).as_py():
        rp, rp_units = _alignment(reference, st.r_precision, A.REFERENCE_ID)
        cs, cs_units = _clip_score_units(reference, A.REFERENCE_ID, w)
        rows.append({"model": REAL_IMAGES, **rp, "r_precision_reading": st.r_precision["reading"], **cs,
                     "fid": None, "fid_n_generated": None, "fid_n_reference": None})
        units[REAL_IMAGES] = {"r_precision": rp_units, "clip_score": cs_units}
    return pd.DataFrame(rows), units


def headline_section(run: Run, images: pa.Table, reference: pa.Table, units: dict) -> dict:
    """metrics.json's ``headline`` (and headline_units.parquet): per generator (and the reference
    images, when they have captions: kind "data") R-precision and CLIPScore over the images, each
    with its interval. FID is not a mean over images: it has none."""
    st = run.st
    metrics = {row: H.alignment_metrics(u) for row, u in units.items() if row != REAL_IMAGES}
    ok = pc.equal(images.column(GENERATION_STATUS), GenerationStatus.OK)
    made = {m: int(pc.sum(pc.and_(pc.fill_null(ok, False), pc.equal(images.column(MODEL), m))).as_py() or 0)
            for m in metrics}
    excluded = {m: {"not generated (failed or blocked)": st.requests.num_rows - n} for m, n in made.items()}
    subjects = H.subjects(metrics, run.models, made, excluded)
    if units.get(REAL_IMAGES):
        subjects.append(HL.Subject(REAL_IMAGES, {"data": "reference images", "kind": reference_kind(st.reference),
                                                 "pairing": effective_pairing(st.reference)},
                                   H.alignment_metrics(units[REAL_IMAGES]), kind="data",
                                   images=reference.num_rows))
    return HL.write(run.rd, H.ALIGNMENT_STUDY, subjects, protocol(st), run.options.intervals,
                    run.options.standin_models)


def protocol(st: AlignmentSettings) -> dict:
    """What two alignment runs must share to be compared: the drawn captions, seeds, safety policy,
    CLIP and the R-precision / CLIPScore settings, the reference set's kind (not the generators)."""
    gen = st.generation
    return {"paper": "000", "part": "image-text alignment (App. D)", "captions": captions_digest(st.requests),
            "images_per_prompt": 1, "seed": int(gen.seed), "safety": gen.safety.job(),
            "clip": H.model_protocol(st.clip), "r_precision": dict(st.r_precision),
            "clip_score": dict(st.clip_score), "reference": reference_kind(st.reference),
            "pairing": effective_pairing(st.reference)}


def with_intervals(table: pd.DataFrame, lookup: dict) -> pd.DataFrame:
    """Table 19's table with the R-precision and CLIPScore intervals beside them."""
    return H.with_intervals(table, lookup, {"r_precision": H.R_PRECISION, "clip_score": H.CLIP_SCORE})


def _alignment(table: pa.Table, rp: dict, id_column: str) -> tuple[dict, tuple | None]:
    """R-precision of the rows' images against their captions, in the configured reading (``rp``:
    the r_precision settings), and its units: (ids from ``id_column``, each image's 100 x hit)."""
    img, ok_i = _vectors(table, A.CLIP_IMAGE_EMBEDDING)
    txt, ok_t = _vectors(table, A.CLIP_TEXT_EMBEDDING)
    ok = ok_i & ok_t
    if ok.sum() < 2:
        return {"r_precision": None, "r_precision_n": int(ok.sum()), "negatives": None}, None
    if rp["reading"] == "released":
        norms = [table.column(c).to_numpy(zero_copy_only=False) for c in (A.CLIP_IMAGE_NORM, A.CLIP_TEXT_NORM)]
        if any(pd.isna(n[ok]).any() for n in norms):
            raise ValueError("the released R-precision needs the CLIP feature norms, which these rows lack "
                             "(images scored before the norms were stored: run again in a new run directory)")
        r = AM.r_precision_released(img[ok], txt[ok], norms[0][ok].astype(np.float32), norms[1][ok].astype(np.float32),
                                    negatives=int(rp["negatives"]), r=int(rp["r"]), repeats=int(rp["repeats"]),
                                    seed=int(rp["seed"]), per_image=True)
    else:
        captions = np.asarray(table.column(PROMPT).to_pylist(), dtype=object)[ok].tolist()
        r = AM.r_precision(img[ok], txt[ok], captions=captions, negatives=int(rp["negatives"]), r=int(rp["r"]),
                           seed=int(rp["seed"]), per_image=True)
    ids = np.asarray(table.column(id_column).to_pylist(), dtype=object)[ok].tolist()
    return ({"r_precision": r["r_precision"], "r_precision_n": r["n"], "negatives": r["negatives"]},
            (ids, r["per_image"].tolist()))


def scored_rows(phase, branch: str, gen_ok: pa.Table, ok: int, share: float) -> list[dict]:
    emb = int(pc.sum(pc.is_valid(gen_ok.column(A.CLIP_COSINE))).as_py() or 0) if gen_ok.num_rows else 0
    fid = int(pc.sum(pc.is_valid(gen_ok.column(A.FID_FEATURES))).as_py() or 0) if gen_ok.num_rows else 0
    return [stage_row(phase, branch, "clip alignment", ok, emb, {"not_scored": ok - emb}, round(ok * share)),
            stage_row(phase, branch, "fid features", ok, fid, {"no_features": ok - fid}, round(ok * share))]
