"""The caption stream end to end: where the time goes, before and after fusing the scan.

    python pipelines/synthetic_laion.py --rows 4000000 --occupation-share 0.005 --files 8 --output /tmp/syn4m
    python benchmarks/bench_caption_stream.py --input /tmp/syn4m

Four measurements on the same files and the same cores, one after the other:

1. **kernel baseline**: a plain pyarrow read of the caption and URL columns plus the same match
   kernels (``CaptionValidator``, ``OccupationMatcher``, ``GenderWordIndicators`` called directly),
   one process per core over the files (``multiprocessing``), no Ray;
2. **scan, unfused** (the stream as it was): ``ray.data.read_parquet`` + one ``map_batches``
   stage per operator; and **scan, fused**: ``scan.scan_parquet`` (the stages inside the read
   tasks). Both drained to the driver; the scan part only (read + validate + match + gender words),
   after the Ray workers have started (as the baseline's processes have);
3. **stream** (before / after): the whole caption stream with spaCy NER and SBERT, with Ray
   Data's per-operator statistics: "before" is the unfused scan, NER on every matched caption and
   SBERT batched by rows (2,048 per Ray batch, 256 per encode call); "after" is the stream as the
   pipeline runs it (``--streams`` picks them and their order; a name given twice runs twice). Ray's
   ``ds.stats()`` and ``ray.timeline()`` of each are written next to the table (``--stats-dir``).

4. **parts alone** (``--parts parts``): the fused scan's matched rows collected once, then
   each model stage alone on them in this process, as the stream's actors run it (spaCy NER with
   its prefilter; the explode + SBERT with each ``--sbert-backends``), and the stream's wall time
   against the sum of its parts (scan + NER + SBERT).

It prints a markdown table per part, and the LAION-2B-en projection from the measured rates.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.text_caption_validator import CaptionValidator  # noqa: E402
from operators.text_gender_words import GenderWordIndicators  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from pipelines.engine.cli import config as study_config  # noqa: E402
from pipelines.engine.cli.options import RunOptions  # noqa: E402
from pipelines.engine.storage.inputs import resolve_parquet_inputs
from pipelines.engine.stream import scan, stages  # noqa: E402
from pipelines.studies.amplification import captions, jobs  # noqa: E402
from schemas import captions as C  # noqa: E402

LAION_2B_EN_ROWS = 2_322_161_808  # LAION-2B-en metadata rows


def kernels(cfg: dict):
    gi = cfg["gender_indicators"]
    occ = jobs.occupations_from(cfg)
    return (CaptionValidator("TEXT", "URL"), OccupationMatcher(occ),
            GenderWordIndicators(gi["male_words"], gi["female_words"], gi["male_pronouns"], gi["female_pronouns"]))


def _kernel_file(args) -> tuple[int, int]:
    path, batch_rows = args
    import pyarrow as pa_

    pa_.set_cpu_count(1)
    validate, match, words = kernels(study_config.load_config())
    rows = matched = 0
    for rb in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["URL", "TEXT"], use_threads=False):
        t = validate(pa.Table.from_batches([rb]))
        rows += t.num_rows
        t = t.filter(pc.equal(t.column(C.CAPTION_STATUS), C.OUTCOME_KEPT))
        t = match(t)
        t = t.filter(pc.equal(t.column(C.OCCUPATION_STATUS), C.OUTCOME_KEPT))
        matched += words(t).num_rows
    return rows, matched


def kernel_baseline(pool, files: list[str], batch_rows: int) -> dict:
    t = time.perf_counter()
    out = pool.map(_kernel_file, [(f, batch_rows) for f in files])
    wall = time.perf_counter() - t
    return {"rows": sum(r for r, _ in out), "matched": sum(m for _, m in out), "wall": wall}


def read_baseline(pool, files: list[str]) -> float:
    t = time.perf_counter()
    pool.map(_read_file, files)
    return time.perf_counter() - t


def _read_file(path: str) -> int:
    n = 0
    for rb in pq.ParquetFile(path).iter_batches(batch_size=262144, columns=["URL", "TEXT"], use_threads=False):
        n += rb.num_rows
    return n


def drain(ds) -> tuple[int, float, str]:
    t = time.perf_counter()
    rows = 0
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        data = block.filter(pc.is_null(block.column(C.TALLY_STAGE)))
        rows += data.num_rows
    wall = time.perf_counter() - t
    return rows, wall, ds.stats()


def unfused_scan(ray, inp, pipeline, schema):
    ds = ray.data.read_parquet(inp.files, filesystem=inp.filesystem).select_columns(["URL", "TEXT"])
    return stages.run(ds, pipeline, schema)


def before_pipeline(pipeline):
    """The stream's stages in the "before" configuration: NER on every matched caption, SBERT loaded
    and batched by sentence-transformers. SBERT still encodes each input row once (the explode's
    copies of a caption share it), 7.3% fewer encodes on the 4 M set."""
    out = []
    for s in pipeline:
        if s.name == "person_names":
            s = dataclasses.replace(s, kwargs=dict(s.kwargs) | {"prefilter": False})
        if s.name == "prompt_similarity":
            s = dataclasses.replace(s, kwargs=dict(s.kwargs) | {"encode_batch_size": 256, "token_budget": 0,
                                                                   "backend": "sentence-transformers"},
                                    resources=dataclasses.replace(s.declared(), batch_size=2048))
        out.append(s)
    return out


OPERATOR = re.compile(r"^Operator \d+ (?P<name>.+?): (?P<tasks>\d+) tasks executed, (?P<blocks>\d+) blocks produced "
                      r"in (?P<wall>[\d.]+)s", re.M)


def _seconds(text: str) -> float:
    m = re.match(r"([\d.]+)\s*(us|ms|s)", text.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def operator_table(stats: str) -> list[dict]:
    """Per operator of Ray Data's stats text: tasks, wall, summed task wall and CPU time, bytes out."""
    rows = []
    for block in re.split(r"\n(?=Operator \d+ )", stats):
        m = OPERATOR.search(block)
        if not m:
            continue
        def total(label):
            hit = re.search(rf"\* {label}: .*?, ([\d.]+\s*(?:us|ms|s)) total", block)
            return _seconds(hit.group(1)) if hit else 0.0
        size = re.search(r"Output size bytes per block: .*?, (\d+) total", block)
        rows_out = re.search(r"Total output num rows: (\d+)", block)
        rows.append({"operator": m.group("name"), "tasks": int(m.group("tasks")), "wall": float(m.group("wall")),
                     "task_wall": total("Remote wall time"), "task_cpu": total("Remote cpu time"),
                     "bytes_out": int(size.group(1)) if size else 0,
                     "rows_out": int(rows_out.group(1)) if rows_out else 0})
    return rows


