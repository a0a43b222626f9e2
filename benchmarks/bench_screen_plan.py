"""Backend "auto"'s plan: each occupation's captions estimated from a sample of the input,
read at places spread over it (``refine.sample_spots``, the default) against the input's start
(one place), on the same captions as given and sorted by caption text, in one run.

    python benchmarks/bench_screen_plan.py --captions real131k.parquet --text-column TEXT \\
        --occupations man dog woman people girl boy person --sample-rows 16384 --row-group-rows 2048

The captions are written twice to a temporary folder (as given; sorted by caption) in row groups of
``--row-group-rows`` rows, a URL column added where they have none. For each, the true counts (the
plan over every row) are printed beside each sampling's estimate, its largest relative error, the
occupations it would screen (factor 2 of a pool of k = ``--k``, the preset's shape) and its time.
An input of LAION's size is read at 8 places; ``--sample-rows`` and ``--row-group-rows`` scale the
same shape down to a small file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operators.base import Stage  # noqa: E402
from operators.text_caption_validator import CaptionValidator  # noqa: E402
from operators.text_occupation_matcher import OccupationMatcher  # noqa: E402
from pipelines.engine.storage.inputs import resolve_parquet_inputs  # noqa: E402
from pipelines.studies.amplification import refine  # noqa: E402
from pipelines.studies.amplification.selection import SelectionConfig  # noqa: E402
from schemas.occupations import Occupation  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--captions", required=True, help="a parquet file of captions")
    ap.add_argument("--text-column", default="TEXT")
    ap.add_argument("--occupations", nargs="+", required=True)
    ap.add_argument("--sample-rows", type=int, default=refine.SAMPLE_ROWS)
    ap.add_argument("--row-group-rows", type=int, default=8192)
    ap.add_argument("--k", type=int, default=50)
    args = ap.parse_args(argv)

    table = pq.read_table(args.captions, columns=[args.text_column]).rename_columns(["TEXT"])
    table = table.append_column("URL", pa.array([f"https://example.org/{i}.jpg" for i in range(table.num_rows)]))
    occupations = [Occupation(n) for n in args.occupations]
    stages = [Stage(CaptionValidator, {"text_column": "TEXT", "url_column": "URL"}),
              Stage(OccupationMatcher, {"occupations": occupations})]
    cfg = SelectionConfig(sample_size=args.k, nn_k=args.k, n_prompts=4, training_sample="counted_images",
                          pool_factor=3).pool()
    names = list(args.occupations)

    def plan(inp, rows, spots):
        start = time.perf_counter()
        out = refine.screen_plan(inp, ["TEXT", "URL"], stages, names, cfg, sample_rows=rows, factor=2, min_rows=0,
                                 spots=spots)
        return out, time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        for name, data in (("as given", table), ("sorted by caption", table.sort_by([("TEXT", "ascending")]))):
            folder = Path(tmp) / name.split()[0]
            folder.mkdir()
            pq.write_table(data, folder / "part-0.parquet", row_group_size=args.row_group_rows)
            inp = resolve_parquet_inputs([str(folder)], "footer")
            truth = plan(inp, inp.num_rows, 1)[0]
            counts = truth["estimated_captions"]
            print(f"\n{name}: {inp.num_rows:,} rows in {sum(map(len, inp.row_groups))} row groups; "
                  f"screened on the true counts: {len(truth['screened'])} of {len(names)}\n")
            print("| read | places | " + " | ".join(names) + " | largest error | screened | seconds |")
            print("| --- | ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: |")
            print("| every row (the counts) | - | " + " | ".join(f"{counts[n]:,}" for n in names) + " | - | "
                  f"{len(truth['screened'])} | - |")
            for label, spots in (("spread (the default)", refine.SAMPLE_SPOTS), ("the start", 1)):
                got, seconds = plan(inp, args.sample_rows, spots)
                est = got["estimated_captions"]
                err = max(abs(est[n] - counts[n]) / counts[n] for n in names if counts[n])
                places = len(refine.sample_spots(inp, args.sample_rows, spots))
                print(f"| {args.sample_rows:,} rows at {label} | {places} | " + " | ".join(f"{est[n]:,}" for n in names)
                      + f" | {err:.0%} | {len(got['screened'])} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
