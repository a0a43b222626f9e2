"""Cross-modal attribute classifiers (paper 001, section 4.2, Eqs. 6-7; settings of section 6).

For attribute a, a logistic regression is trained on CLIP *text* embeddings only: positives
"[g^] [a] [c^]" and negatives "[g^] [c^]" (g^ in {A man, A woman, A person}, c^ in C; 48 + 48
sentences with the paper's sets), with binary cross-entropy, by SGD (scikit-learn's
``SGDClassifier``: learning rate 1e-3, at most 5000 iterations, 10 % of the texts held out for early
stopping after 5 iterations without improvement; the paper gives neither the schedule nor the
tolerance: ``SGD_READINGS`` names the readings, see there). Because CLIP aligns texts and images in one
space, the classifier then scores *image* embeddings: CLS-f_a is the mean probability over the
images (Eq. 7). Ten classifiers with different seeds form an ensemble whose probabilities are
averaged.

Training happens once per scorer; applying the ensemble is one matrix product over all images,
members and attributes (the fitted weights are kept as arrays, not as scikit-learn objects).
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from schemas.gep import Attribute, clean_text

def render(template: str, gender: str, attribute: str = "", context: str = "") -> str:
    """Fill a template; runs of spaces collapse and a space before final punctuation goes, so
    "{gender} {context}." with no context gives "A photo of a lawyer."."""
    for key in re.findall(r"{(\w*)}", template):
        if key not in ("gender", "attribute", "context"):
            raise ValueError(f"template {template!r}: unknown placeholder {{{key}}} (use gender, attribute, context)")
    text = clean_text(template.format(gender=gender, attribute=attribute, context=context))
    return re.sub(r"\s+([.,!?;:])", r"\1", text)


def classifier_sentences(attribute: Attribute, genders: list[str], contexts: list[str],
                         positive: str, negative: str) -> tuple[list[str], list[int]]:
    """Training texts of one attribute's classifier and their labels (1: positive)."""
    ctx = list(contexts) or [""]
    pos = [render(positive, g, attribute.phrase, c) for g in genders for c in ctx]
    neg = [render(negative, g, "", c) for g in genders for c in ctx]
    return pos + neg, [1] * len(pos) + [0] * len(neg)


TABLE2_CONTEXTS = (  # paper 001, Table 2: C^ when a study has no contexts of its own (section 7)
    "sitting at a table", "sitting on a bed", "standing on a skateboard", "standing next to a rack", "riding a bike",
    "riding a horse", "laying on the snow", "laying on a couch", "walking through a forest", "walking down a sidewalk",
    "holding up a smartphone", "holding an umbrella", "jumping into the air", "jumping over a box",
    "running across the park", "running on the beach",
)


# Paper 001, section 6 "Experiment Details": "SGD, with learning rate 1e-3, maximum iterations 5000, validation
# fraction 10%, and early stopping with 5 iterations in scikit-learn" -- scikit-learn's schedule (learning_rate)
# and stopping tolerance (tol) are not given. With 10 validation texts the validation accuracy saturates at
# once, so any tol stops training after 6 epochs; at a rate of 1e-3 that leaves every probability within ~0.01
# of 0.5, while section 6.2 reports 0.6-0.8 for detected attributes. Evidence for each reading:
# benchmarks/bench_gep_cls_schedule.py, docs/benchmarks.md.
SGD_READINGS = {
    # default: a constant rate of 1e-3 for all 5000 epochs (tol=None: the 5-epoch criterion never stops it;
    # the 10 % stay held out). Detected attributes on CLIP-like image embeddings: 0.6-0.8, as in section 6.2.
    "max-iter": {"schedule": "constant", "tol": None},
    # scikit-learn's default tolerance: stops after 6 epochs, probabilities ~0.5 (ranks only)
    "tol-1e-3": {"schedule": "constant", "tol": 1e-3},
}
FROM_SGD = "from sgd"  # schedule / tol not given: the named reading's


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
    alpha: float = 1e-4             # not stated: scikit-learn's default L2 penalty
    sgd: str = "max-iter"           # a reading of SGD_READINGS (sets schedule and tol), or "custom"
    schedule: str = FROM_SGD        # scikit-learn learning_rate (the rate above is eta0); given: overrides sgd
    tol: float | None | str = FROM_SGD  # scikit-learn tol on the validation score; given: overrides sgd

    def __post_init__(self):
        if self.sgd == "custom" and FROM_SGD in (self.schedule, self.tol):
            raise ValueError("classifier sgd 'custom' needs both schedule and tol")
        if self.sgd != "custom" and self.sgd not in SGD_READINGS:
            raise ValueError(f"classifier sgd must be one of {sorted(SGD_READINGS)} or 'custom', got {self.sgd!r}")
        reading = SGD_READINGS.get(self.sgd, {})
        if self.schedule == FROM_SGD:
            self.schedule = reading["schedule"]
        if self.tol == FROM_SGD:
            self.tol = reading["tol"]
        # what the record names: the reading these values are, or "custom"
        self.sgd = next((k for k, v in SGD_READINGS.items() if v == {"schedule": self.schedule, "tol": self.tol}),
                        "custom")
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


def _unused_score(coef, intercept) -> float:
    return 0.0


def sgd_classifier():
    """scikit-learn's ``SGDClassifier``, except that with tol=None (where the validation score cannot stop
    anything) the score is not computed: scikit-learn computes it every epoch through ``estimator.score``,
    ~9 ms of input checks, which would make a 5000-epoch fit ~45 s instead of ~1 s. Same fit, bit for bit."""
    from sklearn.linear_model import SGDClassifier  # deferred: sklearn

    class SGD(SGDClassifier):
        def _make_validation_score_cb(self, *args, **kwargs):
            if self.early_stopping and self.tol is None:
                return _unused_score
            return super()._make_validation_score_cb(*args, **kwargs)

    return SGD


def check_validation_split(n: int, st: ClassifierSettings, attribute: str = "") -> None:
    """Early stopping holds out ``validation_fraction`` of the ``n`` training sentences, stratified:
    both the held-out and the training part need at least one sentence per class (two classes).
    Too few sentences (e.g. one context) is a clear error, not scikit-learn's inside a worker."""
    held = math.ceil(st.validation_fraction * n)
    if held < 2 or n - held < 2:
        raise ValueError(f"classifier {attribute!r}: {n} training sentences per attribute leave {held} for early "
                         f"stopping's validation split (validation_fraction {st.validation_fraction}), fewer than "
                         f"its two classes need: give the classifier more contexts (classifier.contexts) or a "
                         f"larger validation_fraction")


def fit_ensemble(x: np.ndarray, y: np.ndarray, st: ClassifierSettings, attribute: str = "") -> Ensemble:
    """Train ``st.ensemble`` logistic regressions by SGD on (x, y), seeds st.seed + k."""
    SGD = sgd_classifier()
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.int64)
    if len(np.unique(y)) != 2:
        raise ValueError(f"classifier {attribute!r}: training texts need positives and negatives")
    check_validation_split(len(y), st, attribute)
    weights, intercepts, iters, train_acc = [], [], [], []
    for k in range(st.ensemble):
        clf = SGD(loss="log_loss", learning_rate=st.schedule, eta0=st.learning_rate, alpha=st.alpha,
                  max_iter=st.max_iter, tol=st.tol, early_stopping=True, validation_fraction=st.validation_fraction,
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
