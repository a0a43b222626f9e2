"""DALL-Eval's gender MAD and average gender from shares corrected by people: Rogan-Gladen per
prompt with the model's sensitivity and specificity, by hand, on a hand-made run."""

import json

import numpy as np
import pandas as pd
import pytest

from pipelines.annotate import cli
from pipelines.annotate.tasks import TaskSet


def _label(out, answers):
    items = TaskSet.load(out).items
    pd.DataFrame({"item_id": items["item_id"], "annotator": "expert",
                  "answer": [answers(r) for r in items.to_dict("records")]}).to_csv(out / "l.csv", index=False)
    assert cli.main(["import", str(out), str(out / "l.csv")]) == 0
    assert cli.main(["estimate", str(out), "--resamples", "100"]) == 0
    return items, pd.read_parquet(out / "estimate" / "gender_mad_corrected.parquet").set_index("model")


def test_gender_mad_from_corrected_shares(social_run, models, tmp_path):
    images = pd.read_parquet(social_run / "images.parquet")
    neutral = images[(images.group == "person") & images.detected_gender.isin(["female", "male"])]
    p_obs = neutral.groupby(["model", "prompt"]).detected_gender.apply(lambda g: (g == "female").mean())
    out = tmp_path / "agree"
    assert cli.main(["plan", str(social_run), "--protocol", "dalleval-social", "--output", str(out), "--n", "1000"]) == 0
    _, table = _label(out, lambda r: r["prediction"] or "unsure")
    for m in models:           # people agree with the detector: se = sp = 1, the run's own numbers
        row = table.loc[m]
        assert (row["sensitivity"], row["specificity"]) == (1.0, 1.0)
        assert row["corrected"] == pytest.approx(np.mean(np.abs(p_obs[m] - 0.5))) == pytest.approx(row["classifier"])
        assert row["corrected_average"] == pytest.approx(np.mean(2 * p_obs[m] - 1))
        assert row["corrected_low"] <= row["corrected"] <= row["corrected_high"]
    # people see a woman in every other image the detector called male, on the neutral and the "man" prompts
    out = tmp_path / "flip"
    assert cli.main(["plan", str(social_run), "--protocol", "dalleval-social", "--output", str(out), "--n", "1000"]) == 0
    items, table = _label(out, lambda r: "female" if r["prediction"] == "male" and int(r["image_id"][-1]) % 2 == 0
                          else (r["prediction"] or "unsure"))
    for m in models:
        mine = items[(items.model == m) & items.prediction.isin(["female", "male"])]
        truth = np.where((mine.prediction == "male") & (mine.image_id.str[-1].astype(int) % 2 == 0), "female",
                         mine.prediction)
        se = ((mine.prediction == "female") & (truth == "female")).sum() / (truth == "female").sum()
        sp = ((mine.prediction == "male") & (truth == "male")).sum() / (truth == "male").sum()
        p = np.clip((p_obs[m] + sp - 1) / (se + sp - 1), 0, 1)
        row = table.loc[m]
        assert (row["sensitivity"], row["specificity"]) == pytest.approx((se, sp)) and se < 1 == sp
        assert row["corrected"] == pytest.approx(np.mean(np.abs(p - 0.5)))
        assert row["corrected_average"] == pytest.approx(np.mean(2 * p - 1)) and row["corrected_average"] > row["classifier_average"]
        assert row["corrected_low"] < row["corrected_high"]
    record = json.loads((out / "estimate" / "estimates.json").read_text())
    assert len(record["gender_mad"]) == len(models)
    assert "Gender MAD and average gender from corrected shares" in (social_run / "report.html").read_text()


def test_no_labelled_image_of_one_class_gives_no_corrected_mad(social_run, tmp_path):
    out = tmp_path / "one"
    assert cli.main(["plan", str(social_run), "--protocol", "dalleval-social", "--output", str(out), "--n", "1000"]) == 0
    _, table = _label(out, lambda r: "female")
    assert table["corrected"].isna().all() and (table["flag"] != "").all()
