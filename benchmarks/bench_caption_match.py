"""Throughput of the caption scan's CPU stages: occupation matching and gender word/pronoun indicators.

Vectorised operators (pyarrow compute) vs a plain Python ``re`` loop over rows with the same
patterns, on the same synthetic LAION-like captions, on one core. Not a test: prints a table.

    python benchmarks/bench_caption_match.py --rows 1000000 --occupation-share 0.02 0.5
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

pa.set_cpu_count(1)
pa.set_io_thread_count(1)

from benchmarks.common import best_of  # noqa: E402
from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from pipelines.engine.cli.config import load_config  # noqa: E402
from pipelines.studies.amplification.jobs import occupations_from  # noqa: E402
from pipelines.synthetic_laion import generate  # noqa: E402

BATCH = 262144  # the pipeline's default --scan-batch-size


def batches(captions: pa.Array):
    for i in range(0, len(captions), BATCH):
        yield pa.table({"caption": captions.slice(i, BATCH)})


class PythonLoop:
    """The baseline: one compiled ``re`` pattern per concern, applied row by row."""

    def __init__(self, matcher: OccupationMatcher, gi: dict):
        forms = {f: o.name for o in matcher.occupations for f in o.forms()}
        # the natural Python form: one alternation between word boundaries (underscores aside,
        # the same words as the vectorised matcher)
        alt = "|".join(r"\W+".join(map(re.escape, f.split())) for f in sorted(forms, key=len, reverse=True))
        self.occ = re.compile(rf"\b({alt})\b", re.IGNORECASE)
        self.forms = {re.sub(r"\s+", " ", f): n for f, n in forms.items()}
        self.male = set(gi["male_words"]) | set(gi["male_pronouns"])
        self.female = set(gi["female_words"]) | set(gi["female_pronouns"])
        self.word = re.compile(r"[^\W_]+")

    def occupations(self, captions: list) -> list:
        out = []
        for c in captions:
            if c is None:
                out.append([])
                continue
            found = []
            for m in self.occ.finditer(c):
                name = self.forms.get(" ".join(self.word.findall(m.group(1).lower())))
                if name and name not in found:
                    found.append(name)
            out.append(found)
        return out

    def indicators(self, captions: list) -> list:
        out = []
        for c in captions:
            words = self.word.findall(c.lower()) if c else []
            m = [w for w in words if w in self.male]
            f = [w for w in words if w in self.female]
            out.append("both" if m and f else "male" if m else "female" if f else "none")
        return out


def run(rows: int, share: float, repeat: int, loop_rows: int) -> list[tuple]:
    cfg = load_config()
    gi = cfg["gender_indicators"]
    matcher = OccupationMatcher(occupations_from(cfg))
    words = GenderWordIndicators(gi["male_words"], gi["female_words"], gi["male_pronouns"], gi["female_pronouns"])
    captions = generate(rows, seed=1, occupation_share=share).column("TEXT").combine_chunks()
    matched = []

    def occ():
        matched.clear()
        for b in batches(captions):
            out = matcher(b)
            matched.append(out.filter(pa.compute.equal(out["occupation_status"], "kept")).select(["caption"]))

    def ind_all():
        for b in batches(captions):
            words(b)

    t_occ = best_of(occ, repeat)
    t_prefilter = best_of(lambda: [matcher.any_match(b["caption"].combine_chunks()) for b in batches(captions)], repeat)
    m = pa.concat_tables(matched)
    t_ind_matched = best_of(lambda: [words(pa.Table.from_batches([b])) for b in m.to_batches(BATCH)], repeat)
    t_ind_all = best_of(ind_all, repeat)

    base = PythonLoop(matcher, gi)
    sample = captions.slice(0, loop_rows).to_pylist()
    t0 = time.perf_counter(); base_occ = base.occupations(sample); t_loop_occ = (time.perf_counter() - t0) / len(sample)
    t0 = time.perf_counter(); base.indicators(sample); t_loop_ind = (time.perf_counter() - t0) / len(sample)
    # the baseline computes the same thing
    ours = matcher(pa.table({"caption": captions.slice(0, loop_rows)}))["occupations"].to_pylist()
    agree = sum(sorted(a) == sorted(b) for a, b in zip(ours, base_occ)) / len(sample)

    pipeline = rows / (t_occ + t_ind_matched)
    return [
        (share, "occupation prefilter (regex pass only)", rows / t_prefilter, None),
        (share, "occupation match (prefilter + which + status)", rows / t_occ, 1 / t_loop_occ),
        (share, "word/pronoun indicators, every caption", rows / t_ind_all, 1 / t_loop_ind),
        (share, f"match + indicators on the {len(m):,} matches (pipeline)", pipeline, 1 / (t_loop_occ + share * t_loop_ind)),
        (share, f"baseline agreement on occupations: {agree:.4f}", None, None),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--occupation-share", type=float, nargs="+", default=[0.02, 0.5],
                    help="share of captions naming an occupation (LAION-2B-en: ~0.01-0.02 for 62 occupations)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for the vectorised runs")
    ap.add_argument("--loop-rows", type=int, default=200_000, help="rows timed for the Python loop baseline")
    args = ap.parse_args()
    print(f"{args.rows:,} synthetic captions, 1 core (pyarrow cpu_count=1), pyarrow {pa.__version__}")
    print(f"{'share':>6}  {'stage':<58} {'vectorised/s':>14} {'python re/s':>13} {'speed-up':>9}")
    for share in args.occupation_share:
        for s, stage, ours, loop in run(args.rows, share, args.repeat, args.loop_rows):
            v = f"{ours:>14,.0f}" if ours else " " * 14
            b = f"{loop:>13,.0f}" if loop else " " * 13
            x = f"{ours / loop:>8.1f}x" if ours and loop else ""
            print(f"{s:>6.2f}  {stage:<58} {v} {b} {x}")


if __name__ == "__main__":
    main()
