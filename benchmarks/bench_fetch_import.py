"""What a fetch worker pays to build the downloader, with img2dataset's unused imports deferred and without.

    python benchmarks/bench_fetch_import.py --repeats 5

The fetch stage runs as Ray tasks; every worker process that runs one imports ``img2dataset`` when
it builds ``ImageFetcher``. img2dataset's package imports ``wandb`` (its logger), ``webdataset``
(its shard writers) and ``albumentations`` (its resizer's transforms) at module level;
``operators`` defers the three (``operators/support/deferred_imports.py``), so only what a fetch
uses runs. This builds the fetcher in fresh Python processes, as a worker does: once as the
project does it (``import operators`` first: deferred), and once with ``webdataset`` and
``albumentations`` imported first (the baseline: what a worker paid before they were deferred;
``wandb`` is deferred in both), and prints the CPU seconds of each side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import fresh_process_json  # noqa: E402

_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {repo!r})
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")   # as the fetcher sets it
t = time.process_time()
if sys.argv[1] == "eager":
    import operators.support.deferred_imports as d   # operators defers the three as usual ...
    for name in ("webdataset", "albumentations"):     # ... and these two are loaded before anyone asks
        d.load(sys.modules[name])
from operators.image_fetch import ImageFetcher
ImageFetcher()
print(json.dumps({{"cpu_s": time.process_time() - t,
                   "webdataset_loaded": type(sys.modules["webdataset"]).__name__ == "module"}}))
"""


def build_once(how: str) -> dict:
    return fresh_process_json(_CHILD.format(repo=str(REPO)), how)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per way (default 5)")
    args = p.parse_args(argv)
    build_once("deferred")   # warm the file cache
    runs = {how: [build_once(how) for _ in range(args.repeats)] for how in ("eager", "deferred")}
    cpu = {how: statistics.median(r["cpu_s"] for r in rs) for how, rs in runs.items()}
    loaded = {how: rs[0]["webdataset_loaded"] for how, rs in runs.items()}
    print(f"{'build ImageFetcher in a fresh process':<40} {'eager (s)':>10} {'deferred (s)':>13} {'saved':>7}")
    print(f"{'CPU seconds, median of ' + str(args.repeats):<40} {cpu['eager']:>10.2f} {cpu['deferred']:>13.2f} "
          f"{1 - cpu['deferred'] / cpu['eager']:>7.0%}")
    print(f"webdataset loaded: eager {loaded['eager']}, deferred {loaded['deferred']}")


if __name__ == "__main__":
    main()