def print_operators(title: str, stats: str) -> None:
    print(f"\n{title}\n")
    print("| Ray Data operator | tasks | task wall, summed (s) | task CPU, summed (s) | rows out | MB out |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in operator_table(stats):
        print(f"| {r['operator'][:70]} | {r['tasks']} | {r['task_wall']:.1f} | {r['task_cpu']:.1f} | "
              f"{r['rows_out']:,} | {r['bytes_out'] / 1e6:,.1f} |")


def collect(ds) -> pa.Table:
    """The data rows of a stream (tally rows dropped), in one table."""
    out = [b.filter(pc.is_null(b.column(C.TALLY_STAGE)))
           for b in ds.iter_batches(batch_size=None, batch_format="pyarrow")]
    return pa.concat_tables(out).drop_columns([c for c in (C.TALLY_STAGE,) if c in out[0].column_names]) if out else None


def parts_alone(ray, inp, pipeline, n: int, schema, args) -> dict:
    """Each part of the stream alone on the same rows: the scan (Ray, as in the stream), then NER and
    the explode + SBERT in this process on the scan's matched rows, one Ray batch at a time."""
    import torch  # deferred: torch

    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    matched = collect(scan.scan_parquet(ray, inp, ["URL", "TEXT"], pipeline[:n], schema))
    out = {"scan": time.perf_counter() - t, "matched": matched.num_rows}
    rest = {s.name: s for s in pipeline[n:]}

    def run(stage, table, **kw):
        """(the stage's output, seconds over its Ray batches, seconds to build it)"""
        t = time.perf_counter()
        op = stage.op(**(dict(stage.kwargs) | kw))
        load = time.perf_counter() - t
        size = stage.declared().batch_size
        t = time.perf_counter()
        parts = [op(table.slice(i, size)) for i in range(0, table.num_rows, size)]
        return pa.concat_tables(parts) if parts else table, time.perf_counter() - t, load

    names = rest.get("person_names")
    if names is not None:
        matched, out["ner"], _ = run(names, matched)
    exploded, out["explode"], _ = run(rest["explode_occupations"], matched)
    for backend in args.sbert_backends:
        _, out[f"sbert {backend}"], out[f"sbert {backend} load"] = run(rest["prompt_similarity"], exploded,
                                                                       backend=backend)
    # the encoder without token batches: the library's 64 texts by characters
    _, out["sbert torch, library batches"], out["sbert torch, library batches load"] = run(
        rest["prompt_similarity"], exploded, backend="sentence-transformers", token_budget=0)
    first = args.sbert_backends[0]
    out["sum"] = out["scan"] + out.get("ner", 0.0) + out["explode"] + out[f"sbert {first}"]
    print(f"\nparts alone on {matched.num_rows:,} matched captions ({exploded.num_rows:,} rows after the explode), "
          f"{args.threads} torch thread(s):")
    print("| part | seconds | rate |")
    print("| --- | ---: | ---: |")
    print(f"| scan (Ray, fused, drained to the driver) | {out['scan']:.1f} | {inp.num_rows / out['scan']:,.0f} input rows/s |")
    if "ner" in out:
        print(f"| spaCy NER (prefilter on) | {out['ner']:.1f} | {matched.num_rows / out['ner']:,.0f} captions/s |")
    print(f"| explode | {out['explode']:.2f} | |")
    for backend in args.sbert_backends + ["torch, library batches"]:
        print(f"| SBERT {backend} (+ {out[f'sbert {backend} load']:.1f} s to load) | {out[f'sbert {backend}']:.1f} | "
              f"{exploded.num_rows / out[f'sbert {backend}']:,.0f} rows/s |")
    print(f"| sum (scan + NER + explode + SBERT {first}) | {out['sum']:.1f} | |")
    return out


def pool_arg(text: str) -> int | tuple[int, int]:
    lo, _, hi = text.partition("-")
    return (int(lo), int(hi)) if hi else int(lo)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="directory of LAION-like parquet files (URL, TEXT)")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--parts", nargs="+", default=["kernel", "scan", "stream"],
                    choices=["kernel", "scan", "stream", "parts"])
    ap.add_argument("--sbert-backends", nargs="+", default=["torch"], choices=["torch", "sentence-transformers", "openvino", "openvino-bf16"],
                    help="SBERT encoders timed alone (--parts parts); the stream runs the first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of a part run alone (an actor's: 1)")
    ap.add_argument("--embed-actors", type=pool_arg, default=None,
                    help="SBERT actors of the stream: N, or MIN-MAX for a pool Ray Data grows (default: what "
                         "`captions` picks)")
    ap.add_argument("--embed-batch", type=int, default=None,
                    help="rows per SBERT Ray batch (one encode call, sorted by length; default: the stage's)")
    ap.add_argument("--sbert-fold", choices=["off", "tokens"], default="off",
                    help="SBERT duplicate folding (default off: the synthetic captions repeat their templates, "
                         "folding would flatter the figure; `captions` folds by default)")
    ap.add_argument("--explode-batch", type=int, default=None,
                    help="rows per explode task (default: the operator's); its blocks are what the SBERT actors share")
    ap.add_argument("--streams", nargs="+", default=["before", "after"], choices=["before", "after"],
                    help="the streams `--parts stream` runs, in this order (default: before after); a name "
                         "given twice runs twice, e.g. `after after` for a warm second run")
    ap.add_argument("--stats-dir", default=None, help="write Ray Data's stats of each stream here")
    ap.add_argument("--laion-share", type=float, nargs="+", default=[0.01, 0.02],
                    help="share of LAION-2B-en captions naming an occupation, for the projection")
    args = ap.parse_args(argv)
    inp = resolve_parquet_inputs(args.input)
    print(f"{inp.num_rows:,} rows in {len(inp.files)} files ({args.input}); {args.cores} cores")
    results: dict = {}
    if "kernel" in args.parts:
        with mp.get_context("spawn").Pool(args.cores) as pool:  # started (and warmed) before any timing
            kernel_baseline(pool, inp.files[:args.cores], 262144)
            results["read"] = read_baseline(pool, inp.files)
            results["kernel"] = kernel_baseline(pool, inp.files, 262144)
        k = results["kernel"]
        print(f"kernel baseline: {k['rows']:,} rows, {k['matched']:,} matched in {k['wall']:.1f} s "
              f"({k['rows'] / k['wall']:,.0f} rows/s; the read alone {results['read']:.1f} s)")

    if "parts" in args.parts and "stream" not in args.parts:
        args.parts.append("stream")
    if "scan" in args.parts or "stream" in args.parts:
        import ray  # deferred: ray

        ray.init(num_cpus=max(args.cores, 4), include_dashboard=False, log_to_driver=False)
        from ray.data import DataContext  # deferred: ray

        DataContext.get_current().enable_progress_bars = False
        from pipelines import amplification

        cli = amplification.build_parser().parse_args(["captions", "--output", "/tmp/unused", "--device", "cpu"])
        st = captions.settings(cli)   # the preset's settings, as `captions` builds them
        columns = {"text_column": "TEXT", "url_column": "URL", "kept_columns": []}
        schema = C.stream_schema()
        cli.embed_actors = args.embed_actors
        opts = RunOptions.from_args(cli)
        pipeline = captions.caption_stages(st, opts, columns)
        actors = captions.embed_actors(opts, st, ray)
        print(f"SBERT: {actors} actor(s), folding {args.sbert_fold}, backend {args.sbert_backends[0]}")
        pipeline = [dataclasses.replace(s, kwargs=dict(s.kwargs) | {"backend": args.sbert_backends[0],
                                                                     "fold_duplicates": args.sbert_fold},
                                        resources=dataclasses.replace(
                                            s.declared(), actors=actors,
                                            batch_size=args.embed_batch or s.declared().batch_size))
                    if s.name == "prompt_similarity" else s for s in pipeline]
        if args.explode_batch:
            pipeline = [dataclasses.replace(s, resources=dataclasses.replace(s.declared(), batch_size=args.explode_batch))
                        if s.name == "explode_occupations" else s for s in pipeline]
        n = scan.fusable(pipeline)
        if "scan" in args.parts:
            # Ray's worker processes start and import the project on first use (seconds per worker, once
            # per session, like the baseline's process pool, which is also started before timing)
            t = time.perf_counter()
            drain(scan.scan_parquet(ray, inp, ["URL", "TEXT"], pipeline[:n], schema))
            drain(unfused_scan(ray, inp, pipeline[:n], schema))
            print(f"Ray workers warmed up in {time.perf_counter() - t:.1f} s (not counted)")
            for name, make in (("scan, unfused (before)", lambda: unfused_scan(ray, inp, pipeline[:n], schema)),
                               ("scan, fused (after)", lambda: scan.scan_parquet(ray, inp, ["URL", "TEXT"],
                                                                                pipeline[:n], schema))):
                rows, wall, stats = drain(make())
                results[name] = {"matched": rows, "wall": wall, "stats": stats}
                print(f"{name}: {rows:,} matched in {wall:.1f} s ({inp.num_rows / wall:,.0f} rows/s)")
                print_operators(f"Ray Data operators, {name}", stats)
        if "stream" in args.parts:
            makers = {"before": lambda: stages.run(unfused_scan(ray, inp, pipeline[:n], schema),
                                                   before_pipeline(pipeline[n:]), schema),
                      "after": lambda: stages.run(scan.scan_parquet(ray, inp, ["URL", "TEXT"], pipeline[:n], schema),
                                                  pipeline[n:], schema)}
            for which in args.streams:   # in the order given; a repeated name runs again (the last counts)
                name, make = f"stream {which}", makers[which]
                rows, wall, stats = drain(make())
                results[name] = {"rows": rows, "wall": wall, "stats": stats}
                print(f"{name}: {rows:,} annotated rows in {wall:.1f} s ({inp.num_rows / wall:,.0f} input rows/s)")
                print_operators(f"Ray Data operators, {name}", stats)
                if args.stats_dir:
                    Path(args.stats_dir).mkdir(parents=True, exist_ok=True)
                    Path(args.stats_dir, name.replace(" ", "_") + ".txt").write_text(stats)
                    ray.timeline(str(Path(args.stats_dir, name.replace(" ", "_") + ".timeline.json")))
        if "parts" in args.parts:
            results["parts"] = parts_alone(ray, inp, pipeline, n, schema, args)

    print("\n| measurement | rows | matched | wall (s) | input rows/s | vs kernel baseline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = results.get("kernel", {}).get("wall")
    if "read" in results:
        print(f"| plain pyarrow read, {args.cores} processes | {inp.num_rows:,} | | {results['read']:.1f} | "
              f"{inp.num_rows / results['read']:,.0f} | |")
    if "kernel" in results:
        k = results["kernel"]
        print(f"| read + match kernels, {args.cores} processes | {k['rows']:,} | {k['matched']:,} | {k['wall']:.1f} | "
              f"{k['rows'] / k['wall']:,.0f} | 1.00x |")
    for name in ("scan, unfused (before)", "scan, fused (after)", "stream before", "stream after"):
        if name in results:
            r = results[name]
            ratio = f"{r['wall'] / base:.2f}x" if base else ""
            matched = r.get("matched", "")
            print(f"| {name} | {inp.num_rows:,} | {matched if matched == '' else f'{matched:,}'} | {r['wall']:.1f} | "
                  f"{inp.num_rows / r['wall']:,.0f} | {ratio} |")

    if "parts" in results and "stream after" in results:
        p = results["parts"]
        wall = results['stream after']['wall']
        print(f"\nstream after / sum of its parts alone: {wall:.1f} s / {p['sum']:.1f} s = "
              f"{wall / p['sum']:.2f}x (goal: <= 1.2x; the parts run one after another, SBERT on "
              f"{args.threads} thread(s), the stream overlaps them on its actors)")
    if "stream after" in results and "scan, fused (after)" in results:
        ops = {r["operator"]: r for r in operator_table(results["stream after"]["stats"])}
        scan_cpu = sum(r["task_cpu"] for o, r in ops.items() if "_scan_task" in o)
        matched = results["scan, fused (after)"]["matched"]
        model_cpu = sum(r["task_cpu"] for o, r in ops.items() if "StreamStage" in o)
        per_row, per_match = scan_cpu / inp.num_rows, model_cpu / max(matched, 1)
        print(f"\nLAION-2B-en projection ({LAION_2B_EN_ROWS:,} rows) from the 'stream after' CPU times: scan "
              f"{per_row * 1e6:.2f} core-µs per input row, model stages {per_match * 1e3:.2f} core-ms per matched "
              f"caption")
        print("\n| occupation share | scan core-hours | model-stage core-hours | total core-hours | cores for one hour |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for share in args.laion_share:
            s_h = LAION_2B_EN_ROWS * per_row / 3600
            m_h = LAION_2B_EN_ROWS * share * per_match / 3600
            print(f"| {share:.1%} | {s_h:,.1f} | {m_h:,.1f} | {s_h + m_h:,.1f} | {s_h + m_h:,.0f} |")


if __name__ == "__main__":
    main()
