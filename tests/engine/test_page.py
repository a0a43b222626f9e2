"""pipelines/engine/report/page.py: model labels, the stand-in notice and the page skeleton."""

import pandas as pd

from pipelines.engine.report import page as Pg


def test_model_labels_are_the_last_path_part_and_unique():
    labels = Pg.model_labels(["stable-diffusion-v1-5/stable-diffusion-v1-5", "/runs/r/standin_models/generator-1-standin",
                              "local-dir:/x/clip-vit-standin/", None, float("nan")],
                             ["CompVis/stable-diffusion-v1-4"])
    assert labels == {"stable-diffusion-v1-5/stable-diffusion-v1-5": "stable-diffusion-v1-5",
                      "/runs/r/standin_models/generator-1-standin": "generator-1-standin",
                      "local-dir:/x/clip-vit-standin/": "clip-vit-standin",
                      "CompVis/stable-diffusion-v1-4": "stable-diffusion-v1-4"}
    # two ids with one last part: the part before it as a suffix; still the same: #2
    same = Pg.model_labels(["runwayml/stable-diffusion-v1-5", "stable-diffusion-v1-5/stable-diffusion-v1-5",
                            "/a/org/sd", "/b/org/sd", "sd"])
    assert same == {"runwayml/stable-diffusion-v1-5": "stable-diffusion-v1-5 (runwayml)",
                    "stable-diffusion-v1-5/stable-diffusion-v1-5": "stable-diffusion-v1-5 (stable-diffusion-v1-5)",
                    "/a/org/sd": "sd (org)", "/b/org/sd": "sd (org) #2", "sd": "sd"}
    assert len(set(same.values())) == len(same)
    assert Pg.label(same, "/b/org/sd") == "sd (org) #2" and Pg.label({}, "x/y") == "y" and Pg.label({}, None) == "-"


def test_relabel_columns_and_headers():
    labels = {"org/a": "a", "org/b": "b"}
    df = pd.DataFrame({"model": ["org/a", "ref row", None], "org/b": [1, 2, 3]})
    out = Pg.relabel(df, labels, header=True)
    assert list(out["model"][:2]) == ["a", "ref row"] and out["model"].isna().iloc[2]
    assert list(out.columns) == ["model", "b"] and list(df.columns) == ["model", "org/b"]   # a copy


def test_standin_notice_and_page_skeleton():
    assert Pg.standin_console(True) == "NOTE: stand-in models with random weights: these numbers mean nothing."
    assert Pg.standin_console(False) == ""
    assert "Stand-in models with random weights: these numbers mean nothing." in Pg.standin_banner("x")
    assert Pg.any_standin([{"standin": False}, {"standin": True}]) and not Pg.any_standin([{"standin": False}])
    assert Pg.any_standin([], flag=True)
    doc = Pg.document("t <1>", ["<p>a</p>", Pg.headline("<p>lead</p>", ["3 images", "", "1 left out"])])
    assert doc.startswith("<!doctype html>") and "<title>t &lt;1&gt;</title>" in doc and doc.endswith("</body></html>")
    assert "<b>Behind it:</b> 3 images; 1 left out.</p>" in doc and ".tw{overflow-x:auto" in doc
    assert Pg.details("more <rows>", "<table></table>").startswith("<details class=more><summary>more &lt;rows&gt;")
    assert Pg.plural(1, "image") == "1 image" and Pg.plural(1200, "image") == "1,200 images"
