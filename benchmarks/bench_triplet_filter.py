"""Throughput of the triplet filter (paper 004, section 3): vectorised vs a Python ``re`` loop.

Synthetic COCO / GCC-like captions (about 2% with *person* / *people*, a fifth with a Table S1
word), the vectorised ``TripletFilter`` in batches of 16,384 (its declared batch size) on one
core (``pa.set_cpu_count(1)``) against ``python_loop_filter``, the same rule one caption at a
time, on the same captions. Checks that both give the same verdicts. Not a test: prints a table.

    python benchmarks/bench_triplet_filter.py --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

pa.set_cpu_count(1)
pa.set_io_thread_count(1)

from benchmarks.common import best_of  # noqa: E402
from operators.text_triplet_filter import TripletFilter, python_loop_filter  # noqa: E402
from schemas.exposed import FEMININE, HUMAN_WORD, MASCULINE, TRIPLET_STATUS  # noqa: E402

BATCH = TripletFilter.resources.batch_size

SUBJECTS = ["A dog", "Two cats", "A red bus", "A plate of food", "The old bridge", "A train", "A bowl of fruit",
            "A small boat", "Three horses", "A laptop", "A kitchen", "An airplane", "A giraffe", "A pizza"]
VERBS = ["sitting on", "parked next to", "standing near", "lying under", "in front of", "on top of", "beside"]
PLACES = ["a wooden table.", "the beach at sunset", "a busy street", "a snowy field", "a green park", "the river bank",
          "a white background", "an old building", "the city center", "a cloudy sky"]
PERSON = ["A person", "Two people", "People", "a person's hand", "PEOPLE", "A group of people", "person"]
HUMANS = ["a man", "a woman", "his friend", "two kids", "a young girl", "the tourists", "a soccer player",
          "her family", "a chef", "Spider-Man"]


def synthetic_captions(rows: int, seed: int = 0, person_share: float = 0.02, human_share: float = 0.2) -> pa.Array:
    rng = np.random.default_rng(seed)
    u = rng.random(rows)
    subj = np.array(SUBJECTS, object)[rng.integers(len(SUBJECTS), size=rows)]
    subj = np.where(u < person_share, np.array(PERSON, object)[rng.integers(len(PERSON), size=rows)], subj)
    verb = np.array(VERBS, object)[rng.integers(len(VERBS), size=rows)]
    place = np.array(PLACES, object)[rng.integers(len(PLACES), size=rows)]
    # a Table S1 word in a fifth of the captions, independently of person / people
    human = rng.random(rows) < human_share
    place = np.where(human, np.array(HUMANS, object)[rng.integers(len(HUMANS), size=rows)], place)
    return pc.binary_join_element_wise(pa.array(subj, pa.string()), pa.array(verb, pa.string()),
                                       pa.array(place, pa.string()), " ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--person-share", type=float, default=0.02, help="share of captions with person / people")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for the vectorised run")
    ap.add_argument("--loop-rows", type=int, default=None, help="rows timed for the Python loop (default: all)")
    args = ap.parse_args()

    captions = synthetic_captions(args.rows, person_share=args.person_share)
    op = TripletFilter(text_column="TEXT")
    out = []

    def vectorised():
        out.clear()
        for i in range(0, len(captions), BATCH):
            out.append(op(pa.table({"TEXT": captions.slice(i, BATCH)})))

    t_vec = best_of(vectorised, args.repeat)
    result = pa.concat_tables(out)
    sample = captions.slice(0, args.loop_rows or args.rows).to_pylist()
    t0 = time.perf_counter()
    loop = python_loop_filter(sample)
    t_loop = time.perf_counter() - t0

    n = len(sample)
    ours = list(zip(result[TRIPLET_STATUS].to_pylist()[:n], result[HUMAN_WORD].to_pylist()[:n],
                    result[FEMININE].to_pylist()[:n], result[MASCULINE].to_pylist()[:n]))
    same = sum(o == (v.status, v.human_word, v.feminine, v.masculine) for o, v in zip(ours, loop))
    kept = pc.sum(pc.equal(result[TRIPLET_STATUS], "kept")).as_py()

    vec_rate, loop_rate = args.rows / t_vec, n / t_loop
    print(f"{args.rows:,} synthetic captions ({args.person_share:.0%} with person/people), {kept:,} kept; "
          f"1 core (pyarrow cpu_count=1), batches of {BATCH:,}, pyarrow {pa.__version__}")
    print(f"{'implementation':<40} {'captions/s per core':>20}")
    print(f"{'TripletFilter (vectorised: numpy + RE2)':<40} {vec_rate:>20,.0f}")
    print(f"{'python_loop_filter (re, row by row)':<40} {loop_rate:>20,.0f}")
    print(f"{'speed-up':<40} {vec_rate / loop_rate:>19.1f}x")
    print(f"verdicts identical on {same:,} / {n:,} captions")


if __name__ == "__main__":
    main()
