"""Simulated annotators, for the demo and the tests: never people, and marked so everywhere.

Each simulated annotator answers every item from a known truth (by default the run's classifier
answer, or a choice drawn at random where the classifier gave none): with probability
``error_rate`` another choice drawn uniformly, with probability ``unsure_rate`` "unsure" (when the
protocol has it). Their names start with ``simulated-`` and their answers carry the origin
``simulated``; reports say how many answers are simulated.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from schemas import annotation as A

PREFIX = "simulated-"


def simulate(items: pd.DataFrame, choices: list[str], unsure: str | None, annotators: int = 3,
             error_rate: float = 0.1, unsure_rate: float = 0.05, seed: int = 0,
             truth: pd.Series | None = None) -> pd.DataFrame:
    """The long table of ``annotators`` simulated annotators over ``items``; ``truth`` (indexed like
    ``items``) defaults to each item's classifier answer."""
    if not 0 <= error_rate <= 1 or not 0 <= unsure_rate <= 1 or error_rate + unsure_rate > 1:
        raise ValueError(f"error rate {error_rate} and unsure rate {unsure_rate}: each in [0, 1], their sum at most 1")
    rng = np.random.default_rng(seed)
    scale = [c for c in choices if c != unsure]
    truth = items[A.PREDICTION] if truth is None else truth
    truth = truth.where(truth.isin(scale))
    base = np.array([t if isinstance(t, str) else scale[rng.integers(len(scale))] for t in truth], dtype=object)
    rows = []
    for k in range(annotators):
        u = rng.random(len(items))
        answers = base.copy()
        wrong = u < error_rate
        for i in np.flatnonzero(wrong):
            others = [c for c in scale if c != base[i]]
            answers[i] = others[rng.integers(len(others))] if others else base[i]
        if unsure is not None:
            answers[(u >= error_rate) & (u < error_rate + unsure_rate)] = unsure
        rows.append(pd.DataFrame({A.ITEM_ID: items[A.ITEM_ID].to_numpy(), A.ANNOTATOR: f"{PREFIX}{k + 1}",
                                  A.ANSWER: answers}))
    return pd.concat(rows, ignore_index=True)
