"""Per-occupation caption counts on a skewed input: the combinable aggregation against a
plain group-by.

One occupation holds 90% of the annotated captions (as "student" or "author" would at LAION
scale). The baseline is a plain group-by: ``groupby(occupation).map_groups(...)``, which shuffles every
caption and hands one worker all of that occupation's rows. The combinable plan maps each block to at
most one row per occupation and sums those on the driver. Both results must be equal.

Peak memory per worker is the peak RSS any Ray worker process reaches while the plan runs
(sampled with psutil every 50 ms; Ray 2.60's Data statistics do not report memory).

    python benchmarks/bench_occupation_stats.py --rows 4000000 --blocks 40
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from pipelines.studies.amplification import caption_report as report  # noqa: E402
from schemas.captions import CAPTION_GENDER, OCCUPATION, CaptionGender  # noqa: E402
from schemas.subsets import OCCUPATION_STATS  # noqa: E402


def old_occupation_stats(group: pa.Table) -> pa.Table:
    """The replaced map_groups function (one call per occupation with all its rows)."""
    g = group.column(CAPTION_GENDER)
    female = pc.sum(pc.is_in(g, pa.array([CaptionGender.FEMALE, CaptionGender.BOTH]))).as_py() or 0
    male = pc.sum(pc.is_in(g, pa.array([CaptionGender.MALE, CaptionGender.BOTH]))).as_py() or 0
    anyind = pc.sum(pc.not_equal(g, CaptionGender.NONE)).as_py() or 0
    return pa.table({OCCUPATION: [group.column(OCCUPATION)[0].as_py()], "matched_captions": [group.num_rows],
                     "female_indicator_captions": [female], "male_indicator_captions": [male],
                     "any_indicator_captions": [anyind]}, schema=OCCUPATION_STATS)


def skewed(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    others = [f"occupation-{i:02d}" for i in range(61)]
    occ = np.where(rng.random(rows) < 0.9, "student", rng.choice(others, rows))
    gender = rng.choice([CaptionGender.NONE, CaptionGender.MALE, CaptionGender.FEMALE, CaptionGender.BOTH],
                        rows, p=[0.7, 0.12, 0.12, 0.06])
    # a caption-like payload column: the annotated table carries captions, and so does the shuffle
    caption = pa.array(np.char.add("a photo of a caption number ", np.arange(rows).astype(str)))
    return pa.table({OCCUPATION: pa.array(occ), CAPTION_GENDER: pa.array(gender), "caption": caption})


class RssSampler:
    """Peak RSS of any Ray worker process while a plan runs."""

    def __init__(self):
        import psutil  # deferred: psutil

        self.psutil, self.peak, self.stop = psutil, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        import os

        me = self.psutil.Process(os.getpid())
        while not self.stop.is_set():
            # this driver's own Ray instance only (its raylet and workers are our descendants), not
            # another Ray instance on the same machine
            for p in me.children(recursive=True):
                try:
                    cmd = " ".join(p.cmdline())
                    if cmd.startswith("ray::") or "default_worker.py" in cmd:
                        self.peak = max(self.peak, p.memory_info().rss)
                except self.psutil.Error:
                    pass
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()

    import ray  # deferred: ray

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    table = skewed(args.rows)
    step = -(-args.rows // args.blocks)
    blocks = [table.slice(i, step) for i in range(0, args.rows, step)]
    print(f"{args.rows:,} annotated captions in {len(blocks)} blocks, 90% 'student'; "
          f"{table.nbytes / 2**20:,.0f} MiB in Arrow; {args.num_cpus} CPUs")

    results = {}
    for name in ("groupby + map_groups (before)", "map per block + driver sum (now)"):
        data = ray.data.from_arrow(blocks).materialize()
        with RssSampler() as rss:
            t0 = time.perf_counter()
            if name.startswith("groupby"):
                ds = data.groupby(OCCUPATION, num_partitions=args.num_cpus).map_groups(old_occupation_stats,
                                                                                      batch_format="pyarrow")
                out = pa.concat_tables(ray.get(ds.to_arrow_refs()))
                out = out.sort_by(OCCUPATION)
            else:
                from pipelines.studies.amplification import caption_selection

                ds = caption_selection.partial_occupation_stats(data)
                out = report.combine_occupation_stats(ray.get(ds.to_arrow_refs()))
            wall = time.perf_counter() - t0
        results[name] = out
        print(f"{name:<34} wall {wall:7.2f} s   peak worker RSS {rss.peak / 2**20:8,.0f} MiB")
    a, b = results.values()
    assert a.equals(b.cast(a.schema)), "the two plans disagree"
    print("results equal")
    ray.shutdown()


if __name__ == "__main__":
    main()
