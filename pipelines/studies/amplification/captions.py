"""The caption side of paper 002 (`amplification.py captions`, and the first phase of `run`).

LAION captions -> validate -> occupation match -> gender words -> person names -> one row per
(caption, occupation) -> SBERT similarity to the occupation's prompts, streamed in resumable
shards of input files; then the training subsets (naive, no indicators, NN, NN + no indicators;
sections 4 and 5) by a partial top-k reduction, and the per-occupation summaries.

This module runs the caption side in an open run (``caption_side``), records its models and
metrics, prints it, and is the `captions` study; the pieces are its siblings: the settings, job
and input (``caption_settings``), the stage list and its resources (``caption_stages``), the
resumable scan (``caption_scan``) and the selection of the subsets (``caption_selection``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa

from operators.text_caption_normaliser import CONTROL_CHARACTERS, INVISIBLE_CHARACTERS
from operators.text_name_gender import NER_RUN, NER_SKIPPED, STAGE_NAMES, spacy_record
from operators.support.sbert_openvino import version as openvino_version
from operators.text_prompt_similarity import (SBERT_ENCODED, SBERT_FOLDED, TORCH_BACKENDS, PromptSimilarity, lean_loader,
                                              load_sentence_transformer, sbert_backend, sbert_loader, sbert_provenance)
from pipelines.engine.cli import config as study_config
from pipelines.engine.cli.options import RunOptions
from pipelines.engine.storage import io
from pipelines.engine.stream import runtime, stages
from pipelines.engine.run.lifecycle import Outcome, Run, Study, run_study
from pipelines.engine.stream.progress import Phase
from pipelines.engine.stats.summary import (
    CountMismatch,
    check_chain,
    format_summary,
    outcomes_by_stage,
    stage_counts,
    summarize,
    summary_rows_captions,
)
from pipelines.studies.amplification import caption_report as report
from pipelines.studies.amplification import caption_reuse
from pipelines.studies.amplification.caption_scan import CAPTION_TALLIES, TALLY_SCHEMA, scan_shards
from pipelines.studies.amplification.caption_selection import STAGE_DUPLICATES, duplicate_counts, select_pool
from pipelines.studies.amplification.caption_settings import (FILES, CaptionSettings, input_job, sbert_fold,
                                                             sbert_on_gpus, screen_note, screen_occupations,
                                                             selection_config, settings, validate_input)
from pipelines.studies.amplification.caption_stages import (caption_stages, configured_stages, embed_actors, planned,
                                                           with_embed_actors)
from pipelines.studies.amplification.selection import walk
from schemas import captions as C
from schemas.subsets import MATCHED_CAPTIONS

# the installed project, also when `ray submit` runs a copy of this script outside the repository
REPO = Path(study_config.__file__).resolve().parents[3]
SAMPLE_INPUT = REPO / "data" / "synthetic" / "laion_synthetic_sample.parquet"


def caption_side(run: Run, st: CaptionSettings, own_run: bool) -> tuple[dict, tuple]:
    """The caption side in an open run: scan (resumable shards), training subsets, summaries.
    Returns its metrics and what ``print_caption_side`` shows; ``own_run``: the `captions`
    subcommand (adds the run summary rows)."""
    rd, ray = run.rd, run.ray
    opts = with_embed_actors(run.options, embed_actors(run.options, st, ray))   # recorded as resolved
    inp, columns, extra_fields = st.input
    selection = selection_config(st)
    annotated_schema = C.annotated_schema(extra_fields)
    digest = rd.plan(caption_reuse.PLAN, caption_reuse.caption_digest(opts, st))   # what --captions-from checks
    source = opts.flags.get("captions_from")
    if source:
        copied = caption_reuse.adopt(rd, source, digest, caption_records(run.models))
        print(f"caption scan: {copied} shard(s) taken from {source} (the same caption settings, input and models)")
    phase, budget, attempt = scan_shards(ray, rd, inp, columns, annotated_schema, C.stream_schema(extra_fields),
                                         st, opts)
    tallies = rd.read_parts(CAPTION_TALLIES, TALLY_SCHEMA)
    pool, stats, annotated_rows = select_pool(run, st, selection.pool())
    folded = duplicate_counts(run, st, pool, selection)
    subsets = walk(pool, selection)[0]   # the first k captions; `run` walks the pool to k counted images
    io.write_table(subsets, rd.fs, rd.file(FILES["subsets"]))
    if selection.walks:
        io.write_table(pool, rd.fs, rd.file(FILES["pool"]))
    sim = report.similarity_summary(stats, subsets, st.occupations)
    io.write_table_and_csv(sim, rd.fs, rd.file(FILES["similarity"]))

    counts = stage_counts(tallies)
    io.write_table_and_csv(counts, rd.fs, rd.file(FILES["counts"]))
    order = [s.name for s in caption_stages(st, opts, columns)]  # the summary follows the stage list
    summary = summarize(counts, order)
    if summary[C.STAGE_CAPTIONS]["rows_in"] != inp.num_rows:
        raise CountMismatch(f"read {summary[C.STAGE_CAPTIONS]['rows_in']} rows, the files hold {inp.num_rows}")
    check_chain(summary, final_rows=annotated_rows, expansions=(C.STAGE_EXPLODE,))
    summary[STAGE_DUPLICATES] = folded   # after the chain: the selection's folded rows, per reason
    unmatched_occupations(sim)   # a warning naming them; none matching at all: an error (exit 2)

    sizes, head = report.subset_sizes(subsets), report.headline(sim)
    names = ner_counts(counts, st)
    encoded = sbert_counts(counts, st, opts)
    metrics = {
        "stage": "captions",
        "attempt_summary": summarize(stage_counts(attempt), order),
        "input": {"paths": list(opts.flags["captions"]), "files": [inp.display(f) for f in inp.files], "rows": inp.num_rows,
                  **columns, "page_checksums": inp.checksum_record()},
        "output": rd.display(),
        "config": {
            "occupations": [o.__dict__ | {"forms": list(o.forms(st.occupation_forms == "plural"))}
                            for o in st.occupations],
            "occupation_forms": st.occupation_forms,
            "prompts": st.prompts,
            "gender_indicators": st.gender_indicators | {"names_enabled": st.names_enabled},
            "selection": selection.as_dict() | {"seed": st.selection["seed"]},
            "models": st.models,
            "config_file": opts.flags["config"] or str(study_config.default_config_path()),
            "occupations_file": opts.flags["occupations_file"],
            "execution": st.execution,
            "resources": {"scan_batch_size": opts.flags["scan_batch_size"], "ner_actors": opts.flags["ner_actors"],
                          "embed_actors": opts.flags["embed_actors"], "embed_gpus": opts.flags["embed_gpus"],
                          "device": opts.device},
            "stages": stages.describe(configured_stages(st, opts, columns)),
        },
        "models": caption_records(run.models),
        "counts": summary,
        "caption_phase": _phase_record(phase),
        **({"caption_scan_from": source} if source else {}),   # --captions-from: whose finished scan it took over
        "error_budgets": [budget.as_dict()],
        "annotated_rows": annotated_rows,
        "names_ner": names,
        "sbert_encoded": encoded,
        # captions whose control or invisible characters were made spaces or removed (normalise_captions)
        "captions_normalised": {k: outcomes_by_stage(counts).get(C.STAGE_NORMALISE, {}).get(k, 0)
                                for k in (CONTROL_CHARACTERS, INVISIBLE_CHARACTERS)},
        # --sbert-backend screened: how the subsets were made exact (refine.exact_pool); the annotated
        # captions keep the bf16 screen's cosines
        "sbert_screen": run.records.get("sbert_screen"),
        # backend "auto": the occupations screened and the estimate behind it (refine.screen_plan)
        "sbert_screen_plan": st.sbert.get("screen_plan"),
        "subset_rows": sizes,
        "caption_headline": head,   # (the caption side's means; "headline" is the interval contract)
        "_stats": stats,   # the per-occupation stats, for `run` to summarise its walked subsets (popped there)
    }
    if own_run:
        metrics.pop("_stats")
        metrics["run_summary"] = summary_rows_captions(summary, phase, summarize(stage_counts(attempt), order))
    return metrics, (format_summary(summary), annotated_rows, subsets, sizes, head, names)


def _phase_record(phase: Phase) -> dict:
    return {"name": phase.name, "unit": phase.unit, "total": phase.total, "reused": phase.reused,
            "processed": phase.processed, "seconds": round(phase.seconds, 3),
            "rate_per_s": None if phase.rate is None else round(phase.rate, 3)}


def load_caption_models(opts: RunOptions, st: CaptionSettings) -> list[dict]:
    """Load spaCy and SBERT on the driver before any data is read; their provenance records."""
    records = []
    if st.names_enabled:
        spacy_model = st.gender_indicators["spacy_model"]
        records.append({"role": "caption side (spacy)", "key": "spacy", "model": spacy_model, "standin": False,
                        "detail": spacy_record(spacy_model)})
    sbert, revision = st.sbert.model, st.sbert.revision
    # openvino missing where a backend needs it: fails now
    backend = sbert_backend(st.sbert.get("backend", "auto"), on_gpu=False, screens=bool(screen_occupations(st)))
    # loaded here the way the actors will load it (on GPUs through sentence-transformers)
    model = load_sentence_transformer(sbert, revision, "cpu", lean=lean_loader(backend) and not sbert_on_gpus(opts))
    records.append({"role": "caption side (sbert)", "key": "sbert", "model": sbert, "standin": False,
                    "detail": sbert_provenance(sbert, revision)   # the hub commit and sha256 of what loaded
                    | {"backend": backend, "loader": sbert_loader(model),
                       "openvino": openvino_version() if backend not in TORCH_BACKENDS or screen_occupations(st)
                       else None}
                    | ({"screened": screen_note(st)} if screen_occupations(st) else {})})
    return records


def caption_records(records: list[dict]) -> dict:
    """metrics.json's "models" of the caption side: {"spacy": ..., "sbert": ...}."""
    return {r["key"]: r["detail"] for r in records if r.get("key")}


