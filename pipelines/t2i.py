"""`t2i <study> <command> ...`: every study behind one console command.

The study registry below maps a study's name to its entry script's ``main``; ``t2i gep run ...``
is exactly ``python pipelines/gep.py run ...`` (the scripts stay, for ``ray submit cluster.yaml
pipelines/<study>.py -- ...``). A new study is one folder under ``pipelines/studies/``, its entry
script, and one line here.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines import amplification, dalleval, exposed, gep  # noqa: E402
from pipelines.annotate import cli as annotate  # noqa: E402
from pipelines.engine.stats import compare  # noqa: E402

# study -> (its entry point, what it is)
STUDIES = {
    "amplification": (amplification.main, "paper 002, The Bias Amplification Paradox: LAION captions vs Stable "
                                          "Diffusion (captions, run, summarize)"),
    "gep": (gep.main, "paper 001, gender presentation differences (run, evaluate, summarize)"),
    "dalleval": (dalleval.main, "paper 000, DALL-Eval: social bias, visual reasoning skills, alignment and "
                                "quality (run, skills, alignment, summarize)"),
    "exposed": (exposed.main, "papers 003/004, Stable Diffusion Exposed (triplets, run)"),
}
# commands across studies: name -> (entry point, what it does)
TOOLS = {
    "compare": (compare.main, "finished runs of any studies side by side: intervals, ranks, ties "
                              "(t2i compare RUN ... --output DIR)"),
    "annotate": (annotate.main, "people in the loop: label tasks from a finished run, imports, Krippendorff's "
                                "alpha, the classifier against the majority (t2i annotate plan|import|report ...)"),
}


def usage() -> str:
    width = max(map(len, STUDIES))
    lines = ["usage: t2i <study> <command> [options]   (t2i <study> --help for a study's commands)", "", "studies:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in STUDIES.items()]
    lines += ["", "across studies:"] + [f"  {name:<{width}}  {what}" for name, (_, what) in TOOLS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name in TOOLS:
        return TOOLS[name][0](rest)
    if name not in STUDIES:
        print(f"error: unknown study {name!r}; one of: {', '.join(STUDIES)}\n\n{usage()}", file=sys.stderr)
        return 2
    return STUDIES[name][0](rest)


if __name__ == "__main__":
    sys.exit(main())
