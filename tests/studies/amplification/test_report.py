"""Run results from a hand-built per-image table: T, G, the four approaches, section 6, report."""

import numpy as np
import pandas as pd
import pytest

from pipelines.studies.amplification import report as rep, results
from schemas import images as I

OCCS = ["nurse", "engineer", "teacher"]


def _rows(source, occupation, n_female, n_male, **extra):
    base = {I.SOURCE: source, "occupation": occupation, I.COUNTED: True, **extra}
    return [base | {I.GENDER: "female"}] * n_female + [base | {I.GENDER: "male"}] * n_male


def _table():
    rows = []
    # training: naive nurse 80% (4/5), engineer 20% (1/5); one uncounted image each
    rows += _rows("training", "nurse", 4, 1, subset="naive", caption_gender="none")
    rows += _rows("training", "engineer", 1, 4, subset="naive", caption_gender="female")
    rows += [{I.SOURCE: "training", "occupation": "nurse", "subset": "naive", I.COUNTED: False, I.GENDER: "ambiguous",
              "caption_gender": "none"}]
    # no indicators: nurse 75%, engineer 0%
    rows += _rows("training", "nurse", 3, 1, subset="no_indicators", caption_gender="none")
    rows += _rows("training", "engineer", 0, 2, subset="no_indicators", caption_gender="none")
    # NN per prompt: prompt 1 nurse 90%, prompt 2 nurse 60%; engineer 10% both
    for p, (f, m) in {1: (9, 1), 2: (6, 4)}.items():
        rows += _rows("training", "nurse", f, m, subset="nn", prompt_id=p)
        rows += _rows("training", "engineer", 1, 9, subset="nn", prompt_id=p)
        rows += _rows("training", "nurse", f - 2, m + 2, subset="nn_no_indicators", prompt_id=p)  # 70% / 40%
        rows += _rows("training", "engineer", 1, 9, subset="nn_no_indicators", prompt_id=p)
    # generated, model m: nurse 100% / 40% (switch) for prompts 1/2; engineer 10% / 30%
    rows += _rows("generated", "nurse", 10, 0, model="m", prompt_id=1)
    rows += _rows("generated", "nurse", 4, 6, model="m", prompt_id=2)
    rows += _rows("generated", "engineer", 1, 9, model="m", prompt_id=1)
    rows += _rows("generated", "engineer", 3, 7, model="m", prompt_id=2)
    # captions as prompts: nurse 80%, engineer 50% (balanced vs 20%: a switch)
    rows += _rows("caption_prompt", "nurse", 4, 1, model="m", caption_gender="none")
    rows += _rows("caption_prompt", "engineer", 1, 1, model="m", caption_gender="female")
    # teacher: only naive training images (60%), 2 of 5 captions with female indicators, nothing generated
    rows += _rows("training", "teacher", 2, 0, subset="naive", caption_gender="female")
    rows += _rows("training", "teacher", 1, 2, subset="naive", caption_gender="none")
    df = pd.DataFrame(rows)
    for c in ("subset", "prompt_id", "model", "caption_gender", "caption_id"):
        if c not in df:
            df[c] = None
    return df


def test_compute_four_approaches():
    res = results.compute(_table(), OCCS, n_prompts=2, models=["m"])
    per = res["approaches"]["m"]
    naive = {p["group"]: p for p in per["naive"]["per_prompt"]}
    # prompt 1: nurse |100-50|-|80-50| = 20, engineer |10-50|-|20-50| = 10 -> 15
    assert naive["1"]["expected_amplification"] == pytest.approx(15.0)
    # prompt 2: nurse switches (40 vs 80); engineer |30-50|-|20-50| = -10
    assert naive["2"]["expected_amplification"] == pytest.approx(-10.0)
    assert naive["2"]["excluded"] == {"direction_switch": ["nurse"], "no_generated_images": ["teacher"]}
    assert per["naive"]["average"] == pytest.approx(2.5)
    noind = {p["group"]: p["expected_amplification"] for p in per["no_indicators"]["per_prompt"]}
    assert noind["1"] == pytest.approx(((50 - 25) + (40 - 50)) / 2)
    nnn = {p["group"]: p["expected_amplification"] for p in per["nn_no_indicators"]["per_prompt"]}
    # NN + no indicators has its own T: nurse p1 |100-50|-|70-50| = 30, engineer 0 -> 15
    assert nnn["1"] == pytest.approx(15.0)
    nn = {p["group"]: p for p in per["nn"]["per_prompt"]}
    # NN joins on the prompt: nurse p1 |100-50|-|90-50| = 10, engineer p1 0; p2 nurse 40 vs 60 switch
    assert nn["1"]["expected_amplification"] == pytest.approx(5.0)
    assert nn["2"]["excluded"]["direction_switch"] == ["nurse"]
    # T rows exist only where they can: prompt-free subsets once per occupation, NN per prompt
    T = res["T"]
    assert len(T[T.subset == "naive"]) == 3 and set(T[T.subset == "naive"].prompt_id) == {0}
    assert len(T[T.subset == "nn"]) == 3 * 2 and set(T[T.subset == "nn"].prompt_id) == {1, 2}
    t6 = res["tables6"]["m"].set_index("occupation")
    assert t6.loc["nurse", "training"] == pytest.approx(80.0) and t6.loc["nurse", "n_training"] == 5
    assert t6.loc["engineer", "prompt_2"] == pytest.approx(30.0)
    t3 = results.table3(res["approaches"], 2)
    assert list(t3["approach"]) == list(results.APPROACH_TITLES.values())
    assert t3.iloc[0]["#1"] == pytest.approx(15.0)
    assert t3.iloc[0]["n_#1"] == 2 and t3.iloc[0]["excluded_#2"] == "direction_switch=1; no_generated_images=1"