def unmatched_occupations(sim: pa.Table) -> list[str]:
    """The occupations no caption of the input names (a warning naming them); none matching at all
    is an error (a misspelt job, the wrong caption column, or a sample without them)."""
    counts = zip(sim.column(C.OCCUPATION).to_pylist(), sim.column(MATCHED_CAPTIONS).to_pylist())
    unmatched = [o for o, n in counts if not n]
    if not unmatched:
        return unmatched
    names = ", ".join(unmatched[:12]) + (f" and {len(unmatched) - 12} more" if len(unmatched) > 12 else "")
    if len(unmatched) == sim.num_rows:
        raise io.InputError(f"no caption of the input names any of the {sim.num_rows} occupation(s) ({names}): "
                            f"check their spelling, --occupation-forms, and the caption column (--caption-column)")
    print(f"warning: {len(unmatched)} of {sim.num_rows} occupation(s) match no caption of the input, so their "
          f"tables stay empty: {names} (check their spelling and --occupation-forms)")
    return unmatched


def sbert_counts(counts: pa.Table, st: CaptionSettings, opts: RunOptions) -> dict:
    """How many (caption, occupation) rows SBERT embedded and how many reused the embedding of
    another row of their batch: the same input row, or the same token ids (``sbert_fold``), from
    the similarity stage's tallies."""
    c = outcomes_by_stage(counts).get(PromptSimilarity.stage_name, {})
    rows, encoded = c.get(C.OUTCOME_ROWS_IN, 0), c.get(SBERT_ENCODED, 0)
    return {"fold_duplicates": sbert_fold(st, opts), "rows": rows, "encoded": encoded,
            "folded": c.get(SBERT_FOLDED, 0), "share_encoded": round(encoded / rows, 6) if rows else None}


