"""Every study's report.html, rendered from tiny synthetic inputs (no Ray, no models), read the way a
person reads it: in headless Chromium at 1400 px. The page never scrolls sideways (wide tables and
image strips scroll in their own box), every image loads, nothing on the page refers to a file
beside it (figures and example images are embedded), it opens with the headline box and the
stand-in notice, and models are named by their short labels (two models with the same last path
part get told apart).

The measurement is ``scripts/screenshots.py``'s ``check_page``: a copy of the page with a small
script that writes scrollWidth, innerWidth and each image's naturalWidth into the DOM, read back
with ``chromium --headless --dump-dom``. Skipped only when no chromium binary is found."""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from pipelines.engine.report.figures import FigureDir

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 1400
# two generators whose hub ids end alike: the page must tell them apart by label, never by full id
GEN_A, GEN_B = "org-a/stable-diffusion-v1-5", "/runs/r/standin_models/stable-diffusion-v1-5"
LABEL_A, LABEL_B = "stable-diffusion-v1-5 (org-a)", "stable-diffusion-v1-5 (standin_models)"
NOTICE = "Stand-in models with random weights: these numbers mean nothing."


def _screenshots():
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SHOTS = _screenshots()
CHROMIUM = SHOTS.find_chromium()


def _records(*models, standin=True):
    return [{"role": "generator", "model": m, "standin": standin,
             "detail": {"revision": "main", "dtype": "float32", "device": "cpu", "weights_sha256": "ab" * 32}}
            for m in models]


def _png(path: Path, seed: int, size: int = 64) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


# ------------------------------------------------------------------------------------ the studies' pages
def amplification_page(out: Path) -> str:
    from studies.amplification.test_report import _render_inputs

    from pipelines.studies.amplification import report as rep

    return rep.render_html(*_render_inputs(), figures=FigureDir(pafs.LocalFileSystem(), str(out)))


def gep_page(out: Path) -> str:
    from pipelines.studies.gep import metrics as M
    from pipelines.studies.gep import report as rep

    names = ["dress", "suit", "hat", "a very long attribute name that makes a column wide"]
    rng = np.random.default_rng(0)
    rows = [{"model": m, "setting": s, "gender": g, "attribute": a, "estimator": e,
             "frequency": float(rng.uniform(0, 1)), "images": 4 if s == "neutral" else 1}
            for m in (GEN_A, GEN_B) for s in ("neutral", "explicit") for e in ("C", "CC", "CLS")
            for g in ("woman", "man") for a in names]
    freq = pd.DataFrame(rows)
    vectors = M.gep_vectors(freq)
    shown = {"frequencies": freq, "vectors": vectors, "gep": M.gep_scores(vectors)}
    meta = {"run_id": "gep-test", "output": str(out), "images": 2 * (8 + 8), "models": [GEN_A, GEN_B],
            "standin": True, "settings": ["neutral", "explicit"], "reference": "an object", "ensemble": 3,
            "attributes": names}
    return rep.render_html(meta, shown, rep.paper_tables(shown, names), None, _records(GEN_A, GEN_B),
                           figures=FigureDir(pafs.LocalFileSystem(), str(out)))


def dalleval_page(out: Path) -> str:
    from pipelines.studies.dalleval import report as rep
    from pipelines.studies.dalleval.study import analyse
    from schemas import dalleval as S
    from schemas.images import GENERATION_STATUS, MODEL
    from schemas.subsets import PROMPT

    attrs = ["boots", "dress", "suit", "hat", "tie", "mask", "gloves", "skirt", "jacket", "uniform", "shirt", "jeans",
             "shorts", "slacks", "slippers"]   # the paper's 15: Table 9's wide table
    rng = np.random.default_rng(1)
    rows = []
    for m in (GEN_A, GEN_B):
        for group in ("person", "woman", "man"):
            for prof in ("nurse", "engineer", "software developer"):
                for i in range(2):
                    rows.append({MODEL: m, S.GROUP: group, S.PROFESSION: prof, PROMPT: f"a {group} who works as a {prof}",
                                 GENERATION_STATUS: "ok", S.DETECTED_GENDER: ["male", "female", "unknown"][(i + len(prof)) % 3],
                                 S.SKIN_TONE: int(rng.integers(1, 11)), S.ATTRIBUTE_NAMES: attrs,
                                 S.ATTRIBUTE_PRESENT: [bool(v) for v in rng.integers(0, 2, len(attrs))]})
    images = pa.Table.from_pylist(rows)
    meta = {"run_id": "dalleval-test", "output": str(out), "images": images.num_rows, "models": [GEN_A, GEN_B],
            "standin": True, "detect": {"gender": "blip2", "attributes": True, "skin_tone": True},
            "neutral": "person", "compare": ["woman", "man"], "attributes": attrs}
    results = analyse(images, "person", ["woman", "man"], meta["detect"])
    return rep.render_html(meta, results, _records(GEN_A, GEN_B), figures=FigureDir(pafs.LocalFileSystem(), str(out)))


