"""SBERT screened in bf16, its candidates re-encoded in fp32 (``--sbert-backend screened``),
against torch fp32 on every row, on the same (caption, occupation) rows, in one run.

    python benchmarks/bench_sbert_screen.py --captions real.parquet --text-column TEXT \\
        --occupations man dog woman people girl boy person --k 500 50 --threads 2

For each row the similarity stage (``PromptSimilarity``, folding off, Ray batches of 4,096) runs
with torch fp32 and with OpenVINO bf16; then, for each k (the paper's preset shape: naive walked
from a pool of 3k by sample key, the NN subsets the first k by cosine per Table 1 prompt, URL
fold), the pool is selected from the torch cosines (the reference) and from the screen through
``refine.exact_pool``, which re-encodes the candidates with torch fp32. Printed: the times, the
share re-encoded, the effective speed of screen + re-encode against torch on every row, and how
many groups have the same members and the same order as the reference.

The share re-encoded is about (pool rows per occupation) / (rows per occupation): with k = 500 a
pool holds up to ~3,500 rows per occupation, so the screen pays off when occupations have many
more captions than that (LAION-2B-en: hundreds of thousands each). A smaller k on a smaller input
gives the same ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.support.sbert_openvino import version as openvino_version  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from operators.text_prompt_similarity import PromptSimilarity  # noqa: E402
from pipelines.engine.cli import config as study_config  # noqa: E402
from pipelines.studies.amplification import jobs, refine  # noqa: E402
from pipelines.studies.amplification.caption_selection import select_subsets_local  # noqa: E402
from pipelines.studies.amplification.prompts import prompt_table  # noqa: E402
from pipelines.studies.amplification.selection import SelectionConfig  # noqa: E402
from schemas.occupations import Occupation  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "laion_synthetic_sample.parquet"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def annotated_rows(path: str, column: str, occupations: list, seed: int = 0) -> pa.Table:
    """One row per (caption, occupation it names), with the columns the selection reads."""
    caps = pq.read_table(path, columns=[column]).column(column).combine_chunks().cast(pa.string())
    caps = caps.filter(pc.and_(pc.is_valid(caps), pc.greater(pc.utf8_length(caps), 0)))
    which = OccupationMatcher(occupations).which(caps)
    lengths = pc.fill_null(pc.list_value_length(which), 0).to_numpy(zero_copy_only=False)
    idx = np.repeat(np.arange(len(caps)), lengths)
    rng = np.random.default_rng(seed)
    n = len(idx)
    return pa.table({
        "caption_id": pa.array(np.arange(n), pa.int64()),
        "url": pa.array([f"u{i}" for i in idx], pa.string()),
        "caption": caps.take(pa.array(idx)),
        "occupation": pc.list_flatten(which),
        "caption_gender": pa.array(["none"] * n, pa.string()),
        "sample_key": pa.array(rng.uniform(0, 1, n)),
    })


def similarities(op: PromptSimilarity, rows: pa.Table, step: int = 4096) -> tuple[float, pa.Table]:
    t = time.perf_counter()
    out = pa.concat_tables([op(rows.slice(i, step)) for i in range(0, rows.num_rows, step)])
    return time.perf_counter() - t, out


def compare(got: pa.Table, want: pa.Table) -> tuple[int, int, int, int]:
    """(groups, same members, same members and order, order differing only among equal captions)."""
    keys = ["occupation", "subset", "prompt_id"]
    g, w = got.to_pandas(), want.to_pandas()
    for t in (g, w):
        t["prompt_id"] = t["prompt_id"].fillna(0)
    groups = members = order = equal_text = 0
    wg = dict(list(w.groupby(keys)))
    for key, x in g.groupby(keys):
        y = wg.get(key)
        groups += 1
        if y is None or set(x.caption_id) != set(y.caption_id):
            continue
        members += 1
        xs, ys = x.sort_values("rank"), y.sort_values("rank")
        if list(xs.caption_id) == list(ys.caption_id):
            order += 1
        elif list(xs.caption) == list(ys.caption):
            equal_text += 1
    return groups, members, order, equal_text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", default=str(SAMPLE))
    ap.add_argument("--text-column", default="TEXT")
    ap.add_argument("--occupations", nargs="+", help="terms matched as occupations (default: the preset's)")
    ap.add_argument("--k", type=int, nargs="+", default=[500], help="sample_size = nn_k, one selection per value")
    ap.add_argument("--margin", type=float, default=refine.DEFAULT_MARGIN)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    import torch  # deferred: torch

    if args.threads:
        torch.set_num_threads(args.threads)
    config = study_config.load_config(None)
    occupations = [Occupation(o) for o in args.occupations] if args.occupations else jobs.occupations_from(config)
    prompts = prompt_table(occupations, config["prompts"])
    rows = annotated_rows(args.captions, args.text_column, occupations)
    print(f"{rows.num_rows:,} (caption, occupation) rows from {args.captions}, {len(occupations)} occupations; "
          f"torch {torch.__version__}, openvino {openvino_version()}, {torch.get_num_threads()} threads", flush=True)
    exact_op = PromptSimilarity(MODEL, prompts, device="cpu", precision="fp32", fold_duplicates="off")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        screen_op = PromptSimilarity(MODEL, prompts, device="cpu", precision="fp32", backend="screened",
                                     fold_duplicates="off")
    for op in (exact_op, screen_op):
        op(rows.slice(0, 256))                                        # warm-up
    t_exact, exact = similarities(exact_op, rows)
    t_screen, screen = similarities(screen_op, rows)
    print(f"torch fp32 on every row: {t_exact:.1f} s ({rows.num_rows / t_exact:,.0f} rows/s); "
          f"bf16 screen: {t_screen:.1f} s ({rows.num_rows / t_screen:,.0f} rows/s, {t_exact / t_screen:.2f}x)")
    per_occ = pc.value_counts(rows.column("occupation")).field("counts").to_numpy()
    print(f"rows per occupation: median {np.median(per_occ):,.0f}, min {per_occ.min():,}, max {per_occ.max():,}")
    print("\n| k | pool rows | re-encoded | share | re-encode s | screen + re-encode s | torch s | effective | "
          "groups: same members | same order | order differs only among equal captions | max screen error |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |")
    for k in args.k:
        cfg = SelectionConfig(sample_size=k, nn_k=k, n_prompts=len(config["prompts"]),
                              training_sample="counted_images", pool_factor=3).pool()
        want = select_subsets_local(exact, cfg, prompts)[0]
        t = time.perf_counter()
        got, record = refine.exact_pool(
            select_subsets_local(screen, cfg, prompts)[0], cfg, lambda r: select_subsets_local(r, cfg, prompts)[0],
            lambda lim: refine.candidate_rows(screen, lim, cfg), refine.exact_similarities(exact_op), args.margin)
        t_refine = time.perf_counter() - t
        groups, members, order, equal_text = compare(got, want)
        total = t_screen + t_refine
        print(f"| {k} | {want.num_rows:,} | {record['re_encoded']:,} | {record['re_encoded'] / rows.num_rows:.1%} | "
              f"{t_refine:.1f} | {total:.1f} | {t_exact:.1f} | {t_exact / total:.2f}x | {members} of {groups} | "
              f"{order} of {groups} | {equal_text} | {record['max_screen_error']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
