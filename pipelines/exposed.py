"""Stable Diffusion Exposed (papers 003/004): where gender bias enters generation, measured on triplets
of prompts that differ in one gender word, on the shared operators.

Subcommands:
  triplets   captions (parquet, text or CSV: COCO, Flickr30k, TextCaps, GCC, LAION) -> neutral captions
             with person/people and no other word of Table S1 -> (neutral, feminine, masculine) triplets
             (person -> woman / man, people -> women / men), or the Profession set of Table S2
             (female / male before the profession); writes triplets.parquet and the filter's counts
             into a run directory DIR/exposed-triplets-<8 hex digits>/ with run.json.
  run        triplets -> units (triplet x seeds, one recorded seed shared by the three prompts) ->
             generation with any diffusers model (the unit's three images in one call), and on the
             generator's device: prompt-space and denoising-space cosines, SSIM, Diff. Pix., ResNet-50,
             CLIP ViT-B/32, DINO ViT-S/16, split-product (section 4) -> Table 3 / S3-shaped means per model
             and source with the units behind each and their intervals (bootstrap over triplets), the RQ1
             answer and gap per cell, metrics.json (its "headline"), headline_units.parquet, report.html.

Runs on a local Ray instance by default; inside `ray submit` / `ray job submit`, or with RAY_ADDRESS
/ --ray-address set, on that cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python pipelines/exposed.py, ray submit)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.engine.cli import arguments, entry  # noqa: E402

SPACES = ("prompt", "prompt_pooled", "denoising", "ssim", "diff_pix", "resnet", "clip", "dino", "split_product")


def _add_triplet_sources(g, run: bool) -> None:
    g.add_argument("--captions", action="append", metavar="[SOURCE=]PATH[:COLUMN]",
                   help="a caption set: its name (gcc, coco, textcaps, flickr30k, laion, or any; default the file's "
                        "name) = a parquet file or folder, a text file (one caption per line) or a CSV; COLUMN "
                        "defaults to --caption-column. Repeat per set" +
                        ("; replaces the configured sets (default: the bundled sample)" if run else ""))
    g.add_argument("--no-professions", action="store_true", help="leave out the Profession set (Table S2)")
    g.add_argument("--per-topic", type=int, metavar="N",
                   help="triplets per topic of Table S2 (default all: 20 professions x 3 templates; the first N "
                        "cover N different professions up to 20)")
    g.add_argument("--profession-sentences", metavar="FILE",
                   help="your own neutral sentences naming Table S2 professions (text, parquet or CSV column TEXT) "
                        "instead of the built-in templates")
    g.add_argument("--max-triplets", type=int, metavar="N", help="at most N triplets per source (quick runs)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exposed.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("triplets", help="triplets from captions or from the Profession set (no models, no Ray)")
    t.add_argument("--captions", "--input", dest="captions", metavar="PATH",
                   action=arguments.deprecated_alias(argparse._StoreAction, ("--input",)),
                   help="captions: parquet file or folder, text file or CSV (--input: deprecated spelling)")
    arguments.add_dataset_columns(t, ("--column",), url=False)
    t.add_argument("--source", help="name of the caption set, used in triplet ids (default: the input's file name)")
    t.add_argument("--profession-set", "--professions", dest="profession_set",
                   action=arguments.deprecated_alias(argparse._StoreTrueAction, ("--professions",)),
                   help="the Profession set (Table S2) from the built-in templates, or from --captions as sentences "
                        "(--professions: deprecated spelling; DALL-Eval's --professions names a list)")
    t.add_argument("--per-topic", type=int, metavar="N",
                   help="triplets per topic (default all: 20 professions x 3 templates)")
    arguments.add_output(t)
    # the two run controls of arguments.add_run_control that apply to a command without Ray
    t.add_argument("--run-id", metavar="ID",
                   help="name of this run's directory under --output (default: exposed-triplets-<8 hex digits of "
                        "the configuration fingerprint>, so the same command finds the same directory and a "
                        "different input or setting never overwrites it)")
    t.add_argument("--overwrite", action="store_true",
                   help="discard this run's directory and make the triplets again instead of reusing a finished run")

    r = sub.add_parser("run", help="triplets, generation and representational disparities (one Ray job)")
    arguments.add_output(r)
    s = r.add_argument_group("triplets (section 3, App. A; any key of configs/exposed.yaml in --config)")
    s.add_argument("--config", metavar="YAML", help="study file overriding configs/exposed.yaml")
    _add_triplet_sources(s, run=True)
    s.add_argument("--no-captions", action="store_true", help="no caption sets: the Profession set only")
    arguments.add_caption_column(s, None, (), "caption column of a --captions set without :COLUMN (default: "
                                 "recognised from its columns: LAION's TEXT, Re-LAION's caption, COYO's and DataComp's "
                                 "text, else its one caption-like column; a text file's lines)")
    s.add_argument("--dataset-name", metavar="NAME", help="which dataset the --captions sets are (default: recognised "
                   "from their columns and paths)")
    s.add_argument("--seeds-per-triplet", action="append", metavar="SOURCE=N",
                   help="seeds per triplet of a source (default gcc=5, profession=5, others 1); repeat per source")
    g = r.add_argument_group("generation (section 3)")
    arguments.add_generation(g, "SD v1.4, v2.0-base, v2.1-base", safety="check-all: units with a flagged image "
                             "are counted, not measured", seed_unit="unit")
    d = r.add_argument_group("representational disparities (section 4, App. A)")
    d.add_argument("--spaces", nargs="+", choices=SPACES,
                   help="spaces to measure (default all; prompt and denoising are always measured)")
    d.add_argument("--resnet-model", help="ResNet-50 (transformers): hub id or directory (default microsoft/resnet-50)")
    arguments.add_clip(d, "the image-space disparity", "ViT-B-32")
    d.add_argument("--dino-model", help="DINO ViT-S/16 (transformers): hub id or directory (default facebook/dino-vits16)")
    d.add_argument("--split-product-model",
                   help="DINO ViT-B/8 for split-product: hub id or directory (default facebook/dino-vitb8)")
    o = r.add_argument_group("objects and dependency groups (sections 5-7, App. A)")
    o.add_argument("--no-objects", action="store_true",
                   help="skip object detection, attention masks and dependency groups (sections 3-4 only)")
    o.add_argument("--detector", help="GroundingDINO or OWLv2 (transformers): hub id or directory "
                                      "(default IDEA-Research/grounding-dino-tiny)")
    o.add_argument("--segmenter", help="SAM (transformers): hub id or directory (default facebook/sam-vit-huge)")
    o.add_argument("--tags", metavar="FILE", help="tag list added to each prompt's nouns (default configs/exposed_tags.txt)")
    o.add_argument("--min-count", action="append", metavar="SOURCE=N",
                   help="bias-score minimum count of a source (default 20 for coco/textcaps/flickr30k, 5 for "
                        "gcc/profession); repeat per source")
    o.add_argument("--attention-layers", choices=["daam", "all"],
                   help="cross-attention layers of the word heat maps: daam (default: DAAM's defaults, no mid block, "
                        "no maps at 1/8 of the latent grid, averaged on the latent grid) or all (every attn2)")
    o.add_argument("--leave-out-individuals", choices=["group_tests", "all_tests", "none"],
                   help="person words (person, woman, man, ...) left out of: group_tests (default: the plots and "
                        "Tables S4-S6; they stay in s_O, the RQ2 tests and the bias scores), all_tests (also s_O "
                        "and the RQ2 tests), none (only the plots)")
    d.add_argument("--standin-models", action="store_true",
                   help="tiny random-weight generators and image models (offline smoke run; numbers are meaningless)")
    arguments.add_intervals(r.add_argument_group(
        "headline intervals (each Table 3 / Table 4 number and RQ1 gap: bootstrap over triplets, docs/method.md)"))
    x = r.add_argument_group("execution")
    arguments.add_run_control(x, "exposed")
    arguments.add_generation_execution(x, "generator", batch=2, unit="units (three images each)", speed=False,
                                       save="the images (without them the report shows none)")
    return p


COMMANDS = {"run": "pipelines.studies.exposed.study:run",
            "triplets": "pipelines.studies.exposed.triplets:run_command"}


def main(argv=None) -> int:
    return entry.main(build_parser(), COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
