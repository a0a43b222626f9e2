"""Amplification math against paper 002's own tables (Tables 3, 6, 7; App. A.1)."""

from helpers import TESTS_DATA

import numpy as np
import pandas as pd
import pytest

from pipelines.studies.amplification.metrics import (
    AMPLIFICATION,
    EXCLUDED,
    amplification,
    compare,
    direction,
    expected_amplification,
    female_indicator_share,
    pearson,
    percent_female,
    summarize_percentages,
)
from schemas.captions import CAPTION_GENDER, OCCUPATION
from schemas.images import COUNTED, GENDER, PERCENT_FEMALE

DATA = TESTS_DATA
# Table 3, naive approach, prompts #1-#4 and the average
TABLE3_NAIVE = {"SD 1.4": ([10.24, 17.57, 10.77, 11.68], 12.57), "SD 1.5": ([10.87, 16.36, 11.15, 9.91], 12.07)}


def test_formula_and_direction():
    # A = |G-50| - |T-50|: further from balance amplifies, closer de-amplifies
    assert amplification(10, 25) == pytest.approx(15.0)
    assert amplification(30, 10) == pytest.approx(-20.0)
    assert amplification(90, 80) == pytest.approx(10.0)
    assert list(direction([10, 50, 90])) == [-1, 0, 1]


def test_table6_reproduces_table3_naive_sd14():
    res = summarize_percentages(pd.read_csv(DATA / "paper002_table6.csv"))["all"]
    got = [r["expected_amplification"] for r in res["per_prompt"]]
    assert [r["group"] for r in res["per_prompt"]] == ["#1", "#2", "#3", "#4"]
    assert [round(v, 2) for v in got] == TABLE3_NAIVE["SD 1.4"][0]
    # the paper averages the rounded per-prompt values: (10.24+17.57+10.77+11.68)/4 = 12.565 -> 12.57
    assert res["average"] == pytest.approx(np.mean(got))
    assert abs(res["average"] - TABLE3_NAIVE["SD 1.4"][1]) <= 0.01
    # the paper rejects E[A] = 0 for the naive approach on every prompt
    assert all(r["p_value"] < 0.05 and r["t_statistic"] > 0 for r in res["per_prompt"])


def test_table7_reproduces_table3_naive_sd15_within_rounding():
    res = summarize_percentages(pd.read_csv(DATA / "paper002_table7.csv"))["all"]
    got = [r["expected_amplification"] for r in res["per_prompt"]]
    # Table 7 prints percentages to 0.1, so E[A] can differ from Table 3 in the second decimal
    assert got == pytest.approx(TABLE3_NAIVE["SD 1.5"][0], abs=0.015)
    assert res["average"] == pytest.approx(TABLE3_NAIVE["SD 1.5"][1], abs=0.01)


def test_exactly_50_counts_as_a_switch():
    # Table 7: athlete is 44.8 in training and exactly 50.0 for prompt #3; treating 50 as "either
    # side" would give E[A] = 10.78 for that prompt instead of Table 3's 11.15
    res = summarize_percentages(pd.read_csv(DATA / "paper002_table7.csv"))["all"]
    p3 = next(r for r in res["per_prompt"] if r["group"] == "#3")
    assert "athlete" in p3["excluded"]["direction_switch"]


def test_switching_occupations_of_appendix_a1():
    # "5 occupations (assistant, author, dentist, painter, supervisor) exhibit switching behavior
    # consistently for all prompts, using both SD 1.4 and 1.5"
    sets = []
    for t in (6, 7):
        for r in summarize_percentages(pd.read_csv(DATA / f"paper002_table{t}.csv"))["all"]["per_prompt"]:
            sets.append(set(r["excluded"]["direction_switch"]))
    assert sorted(set.intersection(*sets)) == ["assistant", "author", "dentist", "painter", "supervisor"]


def test_models_in_one_csv_and_missing_pairs_are_listed():
    a = pd.read_csv(DATA / "paper002_table6.csv").assign(model="SD 1.4")
    b = pd.read_csv(DATA / "paper002_table7.csv").assign(model="SD 1.5")
    b = b[~((b.occupation == "nurse") & (b.group == "#2"))]  # drop one pair
    res = summarize_percentages(pd.concat([a, b]))
    assert set(res) == {"SD 1.4", "SD 1.5"}
    p2 = next(r for r in res["SD 1.5"]["per_prompt"] if r["group"] == "#2")
    assert p2["excluded"]["no_generated_images"] == ["nurse"]
    assert round(res["SD 1.4"]["per_prompt"][0]["expected_amplification"], 2) == 10.24