def skills_page(out: Path) -> str:
    from pipelines.engine.storage.checkpoint import model_dir
    from pipelines.studies.dalleval import report_skills as rep
    from pipelines.studies.dalleval import skills as K
    from pipelines.studies.dalleval.skills_study import analyse
    from schemas import paintskills as P
    from schemas.images import GENERATION_STATUS, MODEL

    req = K.skill_prompts({s: 3 for s in P.Skill.ALL})
    parts = []
    for k, m in enumerate((GEN_A, GEN_B)):
        n = req.num_rows
        t = req.append_column(MODEL, pa.array([m] * n)).append_column(GENERATION_STATUS, pa.array(["ok"] * n))
        objs = t.column(P.OBJECT_A).to_pylist()
        t = t.append_column(P.DET_LABELS, pa.array([[o, "dog"] for o in objs], pa.list_(pa.string())))
        t = t.append_column(P.DET_SCORES, pa.array([[0.9, 0.8 if i % 2 else 0.1] for i in range(n)], pa.list_(pa.float32())))
        t = t.append_column(P.DET_BOXES, pa.array([[[0.1, 0.1, 0.4, 0.5], [0.5, 0.5, 0.9, 0.9]]] * n,
                                                  pa.list_(pa.list_(pa.float32()))))
        parts.append(t)
        for i, image_id in enumerate(t.column(P.IMAGE_ID).to_pylist()):
            _png(out / "images" / model_dir(m) / f"{image_id}.png", 100 * k + i)
    judged = K.judge(pa.concat_tables(parts))
    meta = {"run_id": "skills-test", "output": str(out), "models": [GEN_A, GEN_B], "standin": True,
            "detector": {"model": "/runs/r/standin_models/detr-standin", "threshold": 0.7},
            "templates": "table1", "sizes": {s: 3 for s in P.Skill.ALL}, "images_dir": "images", "examples": 6}
    return rep.render_html(meta, judged, analyse(judged), _records(GEN_A, GEN_B),
                           figures=FigureDir(pafs.LocalFileSystem(), str(out)))


def alignment_page(out: Path) -> str:
    from pipelines.engine.storage.checkpoint import model_dir
    from pipelines.studies.dalleval import report_alignment as rep
    from schemas import alignment as A
    from schemas.images import GENERATION_STATUS, IMAGE_ID, MODEL, SEED
    from schemas.subsets import PROMPT

    rows = []
    for k, m in enumerate((GEN_A, GEN_B)):
        for i in range(10):   # a strip of ten 160 px examples: wider than the page, scrolls in its box
            rows.append({IMAGE_ID: f"i{i}", PROMPT: f"a dog number {i} sitting on a rather long red couch", SEED: i,
                         MODEL: m, GENERATION_STATUS: "ok", A.CLIP_COSINE: 0.2 + 0.01 * i})
            _png(out / "images" / model_dir(m) / f"i{i}.png", 10 * k + i, size=256)
    table = pd.DataFrame([{"model": m, "r_precision": 10.0, "r_precision_n": 10, "negatives": 9,
                           "r_precision_reading": "project", "clip_score": 0.5, "clip_score_100": 20.0,
                           "clip_score_n": 10, "fid": 123.4, "fid_n_generated": 10, "fid_n_reference": 8}
                          for m in (GEN_A, GEN_B)])
    meta = {"run_id": "alignment-test", "output": str(out), "models": [GEN_A, GEN_B], "standin": True,
            "captions": {"read": 12, "null_or_blank": 2, "kept": 10}, "reference": "bundled",
            "fid": {"extractor": "pipelines.standins.fid:tiny_fid_extractor"},
            "clip": {"model": "local-dir:/runs/r/standin_models/clip-vit-standin"},
            "r_precision": {"negatives": 99, "r": 1, "reading": "project"}, "pairing": {},
            "images_dir": "images", "examples": 10}
    return rep.render_html(meta, pa.Table.from_pylist(rows), table, _records(GEN_A, GEN_B),
                           figures=FigureDir(pafs.LocalFileSystem(), str(out)))