def test_compute_caption_prompts_and_correlation():
    res = results.compute(_table(), OCCS, n_prompts=2, models=["m"])
    cp = res["caption_prompts"]["m"]
    # all captions: nurse 80 -> 80 (A = 0); engineer 20 -> 50 switch (balanced is its own direction)
    assert cp["all_captions"]["average"] == pytest.approx(0.0)
    assert cp["all_captions"]["per_prompt"][0]["excluded"] == {"direction_switch": ["engineer"],
                                                               "no_generated_images": ["teacher"]}
    # no-indicator captions: only nurse has any (training 4/5 counted, generated 4/5)
    assert cp["no_indicator_captions"]["per_prompt"][0]["excluded"]["no_training_images"] == ["engineer"]
    assert cp["no_indicator_captions"]["average"] == pytest.approx(0.0)  # nurse: 80 -> 80
    corr = res["indicator_correlation"]
    # per occupation: % female of counted naive images vs % of their captions with female indicators
    x, y = [80.0, 20.0, 60.0], [0.0, 100.0, 40.0]
    assert corr["n"] == 3 and corr["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_missing_generation_is_listed_not_lost():
    df = _table()
    df = df[~((df[I.SOURCE] == "generated") & (df["occupation"] == "engineer"))]
    res = results.compute(df, OCCS, n_prompts=2, models=["m"])
    naive = {p["group"]: p for p in res["approaches"]["m"]["naive"]["per_prompt"]}
    assert naive["1"]["excluded"]["no_generated_images"] == ["engineer", "teacher"]


def test_scatter_shading_and_points():
    from matplotlib.collections import PathCollection
    from matplotlib.colors import to_hex
    from matplotlib.patches import Polygon

    fig, drawn = rep.scatter_figure([([(20.0, 10.0, "engineer"), (np.nan, 5.0, "x"), (None, 1.0, "y")], "t & <t>")])
    assert drawn == [1]
    (ax,) = fig.axes
    assert ax.get_title() == "t & <t>" and ax.get_xlim() == (0, 100) and ax.get_ylim() == (0, 100)
    assert ax.get_xlabel() == "% female, training" and ax.get_ylabel() == "% female, generated"
    (points,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert points.get_offsets().tolist() == [[20.0, 10.0]]
    shaded = [p for p in ax.patches if isinstance(p, Polygon)]
    assert len(shaded) == 4
    # the point (T=20, G=10) lies in the lower-left amplification triangle (0,0)-(50,0)-(50,50), in red
    (home,) = [p for p in shaded if p.get_path().contains_point((20.0, 10.0))]
    assert home.get_xy().tolist()[:3] == [[0, 0], [50, 0], [50, 50]]
    assert to_hex(home.get_facecolor()) == rep.AMPLIFICATION_COLOR
    (diagonal,) = ax.lines
    assert diagonal.get_xydata().tolist() == [[0, 0], [100, 100]] and diagonal.get_linestyle() == "--"


def _render_inputs():
    res = results.compute(_table(), OCCS, n_prompts=2, models=["m"])
    t3 = results.table3(res["approaches"], 2)
    counts = pd.DataFrame([{"branch": "generated", "stage": "face_filter", "rows_in": 40, "outcome": "kept", "count": 38},
                           {"branch": "generated", "stage": "face_filter", "rows_in": 40, "outcome": "no_face",
                            "count": 2}])
    caption_counts = {"ner": {"rows_in": 100, "rows_out": 90, "dropped": {"no_person": 10, "other": 0}}}
    models = [{"role": "generator", "model": "hub-org/sd-standin", "standin": True,
               "detail": {"revision": "main", "commit": "f" * 40, "weights_sha256": "e" * 64, "dtype": "float32",
                          "device": "cpu", "pipeline_class": "StableDiffusionPipeline"}},
              {"role": "face detector", "model": "MediaPipe BlazeFace (full-range)", "standin": False,
               "detail": {"model": "mediapipe BlazeFace full-range", "model_sha256": "d" * 64}}]
    meta = {"output": "/runs/r1", "input": "sample.parquet", "occupations": 3, "images": len(_table())}
    return res, t3, counts, caption_counts, models, meta


FIGURE_STEMS = ["m_figure3_naive_prompt1", "m_figure7_approaches_prompt1", "m_figure9_approaches_average",
                "m_figure5_captions_as_prompts"]


def test_render_html_tables_figures_and_models(tmp_path):
    import pyarrow.fs as pafs
    from html import unescape

    from pipelines.engine.report import figures

    page = rep.render_html(*_render_inputs(), figures=figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path)))
    # the tables
    for heading in ("Bias amplification E[A] per prompt (Table 3)", "% female per occupation (Table 6/7)",
                    "Gender indicators (section 5.1)", "Caption side", "Image side", "<h2>Models</h2>"):
        assert heading in page, heading
    # headline, models, Table 3, Table 6/7, caption and image counts
    assert page.count("<table") == 1 + 1 + 1 + 1 + 2
    for title in results.APPROACH_TITLES.values():
        assert f"<td>{title}</td>" in page
    assert "<th>n_#1</th>" in page and "<td class=n>15.00</td>" in page            # Table 3, naive #1
    assert "<th>prompt_2</th>" in page and "<td class=n>80.0</td>" in page        # Table 6/7, nurse training
    assert "<td>no_person=10</td>" in page and "<td>no_face</td>" in page
    # the page opens with the headline (average E[A] per approach and model) and what stands behind it;
    # the per-stage counts come last, collapsed
    assert page.index("class=headline") < page.index("Table 3)") < page.index("<h2>Models</h2>") \
        < page.index("Caption side")
    headline = page[page.index("class=headline"):page.index("</section>")]
    assert "<th>approach</th><th>m</th>" in headline and "<td class=n>2.50</td>" in headline  # naive average
    assert "149 images in the per-image table" in headline and "2 no generated images, 1 direction switch" in headline
    assert page.index("<details class=more><summary>Diagnostics") < page.index("Caption side")
    # the figures: PDF + PNG under figures/, shown as the PNG embedded in the page (no link to a file)
    for stem in FIGURE_STEMS:
        pdf, png = tmp_path / "figures" / f"{stem}.pdf", tmp_path / "figures" / f"{stem}.png"
        assert pdf.read_bytes().startswith(b"%PDF"), stem
        assert png.read_bytes().startswith(b"\x89PNG"), stem
        assert f'<img src="{figures.png_uri(png.read_bytes())}"' in page, stem
        assert f'data-figure="{stem}"' in page and f"figures/{stem}.pdf, .png" in page, stem
    assert page.count("<img") == len(FIGURE_STEMS) and "<svg" not in page
    assert 'src="figures/' not in page and "href=" not in page
    # Figure 7: the four approaches as panels; naive #1 draws nurse and engineer, NN #1 both too
    assert "Naive Approach, #1: 2 occupations drawn" in page and "NN + No Indicators, avg:" in page
    # models: the provenance table, not a dict repr; the stand-in notice on top
    text = unescape(page)
    assert "STAND-IN (random weights)" in page and "hub-org/sd-standin" in page and "float32" in page
    assert "{'" not in text and "Stand-in models" in page
    assert page.index("Stand-in models with random weights: these numbers mean nothing") < page.index("class=headline")


