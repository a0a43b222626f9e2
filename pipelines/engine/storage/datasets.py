"""Which columns of a caption file hold the caption and the image URL, and which dataset it is.

Every study that reads captions (amplification, Exposed ``triplets`` and ``run --captions``,
DALL-Eval alignment) asks ``choose_columns`` once, on the driver, from the files' schemas (the
parquet footers, a CSV header): no data is read. The rules, in order:

1. An explicit ``--caption-column`` / ``--url-column`` wins: its exact name, else its one
   case-insensitive match.
2. ``--dataset-name`` names a layout of ``schemas/datasets.py`` (or one of its variants): its
   columns are used, and must be there.
3. Otherwise a file whose columns include every ``signature`` column of one known layout is that
   dataset (LAION's ``TEXT``/``URL``, Re-LAION's ``caption``/``url``, COYO's ``id``/``text``/
   ``url``, DataComp's ``uid``/``text``/``url``); the path names the variant
   (``relaion2B-en-research-safe``...).
4. Otherwise the one column whose name is caption-like (``schemas.datasets.CAPTION_NAMES``,
   case-insensitively), and likewise for the URL.

A file with two candidates for one role and no rule above deciding (``caption`` and ``text``;
``url`` and ``URL``), or files that disagree, is an error that names the candidates and the flag.
The choice is printed in one line (``ColumnChoice.line``) and recorded with the run
(``ColumnChoice.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.datasets import BY_KEY, CAPTION_NAMES, LAYOUTS, URL_NAMES, DatasetLayout


class ColumnError(ValueError):
    """The caption or URL column cannot be chosen: the message names the file, the candidates and the flag."""


@dataclass
class ColumnChoice:
    caption: str
    url: str | None
    layout: DatasetLayout | None = None
    variant: str | None = None          # the dataset variant's title, from the path or --dataset-name
    name: str | None = None             # --dataset-name as given, when it names no known layout
    why_caption: str = ""
    why_url: str = ""
    extras: list[str] = field(default_factory=list)   # the layout's other columns present in every file
    variant_from: str = ""              # "from the path" or "--dataset-name"

    @property
    def dataset(self) -> str:
        return self.name or self.variant or (self.layout.title if self.layout else "unrecognised layout")

    def line(self) -> str:
        """The one line a run prints about its input columns."""
        if self.url and self.why_url == self.why_caption:
            cols = f"caption {self.caption!r}, URL {self.url!r} ({self.why_caption})"
        else:
            url = f"URL {self.url!r} ({self.why_url})" if self.url else f"no URL column ({self.why_url})"
            cols = f"caption {self.caption!r} ({self.why_caption}), {url}"
        return f"input columns: {cols}; dataset: {self.dataset}{f' ({self.variant_from})' if self.variant_from else ''}"

    def record(self) -> dict:
        return {"dataset": self.dataset, "layout": self.layout.key if self.layout else None,
                "variant": self.variant, "name": self.name, "caption_column": self.caption,
                "url_column": self.url, "why_caption": self.why_caption, "why_url": self.why_url,
                "extra_columns": list(self.extras), "variant_from": self.variant_from or None}


def match_name(names: list[str], wanted: str) -> str | None:
    """``wanted`` among ``names``: its exact spelling, else its one case-insensitive match (TEXT/text)."""
    if wanted in names:
        return wanted
    ci = [n for n in names if n.lower() == wanted.lower()]
    return ci[0] if len(ci) == 1 else None


def _candidates(names: list[str], known: tuple[str, ...]) -> list[str]:
    low = {k.lower() for k in known}
    return [n for n in names if n.lower() in low]


def matching_layouts(names: list[str]) -> list[DatasetLayout]:
    """The known layouts whose signature columns are all among ``names`` (exact spelling)."""
    have = set(names)
    return [lay for lay in LAYOUTS if set(lay.signature) <= have]


def variant_of(layout: DatasetLayout | None, paths: list[str]) -> str | None:
    """The variant a path names (the first of the layout's variants found in any path)."""
    if layout is None:
        return None
    text = _norm(" ".join(paths))
    for needle, title in layout.variants:
        if _norm(needle) in text:
            return title
    return None


def _norm(text: str) -> str:
    """Lower case, "_" as "-": laion2B_en and laion2B-en name the same variant."""
    return text.lower().replace("_", "-")


def named_dataset(name: str) -> tuple[DatasetLayout | None, str | None]:
    """(layout, variant) of a --dataset-name: a layout key, a variant's path name or title; (None,
    None) for any other name (recorded as given; the columns are then found as without it)."""
    low = _norm(name.strip())
    if low in BY_KEY:
        return BY_KEY[low], None
    for lay in LAYOUTS:
        for needle, title in lay.variants:
            if low in (_norm(needle), _norm(title)):
                return lay, title
    return None, None


def choose_columns(files: list[tuple[str, list[str]]], caption_flag: str | None = None,
                   url_flag: str | None = None, dataset_name: str | None = None, url: bool = True,
                   paths: list[str] | None = None) -> ColumnChoice:
    """The caption (and, with ``url``, URL) column of the files ``[(display name, column names)]``.

    ``url_flag`` "none" (any case) means the data has no URLs. ``paths``: what the user gave (the
    variant is read from it and from the file names)."""
    if not files:
        raise ColumnError("no input files")
    layout, variant, name = None, None, None
    if dataset_name:
        layout, variant = named_dataset(dataset_name)
        name = None if layout else dataset_name.strip()
    per_file = []
    for where, names in files:
        found = [layout] if layout else matching_layouts(names)
        if layout and not set(layout.signature) <= set(names):
            raise ColumnError(f"{where} is not in the {layout.title} layout (--dataset-name {dataset_name}): it lacks "
                              f"{', '.join(c for c in layout.signature if c not in names)} (columns: {', '.join(names)})")
        if len(found) > 1:  # two layouts' signatures: a merged file; the flags decide
            found = []
        per_file.append(found[0] if found else None)
    if layout is None:
        kinds = {lay.key if lay else None for lay in per_file}
        if len(kinds) > 1:
            first: dict = {}   # one file named per layout (its last)
            for (where, _), lay in zip(files, per_file):
                first[lay.key if lay else None] = where
            shown = ", ".join(f"{where} ({BY_KEY[k].title if k else 'unrecognised'})" for k, where in first.items())
            raise ColumnError(f"the input files have different column layouts: {shown}; read one dataset per run, or "
                              f"name the columns with --caption-column and --url-column")
        layout = per_file[0]
    if variant is None:
        variant = variant_of(layout, (paths or []) + [w for w, _ in files])
    caption, why_caption = _choose(files, "caption", caption_flag, layout.caption if layout else None,
                                   CAPTION_NAMES, layout)
    if not url or (url_flag is not None and url_flag.lower() == "none"):
        url_col, why_url = None, "--url-column none" if url else "not read"
    else:
        url_col, why_url = _choose(files, "url", url_flag, layout.url if layout else None, URL_NAMES, layout)
    extras = [c for c in (layout.extras + ((layout.id_column,) if layout and layout.id_column else ()) if layout else ())
              if all(c in names for _, names in files)]
    how = "--dataset-name" if dataset_name else ("from the path" if variant else "")
    return ColumnChoice(caption, url_col, layout, variant, name, why_caption, why_url,
                        sorted(set(extras), key=extras.index), how)


def _choose(files, role: str, flag: str | None, from_layout: str | None, known: tuple[str, ...],
            layout: DatasetLayout | None) -> tuple[str, str]:
    chosen, why = None, ""
    for where, names in files:
        if flag:
            name = match_name(names, flag)
            if name is None:
                raise ColumnError(f"{where} has no {role} column {flag!r} (--{role}-column; columns: {', '.join(names)})")
            reason = f"--{role}-column"
        elif from_layout:
            others = [c for c in _candidates(names, known) if c != from_layout and c not in layout.extras]
            if others:
                raise ColumnError(
                    f"{where} is ambiguous: it has the {layout.title} {role} column {from_layout!r} and also "
                    f"{', '.join(repr(c) for c in others)}; choose with --{role}-column")
            name, reason = from_layout, f"the {layout.title} layout: columns {', '.join(layout.signature)}"
        else:
            cands = _candidates(names, known)
            if len(cands) > 1:
                raise ColumnError(f"{where} is ambiguous: {role} candidates {', '.join(repr(c) for c in cands)}; "
                                  f"choose with --{role}-column")
            if not cands:
                raise ColumnError(f"{where} has no {role} column (none of {', '.join(known)}; columns: "
                                  f"{', '.join(names)}); choose it with --{role}-column"
                                  + ("" if role == "caption" else ", or --url-column none if it has no URLs"))
            name, reason = cands[0], f"the only {role}-like column"
        if chosen is not None and name != chosen:
            raise ColumnError(f"{where} names the {role} column {name!r}, other files {chosen!r}")
        chosen, why = name, reason
    return chosen, why
