"""Prompts of the GEP study (paper 001, section 3; section 4.2 for the classifiers' training texts).

G (gender indicators, label -> text), A (attributes with their phrases, Table 1) and C (contexts,
Table 2) are configuration. The neutral setting prompts "[g] [c]" and scores every attribute on
every image; the explicit setting prompts "[g] [a] [c]" and scores only the named attribute. With
the paper's sets that is 2 x 16 = 32 neutral and 2 x 15 x 16 = 480 explicit prompts, five images
each. Every image gets a stable id and a seed derived from (base seed, prompt text, image index).

The cross-modal classifiers (section 4.2) are trained on texts only: positives "[g^] [a] [c^]" and
negatives "[g^] [c^]" for g^ in G^ = {A man, A woman, A person} and c^ in C^ = C, i.e. 48 + 48
sentences per attribute with the paper's sets.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import pyarrow as pa

from operators.support.attribute_classifier import render
from operators.support.seeds import image_seeds
from schemas.gep import (
    Attribute,
    clean_text as _clean,
    ATTRIBUTE,
    CONTEXT,
    CONTEXT_ID,
    GENDER,
    GENDER_TEXT,
    GEP_REQUESTS,
    IMAGE_ID,
    SETTING,
    Setting,
)
from schemas.images import IMAGE_INDEX, SEED
from schemas.subsets import PROMPT

_SLUG = re.compile(r"[^a-z0-9]+")


def parse_attributes(spec) -> list[Attribute]:
    """Attributes from the config: a mapping name -> phrase / {phrase, text}, or a list of names."""
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, (list, tuple)):
        items = [(a, None) if isinstance(a, str) else (a.get("name"), a) for a in spec]
        items = [(n, {k: v for k, v in (s or {}).items() if k != "name"} or None) for n, s in items]
    else:
        raise ValueError(f"attributes: expected a mapping or a list, got {type(spec).__name__}")
    out = [Attribute.parse(n, s) for n, s in items]
    if not out:
        raise ValueError("attributes: at least one attribute is needed")
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise ValueError(f"attributes: duplicate names in {names}")
    return out


def parse_genders(spec) -> dict[str, str]:
    """G as label -> text; a list of texts gets labels from the texts ("A woman" -> "woman")."""
    if isinstance(spec, Mapping):
        out = {str(k).strip(): _clean(str(v)) for k, v in spec.items()}
    elif isinstance(spec, (list, tuple)):
        out = {label_of(str(t)): _clean(str(t)) for t in spec}
    else:
        raise ValueError(f"genders: expected a mapping label -> text or a list of texts, got {spec!r}")
    if len(out) < 2:
        raise ValueError(f"genders: at least two groups are needed to compare, got {list(out)}")
    return out


def label_of(text: str) -> str:
    words = _clean(text).rstrip(".").split()
    if words and words[0].lower() in ("a", "an", "the"):
        words = words[1:]
    return " ".join(words).lower() or text


def image_id(setting: str, gender: str, attribute: str | None, context_id: int | None, index: int) -> str:
    slug = lambda s: _SLUG.sub("_", s.lower()).strip("_") or "x"  # noqa: E731
    ctx = "c" if context_id is None else f"c{context_id:02d}"
    return f"{setting}-{slug(gender)}-{slug(attribute) if attribute else 'none'}-{ctx}-{index}"


def gep_requests(genders: Mapping[str, str], attributes: list[Attribute], contexts: list[str],
                 settings: Iterable[str], templates: Mapping[str, str], images_per_prompt: int,
                 seed: int) -> pa.Table:
    """One row per image to generate (``schemas.gep.GEP_REQUESTS``), settings in the given order,
    then gender, attribute, context and image index."""
    if images_per_prompt < 1:
        raise ValueError(f"images_per_prompt must be >= 1, got {images_per_prompt}")
    settings = list(settings)
    for s in settings:
        if s not in Setting.ALL:
            raise ValueError(f"unknown setting {s!r}; use {Setting.ALL}")
        if s not in templates:
            raise ValueError(f"no template for the {s} setting")
    ctx = list(enumerate(contexts)) or [(None, "")]
    rows: dict[str, list] = {f.name: [] for f in GEP_REQUESTS}
    for setting in settings:
        attrs = [None] if setting == Setting.NEUTRAL else attributes
        for label, text in genders.items():
            for a in attrs:
                for ci, c in ctx:
                    prompt = render(templates[setting], text, a.phrase if a else "", c)
                    for k in range(images_per_prompt):
                        rows[IMAGE_ID].append(image_id(setting, label, a.name if a else None, ci, k))
                        rows[SETTING].append(setting)
                        rows[GENDER].append(label)
                        rows[GENDER_TEXT].append(text)
                        rows[ATTRIBUTE].append(a.name if a else None)
                        rows[CONTEXT_ID].append(ci)
                        rows[CONTEXT].append(c or None)
                        rows[PROMPT].append(prompt)
                        rows[IMAGE_INDEX].append(k)
    rows[SEED] = image_seeds(seed, rows[PROMPT], rows[IMAGE_INDEX]).tolist()
    table = pa.Table.from_pydict(rows, schema=GEP_REQUESTS)
    ids = table.column(IMAGE_ID).to_pylist()
    if len(set(ids)) != len(ids):
        raise ValueError("two images got the same id: gender labels or attribute names collide after slugging")
    return table