def ner_counts(counts: pa.Table, st: CaptionSettings) -> dict | None:
    """How many matched captions spaCy ran on (all of them without the prefilter), from the
    person-name stage's tallies; None with --no-names."""
    if not st.names_enabled:
        return None
    c = outcomes_by_stage(counts).get(STAGE_NAMES, {})
    captions, ran = c.get(C.OUTCOME_ROWS_IN, 0), c.get(NER_RUN, 0)
    return {"prefilter": bool(st.gender_indicators.get("ner_prefilter", True)), "captions": captions,
            "ner_run": ran, "ner_skipped": c.get(NER_SKIPPED, 0),
            "share_ner_run": round(ran / captions, 6) if captions else None}


def print_caption_side(rd, shown: tuple, brief: bool = False) -> None:
    summary_text, annotated_rows, subsets, sizes, head, names = shown
    report.print_caption_report(summary_text, rd.display(), annotated_rows, subsets, sizes, head, FILES, brief)
    if names and names["captions"]:
        how = ("only where a word is a first name gender-guesser knows; person_names is null elsewhere"
               if names["prefilter"] else "on every caption (--ner-all)")
        print(f"person names: spaCy NER ran on {names['ner_run']:,} of {names['captions']:,} matched captions "
              f"({100 * names['share_ner_run']:.1f}%), {how}")


class CaptionStudy(Study):
    """`amplification.py captions`: the caption side alone, as a study of the engine's lifecycle."""

    name = "paper002-amplification"

    def settings(self, args) -> CaptionSettings:
        st, opts = settings(args), RunOptions.from_args(args)
        # a missing or unreadable input, or a scan --captions-from cannot take over, fails now,
        # before any model loads
        return caption_reuse.check_source(opts, planned(opts, dataclasses.replace(st, input=validate_input(args, st))))

    def job(self, opts, st: CaptionSettings) -> dict:
        return super().job(opts, st) | input_job(opts, st)

    def actor_cpus(self, opts, st: CaptionSettings) -> float:
        return runtime.pool_max(embed_actors(opts, st)) + (opts.flags["ner_actors"] if st.names_enabled else 0)

    def use_standins(self, opts, st: CaptionSettings, root: str) -> None:  # no stand-ins: spaCy and SBERT are real
        raise ValueError("the caption side has no stand-in models")

    def load_models(self, opts, st: CaptionSettings, gpu) -> list[dict]:
        return load_caption_models(opts, st)

    def analyse(self, run: Run, generated: None) -> Outcome:
        metrics, shown = caption_side(run, run.st, own_run=True)
        return Outcome(metrics, metrics.pop("run_summary"), {"shown": shown})

    def report(self, run: Run, outcome: Outcome) -> None:
        print_caption_side(run.rd, outcome.data["shown"])


def run_captions(args) -> dict:
    """`amplification.py captions`."""
    return run_study(CaptionStudy(), args)
