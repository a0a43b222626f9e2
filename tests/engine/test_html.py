"""pipelines/engine/report/html.py: the shared table and the model-records table of the reports."""

import json
import re
from html import unescape

import numpy as np
import pandas as pd

from pipelines.engine.report import html as H

SHA = "ab" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _generator(standin=True):
    return {"role": "generator", "model": "/tmp/models/stable-diffusion-v1-4-standin", "standin": standin,
            "detail": {"model": "/tmp/models/stable-diffusion-v1-4-standin", "revision": "v1.0", "commit": COMMIT,
                       "source": "directory", "pipeline_class": "StableDiffusionPipeline", "dtype": "float16",
                       "device": "cuda:0", "weights_sha256": SHA, "weight_files": {"unet/model.safetensors": "cd" * 32},
                       "standin": "tiny random-weight stand-in"}}


def _cells(page: str, row: int) -> list[str]:
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<tbody>")[1], flags=re.S)
    return re.findall(r"<td[^>]*>(.*?)</td>", rows[row], flags=re.S)


def test_model_table_shows_provenance_columns_and_standin():
    face = {"role": "skin tone", "model": "MediaPipe Face Mesh", "standin": False,
            "detail": {"model": "mediapipe Face Mesh", "landmark_model_sha256": "11" * 32,
                       "detector_model_sha256": "22" * 32, "max_faces": 1}}
    page = H.model_table([_generator(), face])
    head = re.findall(r"<th>(.*?)</th>", page)
    assert head[:7] == ["role", "model id", "revision / hub commit", "weights sha256", "dtype", "device",
                        "real or stand-in"]
    gen = _cells(page, 0)
    assert gen[0] == "generator" and "stable-diffusion-v1-4-standin" in gen[1]
    assert "v1.0" in gen[2] and COMMIT[:12] in gen[2] and f'title="{COMMIT}"' in gen[2]
    assert SHA[:12] in gen[3] and f"{SHA[:13]}" not in re.sub(r'title="[^"]*"', "", gen[3])  # short, full in title
    assert f"weights_sha256: {SHA}" in gen[3]
    assert gen[4] == "float16" and gen[5] == "cuda:0" and gen[6] == "STAND-IN (random weights)"
    # the rest of the record: collapsed, as JSON
    more = re.search(r"<details><summary>[^<]*</summary><pre>(.*?)</pre></details>", gen[7], flags=re.S)
    rest = json.loads(unescape(more.group(1)))
    assert rest == {"source": "directory", "pipeline_class": "StableDiffusionPipeline",
                    "weight_files": {"unet/model.safetensors": "cd" * 32}}
    # no sha256 over all weights: each single-file hash is shown
    mesh = _cells(page, 1)
    assert mesh[6] == "real" and "11" * 6 in mesh[3] and "22" * 6 in mesh[3] and mesh[4] == "-"
    assert json.loads(unescape(re.search(r"<pre>(.*?)</pre>", mesh[7], flags=re.S).group(1))) == {
        "model": "mediapipe Face Mesh", "max_faces": 1}
    text = unescape(page)
    assert "{'" not in text and "': " not in text and "None" not in text  # no dict repr anywhere


def test_model_table_without_detail_and_escaping():
    page = H.model_table([{"role": "caption side <ner>", "model": "en_core_web_sm", "standin": False,
                           "detail": {"name": "x", "nan": float("nan"), "n": np.int64(3)}},
                          {"role": "r", "model": "m", "standin": True}])
    assert "caption side &lt;ner&gt;" in page and "<ner>" not in page
    assert json.loads(unescape(re.search(r"<pre>(.*?)</pre>", page, flags=re.S).group(1))) == {
        "name": "x", "nan": None, "n": 3}
    assert _cells(page, 1)[6] == "STAND-IN (random weights)" and _cells(page, 1)[7] == "-"
    rule_based = H.model_table([{"role": "paraphraser", "model": "standin-chat", "standin": True,
                                 "standin_kind": "rule-based"}])
    assert _cells(rule_based, 0)[6] == "STAND-IN (rule-based)" and _cells(rule_based, 0)[7] == "-"


def test_console_model_lines_name_the_kind_of_stand_in(capsys):
    from pipelines.engine.run.models import print_models

    print_models([{"role": "generator", "model": "sd", "standin": True},
                  {"role": "paraphraser", "model": "chat", "standin": True, "standin_kind": "rule-based"},
                  {"role": "sbert", "model": "minilm", "standin": False}])
    lines = capsys.readouterr().out.splitlines()
    assert "STAND-IN (random weights, meaningless outputs)" in lines[0]
    assert "STAND-IN (rule-based, meaningless outputs)" in lines[1] and "random" not in lines[1]
    assert " real " in lines[2]


def test_table_formats_numbers_missing_values_and_escapes():
    df = pd.DataFrame({"model": ["org/model-a", "<b>"], "x": [1.23456, np.nan], "n": [3, 4],
                       "s": [None, "a & b"]})
    page = H.table(df, 2)
    assert "<th>model</th><th>x</th><th>n</th><th>s</th>" in page
    assert "<td class=n>1.23</td>" in page and "<td class=n>n/a</td>" in page and "<td class=n>3</td>" in page
    assert "&lt;b&gt;" in page and "a &amp; b" in page and "<b>" not in page
    short = H.table(df, 3, na="-", text=H.short_path)
    assert "<td>model-a</td>" in short and "<td class=n>1.235</td>" in short and "<td class=n>-</td>" in short
    assert H.short_path("hf-org/name/") == "name" and H.short_path("plain") == "plain"


def test_tables_scroll_in_their_own_box_and_the_model_table_names_labels():
    df = pd.DataFrame({f"a rather long column name {i}": [1.0] for i in range(30)})
    page = H.table(df)
    assert page.startswith('<div class="tw"><table>') and page.endswith("</table></div>")
    assert "<th>a rather long column name 29</th>" in page          # headers whole, never cut
    assert ".tw{overflow-x:auto" in H.STYLE
    models = H.model_table([_generator()], {_generator()["model"]: "stable-diffusion-v1-4-standin"})
    assert models.startswith('<div class="tw"><table class="models">')
    cell = _cells(models, 0)[1]
    assert "/tmp/models/stable-diffusion-v1-4-standin</code>" in cell and "shown as <b>stable-diffusion-v1-4-standin" in cell
    assert "shown as" not in H.model_table([_generator()])           # no labels: the id alone