def exposed_page(out: Path) -> str:
    from studies.exposed.test_metrics import images as disparity_images
    from studies.exposed.test_objects import image_rows

    from pipelines.engine.storage.checkpoint import model_dir
    from pipelines.studies.exposed import metrics as M
    from pipelines.studies.exposed import report as rep
    from pipelines.studies.exposed import report_objects as objects_report
    from pipelines.studies.exposed.study import object_tables
    from schemas import exposed as S
    from schemas.subsets import PROMPT

    sims = {s: [0.9, 0.95, 0.85] for s in S.Space.ALL} | {S.Space.DIFF_PIX: [30.0, 25.0, 35.0]}
    units = [(m, src, f"{src}-u{i}", "ok", sims) for m in (GEN_A, GEN_B) for src in ("coco", "profession")
             for i in range(2)] + [(GEN_B, "coco", "coco-u9", "nsfw_blocked", {})]
    images = disparity_images(units)
    images = images.set_column(images.schema.get_field_index(S.IMAGE_ID), S.IMAGE_ID,
                               pa.array([f"{u}-{v}" for u, v in zip(images.column(S.UNIT_ID).to_pylist(),
                                                                    images.column(S.VARIANT).to_pylist())]))
    images = images.set_column(images.schema.get_field_index(PROMPT), PROMPT,
                               pa.array([f"a {v} person riding a bicycle down a very long street" for v in
                                         images.column(S.VARIANT).to_pylist()]))
    images = images.set_column(images.schema.get_field_index(S.SEED), S.SEED, pa.array([7] * images.num_rows, pa.int64()))
    for i, (m, image_id) in enumerate(zip(images.column("model").to_pylist(), images.column(S.IMAGE_ID).to_pylist())):
        _png(out / "images" / model_dir(m) / f"{image_id}.png", i)
    disparities = M.disparity_table(images)
    data = {"table3": M.table3(disparities), "direction": M.direction_table(disparities), "images": images}
    counts = pa.Table.from_pylist([
        {S.TRIPLET_SOURCE: "coco", S.TRIPLET_STATUS: "kept", S.HUMAN_WORD: None, S.COUNT: 2},
        {S.TRIPLET_SOURCE: "coco", S.TRIPLET_STATUS: "human_word", S.HUMAN_WORD: None, S.COUNT: 3},
        {S.TRIPLET_SOURCE: "coco", S.TRIPLET_STATUS: "human_word", S.HUMAN_WORD: "girl", S.COUNT: 3}])
    settings = types.SimpleNamespace(min_count={}, default_min_count=1, top_objects=5,
                                     leave_out_individuals="all_tests", min_group_objects=0)
    found = object_tables(settings, image_rows())          # sections 5-7 of the objects test's hand-built rows
    meta = {"run_id": "exposed-test", "output": str(out), "standin": True, "models": [GEN_A, GEN_B], "triplets": 4,
            "units": 4, "spaces": list(S.Space.ALL), "images_dir": f"{out}/images"}
    return rep.render_html(meta, data, counts, _records(GEN_A, GEN_B), figures=FigureDir(pafs.LocalFileSystem(), str(out)),
                           examples=2, extra=lambda sink: objects_report.render_html(found, image_rows().to_pandas(), sink,
                                                                                    examples=0))


PAGES = {"amplification": amplification_page, "gep": gep_page, "dalleval": dalleval_page, "skills": skills_page,
         "alignment": alignment_page, "exposed": exposed_page}


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, make in PAGES.items():
        run = tmp_path_factory.mktemp(name)
        (run / "report.html").write_text(make(run), encoding="utf-8")
        out[name] = run / "report.html"
    return out


@pytest.mark.parametrize("name", list(PAGES))
def test_report_is_one_self_contained_file(pages, name):
    page = pages[name].read_text(encoding="utf-8")
    # no figure or example image linked from the files beside the page: every src is a data URI
    srcs = re.findall(r"""\bsrc\s*=\s*["']([^"']*)["']""", page)
    assert srcs and all(s.startswith("data:image/") for s in srcs), [s[:40] for s in srcs if not s.startswith("data:")]
    assert 'src="figures/' not in page and "src='images/" not in page
    hrefs = re.findall(r"""\bhref\s*=\s*["']([^"']*)["']""", page)
    assert all(h.startswith(("#", "http://", "https://", "data:")) for h in hrefs), hrefs
    assert "<link " not in page and "url(" not in page
    # the figures stay beside the page for papers, as PDF and PNG
    if (pages[name].parent / "figures").exists():
        pdfs = sorted(p.stem for p in (pages[name].parent / "figures").glob("*.pdf"))
        assert pdfs == sorted(p.stem for p in (pages[name].parent / "figures").glob("*.png")) and pdfs


