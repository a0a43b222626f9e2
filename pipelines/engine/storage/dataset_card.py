"""A Hugging Face dataset card (``README.md``) for a finished run or comparison.

The card's YAML header lists every table the folder holds as a ``datasets`` configuration (so
``datasets.load_dataset(<folder or hub repo>, "<table>")`` and ``load_dataset("parquet",
data_files=...)`` load them), and its text says what was measured, by which models (hub ids,
revisions, weight hashes), under which protocol, with the headline numbers and their intervals,
the licences of the inputs and how to cite the papers.
"""

from __future__ import annotations

import json
import posixpath

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.engine.storage import io

CARD = "README.md"
SKIP_DIRS = ("_work", "_standins", "figures", ".")   # checkpoints, stand-in weights, figures: not tables

# study name prefix -> (paper, BibTeX)
PAPERS = {
    "paper002": ("The Bias Amplification Paradox in Text-to-Image Generation (Seshadri, Singh & Elazar, 2023)",
                 "@article{seshadri2023bias,\n  title={The Bias Amplification Paradox in Text-to-Image Generation},\n"
                 "  author={Seshadri, Preethi and Singh, Sameer and Elazar, Yanai},\n  journal={arXiv preprint "
                 "arXiv:2308.00755},\n  year={2023}\n}"),
    "paper001": ("Auditing Gender Presentation Differences in Text-to-Image Models (Zhang, Jiang, Turk & Yang, 2023)",
                 "@article{zhang2023auditing,\n  title={Auditing Gender Presentation Differences in Text-to-Image "
                 "Models},\n  author={Zhang, Yanzhe and Jiang, Lu and Turk, Greg and Yang, Diyi},\n  journal={arXiv "
                 "preprint arXiv:2302.03675},\n  year={2023}\n}"),
    "paper000": ("DALL-Eval: Probing the Reasoning Skills and Social Biases of Text-to-Image Generation Models "
                 "(Cho, Zala & Bansal, ICCV 2023)",
                 "@inproceedings{cho2023dalleval,\n  title={DALL-Eval: Probing the Reasoning Skills and Social Biases "
                 "of Text-to-Image Generation Models},\n  author={Cho, Jaemin and Zala, Abhay and Bansal, Mohit},\n"
                 "  booktitle={ICCV},\n  year={2023}\n}"),
    "paper004": ("Stable Diffusion Exposed: Gender Bias from Prompt to Image (Wu, Nakashima & Garcia)",
                 "@misc{wu_sd_exposed,\n  title={Stable Diffusion Exposed: Gender Bias from Prompt to Image},\n"
                 "  author={Wu, Yankun and Nakashima, Yuta and Garcia, Noa}\n}"),
}

INPUT_LICENCES = (
    "- Generated images and everything measured on them: the licence of the model that made them applies (see "
    "each model's card on the Hugging Face Hub, ids above).\n"
    "- Training captions and URLs (paper 002, Exposed `triplets`): the dataset's own terms; the LAION, Re-LAION, "
    "COYO-700M and DataComp metadata are released under CC-BY 4.0, and the images they link to remain their "
    "owners'. Fetched training images are not redistributed by this card unless the run saved them "
    "(`--save-images`).\n"
    "- Prompt lists, word lists and templates come from the papers cited below.")


def tables(fs: pafs.FileSystem, root: str) -> list[dict]:
    """The folder's parquet tables: each top-level ``<name>.parquet`` file or directory of parts,
    and each folder of image parts (``images/<x>/part-*.parquet``), with its rows and columns."""
    out = []
    for info in sorted(fs.get_file_info(pafs.FileSelector(root, recursive=False)), key=lambda i: i.path):
        name = posixpath.basename(info.path)
        if name.startswith(SKIP_DIRS) or name == "figures":
            continue
        if info.type == pafs.FileType.File and name.endswith(".parquet"):
            out.append(_describe(fs, name[:-8], [info.path], name))
        elif info.type == pafs.FileType.Directory:
            parts = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(info.path, recursive=True))
                           if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                           and not posixpath.basename(i.path).startswith((".", "_")))
            by_dir: dict[str, list[str]] = {}
            for p in parts:
                by_dir.setdefault(posixpath.dirname(p), []).append(p)
            for d, files in by_dir.items():
                rel = posixpath.relpath(d, root)
                pattern = f"{rel}/*.parquet"
                config = rel[:-8] if rel.endswith(".parquet") else rel      # images.parquet/ -> images
                out.append(_describe(fs, config.replace("/", "_"), files, pattern))
    return out


