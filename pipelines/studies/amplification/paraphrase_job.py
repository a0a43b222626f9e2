"""`amplification.py paraphrase`: only App. A.6's paraphrases, written as a table (and as the CSV
`run --paraphrase-file` reads back), resumable like every run.

Its captions: a run directory of `amplification.py run` (section 6's captions: the naive subset's
captions whose training image counted, from images.parquet) or of `captions` (the naive subset's
captions, from training_subsets.parquet), or a parquet / CSV file with caption and occupation
(caption_id, caption_gender and url optional).
"""

from __future__ import annotations

import hashlib
import io as stdio
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from operators.text_prompt_similarity import load_sentence_transformer, sbert_provenance
from pipelines.engine.cli import config as study_config
from pipelines.engine.storage import io
from pipelines.engine.run.lifecycle import Outcome, Run, Study, run_study
from pipelines.engine.run.models import ModelSpec
from pipelines.studies.amplification import jobs, paraphrase_results as PR, paraphrases as PP
from schemas import images as I
from schemas.captions import CAPTION, CAPTION_GENDER, CAPTION_ID, OCCUPATION, URL, CaptionGender
from schemas.occupations import Occupation, parse_occupations
from schemas.subsets import SUBSET, Subset


@dataclass(frozen=True)
class ParaphraseJobSettings:
    """The effective `paraphrase` job: the captions to paraphrase (``rows``) and how."""

    not_in_run_id = (
        "rows",     # the captions: in the run id as their sha256 (source_sha256)
        "source",   # where the captions were read: their content is in the run id (source_sha256)
    )

    label: str
    execution: dict
    occupations: list
    occupation_forms: str
    sbert: ModelSpec
    paraphrase: PP.ParaphraseSettings
    rows: Any          # pa.Table: caption_id, occupation, caption, caption_gender, url
    source: str
    source_sha256: str


def read_source(source: str) -> tuple[pa.Table, str]:
    """The captions to paraphrase, and what they are (for the record)."""
    fs, path = io.output_fs(source)
    for name, what in (("images.parquet", "section 6's captions of a run"),
                       ("training_subsets.parquet", "the naive subset of a caption run")):
        if io.exists(fs, f"{path}/{name}"):
            t = io.read_parquet(fs.open_input_file(f"{path}/{name}"))
            keep = pc.equal(t.column(SUBSET), Subset.NAIVE)
            if name == "images.parquet":
                keep = pc.and_(pc.and_(keep, pc.equal(t.column(I.SOURCE), I.Source.TRAINING)),
                               pc.fill_null(t.column(I.COUNTED), False))
            return t.filter(keep).select([CAPTION_ID, OCCUPATION, CAPTION, CAPTION_GENDER, URL]), what
    if source.endswith(".csv"):
        df = pd.read_csv(stdio.StringIO(io.read_text(source)), keep_default_na=False, na_values=[""])
        t = pa.Table.from_pandas(df, preserve_index=False)
    else:
        try:
            t = io.read_parquet(fs.open_input_file(path))
        except (OSError, pa.ArrowInvalid) as exc:
            raise io.InputError(f"{source}: not a run directory (no images.parquet or training_subsets.parquet) "
                                f"nor a readable parquet / CSV file ({str(exc).splitlines()[0]})") from None
    missing = [c for c in (CAPTION, OCCUPATION) if c not in t.column_names]
    if missing:
        raise io.InputError(f"{source}: needs columns caption and occupation (missing {missing}; has "
                            f"{t.column_names})")
    n = t.num_rows
    if CAPTION_ID not in t.column_names:
        t = t.append_column(CAPTION_ID, pa.array(range(n), pa.int64()))
    if CAPTION_GENDER not in t.column_names:
        t = t.append_column(CAPTION_GENDER, pa.array([CaptionGender.NONE] * n, pa.string()))
    if URL not in t.column_names:
        t = t.append_column(URL, pa.nulls(n, pa.string()))
    t = t.select([CAPTION_ID, OCCUPATION, CAPTION, CAPTION_GENDER, URL])
    return t.cast(pa.schema([pa.field(CAPTION_ID, pa.int64()), pa.field(OCCUPATION, pa.string()),
                             pa.field(CAPTION, pa.string()), pa.field(CAPTION_GENDER, pa.string()),
                             pa.field(URL, pa.string())])), "a caption file"


class ParaphraseJob(Study):
    name = "paper002-paraphrases"

    def settings(self, args) -> ParaphraseJobSettings:
        cfg, label = jobs.job_config(args.config, args.occupations, args.occupations_file, None)
        rows, what = read_source(args.source)
        known = {o.name: o for o in parse_occupations(cfg["occupations"])}
        names = sorted(set(rows.column(OCCUPATION).drop_null().to_pylist()))
        occupations = [known.get(Occupation(n).name) or Occupation(n) for n in names] or list(known.values())
        rows = rows.filter(pc.is_valid(rows.column(OCCUPATION)))
        models = dict(cfg["models"])
        sbert = ModelSpec(models["sbert"], models.get("sbert_revision"), options={"precision": "fp32"})
        ex = study_config.execution_settings(cfg["execution"], args, ("max_retries", "max_error_rate"))
        print(f"paraphrasing {rows.num_rows:,} caption rows ({what}) of {len(occupations)} occupation(s)")
        return ParaphraseJobSettings(label=f"paraphrases-{label}", execution=ex, occupations=occupations,
                                     occupation_forms=cfg.get("occupation_forms", "plural"), sbert=sbert,
                                     paraphrase=PP.settings_from(args, bool(args.standin_models)), rows=rows,
                                     source=str(args.source),
                                     source_sha256=hashlib.sha256(io.parquet_bytes(rows)).hexdigest())

    def gpu_models(self, opts, st) -> bool:
        return st.paraphrase.kind == "transformers"

    def actor_cpus(self, opts, st) -> float:
        return st.paraphrase.actors + 1

    def load_models(self, opts, st: ParaphraseJobSettings, gpu) -> list[dict]:
        load_sentence_transformer(st.sbert.model, st.sbert.revision, "cpu", lean=True)
        return PP.check_backend(st.paraphrase, opts.standin_models) + [
            {"role": "SBERT (caption-paraphrase cosine)", "model": st.sbert.model, "standin": False,
             "detail": sbert_provenance(st.sbert.model, st.sbert.revision)}]

    def analyse(self, run: Run, generated: None) -> Outcome:
        st: ParaphraseJobSettings = run.st
        para = PP.run_in_study(run, st, rows=st.rows)
        rows = para.summary_rows()
        summary = PR.summary(para.table, PR.image_similarity(None), para.record())
        para.summary = summary
        metrics = {"source": st.source, "paraphrases": summary, "error_budgets": [para.budget.as_dict()]}
        return Outcome(metrics, rows, {"summary": summary})

    def report(self, run: Run, outcome: Outcome) -> None:
        s = outcome.data["summary"]
        print(f"\nparaphrases: {s['requests']} captions: " + ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if v)
              + f"; SBERT cosine to the caption, mean {s['sbert_cosine']['mean'] if s['sbert_cosine']['mean'] is None else round(s['sbert_cosine']['mean'], 3)}")
        print(f"  {run.rd.display()}/paraphrases.csv: every caption's paraphrase and status; "
              f"`amplification.py run --paraphrases --paraphrase-file` reads it back")


def run(args) -> dict:
    return run_study(ParaphraseJob(), args)
