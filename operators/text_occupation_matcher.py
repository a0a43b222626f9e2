"""Occupation matching over captions (paper 002, sections 2.3 and 3.2; Table 4).

Case-insensitive whole-word search for every occupation term and its regular plural,
multi-word terms included ("prime minister"). Two vectorised passes:

1. a single RE2 alternation over all terms (``pyarrow.compute.match_substring_regex``) finds the
   captions that name any occupation -- this pass sees every caption of the scan;
2. only for those captions, word n-grams are looked up in a hash set of all term forms
   (``pyarrow.compute.index_in``), which says *which* occupations each caption names.

Pass 1 uses RE2's ASCII word boundary ``\b`` (the fastest form of the pattern), widened by ``_``
so that "fashion_designer" passes. That is exactly the word boundary of ``text_tokens``, so the
two passes agree: pass 1 neither drops a caption pass 2 would match nor keeps one it would not.
"""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.base import Resources, status_array, with_column
from operators.support.tokens import lists_from_pairs, ngrams, regex_escape, words
from schemas.occupations import OCCUPATION_FORMS, parse_occupations, plural
from schemas.captions import (
    CAPTION,
    DROP_NO_OCCUPATION,
    OCCUPATION_STATUS,
    OCCUPATIONS,
    OUTCOME_KEPT,
    STAGE_OCCUPATIONS,
)

class OccupationMatcher:
    """Adds ``occupations`` (list of matched occupation names, in list order) and a status column.

    Status: ``kept`` when the caption names at least one occupation, else ``no_occupation``.
    Reads ``caption``; null captions never match.
    """

    stage_name = STAGE_OCCUPATIONS
    status_column = OCCUPATION_STATUS
    outcomes = (OUTCOME_KEPT, DROP_NO_OCCUPATION)
    resources = Resources(num_cpus=1, batch_size=262144)

    def __init__(self, occupations, forms: str = "plural"):
        """``forms``: "plural" (each term, its regular plural and extra forms) or "singular" (the
        terms as listed); see ``schemas.occupations.OCCUPATION_FORMS``."""
        if forms not in OCCUPATION_FORMS:
            raise ValueError(f"occupation forms must be one of {OCCUPATION_FORMS}, got {forms!r}")
        self.plurals = forms == "plural"
        self.occupations = parse_occupations(occupations)
        # form -> occupation index; a form claimed by two occupations is a configuration error
        owner: dict[str, int] = {}
        for i, occ in enumerate(self.occupations):
            for form in occ.forms(self.plurals):
                if form in owner and owner[form] != i:
                    raise ValueError(
                        f"term {form!r} selects both {self.occupations[owner[form]].name!r} and {occ.name!r}"
                    )
                owner[form] = i
        self.max_words = max(len(f.split(" ")) for f in owner)
        self._by_length: dict[int, tuple[pa.Array, np.ndarray, pa.Array]] = {}
        for n in range(1, self.max_words + 1):
            forms = [f for f in owner if len(f.split(" ")) == n]
            if forms:
                self._by_length[n] = (pa.array(forms, pa.string()), np.array([owner[f] for f in forms], np.int64),
                                      pa.array(sorted({f.split(" ")[0] for f in forms}), pa.string()))
        self.pattern = rf"(?i)(?:\b|_)(?:{'|'.join(self._alternatives())})(?:\b|_)"
        self._names = pa.array([o.name for o in self.occupations], pa.string())

    def _alternatives(self) -> list[str]:
        """Regex alternatives for all forms; "engineers?" instead of "engineer|engineers" keeps
        RE2's automaton small (about 10% faster than listing every form)."""
        def rx(form: str) -> str:
            return r"[\W_]+".join(regex_escape(w) for w in form.split(" "))

        out = []
        for occ in self.occupations:
            if not self.plurals:
                out += [rx(t) for t in occ.terms]
                continue
            for t in occ.terms:
                p = plural(t)
                if p == t + "s":
                    out.append(rx(t) + "s?")
                elif p == t + "es":
                    out.append(rx(t) + "(?:es)?")
                else:
                    out.append(f"{rx(t)}|{rx(p)}")
            out += [rx(f) for f in occ.extra_forms]
        return out

    def any_match(self, captions: pa.Array) -> np.ndarray:
        """Boolean mask: does the caption name any occupation (pass 1, every caption)."""
        hit = pc.match_substring_regex(captions, self.pattern)
        return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)

    def which(self, captions: pa.Array) -> pa.ListArray:
        """List of occupation names per caption (pass 2; run it only on captions that matched)."""
        tokens, parent = words(captions)
        rows, occs = [], []
        for n, (forms, owners, first_words) in self._by_length.items():
            grams, gparent = ngrams(tokens, parent, n, first_words)
            idx = pc.index_in(grams, value_set=forms)
            found = pc.is_valid(idx).to_numpy(zero_copy_only=False)
            rows.append(gparent[found])
            occs.append(owners[pc.fill_null(idx, 0).to_numpy(zero_copy_only=False)[found]])
        rows_a = np.concatenate(rows) if rows else np.empty(0, np.int64)
        occs_a = np.concatenate(occs) if occs else np.empty(0, np.int64)
        # one entry per (row, occupation), ordered by row then by the occupation list order
        key = np.unique(rows_a * len(self.occupations) + occs_a)
        pair_rows, pair_occ = np.divmod(key, len(self.occupations))
        return lists_from_pairs(len(captions), pair_rows, self._names.take(pa.array(pair_occ)))

    def __call__(self, batch: pa.Table) -> pa.Table:
        captions = batch.column(CAPTION).combine_chunks()
        n = len(captions)
        mask = self.any_match(captions)
        hit_rows = np.flatnonzero(mask)
        sub_lists = self.which(captions.take(pa.array(hit_rows, pa.int64())))
        lengths = np.zeros(n, np.int64)
        lengths[hit_rows] = pc.list_value_length(sub_lists).to_numpy(zero_copy_only=False)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        occupations = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), sub_lists.flatten())
        status = status_array(lengths == 0, self.outcomes)  # 0: kept, 1: no_occupation
        batch = with_column(batch, OCCUPATIONS, occupations)
        return with_column(batch, OCCUPATION_STATUS, status)
