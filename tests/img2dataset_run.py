"""img2dataset itself, run the way a user runs it: ``python tests/img2dataset_run.py RUNS_JSON``
downloads each run (a dict of ``img2dataset.download`` arguments) in turn.

img2dataset starts its pool worker and its logger as spawned processes, and a spawned process
imports its parent's main module first: this file. Importing ``operators`` here defers the
packages img2dataset imports at module level but these downloads never use (wandb, and
webdataset and albumentations until a writer or a resize needs them: the fetch stage's own
deferral, operators/support/deferred_imports.py), in this process and in each spawned one:
about 2.8 CPU-s less per process, seven processes per call."""

import json
import sys

import operators  # noqa: F401  (defers wandb, webdataset and albumentations: see above)


def main(runs: list[dict]) -> None:
    from img2dataset import download

    for args in runs:
        download(**args)


if __name__ == "__main__":   # a spawned process imports this file without running the downloads
    main(json.loads(sys.argv[1]))
