"""Cross-modal classifiers (paper 001, section 4.2): trained on text embeddings only, applied to image
embeddings. Controlled embeddings with a known attribute direction, then a tiny real CLIP."""

import hashlib

import numpy as np
import pytest

from operators.metric_gep import roc_auc
from operators.text_attribute_classifier import (
    ClassifierSettings,
    fit_ensemble,
    train_attribute_classifiers,
)
from operators.text_gep_prompts import Attribute, classifier_sentences

D = 24
ATTRS = [Attribute("dress", "in a dress", "a dress"), Attribute("tie", "with a tie", "a tie")]


def synthetic_space(seed=0):
    """A toy CLIP: a sentence's embedding is a random base vector of its words, plus a fixed direction
    per attribute phrase it contains; an image 'with' an attribute shares that direction."""
    rng = np.random.default_rng(seed)
    directions = {a.phrase: 1.5 * rng.normal(size=D) / np.sqrt(D) for a in ATTRS}

    def base(text):
        r = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little"))
        return r.normal(size=D) / np.sqrt(D)

    def embed(texts):
        out = []
        for t in texts:
            v = base(" ".join(w for w in t.split() if w not in "in a dress with tie".split()))
            for phrase, d in directions.items():
                if phrase in t:
                    v = v + d
            out.append(v / np.linalg.norm(v))
        return np.stack(out)

    return embed, directions


def test_ensemble_separates_images_with_the_attribute_from_images_without():
    embed, directions = synthetic_space()
    st = ClassifierSettings(contexts=["riding a bike", "sitting at a table", "holding an umbrella", "running on the beach",
                                      "laying on a couch", "jumping over a box"], ensemble=5, tol=None, max_iter=200)
    ensembles = train_attribute_classifiers(embed, ATTRS, st)
    assert [e.attribute for e in ensembles] == ["dress", "tie"]
    rng = np.random.default_rng(7)
    for a, ens in zip(ATTRS, ensembles):
        assert ens.weights.shape == (5, D) and ens.record["texts"] == 36 and ens.record["positives"] == 18
        plain = rng.normal(size=(40, D)) / np.sqrt(D)
        with_attr = plain[:20] + directions[a.phrase]
        imgs = np.vstack([with_attr, plain[20:]])
        imgs /= np.linalg.norm(imgs, axis=1, keepdims=True)
        p = ens.predict(imgs)
        assert ((p >= 0) & (p <= 1)).all()
        labels = np.r_[np.ones(20), np.zeros(20)]
        assert roc_auc(labels, p) > 0.95, a.name
        assert p[:20].mean() > p[20:].mean() + 0.1


def test_members_differ_by_seed_and_training_is_reproducible():
    embed, _ = synthetic_space()
    st = ClassifierSettings(contexts=["riding a bike", "sitting at a table"], ensemble=3, max_iter=50, tol=None)
    texts, y = classifier_sentences(ATTRS[0], st.genders, st.contexts, st.positive, st.negative)
    x = embed(texts)
    a, b = fit_ensemble(x, y, st, "dress"), fit_ensemble(x, y, st, "dress")
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.allclose(a.weights[0], a.weights[1])      # seeds 0 and 1 differ
    c = fit_ensemble(x, y, ClassifierSettings(**{**st.__dict__, "seed": 5}), "dress")
    assert not np.allclose(a.weights, c.weights)
    one = fit_ensemble(x, y, ClassifierSettings(**{**st.__dict__, "ensemble": 1}), "dress")
    np.testing.assert_allclose(one.predict(x), 1 / (1 + np.exp(-(x @ one.weights[0] + one.intercepts[0]))), rtol=1e-9)


def test_bad_settings_and_one_class_training_are_errors():
    with pytest.raises(ValueError, match="ensemble"):
        ClassifierSettings(ensemble=0)
    with pytest.raises(ValueError, match="validation_fraction"):
        ClassifierSettings(validation_fraction=1.0)
    with pytest.raises(ValueError, match="positives and negatives"):
        fit_ensemble(np.zeros((4, 3)), [1, 1, 1, 1], ClassifierSettings(), "x")


def test_ensemble_on_text_embeddings_of_a_small_clip(tmp_path):
    """The production path: a tiny random open_clip embeds the 48 + 48 training sentences of the paper's
    sets (Table 2 contexts, G^ = A man / A woman / A person) and the paper's SGD settings fit them."""
    import torch

    from operators.image_clip_embedding import ClipImageEmbedder
    from pipelines.standins.clip import build_tiny_open_clip

    torch.set_num_threads(1)
    emb = ClipImageEmbedder(build_tiny_open_clip(tmp_path / "clip"), None, device="cpu")
    st = ClassifierSettings()
    ensembles = train_attribute_classifiers(emb.embed_texts, ATTRS, st)
    for a, ens in zip(ATTRS, ensembles):
        texts, y = classifier_sentences(a, st.genders, st.contexts, st.positive, st.negative)
        assert ens.record["texts"] == 96 and ens.record["members"] == 10
        assert all(1 <= n <= st.max_iter for n in ens.record["iterations"])
        p = ens.predict(emb.embed_texts(texts))
        assert roc_auc(np.asarray(y), p) > 0.6, a.name   # the texts it was trained on rank positives first
