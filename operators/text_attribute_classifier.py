"""Cross-modal attribute classifiers (paper 001, section 4.2, Eqs. 6-7; settings of section 6).

For attribute a, a logistic regression is trained on CLIP *text* embeddings only: positives
"[g^] [a] [c^]" and negatives "[g^] [c^]" (g^ in {A man, A woman, A person}, c^ in C; 48 + 48
sentences with the paper's sets), with binary cross-entropy, by SGD (scikit-learn's
``SGDClassifier``: learning rate 1e-3, at most 5000 iterations, 10 % of the texts held out for early
stopping after 5 iterations without improvement; the paper does not give the schedule or the
tolerance: a constant rate and scikit-learn's default tolerance 1e-3 here, both configurable). Because CLIP aligns texts and images in one
space, the classifier then scores *image* embeddings: CLS-f_a is the mean probability over the
images (Eq. 7). Ten classifiers with different seeds form an ensemble whose probabilities are
averaged.

Training happens once per scorer; applying the ensemble is one matrix product over all images,
members and attributes (the fitted weights are kept as arrays, not as scikit-learn objects).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from operators.text_gep_prompts import Attribute, classifier_sentences

TABLE2_CONTEXTS = (  # paper 001, Table 2: C^ when a study has no contexts of its own (section 7)
    "sitting at a table", "sitting on a bed", "standing on a skateboard", "standing next to a rack", "riding a bike",
    "riding a horse", "laying on the snow", "laying on a couch", "walking through a forest", "walking down a sidewalk",
    "holding up a smartphone", "holding an umbrella", "jumping into the air", "jumping over a box",
    "running across the park", "running on the beach",
)


@dataclass
class ClassifierSettings:
    genders: list[str] = field(default_factory=lambda: ["A man", "A woman", "A person"])
    contexts: list[str] = field(default_factory=lambda: list(TABLE2_CONTEXTS))
    positive: str = "{gender} {attribute} {context}"
    negative: str = "{gender} {context}"
    ensemble: int = 10
    seed: int = 0
    learning_rate: float = 1e-3
    max_iter: int = 5000
    validation_fraction: float = 0.1
    n_iter_no_change: int = 5
    schedule: str = "constant"      # scikit-learn learning_rate: the rate above is eta0
    tol: float | None = 1e-3        # scikit-learn's stopping tolerance on the validation score

    def __post_init__(self):
        if self.ensemble < 1:
            raise ValueError(f"classifier ensemble must be >= 1, got {self.ensemble}")
        if not self.genders:
            raise ValueError("classifier genders (G^) must not be empty")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")


@dataclass
class Ensemble:
    """Fitted members of one attribute: weights (m, d), intercepts (m,) and what training saw."""

    attribute: str
    weights: np.ndarray
    intercepts: np.ndarray
    record: dict

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        """Mean member probability per row of (n, d) ``embeddings`` (float64)."""
        return _sigmoid(np.asarray(embeddings, np.float64) @ self.weights.T + self.intercepts).mean(axis=1)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


def fit_ensemble(x: np.ndarray, y: np.ndarray, st: ClassifierSettings, attribute: str = "") -> Ensemble:
    """Train ``st.ensemble`` logistic regressions by SGD on (x, y), seeds st.seed + k."""
    from sklearn.linear_model import SGDClassifier

    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.int64)
    if len(np.unique(y)) != 2:
        raise ValueError(f"classifier {attribute!r}: training texts need positives and negatives")
    weights, intercepts, iters, train_acc = [], [], [], []
    for k in range(st.ensemble):
        clf = SGDClassifier(loss="log_loss", learning_rate=st.schedule, eta0=st.learning_rate, max_iter=st.max_iter,
                            tol=st.tol, early_stopping=True, validation_fraction=st.validation_fraction,
                            n_iter_no_change=st.n_iter_no_change, random_state=st.seed + k)
        clf.fit(x, y)
        weights.append(clf.coef_[0].copy())
        intercepts.append(float(clf.intercept_[0]))
        iters.append(int(clf.n_iter_))
        train_acc.append(float(clf.score(x, y)))
    ens = Ensemble(attribute, np.stack(weights), np.asarray(intercepts), {})
    ens.record = {"attribute": attribute, "texts": int(len(y)), "positives": int(y.sum()),
                  "members": st.ensemble, "iterations": iters,
                  "train_accuracy_members": [round(a, 4) for a in train_acc],
                  "train_accuracy_ensemble": round(float(((ens.predict(x) >= 0.5) == (y == 1)).mean()), 4)}
    return ens


def train_attribute_classifiers(embed_texts: Callable[[list[str]], np.ndarray], attributes: list[Attribute],
                                st: ClassifierSettings) -> list[Ensemble]:
    """One ensemble per attribute, in order; ``embed_texts`` maps texts to L2-normalised CLIP text
    embeddings (n, d). All attributes' sentences are embedded in one call."""
    texts, labels, spans = [], [], []
    for a in attributes:
        t, y = classifier_sentences(a, st.genders, st.contexts, st.positive, st.negative)
        spans.append((len(texts), len(texts) + len(t)))
        texts += t
        labels += y
    emb = np.asarray(embed_texts(texts), np.float64)
    labels = np.asarray(labels)
    return [fit_ensemble(emb[s:e], labels[s:e], st, a.name) for a, (s, e) in zip(attributes, spans)]


def settings_record(st: ClassifierSettings) -> dict:
    try:
        sk = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        sk = None
    return asdict(st) | {"loss": "log_loss", "early_stopping": True, "scikit_learn_version": sk}