@pytest.mark.parametrize("bad", [
    pd.DataFrame({"occupation": ["a"], "percent_female": [1.0]}),                       # no group column
    pd.DataFrame({"occupation": ["a", "a"], "group": ["training", "#1"], "percent_female": [10, 140]}),
    pd.DataFrame({"occupation": ["a", "a"], "group": ["#1", "#2"], "percent_female": [10, 20]}),   # no training
    pd.DataFrame({"occupation": ["a", "a", "a"], "group": ["training", "#1", "#1"], "percent_female": [10, 20, 30]}),
])
def test_bad_csv_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        summarize_percentages(bad)


def test_per_prompt_training_subsets_join_on_prompt():
    # NN subsets are selected per prompt, so T depends on the prompt too
    training = pd.DataFrame({OCCUPATION: ["nurse", "nurse"], "prompt_id": [1, 2], PERCENT_FEMALE: [80.0, 60.0]})
    generated = pd.DataFrame({OCCUPATION: ["nurse", "nurse"], "prompt_id": [1, 2], PERCENT_FEMALE: [90.0, 40.0]})
    rows = compare(training, generated, [OCCUPATION, "prompt_id"], "prompt_id")
    assert rows[AMPLIFICATION].iloc[0] == pytest.approx(10.0)
    assert rows[EXCLUDED].iloc[1] == "direction_switch"
    res, avg = expected_amplification(rows, "prompt_id")
    assert avg == pytest.approx(10.0) and res[1].expected_amplification is None


def test_percent_female_counts_only_counted_images():
    images = pd.DataFrame({
        OCCUPATION: ["a"] * 5 + ["b"] * 2,
        GENDER: ["female", "female", "male", "female", "ambiguous", "male", None],
        COUNTED: [True, True, True, False, False, False, False],
    })
    out = percent_female(images, [OCCUPATION]).set_index(OCCUPATION)
    assert out.loc["a", "n_images"] == 3 and out.loc["a", PERCENT_FEMALE] == pytest.approx(200 / 3)
    assert out.loc["b", "n_images"] == 0 and np.isnan(out.loc["b", PERCENT_FEMALE])


def test_pearson_and_indicator_share():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 100, 40)
    r = pearson(x, -x + rng.normal(0, 5, 40))
    assert r["r"] < -0.9 and r["p_value"] < 1e-6 and r["n"] == 40
    assert pearson([1, 2], [2, 3])["r"] is None
    caps = pd.DataFrame({OCCUPATION: ["a"] * 4, CAPTION_GENDER: ["female", "both", "male", "none"]})
    assert female_indicator_share(caps).iloc[0, 1] == pytest.approx(50.0)


def test_image_similarity_is_the_mean_pairwise_cosine_naive_and_nn():
    """Section 5.2 (+13%): the mean cosine over all (training image, generated image) pairs of an
    occupation and prompt, for the naive subset and the prompt's NN subset; images without an
    embedding (no single face: CLIP did not run) left out."""
    from pipelines.studies.amplification.metrics import image_similarity

    rng = np.random.default_rng(0)

    def unit(n):
        v = rng.normal(size=(n, 8))
        return list(v / np.linalg.norm(v, axis=1, keepdims=True))

    naive, nn1, gen1, gen2 = unit(5), unit(4), unit(6), unit(3)
    training = pd.DataFrame(
        [{"occupation": "nurse", "subset": "naive", "prompt_id": None, "clip_embedding": v} for v in naive]
        + [{"occupation": "nurse", "subset": "naive", "prompt_id": None, "clip_embedding": None}]
        + [{"occupation": "nurse", "subset": "nn", "prompt_id": 1, "clip_embedding": v} for v in nn1])
    generated = pd.DataFrame(
        [{"model": "m", "occupation": "nurse", "prompt_id": 1, "clip_embedding": v} for v in gen1]
        + [{"model": "m", "occupation": "nurse", "prompt_id": 2, "clip_embedding": v} for v in gen2])
    res = image_similarity(training, generated)
    rows = {r["prompt_id"]: r for r in res["rows"]}
    brute = lambda a, b: float(np.mean([x @ y for x in a for y in b]))  # noqa: E731
    assert rows[1]["naive"] == pytest.approx(brute(naive, gen1)) and rows[1]["nn"] == pytest.approx(brute(nn1, gen1))
    assert rows[2]["naive"] == pytest.approx(brute(naive, gen2)) and rows[2]["nn"] is None   # no NN subset for #2
    assert (rows[1]["n_training_naive"], rows[1]["n_training_nn"], rows[1]["n_generated"]) == (5, 4, 6)
    m = res["per_model"]["m"]
    assert m["pairs"] == 1 and m["nn"] == pytest.approx(rows[1]["nn"]) and m["naive"] == pytest.approx(rows[1]["naive"])
    assert m["nn_change_percent"] == pytest.approx(100 * (m["nn"] - m["naive"]) / abs(m["naive"]))
    assert image_similarity(training.iloc[:0], generated.iloc[:0])["per_model"] == {}
