"""C-f, CC-f and CLS-f per (image, attribute) (paper 001, section 4, Eqs. 4, 5, 7) on controlled
embeddings whose answers are known, and the neutral / explicit scoring rule of section 3."""

import numpy as np
import pyarrow as pa
import pytest

from operators.image_attribute_scores import AttributeScorer, estimator_scores
from operators.image_clip_embedding import embedding_array
from operators.support.attribute_classifier import Ensemble
from schemas.gep import GEP_SCORES

ATTRS = [{"name": "dress", "phrase": "in a dress", "text": "a dress"},
         {"name": "suit", "phrase": "in a suit", "text": "a suit"},
         {"name": "hat", "phrase": "in a hat", "text": "a hat"}]
D = 6


class AxisEmbedder:
    """Texts on fixed axes: "a dress" e0, "a suit" e1, "a hat" e2, "an object" e3; classifier training
    sentences get e4/e5 noise plus their attribute's axis, so the classifiers learn that axis."""

    record = {"model": "axis"}
    axes = {"a dress": 0, "a suit": 1, "a hat": 2, "an object": 3}

    def embed_texts(self, texts):
        out = np.zeros((len(texts), D))
        for i, t in enumerate(texts):
            if t in self.axes:
                out[i, self.axes[t]] = 1.0
                continue
            out[i, 4 + (len(t) % 2)] = 1.0
            for phrase, axis in (("dress", 0), ("suit", 1), ("hat", 2)):
                if phrase in t:
                    out[i, axis] = 2.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def scorer():
    return AttributeScorer(ATTRS, clip={"model": "unused"}, reference="an object",
                           classifier={"contexts": ["riding a bike", "sitting at a table", "holding an umbrella"],
                                       "ensemble": 3, "tol": None, "max_iter": 300}, embedder=AxisEmbedder())


def unit(*pairs):
    v = np.zeros(D)
    for axis, value in pairs:
        v[axis] = value
    return v / np.linalg.norm(v)


def test_estimators_on_known_vectors():
    e = np.array([unit((0, 1.0)), unit((0, 1.0), (3, 1.0))])
    texts = np.eye(D)[:3]
    ref = np.eye(D)[3]
    ens = [Ensemble(n, np.eye(D)[[i]] * 4.0, np.array([-2.0]), {}) for i, n in enumerate(["dress", "suit", "hat"])]
    s = estimator_scores(e, texts, ref, ens)
    np.testing.assert_allclose(s["c"][0], [1, 0, 0])                                 # Eq. 4: cosine to the attribute
    np.testing.assert_allclose(s["c"][1], [2 ** -0.5, 0, 0])
    np.testing.assert_allclose(s["cc"][1], [0, -(2 ** -0.5), -(2 ** -0.5)], atol=1e-12)  # Eq. 5: minus cos to r(a)
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    np.testing.assert_allclose(s["cls"][0], [sig(2.0), sig(-2.0), sig(-2.0)])      # Eq. 7: the classifier's probability


def images(rows):
    ids, settings, genders, attrs, vecs, valid = zip(*rows)
    return pa.table({"image_id": list(ids), "model": ["m"] * len(ids), "setting": list(settings),
                     "gender": list(genders), "attribute": pa.array(list(attrs), pa.string()),
                     "context_id": pa.array([0] * len(ids), pa.int32()),
                     "clip_embedding": embedding_array(np.stack(vecs).astype(np.float32), np.array(valid))})


def test_neutral_scores_every_attribute_explicit_only_the_named_one(scorer):
    batch = images([
        ("n-woman-0", "neutral", "woman", None, unit((0, 1.0)), True),
        ("x-man-suit-0", "explicit", "man", "suit", unit((1, 1.0)), True),
        ("x-woman-hat-0", "explicit", "woman", "hat", unit((4, 1.0)), True),
        ("n-man-blocked", "neutral", "man", None, unit((4, 1.0)), False),   # no image: no scores
    ])
    out = scorer(batch)
    assert out.schema.equals(GEP_SCORES)
    pairs = list(zip(out.column("image_id").to_pylist(), out.column("attribute").to_pylist()))
    assert pairs == [("n-woman-0", "dress"), ("n-woman-0", "suit"), ("n-woman-0", "hat"),
                     ("x-man-suit-0", "suit"), ("x-woman-hat-0", "hat")]
    c = out.column("c").to_pylist()
    np.testing.assert_allclose(c, [1, 0, 0, 1, 0], atol=1e-6)
    np.testing.assert_allclose(out.column("cc").to_pylist(), c, atol=1e-6)     # images orthogonal to "an object"
    cls = out.column("cls").to_pylist()
    assert cls[0] > cls[1] and cls[0] > cls[2]       # the dress image: the dress classifier is the most confident
    assert cls[3] > cls[4]                           # a suit image on suit vs an image without a hat on hat
    assert out.column("gender").to_pylist() == ["woman"] * 3 + ["man", "woman"]


def test_record_and_errors(scorer):
    rec = scorer.describe()
    assert [a["clip_text"] for a in rec["attributes"]] == ["a dress", "a suit", "a hat"]
    assert rec["reference"] == "an object" and len(rec["classifiers"]) == 3
    assert rec["classifier"]["ensemble"] == 3 and rec["classifier"]["scikit_learn_version"]
    bad = images([("x", "explicit", "man", "gloves", unit((1, 1.0)), True)])
    with pytest.raises(ValueError, match="gloves"):
        scorer(bad)
    with pytest.raises(ValueError, match="missing column"):
        scorer(pa.table({"image_id": ["a"]}))
    empty = images([("n", "neutral", "man", None, unit((1, 1.0)), False)])
    assert scorer(empty).num_rows == 0


def test_empty_reference_string_is_embedded_as_given():
    """CC-f with r(a) = "" (Table 8): the empty text is embedded, not replaced by a default."""
    s = AttributeScorer(ATTRS, clip={"model": "unused"}, reference="",
                        classifier={"contexts": ["riding a bike", "sitting at a table", "holding an umbrella"],
                                    "ensemble": 1, "tol": None, "max_iter": 300}, embedder=AxisEmbedder())
    assert s.reference == "" and s.record["reference"] == ""
    np.testing.assert_allclose(s.reference_vector, AxisEmbedder().embed_texts([""])[0])
