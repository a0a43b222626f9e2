"""Throughput of the GEP estimators (paper 001, section 4) on stored CLIP embeddings.

Scores N image embeddings (ViT-L/14 width 768 by default) on the 15 attributes of Table 1 with
C-f, CC-f and CLS-f (ensembles of 10), as ``AttributeScorer`` does: one matrix product per
estimator over all images, attributes and ensemble members. Baseline: the same numbers from a
Python loop over images and attributes calling each classifier member's ``predict_proba`` (what a
direct scikit-learn implementation does). The classifiers are trained once on synthetic text
embeddings (training time is printed separately); both paths are checked to agree.

    python benchmarks/bench_gep_scoring.py --images 2560 --baseline-images 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.image_attribute_scores import estimator_scores  # noqa: E402
from operators.support.attribute_classifier import (  # noqa: E402
    ClassifierSettings,
    train_attribute_classifiers,
)
from pipelines.studies.gep.prompts import parse_attributes  # noqa: E402
from pipelines.engine.cli.config import load_config  # noqa: E402


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=2560)
    p.add_argument("--baseline-images", type=int, default=256)
    p.add_argument("--dim", type=int, default=768)
    a = p.parse_args()
    cfg = load_config(preset="gep.yaml")
    attrs = parse_attributes(cfg["attributes"])
    rng = np.random.default_rng(0)
    vocab: dict[str, np.ndarray] = {}

    def embed(texts):  # a toy text encoder: sum of per-word random vectors
        out = []
        for t in texts:
            v = sum(vocab.setdefault(w, rng.normal(size=a.dim)) for w in t.lower().split())
            out.append(v)
        return unit(np.stack(out))

    st = ClassifierSettings(contexts=cfg["contexts"])
    t0 = time.perf_counter()
    ensembles = train_attribute_classifiers(embed, attrs, st)
    train_s = time.perf_counter() - t0
    text = embed([x.text for x in attrs])
    ref = embed(["an object"])[0]
    images = unit(rng.normal(size=(a.images, a.dim))).astype(np.float32)

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fast = estimator_scores(images, text, ref, ensembles)
        best = min(best, time.perf_counter() - t0)

    # baseline: per image, per attribute, per member, scikit-learn-style probability
    from sklearn.linear_model import SGDClassifier  # deferred: sklearn

    members = []
    for ens in ensembles:
        row = []
        for w, b in zip(ens.weights, ens.intercepts):
            clf = SGDClassifier(loss="log_loss")
            clf.coef_, clf.intercept_, clf.classes_ = w[None, :], np.array([b]), np.array([0, 1])
            row.append(clf)
        members.append(row)
    n = min(a.baseline_images, a.images)
    t0 = time.perf_counter()
    slow = np.zeros((n, len(attrs)))
    for i in range(n):
        e = images[i].astype(np.float64)
        for j in range(len(attrs)):
            _ = float(e @ text[j]), float(e @ text[j] - e @ ref)
            slow[i, j] = np.mean([m.predict_proba(e[None, :])[0, 1] for m in members[j]])
    slow_s = time.perf_counter() - t0
    np.testing.assert_allclose(slow, fast["cls"][:n], rtol=1e-6, atol=1e-9)

    fast_rate = a.images / best
    slow_rate = n / slow_s
    print(f"classifier training: {len(attrs)} attributes x {st.ensemble} members on 96 texts each: {train_s:.2f} s")
    print(f"{'path':<48} {'images/s':>12} {'image-attribute scores/s':>26}")
    print(f"{'vectorised (AttributeScorer)':<48} {fast_rate:>12,.0f} {fast_rate * len(attrs) * 3:>26,.0f}")
    print(f"{'baseline: loop x predict_proba per member':<48} {slow_rate:>12,.1f} {slow_rate * len(attrs) * 3:>26,.0f}")
    print(f"speed-up {fast_rate / slow_rate:,.0f}x; CLS agrees to 1e-6 on {n} images")


if __name__ == "__main__":
    main()