def test_render_html_without_a_directory_embeds_the_figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = rep.render_html(*_render_inputs())
    assert page.count('<img src="data:image/png;base64,') == len(FIGURE_STEMS)
    assert list(tmp_path.iterdir()) == []


def test_summary_html_one_figure_per_model_and_prompt(tmp_path):
    import pyarrow.fs as pafs

    from pipelines.engine.report import figures
    from pipelines.studies.amplification.metrics import summarize_percentages

    df = pd.DataFrame({"occupation": ["nurse", "nurse", "nurse", "engineer", "engineer", "engineer"],
                       "group": ["T", "#1", "#2"] * 2, "percent_female": [80, 90, 40, 20, 10, 30]})
    result = summarize_percentages(df, "T")
    page = rep.summary_html("pct.csv", result, figures=figures.FigureDir(pafs.LocalFileSystem(), str(tmp_path)))
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "all_prompt_1.pdf", "all_prompt_1.png", "all_prompt_2.pdf", "all_prompt_2.png"]
    assert "#1: E[A] = 10.00 (2 occupations): 2 occupations drawn" in page
    assert "#2: E[A] = -10.00 (1 occupations): 1 occupations drawn" in page  # nurse switches: not drawn


def test_clean_json_is_strict():
    import json

    from pipelines.engine.storage.io import clean_json

    doc = clean_json({"a": float("nan"), "b": [np.float32(1.5), np.int64(3)], "c": {"d": float("inf")}})
    assert json.loads(json.dumps(doc, allow_nan=False)) == {"a": None, "b": [1.5, 3], "c": {"d": None}}


