"""The occupations of a study (paper 002, Table 4): the domain type every layer shares (the
matcher searches their forms, the prompts name them, the configuration lists them), with the
English rules it needs: regular plurals and the indefinite article.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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


_VOWEL_Y = re.compile(r"[aeiou]y$")


def normalise_name(name: str) -> str:
    """Canonical spelling of an occupation name: lower case, underscores and runs of space as one space."""
    return " ".join(str(name).replace("_", " ").lower().split())


def plural(term: str) -> str:
    """Regular English plural of the last word of ``term`` (engineers, attorneys, secretaries, coaches)."""
    head, _, last = term.rpartition(" ")
    if re.search(r"(s|x|z|ch|sh)$", last):
        last = last + "es"
    elif last.endswith("y") and not _VOWEL_Y.search(last):
        last = last[:-1] + "ies"
    else:
        last = last + "s"
    return f"{head} {last}" if head else last


@dataclass(frozen=True)
class Occupation:
    """One occupation of a study: its canonical name and the surface terms that select it."""

    name: str
    terms: tuple[str, ...] = ()
    prompt_name: str | None = None
    article: str | None = None
    extra_forms: tuple[str, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "name", normalise_name(self.name))
        terms = tuple(normalise_name(t) for t in (self.terms or (self.name,)))
        object.__setattr__(self, "terms", terms)

    @classmethod
    def parse(cls, spec) -> "Occupation":
        """From a YAML entry: a plain string, or a mapping with name/terms/prompt_name/article/forms."""
        if isinstance(spec, Occupation):
            return spec
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, dict) and "name" in spec:
            unknown = set(spec) - {"name", "terms", "prompt_name", "article", "forms"}
            if unknown:
                raise ValueError(f"occupation {spec['name']!r}: unknown keys {sorted(unknown)}")
            return cls(
                spec["name"],
                tuple(spec.get("terms") or ()),
                spec.get("prompt_name"),
                spec.get("article"),
                tuple(normalise_name(f) for f in spec.get("forms") or ()),
            )
        raise ValueError(f"cannot read occupation entry {spec!r}: expected a name or a mapping with 'name'")

    def forms(self, plurals: bool = True) -> tuple[str, ...]:
        """Every surface form searched: each term, its regular plural, and any explicit extra forms;
        with ``plurals=False`` (``--occupation-forms singular``) the terms exactly as listed."""
        out: list[str] = []
        for t in self.terms:
            for f in ((t, plural(t)) if plurals else (t,)):
                if f not in out:
                    out.append(f)
        if plurals:
            out += [f for f in self.extra_forms if f not in out]
        return tuple(out)


# How a caption "contains" an occupation (paper 002, section 4: "all captions that contain the word
# 'president'"): "plural" searches each term, its regular plural and its extra forms (the project's
# default); "singular" only the terms as listed (the strictest reading of the paper's words).
OCCUPATION_FORMS = ("plural", "singular")


def parse_occupations(specs) -> list[Occupation]:
    occupations = [Occupation.parse(s) for s in specs]
    names = [o.name for o in occupations]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"occupation list names {dupes} more than once")
    if not occupations:
        raise ValueError("the occupation list is empty")
    return occupations