@pytest.mark.parametrize("name", list(PAGES))
def test_report_opens_with_the_notice_and_the_headline(pages, name):
    page = pages[name].read_text(encoding="utf-8")
    body = page[page.index("<body>"):]
    assert body.index(NOTICE) < body.index("class=headline") < body.index("<h2>Models</h2>")
    assert body.index("class=headline") < min(body.index(h) for h in re.findall(r"<h2>[^<]*</h2>", body)
                                              if "class=headline" not in h)
    headline = body[body.index("class=headline"):body.index("</section>")]
    assert "<table" in headline and "<b>Behind it:</b>" in headline


@pytest.mark.parametrize("name", [n for n in PAGES if n != "amplification"])
def test_models_are_named_by_distinct_short_labels(pages, name):
    page = pages[name].read_text(encoding="utf-8")
    models = page[page.index("<h2>Models</h2>"):]
    rest = page[:page.index("<h2>Models</h2>")]
    assert LABEL_A in rest and LABEL_B in rest
    # the full ids only in the models table (a figure's file name is a slug: never an id)
    assert GEN_A not in rest and GEN_B not in rest
    assert GEN_A in models and GEN_B in models and f"shown as <b>{LABEL_A}</b>" in models


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found (chromium, chromium-browser, google-chrome)")
@pytest.mark.parametrize("name", list(PAGES))
def test_report_in_chromium_at_1400_px(pages, name):
    check = SHOTS.check_page(pages[name], WIDTH, 1000, CHROMIUM)
    assert check["innerWidth"] == WIDTH
    assert check["scrollWidth"] <= check["innerWidth"], SHOTS.problems(check)
    assert check["images"] > 0 and check["broken"] == [], SHOTS.problems(check)


def test_console_results_end_with_the_standin_notice_and_use_labels():
    from pipelines.engine.report.page import STANDIN_CONSOLE
    from pipelines.studies.dalleval import report as dalleval_report
    from pipelines.studies.dalleval import report_alignment
    from pipelines.studies.exposed import metrics as M
    from pipelines.studies.exposed import report as exposed_report
    from pipelines.studies.gep import metrics as GM
    from pipelines.studies.gep import report as gep_report
    from studies.exposed.test_metrics import images as disparity_images
    from schemas import exposed as S

    freq = pd.DataFrame([{"model": m, "setting": "neutral", "gender": g, "attribute": "hat", "estimator": "C",
                          "frequency": 0.5, "images": 1} for m in (GEN_A, GEN_B) for g in ("woman", "man")])
    vectors = GM.gep_vectors(freq)
    text = gep_report.format_scores({"frequencies": freq, "vectors": vectors, "gep": GM.gep_scores(vectors)},
                                    standin=True)
    assert text.splitlines()[-1] == STANDIN_CONSOLE and LABEL_A in text and GEN_A not in text
    assert STANDIN_CONSOLE not in gep_report.format_scores({"gep": GM.gep_scores(vectors)})
    summary = [{"model": m, "gender": {"average": 0.1, "mad": 0.2, "prompts": 3, "prompts_without_detections": 0,
                                       "prompts_group": "person"}} for m in (GEN_A, GEN_B)]
    text = dalleval_report.format_results({"summary": summary, "tables": {}}, standin=True)
    assert text.splitlines()[-1] == STANDIN_CONSOLE and LABEL_B in text and GEN_B not in text
    table = pd.DataFrame([{"model": m, "r_precision": 1.0, "r_precision_n": 2, "clip_score": 0.1, "clip_score_100": 4.0,
                           "clip_score_n": 2, "fid": 9.0, "fid_n_generated": 2, "fid_n_reference": 2}
                          for m in (GEN_A, GEN_B)])
    text = report_alignment.format_table(table, standin=True)
    assert text.splitlines()[-1] == STANDIN_CONSOLE and LABEL_A in text
    sims = {s: [0.9, 0.95, 0.85] for s in S.Space.ALL}
    d = M.disparity_table(disparity_images([(GEN_A, "coco", "u1", "ok", sims)]))
    text = exposed_report.format_results(M.table3(d), M.direction_table(d), standin=True)
    assert text.splitlines()[-1] == STANDIN_CONSOLE
    head = text.splitlines()[1]
    for label in exposed_report.SPACE_LABELS.values():       # column headers whole, never cut
        assert label in head