def test_section6_gender_match_of_captions_with_indicators():
    """Section 6's 98.41%: images generated from captions with male or female indicators whose
    gender is the caption's training image's; counted images only, 'both' and 'none' left out."""
    rows = []
    for cid, cg, train_gender, gen_genders in [
        (1, "female", "female", ["female", "female", "male"]),     # 2 of 3 match
        (2, "male", "male", ["male", "male"]),                     # 2 of 2
        (3, "both", "female", ["male"]),                           # 'both': left out
        (4, "none", "male", ["female"]),                           # no indicator: left out
        (5, "male", "ambiguous", ["male"]),                        # training image not counted: left out
    ]:
        rows.append({I.SOURCE: "training", "occupation": "nurse", "subset": "naive", "caption_id": cid,
                     "caption_gender": cg, I.GENDER: train_gender, I.COUNTED: train_gender != "ambiguous"})
        rows += [{I.SOURCE: "caption_prompt", "occupation": "nurse", "caption_id": cid, "caption_gender": cg,
                  "model": "m", I.GENDER: g, I.COUNTED: True} for g in gen_genders]
    rows.append({I.SOURCE: "caption_prompt", "occupation": "nurse", "caption_id": 2, "caption_gender": "male",
                 "model": "m", I.GENDER: "ambiguous", I.COUNTED: False})        # not counted: left out
    rows.append({I.SOURCE: "training", "occupation": "nurse", "subset": "no_indicators", "caption_id": 1,
                 "caption_gender": "female", I.GENDER: "male", I.COUNTED: True})  # another subset: not the naive one
    df = pd.DataFrame(rows)
    df["prompt_id"] = np.nan
    res = results.compute(df, ["nurse"], n_prompts=1, models=["m"])
    gm = res["caption_gender_match"]["m"]
    assert (gm["images"], gm["matching"], gm["captions"]) == (5, 4, 2)
    assert gm["percent"] == pytest.approx(80.0) and gm["paper_percent"] == 98.41


def test_render_html_opens_with_the_interval_table():
    """With metrics.json's headline: the opening box has each average E[A] (and section 6's) with its
    interval, the images behind it and what was left out; Table 3 shows every E[A] with its interval."""
    from pipelines.engine.stats import headline as HL
    from pipelines.engine.stats.intervals import IntervalSettings

    res, _, counts, caption_counts, models, meta = _render_inputs()
    metrics = results.model_metrics(res["approaches"], res["caption_prompts"])
    subject = HL.Subject("m", HL.subject_identity(models[0]), metrics["m"], images=40, excluded={"no_face": 2})
    head = HL.summarize("paper002-amplification", [subject], {}, IntervalSettings(resamples=200), True)
    t3 = results.table3(res["approaches"], 2, head)
    page = rep.render_html(res, t3, counts, caption_counts, models, meta, headline=head)
    box = page[page.index("class=headline>"):page.index("</section>")]
    assert "class=headline-metrics" in box and "<th>value [95% interval]</th>" in box
    averages = [m for m in head["subjects"][0]["metrics"] if "/prompt_" not in m["key"]]
    assert len(averages) == 4 + 2
    for m in averages:
        assert f"<td>{m['label']}</td><td class=n>{HL.interval_text(m)}</td>" in box
    assert "prompt #1" not in box and "m: 40 images (excluded: 2 no_face)" in box
    assert "149 images in the per-image table" in box and "direction switch" in box   # the study's own items
    naive = t3.iloc[0]
    assert naive["#1"] == pytest.approx(15.0) and naive["#1_low"] <= 15.0 <= naive["#1_high"]
    table3 = page[page.index("(Table 3)</h2>"):]
    assert f"<td>{rep.interval_text(15.0, naive['#1_low'], naive['#1_high'])}</td>" in table3


def test_a6_table_prints_the_papers_values_as_published():
    row = {"model": "sd-1.4", "prompts": "paraphrases (App. A.6)", "sbert_cosine_to_caption": 0.8,
           "clip_images_vs_caption_images": None}
    for name, value, paper in (("all_captions", 0.7123, 0.69), ("no_indicator_captions", 2.2, 2.49)):
        row |= {name: value, f"{name}_low": value - 0.1, f"{name}_high": value + 0.1, f"paper_{name}": paper,
                f"n_{name}": 15}
    shown = rep.a6_text(pd.DataFrame([row, dict(row, paper_all_captions=None)]))
    assert shown["E[A], all captions (paper)"].tolist() == ["0.69", "-"]
    assert shown["E[A], no indicators (paper)"].tolist() == ["2.49", "2.49"]
