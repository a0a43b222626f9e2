"""Paper 002's E[A] from % female corrected by people (``pipelines/annotate/derived.py``): the
vectorised resamples equal the one-at-a-time estimator, the study's ``compute`` carries each
percentage's resamples into its rows, and the propagated interval covers the true E[A] at its
nominal rate over 500 simulated datasets where the classifier's own interval does not."""

import numpy as np
import pandas as pd
import pytest

from pipelines.annotate import derived as D
from pipelines.engine.stats import correction as K
from pipelines.engine.stats import intervals as I
from pipelines.studies.amplification import metrics as AM
from schemas import images as IM
from schemas.subsets import PROMPT_ID


@pytest.mark.parametrize("variant", K.VARIANTS)
def test_vectorised_values_are_the_estimator_row_by_row(variant):
    rng = np.random.default_rng(1)
    for n, N in ((7, 30), (40, 300), (2, 5), (6, 0)):
        d = (rng.random((5, n)) < 0.8).astype(float)
        y = (rng.random((5, n)) < 0.4) * d
        f, fu = (rng.random((5, n)) < 0.5).astype(float), (rng.random((5, N)) < 0.5).astype(float)
        one = [K.ppi_proportion(y[i], f[i], fu[i], d[i], variant=variant)["value"] for i in range(5)]
        assert K.ppi_values(y, d, f, fu, variant) == pytest.approx([np.nan if v is None else v for v in one],
                                                                   abs=1e-12, nan_ok=True)


# ten occupations: true % female in the training images (tau) and the generated ones (gamma), all far
# from 50 (no direction switch in the truth); eight amplify, two de-amplify
TAU = np.array([12, 20, 28, 33, 35, 65, 68, 72, 80, 88.0])
GAMMA = np.where(TAU < 50, TAU - 7, TAU + 5)
GAMMA[[3, 7]] = [35.0, 65.0]
TRUE_EA = float(np.mean(np.abs(GAMMA - 50) - np.abs(TAU - 50)))


def _dataset(rng, n_training=150, n_generated=100, labelled=0.2, undecided=0.1):
    """One run's counted images: the classifier misses 20-30% of the women in training photos and
    5% in generated ones (the easier, photo-real case), and calls 2-5% of the men women; people
    label a random 20% and cannot decide 10% of those."""
    cols = {k: [] for k in (IM.SOURCE, "occupation", IM.GENDER, D.VERDICT)}
    for o in range(len(TAU)):
        for source, n, share, miss, false in (("training", n_training, TAU[o], 0.20 + 0.05 * (o % 3), 0.05),
                                              ("generated", n_generated, GAMMA[o], 0.05, 0.02 + 0.02 * (o % 2))):
            female = rng.random(n) < share / 100
            said = np.where(female, rng.random(n) >= miss, rng.random(n) < false)
            verdict = np.where(rng.random(n) >= labelled, None,
                               np.where(rng.random(n) < undecided, "undecided", np.where(female, "female", "male")))
            cols[IM.SOURCE] += [source] * n
            cols["occupation"] += [f"o{o}"] * n
            cols[IM.GENDER] += list(np.where(said, "female", "male"))
            cols[D.VERDICT] += list(verdict)
    df = pd.DataFrame(cols).assign(**{IM.COUNTED: True, PROMPT_ID: 1})
    return df[df[IM.SOURCE] == "training"], df[df[IM.SOURCE] == "generated"].assign(**{IM.MODEL: "m"})


def _rows(percent, training, generated):
    """Paper 002's naive approach, one prompt, as ``results.compute`` joins it."""
    g = percent(generated, [IM.MODEL, "occupation", PROMPT_ID]).drop(columns=[IM.MODEL])
    return AM.compare(percent(training, ["occupation"]), g, ["occupation"], PROMPT_ID)


@pytest.mark.slow          # 500 datasets: about 20 s
def test_corrected_e_a_covers_the_true_e_a_where_the_classifier_s_does_not():
    """500 datasets of the same ten occupations: the classifier's different errors on training and
    generated images make E[A] look larger than it is; its interval (the study's image resamples)
    covers the truth in about two thirds of the first 100, the corrected one at 93-97%."""
    rng = np.random.default_rng(3)
    reps, resamples = 500, 200
    covered, raw_covered, errors = 0, 0, []
    for k in range(reps):
        training, generated = _dataset(rng)
        draws = []
        rows = _rows(D.corrected_percent(resamples=resamples, rng=rng, draws=draws), training, generated)
        values, weights = AM.average_over_groups(AM.occupation_amplification(rows, PROMPT_ID))
        value = float(np.nansum(values * weights) / weights[np.isfinite(values)].sum())
        lo, hi = I.normal_ends(value, D.resampled_averages(rows, PROMPT_ID, np.column_stack(draws)), 0.95,
                               resamples)
        covered += lo <= TRUE_EA <= hi
        errors.append(value - TRUE_EA)
        if k < 100:
            raw = _rows(AM.percent_female, training, generated)
            cube = AM.resampled_amplification(raw, PROMPT_ID, AM.occupation_amplification(raw, PROMPT_ID), False,
                                              resamples, k)
            v, w = AM.average_over_groups_per_resample(cube)
            keep = np.isfinite(v)
            ea = np.where(keep, v * w, 0).sum(axis=1) / np.where(keep, w, 0).sum(axis=1)
            lo, hi = I.percentile_ends(ea, 0.95, resamples)
            raw_covered += lo <= TRUE_EA <= hi
    assert 0.93 <= covered / reps <= 0.97, covered / reps
    assert raw_covered / 100 <= 0.8, raw_covered
    assert abs(np.mean(errors)) < 0.15 * np.std(errors)       # unbiased, as the cross-fitted lambda makes it


def test_compute_carries_each_percentage_s_resamples_into_its_rows():
    """On the study's hand-made table (test_report.py): people who agree with the classifier on
    every image give back the study's E[A] for every approach, each with an interval around it."""
    from tests.studies.amplification.test_report import OCCS, _table

    images = _table()
    images[D.VERDICT] = images[IM.GENDER].where(images[IM.COUNTED], None)
    table = D.corrected_amplification(images, OCCS, 2, ["m"], resamples=50)
    from pipelines.studies.amplification import results

    own = results.compute(_table(), OCCS, 2, ["m"])
    for r in table.to_dict("records"):
        if r["approach"].startswith("section 6: "):
            want = own["caption_prompts"]["m"][r["approach"][len("section 6: "):]]["average"]
        else:
            want = own["approaches"]["m"][r["approach"]]["average"]
        assert r["classifier"] == pytest.approx(want) and r["corrected"] == pytest.approx(want)
        assert r["corrected_low"] <= r["corrected"] <= r["corrected_high"]
