"""Generation prompts of paper 002 (Table 1) with the correct indefinite article."""

from __future__ import annotations

import numpy as np

from operators.text_occupation_explode import _MASK63, _hash64

# Words whose spelling and sound disagree on the first letter.
_AN_DESPITE_CONSONANT = ("hour", "honest", "honor", "honour", "heir")
_A_DESPITE_VOWEL = ("uni", "use", "usu", "uti", "eu", "one", "once", "ewe", "uro")


def indefinite_article(phrase: str) -> str:
    """ "a" or "an" for ``phrase`` (an engineer, a hairdresser, a university lecturer, an hour)."""
    word = phrase.strip().split(" ")[0].lower()
    if not word:
        raise ValueError("empty occupation name")
    if word.startswith(_AN_DESPITE_CONSONANT):
        return "an"
    if word.startswith(_A_DESPITE_VOWEL):
        return "a"
    return "an" if word[0] in "aeiou" else "a"


def render(template: str, occupation) -> str:
    """Fill a Table 1 template ("A photo of {article} {occupation} smiling") for an Occupation."""
    shown = occupation.prompt_name or occupation.name
    article = occupation.article or indefinite_article(shown)
    return template.format(article=article, occupation=shown)


def prompt_table(occupations, templates) -> dict[str, list[str]]:
    """occupation name -> its prompts, in template order (prompt_id = position + 1)."""
    if not templates:
        raise ValueError("no prompt templates configured")
    for t in templates:
        if "{occupation}" not in t:
            raise ValueError(f"prompt template {t!r} has no {{occupation}} placeholder")
    return {o.name: [render(t, o) for t in templates] for o in occupations}


def image_seeds(base_seed: int, prompts, indices) -> np.ndarray:
    """Per-image generator seeds: a deterministic 63-bit hash of (base seed, prompt text, index).

    The seed does not depend on the model, the batch or the worker, so every image can be
    regenerated alone, and two models see the same initial noise for the same prompt and index.
    """
    return np.array([_hash64(f"{int(base_seed)}\x1f{p}\x1f{int(k)}") & _MASK63 for p, k in zip(prompts, indices)],
                    np.int64)