def _describe(fs, config: str, files: list[str], pattern: str) -> dict:
    rows, schema = 0, None
    for f in files:
        with fs.open_input_file(f) as fh:
            meta = pq.ParquetFile(fh).metadata
            rows += meta.num_rows
            schema = schema or meta.schema.to_arrow_schema()
    return {"config": config, "data_files": pattern, "rows": rows, "columns": schema.names if schema else []}


RUN_FILES_NOTE = ("`metrics.json` holds the full configuration (models with revisions and weight hashes, seeds, "
                  "thresholds, package versions); `report.html` the report.")


def card(title: str, study: str, metrics: dict, found: list[dict], description: str = "",
         files_note: str = RUN_FILES_NOTE) -> str:
    """The card's text."""
    headline = metrics.get("headline") or {}
    lines = ["---", f"pretty_name: {json.dumps(title)}", "tags:", "- text-to-image", "- social-bias", "- fairness",
             "- t2i-bias-audit", "license: other", "configs:"]
    for t in found:
        lines += [f"- config_name: {t['config']}", "  data_files:", "  - split: train", f"    path: {t['data_files']}"]
    lines += ["---", "", f"# {title}", ""]
    if headline.get("standin") or _standin(metrics):
        lines += ["> **Stand-in models:** tiny random-weight models replaced the real ones. These numbers exercise "
                  "the pipeline and mean nothing about any model.", ""]
    paper = next((p for k, p in PAPERS.items() if study.startswith(k)), None)
    lines += ["## What was measured", "", description or f"Study `{study}`"
              + (f", after *{paper[0]}*." if paper else "."), ""]
    if headline.get("subjects"):
        from pipelines.engine.stats.headline import interval_text, shown  # deferred: scipy (stats.intervals)

        lvl = headline["interval"]
        lines += ["## Headline numbers", "",
                  f"{int(round(lvl['level'] * 100))}% intervals: bootstrap over the units named ({lvl['method']}, "
                  f"{lvl['resamples']} resamples, seed {lvl['seed']}), or Student's t where the method says t.", "",
                  "| subject | metric | value [interval] | units |", "| --- | --- | --- | --- |"]
        for s in headline["subjects"]:
            for m in s["metrics"]:
                lines.append(f"| {shown(s)} | {m['label']} | {interval_text(m)} | {m['n']} {m['unit']}s |")
        lines.append("")
    models = [m for m in metrics.get("models") or [] if isinstance(m, dict)]
    if models:
        lines += ["## Models", "", "| role | model | revision / commit | weights sha256 | stand-in |",
                  "| --- | --- | --- | --- | --- |"]
        for m in models:
            d = m.get("detail") or {}
            rev = d.get("commit") or (d.get("spec") or {}).get("revision") or d.get("revision") or ""
            lines.append(f"| {m.get('role', '')} | {m.get('model', '')} | {rev} | {d.get('weights_sha256') or ''} | "
                         f"{'yes' if m.get('standin') else 'no'} |")
        lines.append("")
    if headline.get("protocol"):
        lines += ["## Protocol", "", "```json", json.dumps(headline["protocol"], indent=2, sort_keys=True, default=str),
                  "```", ""]
    lines += ["## Files", "", "Load a table with `datasets.load_dataset(\"parquet\", data_files=\"<folder>/<path>\")`, "
              "or `load_dataset(\"<folder or hub repo>\", \"<config>\")`.", "",
              "| config | path | rows | columns |", "| --- | --- | --- | --- |"]
    for t in found:
        cols = ", ".join(t["columns"][:12]) + (f", ... ({len(t['columns'])})" if len(t["columns"]) > 12 else "")
        cols = cols.replace("|", "\\|")
        lines.append(f"| {t['config']} | `{t['data_files']}` | {t['rows']:,} | {cols} |")
    lines += ["", files_note, "",
              "## Licences of the inputs", "", INPUT_LICENCES, "", "## How to cite", ""]
    cited = [p for k, p in PAPERS.items() if study.startswith(k) or k in json.dumps(metrics.get("studies", ""))]
    for name, bib in cited or PAPERS.values():
        lines += [f"*{name}*", "", "```bibtex", bib, "```", ""]
    lines += ["Measured with t2i-bias-audit (this repository's `pipelines/`)."]
    return "\n".join(lines) + "\n"


def _standin(metrics: dict) -> bool:
    return any(isinstance(m, dict) and m.get("standin") for m in metrics.get("models") or [])


def write(fs: pafs.FileSystem, root: str, title: str, study: str, metrics: dict, description: str = "",
          files_note: str = RUN_FILES_NOTE) -> list[dict]:
    """Write ``README.md`` into ``root``; return the tables it lists."""
    found = tables(fs, root)
    io.write_text(card(title, study, metrics, found, description, files_note), fs, f"{root}/{CARD}")
    return found
