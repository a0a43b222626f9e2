"""The NER prefilter of the person-name stage: lossless, and how much spaCy work it saves.

    python benchmarks/bench_ner_prefilter.py                               # the bundled sample
    python benchmarks/bench_ner_prefilter.py --input /tmp/syn1m            # synthetic rows
    python benchmarks/bench_ner_prefilter.py --input captions/*.parquet --all-captions

For each input: the captions (those naming an occupation, as the pipeline runs NER on them, or
every caption with ``--all-captions``) get their gender words, then ``NameGenderIndicators``
runs twice, with the prefilter (the default) and with NER on every caption, in one process. It
prints whether ``caption_gender`` and the male / female indicator lists are identical (they
must be), the share of captions that still needed NER, both stage timings and the speed-up, per
``--policies`` (mostly_* names counted, the default, and/or strict).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_name_gender import NameGenderIndicators  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from pipelines.engine.cli import config as study_config  # noqa: E402
from pipelines.engine.storage.inputs import resolve_column, resolve_parquet_inputs  # noqa: E402
from pipelines.studies.amplification import jobs  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "laion_synthetic_sample.parquet"
COMPARED = ("male_indicators", "female_indicators", "caption_gender")


def load(paths: list[str], column: str, all_captions: bool, limit: int | None, occupations) -> tuple[pa.Table, int]:
    inp = resolve_parquet_inputs(paths)
    col = resolve_column(inp, column, "text")
    parts = []
    for f in inp.files:
        with inp.filesystem.open_input_file(f) as fh:
            parts.append(pq.read_table(fh, columns=[col]).rename_columns(["caption"]).cast(
                pa.schema([pa.field("caption", pa.string())])))
    table = pa.concat_tables(parts)
    rows = table.num_rows
    table = table.filter(pa.array([c is not None and c.strip() != "" for c in table.column("caption").to_pylist()]))
    if not all_captions:
        table = table.filter(pa.array(OccupationMatcher(occupations).any_match(table.column("caption").combine_chunks())))
    return (table if limit is None else table.slice(0, limit)), rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", default=[str(SAMPLE)])
    ap.add_argument("--text-column", default="TEXT")
    ap.add_argument("--all-captions", action="store_true", help="every caption, not only those naming an occupation")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--policies", nargs="+", default=["mostly", "strict"], choices=["mostly", "strict"])
    ap.add_argument("--spacy-model", default=None)
    ap.add_argument("--label", default=None, help="what to call this input in the table")
    args = ap.parse_args(argv)
    cfg = study_config.load_config()
    gi = cfg["gender_indicators"]
    occupations = jobs.occupations_from(cfg)
    table, rows = load(args.input, args.text_column, args.all_captions, args.limit, occupations)
    words = GenderWordIndicators(gi["male_words"], gi["female_words"], gi["male_pronouns"], gi["female_pronouns"])
    table = words(table)
    label = args.label or ", ".join(args.input)
    which = "all captions" if args.all_captions else "captions naming an occupation"
    print(f"{label}: {rows:,} rows, {table.num_rows:,} {which}")
    skip = [f for o in occupations for f in o.forms()]
    model = args.spacy_model or gi["spacy_model"]
    out = []
    for policy in args.policies:
        kw = {"spacy_model": model, "count_mostly": policy == "mostly", "skip_words": skip}
        fast_op, full_op = NameGenderIndicators(**kw), NameGenderIndicators(**kw, prefilter=False)
        t = time.perf_counter()
        fast = fast_op(table)
        t_fast = time.perf_counter() - t
        t = time.perf_counter()
        full = full_op(table)
        t_full = time.perf_counter() - t
        diffs = {c: int(sum(a != b for a, b in zip(fast.column(c).to_pylist(), full.column(c).to_pylist())))
                 for c in COMPARED}
        ran = np.array([p is not None for p in fast.column("person_names").to_pylist()])
        names = sum(1 for m, f in zip(full.column("male_indicators").to_pylist(), full.column("female_indicators").to_pylist())
                    if any(e.startswith("name:") for e in (m or []) + (f or [])))
        skipped_spans = sum(len(p or []) for p, r in zip(full.column("person_names").to_pylist(), ran) if not r)
        out.append((policy, table.num_rows, ran.mean() if len(ran) else 0.0, names, skipped_spans, diffs, t_full, t_fast))
        print(f"  {policy}: NER ran on {ran.sum():,} of {len(ran):,} ({100 * ran.mean():.1f}%); captions with a name "
              f"indicator {names:,}; differing rows {diffs}; PERSON spans not listed on skipped captions "
              f"{skipped_spans:,}; NER on all {t_full:.1f} s, with the prefilter {t_fast:.1f} s", flush=True)
    print("\n| input | names counted | captions | need NER | with a name indicator | differing rows "
          "(male / female / caption_gender) | spans not listed | NER stage, all (captions/s) | with prefilter | speed-up |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for policy, n, share, names, spans, diffs, t_full, t_fast in out:
        print(f"| {label} | {'male/female + mostly_*' if policy == 'mostly' else 'male/female only'} | {n:,} | "
              f"{100 * share:.1f}% | {names:,} | {' / '.join(str(diffs[c]) for c in COMPARED)} | {spans:,} | "
              f"{n / t_full:,.0f} | {n / t_fast:,.0f} | {t_full / t_fast:.2f}x |")


if __name__ == "__main__":
    main()
