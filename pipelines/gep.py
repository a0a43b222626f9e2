"""Gender presentation differences (GEP) of paper 001, "Auditing Gender Presentation Differences in
Text-to-Image Models", on the shared operators.

Subcommands:
  run        prompts from G, A, C (section 3) -> generation with any diffusers model (recorded seeds)
             -> L2-normalised CLIP image embeddings on the generator's device -> C-f, CC-f and CLS-f per
             image and attribute (section 4) -> attribute frequencies per gender, GEP vectors and scores
             (Eq. 2) with intervals, tables shaped like Tables 11-14, metrics.json, report.html; with
             --annotations, GEP_human and the evaluation of every estimator against it (Tables 4, 6, 7, 16).
  evaluate   the same evaluation against human annotations for a finished run (annotations come after
             people have looked at the saved images).
  summarize  GEP vectors and scores from a CSV of known frequencies (model,setting,gender,attribute,
             frequency): re-analyse published tables (Tables 11 and 12 give Table 3), each score with
             its interval over the attributes.

Runs on a local Ray instance by default; inside `ray submit` / `ray job submit`, or with RAY_ADDRESS
/ --ray-address set, on that cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python pipelines/gep.py, ray submit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.engine.cli import arguments, entry  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gep.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="generate, embed, score, and compute GEP (one Ray job)")
    arguments.add_output(r)
    s = r.add_argument_group("study (paper 001, section 3; any key of configs/gep.yaml in --config)")
    s.add_argument("--config", metavar="YAML", help="study file overriding configs/gep.yaml (e.g. jobs/gep_lawyer.yaml)")
    s.add_argument("--settings", nargs="+", choices=["neutral", "explicit"], help="settings to run (default both)")
    s.add_argument("--attributes", metavar="A,B,...", help="only these attributes of the configured set")
    s.add_argument("--max-contexts", type=int, metavar="N", help="only the first N contexts (quick runs)")
    g = r.add_argument_group("generation (section 5, App. A)")
    arguments.add_generation(g, "stable-diffusion-v1-5/stable-diffusion-v1-5", scheduler="LMSDiscreteScheduler, App. A",
                             safety="check-all, flagged images kept (App. A ran no checker)", images_per_prompt="images per prompt (default 5)")
    e = r.add_argument_group("estimators (section 4)")
    arguments.add_clip(e, "the estimators", "ViT-L-14")
    e.add_argument("--reference", help="reference string r(a) of CC-f (default 'an object'; Table 8 also uses '' and 'clothes': "
                        "an empty string is used as given)")
    e.add_argument("--ensemble", type=int, help="classifiers per attribute in the CLS-f ensemble (default 10)")
    e.add_argument("--annotations", metavar="CSV",
                   help="human annotations (image_id,attribute,present[,model]): adds GEP_human and the evaluation")
    e.add_argument("--standin-models", action="store_true",
                   help="tiny random-weight CLIP and generators (offline smoke run; numbers are meaningless)")
    arguments.add_intervals(r.add_argument_group("intervals of the headline numbers (GEP scores: over attributes; "
                                                 "GEP vector entries: over images within prompts)"))
    x = r.add_argument_group("execution")
    arguments.add_run_control(x, "gep")
    arguments.add_generation_execution(x, "generator / scorer", save="the images (annotators need them)")

    v = sub.add_parser("evaluate", help="GEP_human and estimator evaluation for a finished run")
    v.add_argument("--run", required=True, metavar="DIR", help="the run's directory (<output>/<run id>)")
    v.add_argument("--annotations", required=True, metavar="CSV", help="image_id,attribute,present[,model]")

    q = sub.add_parser("summarize", help="GEP vectors and scores from known frequencies")
    q.add_argument("--frequencies", required=True, metavar="CSV",
                   help="columns model,setting,gender,attribute,frequency (gender woman/man)")
    q.add_argument("--first", default="woman", help="first group of v_j = f_first - f_second (default woman)")
    q.add_argument("--second", default="man", help="second group (default man)")
    q.add_argument("--output", metavar="DIR", help="write gep_summary.json, .csv, .html and figures/ here")
    arguments.add_intervals(q.add_argument_group("intervals of the GEP scores (over the attributes)"))
    return p


COMMANDS = {"run": "pipelines.studies.gep.study:run",
            "evaluate": "pipelines.studies.gep.study:evaluate_run",
            "summarize": "pipelines.studies.gep.summarize:run"}


def main(argv=None) -> int:
    return entry.main(build_parser(), COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
