"""The GEP headline on small hand-made inputs, no Ray: per-unit values whose mean is the
reported number, units and strata, intervals beside the values in the tables, the summarize intervals."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from pipelines.engine.stats import headline as HL
from pipelines.engine.stats.intervals import IntervalSettings
from pipelines.studies.gep import headline as GH
from pipelines.studies.gep import metrics as M
from pipelines.studies.gep import report as R
from schemas import gep as S
from schemas.images import GENERATION_STATUS, MODEL
from schemas.subsets import PROMPT

FAST = IntervalSettings(resamples=200, seed=1)


def scored_images(model="m", images_per_prompt=3, seed=0):
    """Neutral images of two groups (two contexts, the man side one image short) scored on two
    attributes, and explicit images of one attribute; scores C, CC, CLS at random."""
    rng = np.random.default_rng(seed)
    images, scores = [], []
    for gender in ("woman", "man"):
        for ctx in (0, 1):
            for i in range(images_per_prompt - (gender == "man" and ctx == 1 and images_per_prompt > 2)):
                for setting, attrs in (("neutral", ["dress", "hat"]), ("explicit", ["dress"])):
                    iid = f"{setting}-{gender}-{'dress' if setting == 'explicit' else 'none'}-c{ctx:02d}-{i}"
                    prompt = f"A {gender}{' in a dress' if setting == 'explicit' else ''} c{ctx}."
                    images.append({MODEL: model, S.IMAGE_ID: iid, PROMPT: prompt, GENERATION_STATUS: "ok"})
                    for a in attrs:
                        scores.append({MODEL: model, S.IMAGE_ID: iid, S.SETTING: setting, S.GENDER: gender,
                                       S.ATTRIBUTE: a, **{c: float(rng.uniform()) for c in ("c", "cc", "cls")}})
    return pd.DataFrame(scores), pd.DataFrame(images)


def vectors_of(scores):
    """GEP vectors the way study.analyse computes them: mean score per group, then Eq. 2."""
    keys = [MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE]
    freq = pd.concat([scores.groupby(keys, sort=False)[col].mean().rename(S.FREQUENCY).reset_index()
                      .assign(**{S.ESTIMATOR: est}) for est, col in S.Estimator.COLUMNS.items()])
    return M.gep_vectors(freq)


def test_every_metric_mean_is_the_reported_number():
    scores, images = scored_images()
    vectors = vectors_of(scores)
    metrics = GH.model_metrics(GH.observations(scores, images), vectors, [("woman", "man")])["m"]
    by_key = {m.key: m for m in metrics}
    # 2 settings x 3 estimators: one score each, plus its vector's entries (2 neutral, 1 explicit)
    assert len(by_key) == len(metrics) == 3 * (1 + 2) + 3 * (1 + 1)
    for r in vectors.to_dict("records"):
        m = by_key[GH.vector_key(r[S.SETTING], r[S.ESTIMATOR], "woman - man", r[S.ATTRIBUTE])]
        assert np.mean(m.values) == pytest.approx(r[M.DIFFERENCE], abs=1e-12)
        assert m.unit == "image" and m.better == "zero"
    for r in M.gep_scores(vectors).to_dict("records"):
        m = by_key[GH.score_key(r[S.SETTING], r[S.ESTIMATOR], r[M.COMPARISON])]
        assert np.mean(m.values) == pytest.approx(r[M.GEP], abs=1e-12)
        assert m.unit == "attribute" and m.better == "lower" and m.units == ["dress", "hat"][:r[M.ATTRIBUTES]]


def test_vector_units_are_images_resampled_within_prompts():
    scores, images = scored_images()
    obs = GH.observations(scores, images)
    cell = obs[(obs[S.SETTING] == "neutral") & (obs[S.ESTIMATOR] == "CLS") & (obs[S.ATTRIBUTE] == "hat")]
    m = GH.vector_metric(cell, "woman", "man", "neutral", "CLS", "woman - man", "hat")
    assert m.units == cell[S.IMAGE_ID].tolist() and len(set(m.units)) == 3 + 3 + 3 + 2
    assert m.strata == cell[PROMPT].tolist() and len(set(m.strata)) == 4
    # each group's images resampled within their prompts: the group sizes stay, the mean is f_woman - f_man
    ci = m.interval(FAST)
    f = cell.groupby(S.GENDER)[S.SCORE].mean()
    assert ci.value == pytest.approx(f["woman"] - f["man"]) and ci.low < ci.value < ci.high


def test_one_image_per_prompt_resamples_within_the_group():
    scores, images = scored_images(images_per_prompt=1)
    obs = GH.observations(scores, images)
    cell = obs[(obs[S.SETTING] == "explicit") & (obs[S.ESTIMATOR] == "C")]
    m = GH.vector_metric(cell, "woman", "man", "explicit", "C", "woman - man", "dress")
    assert m.strata == cell[S.GENDER].tolist()
    ci = m.interval(FAST)
    assert ci.low < ci.high                     # one image per stratum would give no spread at all


def test_human_labels_join_as_the_estimator_human():
    scores, images = scored_images()
    labels = scores[[MODEL, S.IMAGE_ID, S.SETTING, S.GENDER, S.ATTRIBUTE]].assign(
        **{S.PRESENT: (scores[S.GENDER] == "woman").astype(int)})
    obs = GH.human_observations(labels, images)
    assert set(obs[S.ESTIMATOR]) == {"human"} and obs[PROMPT].notna().all()
    hf = labels.groupby([MODEL, S.SETTING, S.GENDER, S.ATTRIBUTE])[S.PRESENT].mean().rename(S.FREQUENCY)
    vec = M.gep_vectors(hf.reset_index().assign(**{S.ESTIMATOR: "human"}))
    metrics = GH.model_metrics(obs, vec, [("woman", "man")])["m"]
    gep = next(m for m in metrics if m.key == GH.score_key("neutral", "human", "woman - man"))
    assert np.mean(gep.values) == 1.0 and gep.scale == 100


def test_subjects_identity_images_and_exclusions():
    scores, images = scored_images()
    images.loc[0, GENERATION_STATUS] = "nsfw_blocked"
    record = {"role": "generator", "model": "m", "detail": {"weights_sha256": "abc", "spec": {"steps": 2}}}
    [subject] = GH.subjects({"m": []}, ["m"], [{"role": "CLIP", "model": "m"}, record], images)
    assert subject.identity == HL.subject_identity(record) and subject.name == "m"
    assert subject.images == len(images) - 1 and subject.excluded == {"nsfw_blocked": 1}


def test_intervals_beside_values_in_frames_and_tables():
    scores, images = scored_images()
    vectors = vectors_of(scores)
    gep = M.gep_scores(vectors)
    metrics = GH.model_metrics(GH.observations(scores, images), vectors, [("woman", "man")])
    head = HL.summarize("paper001-gep", GH.subjects(metrics, ["m"], [], images), {}, FAST, True)
    v, g = GH.attach(vectors, head, M.DIFFERENCE), GH.attach(gep, head, M.GEP)
    cols = list(v.columns)
    assert cols[cols.index(M.DIFFERENCE) + 1:][:2] == ["difference_low", "difference_high"]
    assert (v["difference_low"] <= v[M.DIFFERENCE]).all() and (v[M.DIFFERENCE] <= v["difference_high"]).all()
    one = g[M.ATTRIBUTES] == 1                  # the explicit vectors here: one attribute, no interval
    assert g.loc[one, "gep_low"].isna().all() and g.loc[one, "gep_high"].isna().all()
    rest = g[~one]
    assert (rest["gep_low"] <= rest[M.GEP]).all() and (rest[M.GEP] <= rest["gep_high"]).all()
    wide = R.score_table(g)
    assert list(wide.columns) == [MODEL, M.COMPARISON, S.ESTIMATOR, "neutral", "neutral_low", "neutral_high",
                                  "explicit", "explicit_low", "explicit_high"]
    row = wide[wide[S.ESTIMATOR] == "CC"].iloc[0]
    cell = g[(g[S.ESTIMATOR] == "CC") & (g[S.SETTING] == "neutral")].iloc[0]
    assert (row["neutral"], row["neutral_low"], row["neutral_high"]) == (cell[M.GEP], cell["gep_low"],
                                                                        cell["gep_high"])
    assert np.isnan(row["explicit_low"]) and not np.isnan(row["explicit"])
    table = R.vector_table(v, g, "neutral", ["dress", "hat"])
    assert list(table.columns)[3:] == ["dress", "dress_low", "dress_high", "hat", "hat_low", "hat_high",
                                       "gep", "gep_low", "gep_high"]
    text = R.text_intervals(table)
    assert list(text.columns)[3:] == ["dress", "hat", "gep"] and text["gep"].str.match(r"^\d\.\d{3} \[").all()
    printed = R.format_scores({"gep": g}, level=0.95)
    assert "95% interval" in printed and f"{cell[M.GEP]:.4f} [{cell['gep_low']:.4f}, {cell['gep_high']:.4f}]" in printed
    only = GH.scores_only(head)
    assert {m["key"].split("/")[0] for s in only["subjects"] for m in s["metrics"]} == {"gep"}


def test_summarize_intervals_over_published_attributes():
    freq = pd.DataFrame([{MODEL: "M", S.SETTING: "neutral", S.GENDER: g, S.ATTRIBUTE: a, S.FREQUENCY: f}
                         for g, fs in (("woman", [0.5, 0.1, 0.0, 0.3]), ("man", [0.1, 0.3, 0.0, 0.3]))
                         for a, f in zip("abcd", fs)])
    out = GH.summary_intervals(M.summarize_frequencies(freq), FAST)
    [r] = out["results"]
    assert r["gep_low"] <= r["gep"] <= r["gep_high"] and r["gep_low"] < r["gep_high"]
    assert out["interval"]["unit"] == "attribute" and out["interval"]["resamples"] == 200
    assert "[0." in M.format_summary(out).splitlines()[2]
    csv = R.summary_table(out)
    assert list(csv.columns)[4:7] == ["gep", "gep_low", "gep_high"]


def test_protocol_names_the_study_not_the_generator():
    from pipelines.gep import build_parser
    from pipelines.studies.gep import study as gep_study

    def protocol(*extra):
        args = build_parser().parse_args(["run", "--output", "unused", "--max-contexts", "2", *extra])
        st = gep_study.settings(args)
        return GH.protocol(dataclasses.replace(st, requests=gep_study.requests_of(st)))

    base = protocol()
    assert base == protocol("--generators", "some/other-model")
    assert base != protocol("--images-per-prompt", "3") and base != protocol("--reference", "clothes")
    assert base != protocol("--attributes", "dress,suit")
    assert {"study", "prompts", "images_per_prompt", "seed", "clip", "reference", "classifier",
            "attributes", "contexts"} <= set(base)


def test_image_replicates_resample_images_jointly_across_attributes(monkeypatch):
    """One resample of the images serves every attribute: the first row of counts all ones gives
    the observed |v_j|; the second (one image twice, one left out) the hand-weighted frequencies."""
    scores, images = scored_images()
    obs = GH.observations(scores, images)
    neutral = obs[(obs[S.SETTING] == "neutral") & (obs[S.ESTIMATOR] == S.Estimator.C)]
    ids = sorted(set(neutral[S.IMAGE_ID]))
    weights = np.ones(len(ids))
    weights[ids.index("neutral-woman-none-c00-0")] = 2.0
    weights[ids.index("neutral-woman-none-c00-1")] = 0.0
    monkeypatch.setattr(GH.iv, "resample_counts", lambda rng, n, strata: np.vstack([np.ones(len(ids)), weights]))
    reps = GH.image_replicates(neutral, "woman", "man", ["dress", "hat"], resamples=2)
    vectors = vectors_of(scores)
    observed = vectors[(vectors[S.SETTING] == "neutral") & (vectors[S.ESTIMATOR] == S.Estimator.C)].set_index(S.ATTRIBUTE)
    assert reps[0] == pytest.approx(np.abs(observed.loc[["dress", "hat"], M.DIFFERENCE].to_numpy()), abs=1e-12)
    w = dict(zip(ids, weights))
    for j, attribute in enumerate(["dress", "hat"]):
        cell = neutral[neutral[S.ATTRIBUTE] == attribute]
        f = {g: np.average(part[S.SCORE], weights=[w[i] for i in part[S.IMAGE_ID]]) for g, part in cell.groupby(S.GENDER)}
        assert reps[1, j] == pytest.approx(abs(f["woman"] - f["man"]), abs=1e-12)


def _simulated_run(rng, p_woman, p_man, images=16, shared=2.5):
    """A generator's neutral images of two groups scored on every attribute: each image's scores
    share its own latent (a photo that looks "dressy" scores high on every attribute), so image
    noise is shared across the attributes, as in GEP's neutral setting."""
    rows = []
    for gender, p in (("woman", p_woman), ("man", p_man)):
        for i in range(images):
            latent = rng.normal(0, shared)
            logits = np.log(p / (1 - p)) + latent
            for j, score in enumerate(1 / (1 + np.exp(-logits))):
                rows.append({S.IMAGE_ID: f"{gender}-{i}", PROMPT: f"A {gender} c{i % 4}.", S.GENDER: gender,
                             S.ATTRIBUTE: f"a{j}", S.SCORE: float(rng.uniform() < score)})
    obs = pd.DataFrame(rows)
    f = obs.groupby([S.GENDER, S.ATTRIBUTE])[S.SCORE].mean().unstack()
    attrs = [f"a{j}" for j in range(len(p_woman))]
    values = np.abs(f.loc["woman", attrs] - f.loc["man", attrs]).to_numpy()
    return values, GH.image_replicates(obs, "woman", "man", attrs, resamples=200, seed=int(rng.integers(1 << 30)))


def test_a_a_two_runs_of_one_generator_are_apart_at_most_at_the_stated_rate():
    """150 pairs of runs of the same generator, other seeds: the two-level test calls them
    distinguishable at about 5% (at most 0.09 here); the units-only test, which takes each attribute's
    value as exact while the images' noise is shared across attributes, far more often."""
    from pipelines.engine.stats import intervals as iv

    rng = np.random.default_rng(5)
    p_woman = rng.uniform(0.2, 0.8, 15)
    p_man = np.clip(p_woman + rng.normal(0, 0.1, 15), 0.05, 0.95)
    settings = IntervalSettings(resamples=1000, seed=3, method="percentile")
    two, units = 0, 0
    reps = 150
    for _ in range(reps):
        (a, ra), (b, rb) = _simulated_run(rng, p_woman, p_man), _simulated_run(rng, p_woman, p_man)
        two += iv.two_level_test(ra, rb, a, b, True, settings)["p_value"] < 0.05
        units += iv.paired_test(a, b, settings)["p_value"] < 0.05
    assert two / reps <= 0.09, two / reps
    assert units / reps >= 2 * max(two / reps, 0.05), (units / reps, two / reps)
